"""Each study end to end at a tiny size, plus the invariants of its measurements, and the engine
(Hydra multirun launchers) that runs a study's jobs."""
import json
import re

import numpy as np
import pytest
import torch

from studies import common
from studies.__main__ import main as studies_main
from envs.corruptions import CORRUPTIONS, corrupt
from studies.diversity import head_diversity, linear_cka

# Hydra's basic launcher: the jobs of each stage one after another in one process (the quickest here)
TINY_ARGS = ["--budget", "tiny", "--tasks", "pusht", "--max-steps", "3", "--launcher", "basic"]


TINY_STEPS = ["train.steps=2", "train.batch_size=4", "train.checkpoint_every=2"]


@pytest.fixture
def tiny_extra(tiny_pusht_zarr):
    from tests.helpers import TINY_POLICY

    return [f"task.dataset.path={tiny_pusht_zarr}", "train.val_fraction=0.34", "train.num_threads=1", *TINY_POLICY]


@pytest.mark.parametrize("study", ["main", "data_efficiency", "robustness", "resolution", "diversity"])
def test_study_runs_end_to_end_and_writes_its_table(study, tmp_path, tiny_extra):
    out = studies_main([study, *TINY_ARGS, "--results", str(tmp_path / "results"), *tiny_extra])
    table = (out / "table.md").read_text()
    data = json.loads((out / "results.json").read_text())
    assert data["command"].startswith(f"python -m studies {study} --budget tiny --tasks pusht")
    assert data["rows"], table
    assert (out / "plot.png").stat().st_size > 1000
    if study == "main":
        assert {r["attention"] for r in data["rows"]} == {"full", "lookhere"}
        assert all(r["episodes"] == 1 for r in data["rows"])
    if study == "robustness":
        assert "gaussian_noise 3" in table
    if study == "diversity":
        assert all(0.0 <= float(r["diversity"]) <= 1.0 for r in data["rows"])


def test_resolution_study_evaluates_fibottentions_variants(tmp_path, tiny_extra):
    out = studies_main(["resolution", *TINY_ARGS, "--attentions", "fibottention", "--results", str(tmp_path / "r"), *tiny_extra])
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [r["attention"] for r in rows] == ["fibottention", "fibottention (training window)",
                                              "fibottention (training-grid 2-D offsets)"]
    cell = next(p for p in (tmp_path / "r" / "cells").iterdir() if not p.name.startswith("."))  # .sweeps: the engine's
    grid2d = json.loads((cell / "evals" / "size128_grid2d.json").read_text())
    assert grid2d["image_size"] == 128 and len(grid2d["attention_overrides"]["offset_grid"]) == 2


def test_study_cells_are_cached(tmp_path, tiny_extra):
    args = ["main", *TINY_ARGS, "--results", str(tmp_path / "r"), *tiny_extra]
    studies_main(args)
    cells = sorted(p for p in (tmp_path / "r" / "cells").iterdir() if not p.name.startswith("."))
    stamps = [(c / "checkpoints" / "last" / "model.safetensors").stat().st_mtime_ns for c in cells]
    studies_main(args)
    assert [(c / "checkpoints" / "last" / "model.safetensors").stat().st_mtime_ns for c in cells] == stamps


def test_main_table_keeps_rows_of_earlier_runs_on_the_same_budget(tmp_path, tiny_extra):
    base = ["main", *TINY_ARGS, "--results", str(tmp_path / "r"), *tiny_extra]
    studies_main([*base, "--attentions", "full"])
    out = studies_main([*base, "--attentions", "lookhere"])
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [r["attention"] for r in rows] == ["full", "lookhere"]
    assert "--attentions full" in rows[0]["command"] and "--attentions lookhere" in rows[1]["command"]
    # the second command leaves full out, yet its row is compared to the full cells of the first
    assert "diff_text" not in rows[0] and rows[1]["diff_text"].startswith(("+", "-"))
    table = (out / "table.md").read_text()
    assert table.count("Command: `") == 2 and "| pusht | bc | full | 2 |" in table


@pytest.mark.parametrize("study", ["robustness", "resolution"])
def test_evaluation_studies_keep_rows_of_other_encoders(study, tmp_path, tiny_extra):
    # a study run for one task or encoder must not wipe the table of an earlier run for another
    base = [study, *TINY_ARGS, "--results", str(tmp_path / "r"), *tiny_extra]
    studies_main([*base, "--attentions", "full"])
    out = studies_main([*base, "--attentions", "lookhere"])
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {r["attention"] for r in rows} >= {"full", "lookhere"}
    assert all(r["steps"] == 2 for r in rows)
    lookhere = next(r for r in rows if r["attention"] == "lookhere")
    cell = lookhere["clean"] if study == "robustness" else lookhere[f"size{sorted(lookhere['rates'])[0]}"]
    assert re.search(r"\([+-]\d+ \[", cell), cell  # its difference to the earlier run's full attention
    assert (out / "plot.png").stat().st_size > 1000  # the kept rows (str keys from JSON) plot too


def test_merge_rows_replaces_redone_rows_only():
    old = [{"task": "lift", "attention": "full", "success_rate": 0.5}, {"task": "lift", "attention": "lookhere", "success_rate": 0.9}]
    new = [{"task": "lift", "attention": "full", "success_rate": 1.0}, {"task": "can", "attention": "full", "success_rate": 0.8}]
    merged = common.merge_rows(old, new, ("task", "attention"))
    assert [(r["task"], r["attention"], r["success_rate"]) for r in merged] == [
        ("can", "full", 0.8), ("lift", "full", 1.0), ("lift", "lookhere", 0.9)]


def test_merge_rows_keeps_other_recipes_and_reads_a_missing_key_as_empty():
    old = [{"task": "lift", "steps": 4000, "success_rate": 0.4},  # written before rows had "extra"
           {"task": "lift", "steps": 4000, "extra": "policy.prediction_type=sample", "success_rate": 0.9}]
    new = [{"task": "lift", "steps": 4000, "extra": "", "success_rate": 0.5}]
    merged = common.merge_rows(old, new, ("task", "steps", "extra"))
    assert [(r.get("extra", ""), r["success_rate"]) for r in merged] == [("", 0.5), ("policy.prediction_type=sample", 0.9)]


def test_merge_rows_says_when_a_part_of_a_study_replaces_a_row_of_more_seeds(capsys):
    old = [{"task": "lift", "attention": "full", "per_seed": [0.7, 0.6, 0.8]},
           {"task": "lift", "attention": "lookhere", "counts": {"clean": [[40, 50]]}}]
    new = [{"task": "lift", "attention": "full", "per_seed": [0.6]}, {"task": "lift", "attention": "lookhere", "counts": {"clean": [[40, 50]] * 3}}]
    merged = common.merge_rows(old, new, ("task", "attention"))
    assert [common.seed_count(r) for r in merged] == [1, 3]
    out = capsys.readouterr().out
    assert "the row lift full had 3 seeds and now has this run's 1" in out and "lookhere" not in out


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_corruption_severity_zero_is_identity_and_higher_changes_more(kind):
    img = np.random.default_rng(0).integers(0, 256, (20, 24, 3)).astype(np.uint8)
    assert np.array_equal(corrupt(img, kind, 0), img)
    diffs = [np.abs(corrupt(img, kind, s, np.random.default_rng(1)).astype(int) - img).mean() for s in (1, 2, 3)]
    assert 0 < diffs[0] < diffs[1] < diffs[2]
    assert corrupt(img, kind, 2).dtype == np.uint8 and corrupt(img, kind, 2).shape == img.shape


def test_identical_heads_have_zero_diversity():
    head = torch.randn(4, 1, 10, 8)
    same = head.expand(4, 3, 10, 8)
    res = head_diversity(same)
    assert res["diversity"] == pytest.approx(0.0, abs=1e-9)
    assert res["mean_cka"] == pytest.approx(1.0)
    different = torch.randn(4, 3, 10, 8)
    assert head_diversity(different)["diversity"] > 0.3


def test_cka_is_invariant_to_rotation_and_scale():
    x = torch.randn(50, 6, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(6, 6, dtype=torch.float64))
    assert linear_cka(x, 3.0 * x @ q) == pytest.approx(1.0)


def test_budget_and_command_line_overrides_reach_every_cell():
    import argparse

    from studies.__main__ import cells_for

    budget = {"recipe": "cpu", "seeds": [0, 1], "policies": ["bc", "diffusion"], "attentions": ["full"],
              "overrides": ["policy.n_obs_steps=1"]}
    args = argparse.Namespace(extra=["train.lr=1e-3"])
    cells = cells_for(args, "lift", budget, extra=["train.max_episodes=5"])
    assert [(c.policy, c.seed) for c in cells] == [("bc", 0), ("bc", 1), ("diffusion", 0), ("diffusion", 1)]
    # budget first, then the command line, then the study's own: later overrides win in Hydra
    assert cells[0].overrides()[-3:] == ["policy.n_obs_steps=1", "train.lr=1e-3", "train.max_episodes=5"]
    cfg = cells[0].config()
    assert (cfg.policy.n_obs_steps, cfg.train.lr, cfg.train.max_episodes) == (1, 1e-3, 5)
    assert [c.config().train.steps for c in cells] == [4000, 4000, 5000, 5000]  # from configs/recipe/pair/cpu/
    assert len({c.key for c in cells}) == 4


@pytest.mark.parametrize("task, policy, attention", [("lift", "bc", "fibottention"), ("lift", "bc", "lookhere"),
                                                     ("can", "bc", "full"), ("pusht", "diffusion", "lookhere")])
def test_a_study_cell_trains_exactly_what_the_recipe_command_trains(task, policy, attention, tmp_path):
    """`python train_policy.py task=T policy=P attention=A recipe=cpu` == the small-budget study cell."""
    import argparse

    from core.config import compose, to_dict
    from studies.__main__ import make_cell

    cell = make_cell(argparse.Namespace(extra=[]), common.BUDGETS["small"], task, policy, attention, 0)
    user = compose("config", [f"task={task}", f"policy={policy}", f"attention={attention}", "recipe=cpu",
                              f"run_dir={cell.run_dir}", "eval.num_episodes=0"])
    assert to_dict(cell.config()) == to_dict(user)


def test_the_cpu_recipes_hold_what_the_studies_measured():
    from core.config import compose

    lift_fib = compose("config", ["task=lift", "policy=bc", "attention=fibottention", "recipe=cpu"])
    assert list(lift_fib.policy.input_shapes) == ["agentview_image", "robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos"]
    assert (lift_fib.task.crop_size, lift_fib.train.steps, lift_fib.policy.n_image_obs_steps, lift_fib.train.num_threads) == (84, 4000, 1, 1)
    lift_lh = compose("config", ["task=lift", "policy=bc", "attention=lookhere", "recipe=cpu"])
    assert "robot0_eye_in_hand_image" in lift_lh.policy.input_shapes
    assert (lift_lh.policy.vit.patch_size, lift_lh.policy.vit.pool) == (12, "spatial_softmax")
    assert lift_lh.policy.vit.attention.rotate_directions and lift_lh.policy.vit.attention.global_slope == 0.25
    pusht = compose("config", ["task=pusht", "policy=diffusion", "attention=full", "recipe=cpu"])
    assert (pusht.policy.prediction_type, pusht.policy.down_dims, pusht.train.steps) == ("sample", [32, 64, 128], 15000)
    assert pusht.task.dataset.path == "data/pusht/demos1000.zarr"
    bare = compose("config", ["task=lift", "policy=bc", "attention=full", "recipe=none"])
    assert (bare.task.crop_size, bare.train.steps, len(bare.policy.input_shapes)) == (76, 20000, 5)


# --- the engine: Hydra's launchers run the jobs, a separate step builds the table -------------------
def test_a_2x2_grid_runs_on_submitit_and_the_report_step_builds_its_table(tmp_path, tiny_extra):
    """The cluster path (submitit) in its local mode: 2 attentions x 2 seeds, each job its own process."""
    results = tmp_path / "r"
    args = ["main", "--budget", "tiny", "--tasks", "pusht", "--max-steps", "3", "--attentions", "full,lookhere",
            "--seeds", "0,1", "--results", str(results), "--launcher", "submitit_local", *tiny_extra]
    studies_main(args)
    cells = sorted(p for p in (results / "cells").iterdir() if not p.name.startswith("."))
    assert [c.name.split("_s")[0] for c in cells] == ["pusht_bc_full"] * 2 + ["pusht_bc_lookhere"] * 2
    pids = set()
    for c in cells:
        state = json.loads((c / "checkpoints" / "last" / "training_state.json").read_text())["__dict__"]
        assert state["step"] == 2
        assert json.loads((c / "evals" / "clean.json").read_text())["num_episodes"] == 1
        assert "=== done" in (c / "logs" / "train.log").read_text()
    sweeps = sorted((results / "cells" / ".sweeps").iterdir())
    assert sorted(s.name.split("_")[-2] for s in sweeps) == ["eval", "train"]
    for sweep in sweeps:
        statuses = [json.loads(f.read_text()) for f in (sweep / "status").iterdir()]
        assert sorted(st["status"] for st in statuses) == ["done"] * 4
        pids |= {st["pid"] for st in statuses}
        assert (sweep / ".submitit").is_dir()  # submitit ran them
    assert len(pids) == 8  # every job in a process of its own

    # the report step alone, on partial results: one seed's evaluation of "full" is missing
    (results / "main").rename(tmp_path / "first_table")
    next(c for c in cells if "full" in c.name).joinpath("evals", "clean.json").unlink()
    out = studies_main(["report", *args])
    rows = {r["attention"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert (rows["full"]["episodes"], rows["lookhere"]["episodes"]) == (1, 2)
    assert rows["full"]["success"].endswith(", 1 of 2 seeds so far") and "so far" not in rows["lookhere"]["success"]
    assert rows["lookhere"]["per_seed"] and len(rows["lookhere"]["per_seed"]) == 2
    assert json.loads((out / "results.json").read_text())["command"].startswith("python -m studies main --budget tiny")
    assert "submitit_local" not in (out / "table.md").read_text()  # how the jobs ran is not part of the result
    assert len(list((results / "cells" / ".sweeps").iterdir())) == 2  # the report launched nothing


def test_a_failed_job_is_reported_and_the_others_of_its_sweep_finish(tmp_path, tiny_extra):
    from studies import engine
    from studies.common import Cell

    common.set_results(tmp_path / "r")
    try:
        good = Cell("pusht", "bc", "full", 0, "none", [*TINY_STEPS, *tiny_extra])
        bad = Cell("pusht", "bc", "full", 0, "none", [*TINY_STEPS, *tiny_extra, "task.dataset.path=/nonexistent/pusht.zarr"])
        jobs = [{"kind": "train", "cell": bad.to_json()}, {"kind": "train", "cell": good.to_json()},
                {"kind": "eval", **common.Evaluation(bad, "clean", {"num_episodes": 1}).to_json()}]
        outcomes = engine.launch(jobs, stage="train", study="test", launcher="joblib", n_jobs=2)
        assert [o.status for o in outcomes] == ["failed", "done", "failed"]
        assert "/nonexistent/pusht.zarr" in outcomes[0].message and "not trained" in outcomes[2].message
        assert "Traceback" in (bad.run_dir / "logs" / "train.log").read_text()
        assert good.finished()
        again = engine.launch(jobs[1:2], stage="train", study="test", launcher="joblib")
        assert [o.status for o in again] == ["skipped"]
    finally:
        common.set_results("results")


def test_a_cell_that_does_not_compose_fails_alone_and_the_study_says_so(tmp_path, tiny_extra, capsys):
    args = ["main", *TINY_ARGS, "--attentions", "full,lookhere:7", "--results", str(tmp_path / "r"), *tiny_extra]
    with pytest.raises(SystemExit) as exit_info:
        studies_main(args)
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "2 job(s) failed" in err and "not run: its cell did not finish training" in err and "attention.variant='7' is unknown" in err
    rows = json.loads((tmp_path / "r" / "main" / "results.json").read_text())["rows"]
    assert [r["attention"] for r in rows] == ["full"]


def test_as_many_jobs_run_at_once_as_the_cores_hold():
    from studies.engine import parallel_jobs

    assert parallel_jobs(1, 4, cores=2) == 2  # this machine: two single-thread cells
    assert parallel_jobs(1, 1, cores=2) == 1
    assert parallel_jobs(4, 9, cores=16) == 4
    assert parallel_jobs(None, 4, cores=16) == 1  # torch's default takes every core


@pytest.mark.parametrize("launcher", ["joblib", "slurm"])
def test_the_launcher_switch_picks_the_engine_and_sizes_the_jobs(launcher, tmp_path, monkeypatch):
    import subprocess

    from studies import engine

    seen = {}
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: seen.update(cmd=cmd) or subprocess.CompletedProcess(cmd, 0))
    monkeypatch.setattr(engine, "available_cores", lambda: 2)
    common.set_results(tmp_path / "r")
    try:
        job = {"kind": "train", "cell": common.Cell("lift", "bc", "full", 0).to_json()}
        out = engine.launch([job] * 3, stage="train", study="main", launcher=launcher, threads=1, gpus_per_job=2,
                            procs_per_job=2, overrides=["hydra.launcher.partition=gpu"])
    finally:
        common.set_results("results")
    assert [o.status for o in out] == ["lost"] * 3  # nothing ran: no job wrote its status
    cmd = seen["cmd"]
    assert cmd[1:4] == ["-m", "studies.job", "--multirun"] and "job=range(0,3)" in cmd
    if launcher == "joblib":
        assert "hydra/launcher=joblib" in cmd and "hydra.launcher.n_jobs=2" in cmd
    else:
        assert "hydra/launcher=study_slurm" in cmd
        assert {"hydra.launcher.cpus_per_task=1", "hydra.launcher.gpus_per_node=2", "hydra.launcher.tasks_per_node=2"} <= set(cmd)
    assert cmd[-1] == "hydra.launcher.partition=gpu"


def test_the_slurm_launcher_config_extends_submitit_and_requeues_on_timeout():
    from hydra import compose, initialize_config_dir

    import studies.job  # noqa: F401  (registers the job's schema)
    from core.config import CONFIG_DIR

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("study_job", ["manifest=m.json", "job=0", "hydra/launcher=study_slurm"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher") and launcher.max_num_timeout == 3 and launcher.timeout_min == 1440


def test_the_command_a_table_records_leaves_out_how_the_jobs_ran():
    from studies.__main__ import study_command

    argv = ["report", "main", "--budget", "small", "--launcher", "slurm", "--hydra", "hydra.launcher.partition=gpu",
            "--jobs=3", "policy.vit.dim=64"]
    assert study_command(argv) == "python -m studies main --budget small policy.vit.dim=64"


def test_an_attention_label_sets_any_attention_field_and_names_its_cell():
    robot = common.Cell("lift", "bc", "fibottention:windows=robot", 0)
    mult = common.Cell("lift", "bc", "fibottention:mask_mode=multiplicative", 0)
    lh45 = common.Cell("lift", "bc", "lookhere:45", 0)
    assert robot.overrides()[2] == "attention=fibottention" and "attention.windows=robot" in robot.overrides()
    assert "attention.mask_mode=multiplicative" in mult.overrides() and "attention.variant=45" in lh45.overrides()
    assert robot.key.startswith("lift_bc_fibottentionwindows-robot_s0_") and lh45.key.startswith("lift_bc_lookhere45_s0_")
    assert len({robot.key, mult.key, common.Cell("lift", "bc", "fibottention", 0).key}) == 3
    vit = robot.config().policy.vit.attention
    assert (vit.kind, vit.windows, vit.mask_mode) == ("fibottention", "robot", "additive")


def _summary(k, n):
    return {"successes": k, "num_episodes": n, "success_rate": k / n}


def test_pooled_seeds_give_the_mean_over_seeds_and_a_bootstrap_interval_that_widens_when_they_disagree():
    agree = common.pooled([_summary(45, 50)] * 3 + [None])  # a seed not evaluated yet is left out
    disagree = common.pooled([_summary(50, 50), _summary(40, 50), _summary(45, 50)])
    assert agree["seeds"] == 3 and agree["per_seed"] == [0.9] * 3 and agree["success_rate"] == pytest.approx(0.9)
    assert disagree["success_rate"] == pytest.approx(0.9) and (agree["successes"], agree["episodes"]) == (135, 150)
    width = lambda p: p["ci95"][1] - p["ci95"][0]  # noqa: E731
    assert width(disagree) > 1.3 * width(agree)
    assert common.fmt_rate(disagree).endswith("(100/80/90)")


def test_the_difference_to_full_attention_has_an_interval_and_a_verdict():
    full = [_summary(50, 50)] * 3
    worse = common.difference([_summary(20, 50), _summary(15, 50), None], full)
    assert worse["diff"] == pytest.approx(-0.65) and worse["diff_ci95"][1] < 0
    assert worse["verdict"] == "contradicted" and worse["diff_text"].startswith("-65 [")
    assert common.difference([None], full) is None


def test_the_robustness_study_runs_only_the_chosen_corruptions(tmp_path, tiny_extra):
    out = studies_main(["robustness", *TINY_ARGS, "--attentions", "full", "--corruptions", "brightness:1",
                        "--results", str(tmp_path / "r"), *tiny_extra])
    cell = next(p for p in (tmp_path / "r" / "cells").iterdir() if not p.name.startswith("."))
    assert sorted(p.name for p in (cell / "evals").iterdir()) == ["brightness_1.json", "clean.json"]
    assert "brightness 1" in (out / "table.md").read_text() and "contrast 2" not in (out / "table.md").read_text()
    with pytest.raises(SystemExit, match="brightness:4"):
        studies_main(["robustness", *TINY_ARGS, "--corruptions", "brightness:4", "--results", str(tmp_path / "r"), *tiny_extra])


@pytest.mark.parametrize("kind", ["full", "fibottention", "lookhere"])
def test_activation_patching_reproduces_the_encoder_and_restoring_a_path_removes_its_change(kind):
    from policies.vision.attention import AttentionConfig
    from policies.vision.vit import ViT, ViTConfig
    from studies.feature_shift import relative_change
    from studies.shift_patching import components, run

    torch.manual_seed(0)
    vit = ViT(ViTConfig(dim=32, depth=2, num_heads=4, attention=AttentionConfig(kind=kind))).eval()
    x = torch.rand(4, 3, 72, 72)
    f, clean = run(vit, x)
    torch.testing.assert_close(f, vit(x), rtol=1e-5, atol=1e-5)  # step by step is the encoder itself
    shifted = (x + 0.1).clamp(0, 1)
    f_shift, _ = run(vit, shifted)
    r0 = relative_change(f, f_shift)
    assert r0 > 1e-3
    restored = {label: relative_change(f, run(vit, shifted, clean, names)[0]) for label, names in components(vit)}
    # with CLS pooling the image reaches the output only through attention, and never through the last patch tokens
    assert restored["every block's attention"] < 1e-6 and restored["patch tokens after the last block"] == pytest.approx(r0)
    assert 0 < restored["block0.head1"] < r0 * 1.5 and restored["every block's MLP"] < r0


def test_the_data_efficiency_study_runs_only_the_chosen_demonstration_counts(tmp_path, tiny_extra, capsys):
    out = studies_main(["data_efficiency", *TINY_ARGS, "--attentions", "full", "--demos", "1,2",
                        "--results", str(tmp_path / "r"), *tiny_extra])
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert sorted(r["demos"] for r in rows) == [1, 2]
    trained = sorted(json.loads((p / "config.json").read_text())["train"]["max_episodes"]
                     for p in (tmp_path / "r" / "cells").iterdir() if not p.name.startswith("."))
    assert trained == [1, 2]
    with pytest.raises(SystemExit):
        studies_main(["data_efficiency", *TINY_ARGS, "--seeds", "0,x", "--results", str(tmp_path / "r"), *tiny_extra])
    assert "--seeds: '0,x' is not a comma-separated list of integers" in capsys.readouterr().err


@pytest.mark.parametrize("module", ["feature_shift", "shift_patching", "action_shift"])
def test_the_encoder_analyses_end_a_bad_checkpoint_or_corruption_in_one_line(module, tmp_path, capsys):
    import importlib

    main = importlib.import_module(f"studies.{module}").main
    with pytest.raises(SystemExit):
        main([str(tmp_path / "missing")])
    err = capsys.readouterr().err
    assert "error: no checkpoint at" in err and "Traceback" not in err
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--corruption", "bright"])
    assert "'bright' is not KIND:SEVERITY" in capsys.readouterr().err
