"""rollout.py and core.evaluation on a tiny checkpoint: one short PushT episode writes the JSON summary."""
import json
import math

import numpy as np
import pytest
import torch

from core import evaluation, inference, stats
from core.config import compose
from core.training import train
from tests.helpers import run_command, tiny_train_cfg


def test_wilson_interval_known_values():
    lo, hi = stats.wilson_interval(0, 50)
    assert lo == 0.0 and hi == pytest.approx(0.0714, abs=1e-3)
    lo, hi = stats.wilson_interval(45, 50)
    assert (lo, hi) == (pytest.approx(0.7864, abs=1e-3), pytest.approx(0.9565, abs=1e-3))
    assert stats.wilson_interval(50, 50)[1] == 1.0


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, tiny_pusht_zarr):
    tmp = tmp_path_factory.mktemp("ckpt")
    return train(tiny_train_cfg(tmp, tiny_pusht_zarr, attention="fibottention")).checkpoint


def _rollout(*overrides):
    return evaluation.run(compose("rollout", list(overrides)))


def test_rollout_cli_writes_summary(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "eval"
    summary = _rollout(f"checkpoint={tiny_checkpoint.parent.parent}", "num_episodes=1", "max_steps=6",
                       f"out_dir={out}", "num_videos=1", "device=cpu")
    written = json.loads((out / "summary.json").read_text())
    assert written["num_episodes"] == 1 and written["seed_start"] == 100000
    assert written["episodes"][0]["steps"] == 6  # untrained: runs to the step limit
    assert 0.0 <= written["mean_max_coverage"] <= 1.0
    assert written["successes"] == sum(e["success"] for e in written["episodes"]) == summary["successes"]
    assert math.isfinite(written["seconds_per_episode"])
    assert (out / "videos" / "episode_100000.mp4").stat().st_size > 0
    # where it ran: the same checkpoint can act otherwise on another CPU's kernels
    assert written["environment"]["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert f"success {summary['successes']}/1" in capsys.readouterr().out


def test_rollout_num_threads_is_torchs_and_the_default_leaves_it(tiny_checkpoint, tmp_path, monkeypatch):
    # beside another job, torch's one-thread-per-core default spins against it: a study's evaluations give 1
    calls = []
    monkeypatch.setattr(evaluation.torch, "set_num_threads", calls.append)
    for n, threads in enumerate(([], ["num_threads=1"])):
        _rollout(f"checkpoint={tiny_checkpoint}", "num_episodes=1", "max_steps=2", "num_videos=0", f"out_dir={tmp_path / str(n)}",
                 *threads)
    assert calls == [1]


def test_each_evaluation_gets_its_own_folder(tiny_checkpoint, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_checkpoint.parent.parent, run)
    ckpts = run / "checkpoints"
    base = ["num_episodes=1", "max_steps=2", "num_videos=0", "device=cpu"]
    _rollout(f"checkpoint={ckpts / 'step_0000002'}", *base)
    _rollout(f"checkpoint={ckpts / 'last'}", *base, "max_steps=3")
    _rollout(f"checkpoint={run}", *base, "seed=100001")
    names = sorted(p.name for p in (run / "eval").iterdir())
    # `last` is named by its step, so it cannot be confused with a later `last`
    assert names == ["step_0000002_seed100000_max_steps2_n1", "step_0000002_seed100000_max_steps3_n1",
                     "step_0000002_seed100001_max_steps2_n1"]
    with pytest.raises(FileExistsError, match="holds this evaluation already .*; pass overwrite=true"):
        _rollout(f"checkpoint={ckpts / 'step_0000002'}", *base)
    _rollout(f"checkpoint={ckpts / 'step_0000002'}", *base, "overwrite=true")
    # a standalone checkpoint directory evaluates into eval/ beside it, not two levels up
    alone = tmp_path / "shared" / "my_ckpt"
    shutil.copytree(ckpts / "last", alone)
    _rollout(f"checkpoint={alone}", *base)
    assert (tmp_path / "shared" / "eval" / "my_ckpt_seed100000_max_steps2_n1" / "summary.json").is_file()


def test_rollout_with_worker_processes(tiny_checkpoint):
    s = evaluation.evaluate_checkpoint(tiny_checkpoint, num_episodes=3, workers=2, max_steps=4, num_videos=0, progress=False)
    assert [e["seed"] for e in s["episodes"]] == [100000, 100001, 100002]
    assert all(e["steps"] == 4 for e in s["episodes"])


def _rollout_in_a_joblib_worker(checkpoint):
    return evaluation.evaluate_checkpoint(checkpoint, num_episodes=2, workers=1, max_steps=3, num_videos=0, progress=False)["episodes"]


def test_rollout_workers_start_inside_a_joblib_loky_worker(tiny_checkpoint):
    # a study's evaluations run two at a time in joblib's loky workers (`python -m studies ... --jobs 2`),
    # whose process-wide start method "loky" a spawned environment worker cannot set up
    from joblib import Parallel, delayed

    runs = Parallel(n_jobs=2, backend="loky", timeout=240)(delayed(_rollout_in_a_joblib_worker)(tiny_checkpoint) for _ in range(2))
    assert [[e["steps"] for e in r] for r in runs] == [[3, 3], [3, 3]]


@pytest.mark.parametrize("args, message", [
    (["num_episodes=1"], "rollout.py: error: checkpoint= is required"),
    (["checkpoint=x", "episodes=3"], "Could not override 'episodes'"),
    (["checkpoint=x", "num_episodes=many"], "num_episodes"),
    (["checkpoint=/nonexistent"], "rollout.py: error: no checkpoint at /nonexistent"),
    (["checkpoint=x", "num_episodes=0"], "rollout.py: error: num_episodes must be >= 1, got 0"),
    (["checkpoint=x", "workers=-1"], "rollout.py: error: workers must be >= 0, got -1"),
    (["checkpoint=x", "num_threads=0"], "rollout.py: error: num_threads must be >= 1, got 0"),
])
def test_rollout_bad_arguments_are_one_clear_message(args, message):
    proc = run_command(["rollout.py", *args], timeout=120)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert message in proc.stderr, proc.stderr


def test_rollout_attention_overrides(tiny_checkpoint, monkeypatch):
    seen = {}
    real = evaluation.load_policy

    def spy(*args, **kwargs):
        seen["policy"] = real(*args, **kwargs)
        return seen["policy"]

    monkeypatch.setattr(evaluation, "load_policy", spy)
    s = evaluation.evaluate_checkpoint(tiny_checkpoint, num_episodes=1, max_steps=2, num_videos=0, w_max=7, progress=False)
    assert s["attention_overrides"] == {"w_max": 7}
    # the window reaches every layer's mask: no head attends farther than 7 patches
    patterns = [m.pattern for m in seen["policy"].modules() if hasattr(m, "pattern") and hasattr(m, "qkv")]
    assert patterns and all(p.w_max == 7 for p in patterns)
    assert max(max(offs) for p in patterns for offs in p.offsets((6, 6))) <= 7
    s = evaluation.evaluate_checkpoint(tiny_checkpoint, num_episodes=1, max_steps=2, num_videos=0, image_size=120,
                                    offset_grid="train", progress=False)
    train_grid = seen["policy"].config.patch_grid
    assert s["attention_overrides"] == {"offset_grid": list(train_grid)}
    patterns = [m.pattern for m in seen["policy"].modules() if hasattr(m, "pattern") and hasattr(m, "qkv")]
    assert patterns and all(p.offset_grid == tuple(train_grid) for p in patterns)
    with pytest.raises(ValueError, match="offset_grid='first': give train or"):
        compose("rollout", [f"checkpoint={tiny_checkpoint}", "offset_grid=first"])
    with pytest.raises(inference.OverrideError, match="global_slope= applies to lookhere attention.*'fibottention'"):
        evaluation.evaluate_checkpoint(tiny_checkpoint, num_episodes=1, max_steps=2, num_videos=0, global_slope=0.5, progress=False)


def test_rollout_cli_override_error_is_one_line(tiny_checkpoint):
    """A user mistake ends with the message that names the fix, not a Python traceback."""
    proc = run_command(["rollout.py", f"checkpoint={tiny_checkpoint}", "global_slope=0.5"])
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "rollout.py: error: global_slope= applies to lookhere attention, but this checkpoint uses 'fibottention'; drop global_slope="]


def test_rollout_under_a_corruption_is_recorded_and_named(tiny_checkpoint, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_checkpoint.parent.parent, run)
    base = [f"checkpoint={run}", "num_episodes=1", "max_steps=3", "num_videos=0", "device=cpu"]
    clean = _rollout(*base)
    shifted = _rollout(*base, "corruption=[brightness:1,blur:2]")
    assert clean["corruption"] is None and shifted["corruption"] == "brightness1+blur2"
    written = json.loads((run / "eval" / "step_0000002_seed100000_corruptionbrightness1+blur2_max_steps3_n1"
                          / "summary.json").read_text())
    assert written["corruption"] == "brightness1+blur2"


@pytest.mark.parametrize("bad", ["brightness", "brightness:4", "haze:1", "brightness:x"])
def test_an_unknown_corruption_is_refused_before_anything_loads(bad, tmp_path):
    from envs.shifts import ShiftError

    with pytest.raises(ShiftError, match="give KIND:SEVERITY"):
        _rollout(f"checkpoint={tmp_path / 'no_such_run'}", f"corruption={bad}")


def test_obs_corruptor_applies_every_corruption_to_every_camera_only():
    from envs.corruptions import corrupt, obs_corruptor

    img = np.random.default_rng(0).integers(0, 200, (8, 8, 3), dtype=np.uint8)
    obs = {"cam": img, "state": np.ones(2)}
    out = obs_corruptor([("brightness", 1), ("contrast", 2)], ["cam"])(obs)
    assert np.array_equal(out["cam"], corrupt(corrupt(img, "brightness", 1), "contrast", 2))
    assert out["state"] is obs["state"] and np.array_equal(obs["cam"], img)  # the input is not changed


def test_videos_show_what_the_policy_saw(tiny_checkpoint, tmp_path, monkeypatch):
    """The frames are the camera images the policy received, at image_size= and after corruption=, not
    the clean 256-px render."""
    from envs.corruptions import corrupt

    filmed = {}
    monkeypatch.setattr(evaluation, "_write_video", lambda path, frames, fps: filmed.setdefault(path.parent.parent.name, frames))
    run = dict(num_episodes=1, max_steps=2, num_videos=1, progress=False, image_size=120)
    clean = evaluation.evaluate_checkpoint(tiny_checkpoint, out_dir=tmp_path / "clean", **run)
    evaluation.evaluate_checkpoint(tiny_checkpoint, out_dir=tmp_path / "grey", corruption="contrast:2", **run)
    first_clean, first_grey = filmed["clean"][0], filmed["grey"][0]  # the same seed: the same first scene
    assert first_clean.shape == (120, 120, 3)
    assert np.array_equal(first_grey, corrupt(first_clean, "contrast", 2))
    assert first_grey.std() < 0.6 * first_clean.std()  # contrast x0.5 (PushT's white board would saturate brightness)
    assert clean["videos"]["cameras"] == ["image"] and clean["videos"]["shows"].startswith("what the policy saw")


def test_a_scene_shift_is_rendered_on_the_clean_runs_initial_states_and_paired_with_it(tiny_checkpoint, tmp_path, monkeypatch):
    """corruption=colour:3 reaches the environments (PushT draws itself in other colours), not the frames
    afterwards; the episodes are the clean run's, and the summary pairs them with it."""
    filmed = {}
    monkeypatch.setattr(evaluation, "_write_video", lambda path, frames, fps: filmed.setdefault(path.parent.parent.name, frames))
    run = dict(num_episodes=2, max_steps=2, num_videos=1, progress=False)
    clean = evaluation.evaluate_checkpoint(tiny_checkpoint, out_dir=tmp_path / "clean", **run)
    shifted = evaluation.evaluate_checkpoint(tiny_checkpoint, out_dir=tmp_path / "colour3", corruption="colour:3", **run)
    assert shifted["corruptions"] == [["colour", 3]] and shifted["corruption"] == "colour3"
    assert not np.array_equal(filmed["clean"][0], filmed["colour3"][0])  # the scene changed ...
    assert [e["seed"] for e in shifted["episodes"]] == [e["seed"] for e in clean["episodes"]]
    paired, why = evaluation.paired_with_clean(shifted, tmp_path / "clean")
    assert why == "" and paired["episodes"] == 2 and paired["clean_success_rate"] == clean["success_rate"]
    assert paired["difference"] == pytest.approx(shifted["success_rate"] - clean["success_rate"])
    with pytest.raises(ValueError, match="cannot render a lighting shift"):  # before the policy loads
        monkeypatch.setattr(evaluation, "load_policy", lambda *a, **k: pytest.fail("the policy loaded"))
        evaluation.evaluate_checkpoint(tiny_checkpoint, corruption="lighting:1", **run)


def test_a_paired_difference_reads_pairs_not_two_samples():
    from core.stats import paired_difference

    d = paired_difference([1, 1, 0, 0], [1, 1, 1, 1])
    assert d.mean == -0.5 and d.lo < -0.5 < d.hi <= 0.0
    same = paired_difference([1, 0, 1, 0], [1, 0, 1, 0])  # identical outcomes: no spread at all
    assert (same.mean, same.lo, same.hi) == (0.0, 0.0, 0.0)


def test_a_checkpoint_whose_task_name_alone_was_edited_names_the_cameras_it_reads(tiny_checkpoint, tmp_path):
    """A PushT checkpoint whose config.json says task 'lift' (its shapes left as PushT's) was refused as
    `unknown cameras ['']`: the PushT key 'image' became robosuite's camera ''."""
    import shutil

    ckpt = shutil.copytree(tiny_checkpoint, tmp_path / "edited")
    meta = json.loads((ckpt / "config.json").read_text())
    meta["cfg"]["task"]["name"] = "lift"
    (ckpt / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"^the policy reads camera key\(s\) \['image'\], which task 'lift' does not give") as err:
        evaluation.evaluate_checkpoint(ckpt, num_episodes=1, max_steps=2, progress=False)
    assert "\n" not in str(err.value)
