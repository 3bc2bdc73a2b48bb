"""A result counts only if it answers the question asked; run directories are input from elsewhere; the newest
commands check their input; an error after work names the file and leaves nothing half-written."""
import errno
import hashlib
import json
import re
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from core import evaluation
from core.cli import _message, is_write_error
from core.config import compose
from core.eval_folders import check_eval_dir
from core.eval_identity import EVAL_VERSION, NotComparable, check_done
from core.rundir import RunDirectory, RunPathError, run_path
from core.training import train
from studies import suite
from studies.records import Record, load, records_of_run, run_config, save
from tests.helpers import tiny_train_cfg

RUN = dict(num_episodes=2, max_steps=2, num_videos=0, progress=False)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_pusht_zarr):
    """Two tiny PushT runs of different seeds: the same task and settings, other weights."""
    out = {}
    for seed in (0, 1):
        tmp = tmp_path_factory.mktemp(f"identity{seed}")
        out[seed] = train(tiny_train_cfg(tmp, tiny_pusht_zarr, attention="full", extra=[f"seed={seed}"])).checkpoint.parents[1]
    return out


def _copy(run: Path, tmp_path: Path, name: str = "run") -> Path:
    return Path(shutil.copytree(run, tmp_path / name, symlinks=True))


def _summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


# --- 1. every summary records what it answers, and whatever reuses one compares it -------------------------
def test_a_summary_records_its_checkpoint_step_weights_task_shifts_cap_and_seeds(runs, tmp_path):
    ckpt = runs[0] / "checkpoints" / "last"
    s = evaluation.evaluate_checkpoint(runs[0], out_dir=tmp_path / "e", corruption="colour:1", seed=100003, **RUN)
    ident = _summary(tmp_path / "e")["identity"]
    assert ident == s["identity"]
    assert ident["weights_sha256"] == hashlib.sha256((ckpt / "model.safetensors").read_bytes()).hexdigest()
    assert (ident["checkpoint_step"], ident["task"], ident["policy"], ident["encoder"]) == (2, "pusht", "diffusion", "vit")
    assert (ident["shifts"], ident["max_steps"], ident["seeds"], ident["eval_version"]) == ([["colour", 1]], 2, [100003, 100004],
                                                                                         EVAL_VERSION)
    # no cap given: the task's own horizon is what the episodes ran under, and what is recorded
    meta = evaluation.read_checkpoint_meta(ckpt)
    wanted = evaluation.wanted_identity(ckpt, meta, evaluation.InferenceOverrides(image_size=64), seed=100000,
                                        num_episodes=3, max_steps=None)
    assert wanted["max_steps"] == meta["cfg"]["task"]["env"]["max_episode_steps"] and wanted["inference"] == {"image_size": 64}


def test_a_clean_run_of_other_weights_or_another_cap_is_not_paired_and_the_shifted_run_keeps_its_numbers(runs, tmp_path):
    ev = tmp_path / "ev"
    evaluation.evaluate_checkpoint(runs[1], out_dir=ev / "clean", **RUN)  # another run's clean evaluation
    s = evaluation.evaluate_checkpoint(runs[0], out_dir=ev / "colour1", corruption="colour:1", clean_dir=ev / "clean", **RUN)
    assert "paired" not in s and s["unpaired"].startswith(f"{ev / 'clean' / 'summary.json'} is not this evaluation's clean run")
    assert "weights (sha256)" in s["unpaired"] and s["num_episodes"] == 2 and "\n" not in s["unpaired"]
    assert _summary(ev / "colour1")["unpaired"] == s["unpaired"]
    evaluation.evaluate_checkpoint(runs[0], out_dir=ev / "clean3", max_steps=3, num_episodes=2, num_videos=0, progress=False)
    s = evaluation.evaluate_checkpoint(runs[0], out_dir=ev / "b", corruption="brightness:1", clean_dir=ev / "clean3", **RUN)
    assert "max_steps 3 (asked: 2)" in s["unpaired"]
    evaluation.evaluate_checkpoint(runs[0], out_dir=ev / "clean1", num_episodes=1, max_steps=2, num_videos=0, progress=False)
    s = evaluation.evaluate_checkpoint(runs[0], out_dir=ev / "c", corruption="brightness:1", clean_dir=ev / "clean1", **RUN)
    assert "1 of the shifted run's seeds are missing (e.g. 100001)" in s["unpaired"]
    # the same weights, cap and seeds pair, episode by episode
    evaluation.evaluate_checkpoint(runs[0], out_dir=ev / "clean0", **RUN)
    s = evaluation.evaluate_checkpoint(runs[0], out_dir=ev / "d", corruption="brightness:1", clean_dir=ev / "clean0", **RUN)
    assert s["paired"]["episodes"] == 2 and "unpaired" not in s


def test_rollout_names_a_clean_run_it_does_not_pair_with_in_one_line(runs, tmp_path, capsys):
    ev = tmp_path / "ev"
    evaluation.evaluate_checkpoint(runs[1], out_dir=ev / "clean", **RUN)
    evaluation.run(compose("rollout", [f"checkpoint={runs[0]}", f"out_dir={ev / 'colour1'}", "corruption=colour:1",
                                       "num_episodes=2", "max_steps=2", "num_videos=0", "device=cpu"]))
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("not paired")]
    assert len(err) == 1 and err[0].endswith("this run's own numbers stand") and "weights (sha256)" in err[0]


@pytest.mark.parametrize("damage, reason", [
    (lambda s: {**s, "episodes": [], "num_episodes": 0}, "holds 0 of 2 episodes"),
    (lambda s: {**s, "episodes": s["episodes"][:1], "num_episodes": 1}, "holds 1 of 2 episodes"),
    (lambda s: {k: v for k, v in s.items() if k != "identity"}, "predates the evaluation identity"),
    (lambda s: {**s, "identity": {**s["identity"], "checkpoint_step": 1}}, r"checkpoint step 1 \(asked: 2\)"),
    (lambda s: {**s, "identity": {**s["identity"], "eval_version": EVAL_VERSION - 1}}, "evaluation code version"),
])
def test_only_a_finished_evaluation_of_this_checkpoint_counts_as_done(runs, tmp_path, damage, reason):
    s = evaluation.evaluate_checkpoint(runs[0], out_dir=tmp_path / "e", **RUN)
    check_done(tmp_path / "e" / "summary.json", s["identity"])  # the evaluation itself is done
    (tmp_path / "e" / "summary.json").write_text(json.dumps(damage(s)))
    with pytest.raises(NotComparable, match=reason):
        check_done(tmp_path / "e" / "summary.json", s["identity"])


def test_the_suite_evaluates_again_what_is_empty_or_of_an_older_step_and_keeps_what_answers(runs, tmp_path):
    run = _copy(runs[0], tmp_path)
    seen = []
    options = suite.SuiteOptions(workers=0, episodes=1, clean_episodes=1, max_steps=2)
    folder = suite.evaluate_suite(run, "tiny", options, log=seen.append, progress=False)
    clean = folder / "clean" / "summary.json"
    s = json.loads(clean.read_text())
    clean.write_text(json.dumps({**s, "episodes": [], "num_episodes": 0}))  # a suite once run with --episodes 0
    colour = folder / "colour1" / "summary.json"
    c = json.loads(colour.read_text())
    colour.write_text(json.dumps({**c, "identity": {**c["identity"], "checkpoint_step": 1}}))  # before a resume
    seen.clear()
    suite.evaluate_suite(run, "tiny", options, log=seen.append, progress=False)
    assert seen[0].startswith("clean: 1 episodes, evaluated again: ") and "holds 0 of 1 episodes" in seen[0]
    assert seen[1].startswith("colour1: 1 episodes, evaluated again: ") and "checkpoint step 1 (asked: 2)" in seen[1]
    assert seen[2] == "brightness1: evaluated already, kept"
    assert json.loads(clean.read_text())["num_episodes"] == 1 and json.loads(colour.read_text())["paired"]["episodes"] == 1


# --- records take what was evaluated from the evaluation ----------------------------------------------------
def test_records_take_the_step_and_cap_from_the_summary_never_from_config_json(runs, tmp_path):
    run = _copy(runs[0], tmp_path)
    evaluation.evaluate_checkpoint(run, out_dir=run / "eval" / "clean", **RUN)
    cfg = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**cfg, "train": {**cfg["train"], "steps": 99}}))  # resumed to 99 since
    [record] = records_of_run(run, "none")
    assert (record.steps, record.max_steps, len(record.evaluation)) == (2, 2, 16)
    save(tmp_path / "res", "s", [record])
    assert load(tmp_path / "res", "s") == [record]


@pytest.mark.parametrize("edit, message", [
    (lambda s: {k: v for k, v in s.items() if k != "identity"}, "predates the evaluation identity"),
    (lambda s: {**s, "identity": {**s["identity"], "task": "lift"}}, "evaluates a lift diffusion checkpoint at step 2, not one"),
    (lambda s: {**s, "episodes": [], "num_episodes": 0}, "holds 0 of 2 episodes"),
])
def test_studies_add_refuses_an_evaluation_that_does_not_answer_for_the_run_in_one_line(runs, tmp_path, edit, message):
    run = _copy(runs[0], tmp_path)
    s = evaluation.evaluate_checkpoint(run, out_dir=run / "eval" / "clean", **RUN)
    (run / "eval" / "clean" / "summary.json").write_text(json.dumps(edit(s)))
    with pytest.raises(ValueError, match=message) as err:
        records_of_run(run, "none")
    assert str(run / "eval" / "clean" / "summary.json") in str(err.value) and "\n" not in str(err.value)


def _record(**kw):
    return {**dict(task="pusht", policy="bc", attention="full", steps=2, overrides={}, seed=0, condition={}, successes=1,
                   episodes=2), **kw}


@pytest.mark.parametrize("lines, message", [
    ([_record(), _record(successes=2)], "lines 1 and 2 record the same training under the same condition twice"),
    ([_record(evaluation="ab" * 8), _record(seed=1, evaluation="ab" * 8)], "lines 1 and 2 record the same evaluation twice"),
    ([_record(), _record(seed=1), _record(seed=2, successes=45, episodes=30)], "line 3 is not a record \\(45 successes of 30"),
    ([_record(episodes=-1, successes=0)], "line 1 is not a record \\(episodes -1 is not a count"),
])
def test_a_record_set_that_counts_twice_or_more_than_it_ran_is_refused_naming_the_lines(tmp_path, lines, message):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "records.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(ValueError, match=message) as err:
        load(tmp_path, "s")
    assert str(tmp_path / "s" / "records.jsonl") in str(err.value)


@pytest.mark.parametrize("text, message", [("{not json", "is not JSON"),
                                           (json.dumps({"task": {"name": "pusht"}, "seed": 0}), "lacks policy, attention, train"),
                                           ("[1, 2]", "lacks task, policy")])
def test_a_damaged_run_config_is_named_in_one_line(runs, tmp_path, text, message):
    run = _copy(runs[0], tmp_path)
    (run / "config.json").write_text(text)
    with pytest.raises(ValueError, match=message) as err:
        run_config(run)
    assert str(err.value).startswith(str(run / "config.json"))


# --- 2. a run directory is input from elsewhere ------------------------------------------------------------
@pytest.mark.parametrize("parts, message", [(("..", "x"), "leads outside run"), (("eval", "/etc"), "leads outside run")])
def test_a_path_that_leaves_a_run_is_refused(tmp_path, parts, message):
    with pytest.raises(RunPathError, match=message):
        run_path(tmp_path, *parts)


@pytest.mark.parametrize("name", [".lock", "config.json", "tb", "eval"])
def test_a_resume_refuses_a_run_whose_own_files_are_links_and_writes_nothing_there(runs, tmp_path, name):
    run = _copy(runs[0], tmp_path)
    elsewhere = tmp_path / "elsewhere"
    target = run / name
    if target.is_dir():
        shutil.move(target, elsewhere)
    else:
        elsewhere.write_text(target.read_text() if target.exists() else "precious\n")
        target.unlink(missing_ok=True)
    target.symlink_to(elsewhere)
    before = sorted(p.name for p in elsewhere.iterdir()) if elsewhere.is_dir() else elsewhere.read_text()
    with pytest.raises(RunPathError, match=f"{target} is a symbolic link .* never follows a link inside a run"):
        RunDirectory(run).claim(resume=True, overwrite=False)
    assert (sorted(p.name for p in elsewhere.iterdir()) if elsewhere.is_dir() else elsewhere.read_text()) == before


def test_no_evaluation_output_goes_inside_a_checkpoint_folder(runs, tmp_path):
    run = _copy(runs[0], tmp_path)
    last = run / "checkpoints" / "last"
    assert suite.suite_folder(last, "tiny") == run / "eval" / "suite_tiny"  # a checkpoint folder as the suite's input
    for out in (last / "eval", run / "checkpoints" / "mine"):
        with pytest.raises(ValueError, match=f"out_dir={out} is inside the checkpoint folder"):
            check_eval_dir(out, last)
    (run / "eval").mkdir()
    (run / "eval" / "linked").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(RunPathError, match="is a symbolic link"):
        check_eval_dir(run / "eval" / "linked" / "x", last)


# --- 3. the newest commands check their input before any work ----------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--episodes", "0"], "argument --episodes: '0' is not an integer of at least 1"),
    (["--max-steps", "0"], "argument --max-steps: '0' is not an integer of at least 1"),
    (["--clean-episodes", "-2"], "argument --clean-episodes: '-2' is not an integer of at least 1"),
    (["--clean-episodes", "5", "--episodes", "9"], "--clean-episodes 5 is fewer than --episodes 9"),
])
def test_the_suite_refuses_a_bad_count_in_one_line_before_anything_loads(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.setattr(suite, "evaluate_suite", lambda *a, **k: pytest.fail("the suite started"))
    with pytest.raises(SystemExit) as exit_:
        suite.main([str(tmp_path), *argv])
    text = capsys.readouterr().err or str(exit_.value.code)  # argparse prints its line; sys.exit carries ours
    assert text.startswith("python -m studies.suite: error: ") and message in text and text.strip().count("\n") == 0


@pytest.mark.parametrize("argv, message", [(["--frames", "0"], "'0' is not an integer of at least 1"),
                                           (["--frames", "x"], "'x' is not an integer of at least 1")])
def test_a_probe_refuses_a_bad_option_in_one_line(runs, capsys, argv, message):
    from probes.feature_shift import main

    with pytest.raises(SystemExit):
        main([str(runs[0]), *argv])
    err = capsys.readouterr().err
    assert err.startswith("python -m probes.feature_shift: error: argument --frames: ") and message in err and err.count("\n") == 1


@pytest.mark.parametrize("extra", [{}, {"scene_randomization_max": 2}])
def test_scene_randomization_max_without_kinds_is_refused(extra):
    from datasets.generate import GenerateConfig

    kwargs = {"scene_randomization_max": 3, **extra}
    with pytest.raises(ValueError, match=f"scene_randomization_max={kwargs['scene_randomization_max']} without "
                                         "scene_randomization= changes nothing"):
        GenerateConfig(task="lift", **kwargs)
    assert GenerateConfig(task="lift", scene_randomization="all", **kwargs).randomization("lift") is not None


@pytest.mark.parametrize("encoder, attention, shown", [("resnet18", None, "pusht bc/resnet18:"), ("vit", "full", "pusht bc/full:")])
def test_a_resnet_evaluation_is_named_by_its_encoder(encoder, attention, shown):
    s = dict(task="pusht", policy="bc", encoder=encoder, attention=attention, successes=0, num_episodes=1, success_rate=0.0,
             success_rate_ci95=[0.0, 0.8], mean_max_reward=0.0, mean_episode_length=2.0, seconds_per_episode=1.0, errors=0)
    assert evaluation.format_summary(s).startswith(shown)
    assert evaluation.encoder_of({"encoder": encoder}) == encoder and evaluation.encoder_of({}) == "vit"


# --- 4. an error after the work names the file and leaves nothing half-written ------------------------------
@pytest.mark.parametrize("text", ['{"episodes": [', "[]"])
def test_a_damaged_clean_summary_is_named_and_the_shifted_run_is_written_unpaired(runs, tmp_path, text):
    (tmp_path / "clean").mkdir()
    (tmp_path / "clean" / "summary.json").write_text(text)
    s = evaluation.evaluate_checkpoint(runs[0], out_dir=tmp_path / "b1", corruption="brightness:1",
                                       clean_dir=tmp_path / "clean", **RUN)
    assert s["unpaired"].startswith(f"{tmp_path / 'clean' / 'summary.json'} is not a") and _summary(tmp_path / "b1")["num_episodes"] == 2


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_while_the_summary_is_written_leaves_the_earlier_evaluation_whole(runs, tmp_path, monkeypatch, capsys, code):
    out = tmp_path / "e"
    evaluation.evaluate_checkpoint(runs[0], out_dir=out, num_episodes=2, max_steps=2, num_videos=2, progress=False)
    before = (out / "summary.json").read_text(), sorted(p.name for p in (out / "videos").iterdir())

    def full(path, text):
        raise OSError(code, "No space left on device")

    monkeypatch.setattr(evaluation, "replace_file", full)
    cfg = compose("rollout", [f"checkpoint={runs[0]}", f"out_dir={out}", "num_episodes=2", "max_steps=3", "num_videos=1",
                              "device=cpu", "overwrite=true"])
    with pytest.raises(OSError) as err:
        evaluation.run(cfg)
    assert is_write_error(err.value)  # what the entry points print as their one line, not a traceback
    assert _message(err.value).startswith(f"cannot write {out / 'summary.json'}: No space left on device; free space")
    assert ((out / "summary.json").read_text(), sorted(p.name for p in (out / "videos").iterdir())) == before
    assert sorted(p.name for p in out.iterdir()) == ["summary.json", "videos"]  # no temporary folder or file left


def test_a_video_cut_short_by_a_full_disk_is_removed_and_named(tmp_path, monkeypatch):
    import imageio.v2 as imageio

    def full(path, frames, **kw):
        Path(path).write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(imageio, "mimsave", full)
    path = tmp_path / "v" / "episode_1.mp4"
    with pytest.raises(OSError, match=f"cannot write the video {path}: No space left on device"):
        evaluation._write_video(path, [np.zeros((8, 8, 3), np.uint8)], 10)
    assert not path.exists()


@pytest.mark.parametrize("length", [256, 400])
def test_a_folder_name_the_filesystem_cannot_take_is_refused_before_work(runs, tmp_path, length):
    with pytest.raises(ValueError, match=f"out_dir= has a folder name of {length} bytes .* give a shorter out_dir="):
        check_eval_dir(tmp_path / ("x" * length), runs[0] / "checkpoints" / "last")


def test_overwrite_leaves_no_video_of_the_earlier_evaluation(runs, tmp_path):
    out = tmp_path / "e"
    evaluation.evaluate_checkpoint(runs[0], out_dir=out, num_episodes=3, max_steps=2, num_videos=3, progress=False)
    (out / "videos" / "notes.txt").write_text("mine")  # a file the package did not write stays
    evaluation.evaluate_checkpoint(runs[0], out_dir=out, num_episodes=2, max_steps=2, num_videos=1, progress=False,
                                   overwrite=True)
    assert sorted(p.name for p in (out / "videos").iterdir()) == ["episode_100000.mp4", "notes.txt"]
    assert sorted(p.name for p in out.iterdir()) == ["summary.json", "videos"]


# --- 5. a degenerate policy is named, never scored -------------------------------------------------------------
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_or_inf_weights_end_the_evaluation_naming_the_checkpoint(runs, tmp_path, monkeypatch, value):
    from safetensors.torch import load_file, save_file

    run = _copy(runs[0], tmp_path)
    path = run / "checkpoints" / "last" / "model.safetensors"
    tensors = load_file(path)
    name = next(k for k, v in tensors.items() if v.is_floating_point() and v.numel() > 1 and "normalize" not in k)
    tensors[name].view(-1)[0] = value
    save_file(tensors, path)
    monkeypatch.setattr(evaluation, "load_policy", lambda *a, **k: pytest.fail("the policy loaded"))
    with pytest.raises(FloatingPointError, match=f"checkpoint {run / 'checkpoints' / 'last'} holds NaN or Inf weights \\({name}\\)"):
        evaluation.evaluate_checkpoint(run, out_dir=tmp_path / "e", **RUN)
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("value", [float("nan"), float("-inf")])
def test_a_nan_or_inf_action_ends_the_evaluation_unscored(runs, tmp_path, monkeypatch, value):
    load = evaluation.load_policy

    def degenerate(*a, **k):
        policy = load(*a, **k)
        act = policy.select_action
        policy.select_action = lambda obs, envs: torch.full_like(act(obs, envs), value)
        return policy

    monkeypatch.setattr(evaluation, "load_policy", degenerate)
    with pytest.raises(FloatingPointError, match=f"checkpoint {runs[0] / 'checkpoints' / 'last'}: the policy's action is NaN "
                                                 f"or Inf \\(episode seed 10000[01], step 0\\); the evaluation is not scored"):
        evaluation.evaluate_checkpoint(runs[0], out_dir=tmp_path / "e", num_episodes=2, max_steps=2, num_videos=1, progress=False)
    assert not (tmp_path / "e" / "summary.json").exists() and not list((tmp_path / "e").glob(".videos*"))


# --- 6. data: an empty episode, a LeRobot path that climbs -------------------------------------------------
@pytest.mark.parametrize("empty, shown", [(("demo_2",), "data/demo_2 has no samples"),
                                          (("demo_0", "demo_2"), "data/demo_0 (and 1 more) has no samples")])
def test_a_zero_length_hdf5_episode_is_refused_by_training_and_flagged_by_describe(tmp_path, empty, shown):
    from datasets.describe import describe
    from datasets.robomimic_hdf5 import read_robomimic_hdf5
    from tests.test_reliability import _lift_file

    path = _lift_file(tmp_path / "zl.hdf5", lengths=(6, 5, 4))
    with h5py.File(path, "a") as f:
        for demo in empty:
            g = f["data"][demo]
            g.attrs["num_samples"] = 0
            for name, ds in list(g.items()):
                if isinstance(ds, h5py.Dataset):
                    del g[name]
                    g.create_dataset(name, shape=(0, *ds.shape[1:]), dtype=ds.dtype)
    with pytest.raises(ValueError, match=re.escape(shown)):
        read_robomimic_hdf5(path)
    info = describe(path)
    assert not info["valid"] and any(shown in p for p in info["problems"])


@pytest.mark.parametrize("data_path", ["/elsewhere/file-{file_index:03d}.parquet", "data/../../x/file-{file_index:03d}.parquet",
                                       "data/../data/file-{file_index:03d}.parquet"])
def test_a_lerobot_data_path_that_is_absolute_or_climbs_is_refused(tmp_path, data_path):
    from datasets.lerobot import _check_info

    with pytest.raises(ValueError, match=re.escape(f"data_path ({data_path}) is absolute or contains '..'")):
        _check_info(tmp_path, {"fps": 10, "features": {}, "data_path": data_path})
    _check_info(tmp_path, {"fps": 10, "features": {}, "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"})
