"""Studies as data: the runner over train_policy.py / rollout.py, records from plain runs, and the
invariants of the measurements the analyses make."""
import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from common.provenance import environment, machine_tag
from envs.corruptions import corrupt
from envs.shifts import CORRUPTIONS
from studies.__main__ import main as studies_main
from studies.__main__ import show
from studies.catalog import ARMS, STUDIES, VARIANTS
from studies.records import load, records_of_run
from studies.study import BUDGETS, Arm, Cell, Setting, Study, check, run

CLEAN = Setting("clean", "clean")
SETTINGS = (CLEAN, Setting("brightness1", "brightness 1", {"corruption": [["brightness", 1]]}))
FULL = ARMS["full"]


@pytest.fixture
def tiny_budget(tiny_pusht_zarr):
    from tests.helpers import TINY_POLICY

    tiny = BUDGETS["tiny"]
    return replace(tiny, train_overrides={**tiny.train_overrides, "task.dataset.path": str(tiny_pusht_zarr), "train.val_fraction": "0.34",
                                          "train.num_threads": "1", **dict(o.split("=", 1) for o in TINY_POLICY)})


def test_a_study_trains_and_evaluates_each_cell_once_records_it_and_a_failure_stops_nothing(tmp_path, tiny_budget, capsys):
    # global_slope= is LookHere's: that evaluation of full attention fails, in its own process, and the others run
    study = Study("tiny", ("pusht",), ("bc",), (FULL,), (*SETTINGS, Setting("bad", "bad", {"attention": {"global_slope": 0.5}})))
    results = tmp_path / "results"
    failed = run(study, tiny_budget, results, log=print)
    assert len(failed) == 1 and failed[0].startswith("eval pusht_bc_full_s0_") and " bad: exit status 1" in failed[0]
    cell = study.cells(tiny_budget, results)[0]
    assert cell.trained_step() == 2 and "global_slope= applies to lookhere attention" in (cell.run_dir / "logs" / "eval_bad.log").read_text()
    records = load(results, "tiny")
    assert [(r.attention, r.condition, r.episodes, r.seed, r.steps) for r in records] == \
        [("full", {"corruption": [["brightness", 1]]}, 1, 0, 2), ("full", {}, 1, 0, 2)]
    summary = json.loads((cell.run_dir / "eval" / "brightness1" / "summary.json").read_text())
    assert summary["corruption"] == "brightness1" and records[0].successes == summary["successes"]
    assert records[0].overrides["train.batch_size"] == "4" and records[0].train_seconds > 0
    # where it trained and was evaluated, as the run directory and summary.json recorded it
    here = machine_tag(environment())
    assert here and {r.machine for r in records} == {f"trained on {here}; evaluated on {here}"}
    # again: nothing is trained or evaluated twice, and the records stay as they were
    model = cell.run_dir / "checkpoints" / "last" / "model.safetensors"
    stamp = model.stat().st_mtime_ns
    capsys.readouterr()
    assert len(run(study, tiny_budget, results, log=print)) == 1
    out = capsys.readouterr().out
    assert "1 trained already, 0 to train" in out and "3 evaluations, 2 cached, 1 to run" in out and "0 new or changed" in out
    assert model.stat().st_mtime_ns == stamp and load(results, "tiny") == records
    # the runner measured whether the policy looks, once per checkpoint, and each record of those weights carries it
    probed = json.loads((cell.run_dir / "eval" / "vision_reliance.json").read_text())
    assert all(r.reliance == probed["reliance"] for r in records) and isinstance(probed["reliance"], float)
    assert (cell.run_dir / "logs" / "vision_reliance.log").read_text().count("vision_reliance.json: reliance") == 1  # not again
    # a summary that answers another question (here: another checkpoint's step) is evaluated again, not kept
    stale = cell.summary("brightness1")
    summary = json.loads(stale.read_text())
    stale.write_text(json.dumps({**summary, "identity": {**summary["identity"], "checkpoint_step": 1}}))
    run(study, tiny_budget, results, log=print)
    assert "3 evaluations, 1 cached, 2 to run" in capsys.readouterr().out
    assert json.loads(stale.read_text())["identity"] == summary["identity"] and load(results, "tiny")[0].evaluation == records[0].evaluation
    # the same evaluations, recorded from the run directory as a plain run's are
    assert studies_main(["add", "plain", str(cell.run_dir), "--recipe", "none", "--results", str(results)]) == []
    assert [replace(r, commit="") for r in load(results, "plain")] == [replace(r, commit="") for r in records]
    # only the evaluations a study is about (a run evaluated for several studies)
    assert studies_main(["add", "clean_only", str(cell.run_dir), "--evals", "clean", "--recipe", "none", "--results", str(results)]) == []
    assert [r.condition for r in load(results, "clean_only")] == [{}]
    with pytest.raises(SystemExit):
        studies_main(["add", "clean_only", str(cell.run_dir), "--evals", "clean,contrast2", "--results", str(results)])
    assert "eval/contrast2: no summary.json" in capsys.readouterr().err and len(load(results, "clean_only")) == 1
    # a study of the catalog takes runs of its task and policy only: this PushT BC run is refused in one line
    with pytest.raises(SystemExit):
        studies_main(["add", "can", str(cell.run_dir), "--results", str(results)])
    assert capsys.readouterr().err == (f"python -m studies: error: {cell.run_dir} is a pusht bc run, but study can holds can bc "
                                       "runs: add it to a study of its task and policy, or to a name of your own\n")
    assert not (results / "can").exists()


def test_a_cell_that_another_process_trains_is_left_to_it(tmp_path, tiny_budget):
    """A second runner (or a user's own train_policy.py) holds the cell's lock: its config.json stays, nothing
    is trained or evaluated twice, and the runner names the PID instead of reporting a failure."""
    import fcntl

    study = Study("tiny", ("pusht",), ("bc",), (FULL,), (CLEAN,))
    cell = study.cells(tiny_budget, tmp_path)[0]
    cell.run_dir.mkdir(parents=True)
    (cell.run_dir / "config.json").write_text("{}")  # the other training's, written before its first checkpoint
    lines = []
    with open(cell.run_dir / ".lock", "a+") as lock:  # as core.rundir's RunDirectory holds it
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.write("4242")
        lock.flush()
        assert run(study, tiny_budget, tmp_path, log=lines.append) == []
        assert cell.progress(2) == "being trained by PID 4242"  # what `show` says of it
    assert cell.progress(2) == "no checkpoint: trains from the start"
    assert (cell.run_dir / "config.json").read_text() == "{}" and not (cell.run_dir / "checkpoints").exists()
    assert f"tiny: {cell.run_dir.name} is being trained by PID 4242; rerun when it finishes" in "\n".join(lines)


def test_an_interrupted_cell_resumes_from_its_checkpoint_and_show_says_where_each_stands(tmp_path, tiny_budget, capsys):
    budget = replace(tiny_budget, train_overrides={**tiny_budget.train_overrides, "train.steps": "4"})
    study = Study("tiny", ("pusht",), ("bc",), (FULL,), (CLEAN,))
    cell = study.cells(budget, tmp_path)[0]
    assert cell.progress(4) == "no run directory"
    stopped = ["train.steps=2" if o == "train.steps=4" else o for o in cell.train_command()]  # stops at its step-2 checkpoint
    import subprocess

    from studies.study import REPO

    subprocess.run(stopped, cwd=REPO, check=True, capture_output=True)
    assert cell.trained_step() == 2 and cell.train_command()[-1] == "resume=true"
    assert cell.progress(4) == "resumes from step 2 of 4"
    assert run(study, budget, tmp_path, log=print) == [] and cell.trained_step() == 4
    assert "resumed" in (cell.run_dir / "logs" / "train.log").read_text()
    summary = json.loads((cell.run_dir / "eval" / "clean" / "summary.json").read_text())
    capsys.readouterr()
    show(study, budget, tmp_path)  # each command with where it stands, then what is left
    train, clean, total = capsys.readouterr().out.splitlines()
    assert train.endswith("resume=true  # trained, 4 steps") and clean.endswith(f"  # clean: {summary['successes']}/1 done")
    assert total == "# tiny: 1 of 1 cells trained, 1 of 1 evaluations done"
    cell.run_dir.rename(tmp_path / "elsewhere")  # its records stay: show finds them from the composed config
    show(study, budget, tmp_path)
    assert capsys.readouterr().out.splitlines()[0].endswith("  # no run directory, 1 record of it kept (run trains it again)")


@pytest.mark.parametrize("engine", ["joblib", "local"])
def test_each_engine_runs_every_command_and_reports_each_failure(tmp_path, engine):
    import sys

    from studies.study import launch

    ok, bad = [sys.executable, "-c", "print('ran')"], [sys.executable, "-c", "raise SystemExit(3)"]
    jobs = [("first", ok, tmp_path / "first.log"), ("bad", bad, tmp_path / "bad.log"), ("last", ok, tmp_path / "last.log")]
    failed = launch(jobs, engine, 2, {"timeout_min": 5}, tmp_path / "submitit")
    assert list(failed) == ["bad"]
    if engine == "joblib":  # our logs; submitit keeps its own under the folder it is given
        assert (tmp_path / "first.log").read_text() == (tmp_path / "last.log").read_text() == "ran\n"
        assert "exit status 3" in failed["bad"]
    else:
        assert "submitit log" in failed["bad"] and (tmp_path / "submitit").is_dir()


@pytest.mark.parametrize("task, setting, message", [
    ("nosuchtask", CLEAN, "task=nosuchtask"),
    ("pusht", Setting("bright", "bright", {"corruption": [["brightness", 7]]}), "brightness:7"),
])
def test_a_study_with_a_mistake_stops_before_anything_runs(tmp_path, tiny_budget, task, setting, message):
    study = Study("tiny", (task,), ("bc",), (FULL,), (setting,))
    with pytest.raises(ValueError, match="study tiny: .* does not compose") as err:
        run(study, tiny_budget, tmp_path / "results")
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "results").exists()


def test_every_study_of_the_catalog_composes_and_names_its_cells_as_before(tmp_path):
    budget = replace(BUDGETS["cpu"], seeds=(0,))
    for study in STUDIES.values():
        cells = study.cells(budget, tmp_path)
        assert all(cfg.train.steps > 0 for cfg in check(study, budget, cells)[0])
        assert len({c.run_dir for c in cells}) == len(cells)
    # earlier studies named the directory by its label; it is found by the hash of the same overrides
    cell = Cell("lift", "bc", ARMS["fibottention:windows=robot"], 0, "cpu", results=tmp_path)
    old = tmp_path / "cells" / f"lift_bc_fibottentionwindows-robot_s0_{cell.run_dir.name.rsplit('_', 1)[1]}"
    old.mkdir(parents=True)
    # the names of cells trained before recipe=cpu jittered images (the papers' setting is not hashed)
    assert Cell("lift", "bc", FULL, 0, "cpu", results=tmp_path).run_dir.name == "lift_bc_full_s0_f05f5012ea"
    assert Cell("can", "bc", FULL, 0, "cpu", results=tmp_path).run_dir.name == "can_bc_full_s0_351c598c92"
    # the ResNet-18 baseline is named by its encoder, not by the attention it nominally keeps
    resnet = Cell("lift", "bc", STUDIES["encoders"].arms[0], 0, "cpu", results=tmp_path)
    assert resnet.run_dir.name.startswith("lift_bc_resnet18_s0_") and "policy.encoder=resnet18" in resnet.args
    assert cell.run_dir == old and cell.args[:7] == ["task=lift", "policy=bc", "attention=fibottention", "recipe=cpu",
                                                          "seed=0", "eval.num_episodes=0", "attention.windows=robot"]


def test_each_settings_command_line_evaluates_the_condition_its_records_name():
    """A setting is written once (its condition, in the records' form); the rollout options it writes compose into
    exactly that condition, so a study's evaluations are found again by the claim rows that name the setting."""
    from core.config import compose
    from core.inference import ATTENTION_OPTIONS
    from studies.catalog import SETTINGS

    assert len(SETTINGS) == 19  # clean, 3 scene kinds x 3 severities, 4 pixel corruptions, 4 image sizes, diversity
    for setting in [*SETTINGS.values(), Setting("two", "two", {"corruption": [["brightness", 1], ["lighting", 2]]})]:  # a list of two
        cfg = compose("rollout", ["checkpoint=C", *(f"{k}={v}" for k, v in setting.options(BUDGETS["cpu"], 200).items())])
        attention = {k: getattr(cfg, k) for k in ATTENTION_OPTIONS if getattr(cfg, k) is not None}
        named = {**({"corruption": [list(c) for c in cfg.corruption]} if cfg.corruption else {}),
                 **({"image_size": cfg.image_size} if cfg.image_size else {}), **({"attention": attention} if attention else {})}
        assert named == setting.condition, setting.id
        assert (cfg.num_episodes, cfg.max_steps) == ((30, 200) if setting.condition else (50, None)), setting.id


def test_show_prints_the_two_commands_of_every_cell(tmp_path, capsys):
    studies_main(["show", "robustness", "--seeds", "1", "--results", str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("python train_policy.py task=lift policy=bc attention=full recipe=cpu seed=1 eval.num_episodes=0 "
                               "policy.image_aug.brightness=0.0 policy.image_aug.contrast=0.0 run_dir=")  # the papers' setting
    assert lines[0].endswith("  # no run directory") and len(lines) == 6 * (1 + 6) + 1
    assert lines[2].endswith("num_episodes=30 workers=2 max_steps=200 corruption=brightness:1 num_threads=1  # brightness1: to run")
    assert lines[6].endswith("max_steps=200 corruption=camera:2 num_threads=1  # camera2: to run")  # rendered by the simulator
    assert lines[-1] == "# robustness: 0 of 6 cells trained, 0 of 36 evaluations done"
    with pytest.raises(SystemExit):
        studies_main(["run", "robustnes"])
    assert "unknown study 'robustnes'" in capsys.readouterr().err


def test_a_part_of_a_study_is_its_own_cells_and_settings_and_a_wrong_name_is_one_line(tmp_path, capsys):
    whole = {c.run_dir: c for c in STUDIES["scene_training"].cells(BUDGETS["cpu"], tmp_path)}
    studies_main(["show", "scene_training", "--arms", "fibottention", "--variants", "1", "--seeds", "2",
                  "--settings", "clean,camera2", "--workers", "1", "--results", str(tmp_path)])
    train, clean, camera, _ = capsys.readouterr().out.splitlines()
    run_dir = train.split("  # ")[0].rsplit("run_dir=", 1)[1]
    # the one cell of the whole study with that arm, variant (the random shift) and seed, in the same directory
    assert whole[Path(run_dir)].arm.id == "fibottention" and "policy.image_aug.shift=4 " in train and "seed=2 " in train
    assert clean.endswith("num_episodes=50 workers=1 num_threads=1  # clean: to run")
    assert camera.endswith("workers=1 max_steps=200 corruption=camera:2 num_threads=1  # camera2: to run")
    part = STUDIES["robustness"].select(arms=["fibottention:windows=robot", "full"], settings=["lighting2"])
    assert [a.id for a in part.arms] == ["full", "fibottention:windows=robot"] and [s.id for s in part.settings] == ["lighting2"]
    for argv, message in [(["--arms", "fib"], "study robustness has no arm fib: choose from full, fibottention, lookhere, "),
                          (["--variants", "1"], "study robustness has no variant 1: choose from 0"),
                          (["--settings", "camera3"], "study robustness has no setting camera3: choose from clean, brightness1,")]:
        with pytest.raises(SystemExit):
            studies_main(["run", "robustness", *argv, "--results", str(tmp_path)])
        err = capsys.readouterr().err
        assert err.startswith(f"python -m studies: error: {message}") and err.count("\n") == 1
    assert not (tmp_path / "cells").exists()  # refused before anything ran


def test_show_into_a_reader_that_stops_early_ends_quietly(tmp_path):
    import subprocess
    import sys

    from tests.helpers import REPO

    # `python -m studies show robustness | head -0`: the reader is gone before the first line is written
    proc = subprocess.Popen([sys.executable, "-m", "studies", "show", "robustness", "--results", str(tmp_path)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    assert proc.wait(timeout=60) == 1 and proc.stderr.read() == ""


@pytest.mark.parametrize("task, policy, attention", [("lift", "bc", "fibottention"), ("can", "bc", "full"), ("pusht", "diffusion", "lookhere")])
def test_a_study_cell_trains_exactly_what_the_recipe_command_trains(task, policy, attention, tmp_path):
    """`python train_policy.py task=T policy=P attention=A recipe=cpu` in the papers' setting (no photometric
    augmentation) == the study's cell, and records no extra overrides; the recipe's own augmentation is one."""
    from core.config import compose, to_dict
    from studies.records import PAPERS_SETTING, extra_overrides

    cell = Cell(task, policy, Arm(attention, attention, {"attention": attention}), 0, "cpu", results=tmp_path)
    command = [f"task={task}", f"policy={policy}", f"attention={attention}", "recipe=cpu", "eval.num_episodes=0"]
    user = to_dict(compose("config", [*command, *(f"{k}={v}" for k, v in PAPERS_SETTING.items())]))
    assert to_dict(compose("config", cell.args)) == user and extra_overrides(user, "cpu") == {}
    # the recipe's own jitter, which PushT's recipe turns off (it cost 19 points clean there)
    assert extra_overrides(to_dict(compose("config", command)), "cpu") == ({} if task == "pusht" else VARIANTS["augment"].overrides)
    # cells trained before recipe=cpu jittered images keep their directories: the papers' setting is not hashed
    assert Cell(task, policy, cell.arm, 0, "cpu", {"policy.image_aug.brightness": "0.3"}).args[-2:] == [
        "policy.image_aug.brightness=0.3", "policy.image_aug.contrast=0.0"]
    changed = to_dict(compose("config", [*cell.args, "attention.windows=robot"]))
    if attention == "fibottention":
        assert extra_overrides(changed, "cpu") == {"attention.windows": "robot"}


def test_an_older_runs_config_records_only_what_it_overrode():
    """A run trained before settings were added or moved (GMM fields flat in the policy, no image_aug,
    the dataset format named) records its real overrides only; a camera it dropped is still one."""
    from core.config import compose, to_dict
    from studies.records import extra_overrides

    old = to_dict(compose("config", ["task=lift", "policy=bc", "attention=full", "recipe=cpu", "policy.gmm.num_modes=3",
                                     "policy.image_aug.contrast=0.5", "~task.input_shapes.agentview_image"]))
    old["policy"].update(old["policy"].pop("gmm"))  # the flat layout of older checkpoints
    del old["policy"]["image_aug"]["brightness"], old["policy"]["drop_crop_remainder"]
    old["task"]["dataset"]["format"] = "robomimic_hdf5"
    assert list(extra_overrides(old, "cpu").items()) == [("policy.image_aug.contrast", "0.5"), ("policy.gmm.num_modes", "3"),
                                                         ("~task.input_shapes.agentview_image", None)]


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_corruption_severity_zero_is_identity_and_higher_changes_more(kind):
    img = np.random.default_rng(0).integers(0, 256, (20, 24, 3)).astype(np.uint8)
    assert np.array_equal(corrupt(img, kind, 0), img)
    diffs = [np.abs(corrupt(img, kind, s, np.random.default_rng(1)).astype(int) - img).mean() for s in (1, 2, 3)]
    assert 0 < diffs[0] < diffs[1] < diffs[2]
    assert corrupt(img, kind, 2).dtype == np.uint8 and corrupt(img, kind, 2).shape == img.shape


def test_the_cpu_recipes_hold_what_the_studies_measured():
    from core.config import compose

    lift_fib = compose("config", ["task=lift", "policy=bc", "attention=fibottention", "recipe=cpu"])
    assert list(lift_fib.policy.input_shapes) == ["agentview_image", "robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos"]
    assert (lift_fib.task.crop_size, lift_fib.train.steps, lift_fib.policy.n_image_obs_steps, lift_fib.train.num_threads) == (84, 4000, 1, 1)
    assert (lift_fib.policy.image_aug.brightness, lift_fib.policy.image_aug.contrast) == (0.3, 0.5)  # preset/photometric_aug
    lift_lh = compose("config", ["task=lift", "policy=bc", "attention=lookhere", "recipe=cpu"])
    assert "robot0_eye_in_hand_image" in lift_lh.policy.input_shapes
    assert (lift_lh.policy.vit.patch_size, lift_lh.policy.vit.pool) == (12, "spatial_softmax")
    assert lift_lh.policy.vit.attention.rotate_directions and lift_lh.policy.vit.attention.global_slope == 0.25
    pusht = compose("config", ["task=pusht", "policy=diffusion", "attention=full", "recipe=cpu"])
    assert (pusht.policy.prediction_type, pusht.policy.down_dims, pusht.train.steps) == ("sample", [32, 64, 128], 15000)
    assert pusht.task.dataset.path == "data/pusht/demos1000.zarr"
    assert (pusht.policy.image_aug.brightness, pusht.policy.image_aug.contrast) == (0.0, 0.0)  # no jitter on PushT
    can = compose("config", ["task=can", "policy=bc", "attention=full", "recipe=cpu"])
    assert (can.policy.image_aug.brightness, can.policy.image_aug.contrast) == (0.3, 0.5)
    bare = compose("config", ["task=lift", "policy=bc", "attention=full", "recipe=none"])
    assert (bare.task.crop_size, bare.train.steps, len(bare.policy.input_shapes)) == (76, 20000, 5)


def test_ctrl_c_in_a_study_is_one_line_and_keeps_what_finished(monkeypatch, capsys):
    import studies.study

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # what joblib / submitit raise in the parent on Ctrl-C

    monkeypatch.setattr(studies.study, "run", interrupted)
    with pytest.raises(SystemExit) as exit_:
        studies_main(["run", "main", "--budget", "tiny"])
    assert exit_.value.code == 130
    assert capsys.readouterr().err.strip() == ("python -m studies: interrupted; what finished is kept and recorded, an "
                                               "interrupted training resumes from its checkpoint: rerun the same command to continue")
