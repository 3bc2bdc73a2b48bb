"""rollout.py on a tiny checkpoint: one short PushT episode writes the JSON summary."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

import rollout
from tests.conftest import tiny_train_cfg
from train_policy import train


def test_wilson_interval_known_values():
    lo, hi = rollout.wilson_interval(0, 50)
    assert lo == 0.0 and hi == pytest.approx(0.0714, abs=1e-3)
    lo, hi = rollout.wilson_interval(45, 50)
    assert (lo, hi) == (pytest.approx(0.7864, abs=1e-3), pytest.approx(0.9565, abs=1e-3))
    assert rollout.wilson_interval(50, 50)[1] == 1.0


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, tiny_pusht_zarr):
    tmp = tmp_path_factory.mktemp("ckpt")
    return train(tiny_train_cfg(tmp, tiny_pusht_zarr, attention="fibottention")).checkpoint


def test_rollout_cli_writes_summary(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "eval"
    summary = rollout.main([f"checkpoint={tiny_checkpoint.parent.parent}", "num_episodes=1", "max_steps=6",
                            f"out_dir={out}", "num_videos=1", "device=cpu"])
    written = json.loads((out / "summary.json").read_text())
    assert written["num_episodes"] == 1 and written["seed_start"] == 100000
    assert written["episodes"][0]["steps"] == 6  # untrained: runs to the step limit
    assert 0.0 <= written["mean_max_coverage"] <= 1.0
    assert written["success_rate_ci95"][0] == 0.0 or written["successes"] == 1
    assert math.isfinite(written["seconds_per_episode"])
    assert (out / "videos" / "episode_100000.mp4").stat().st_size > 0
    assert "success 0/1" in capsys.readouterr().out or summary["successes"] == 1


def test_rollout_with_worker_processes(tiny_checkpoint):
    s = rollout.evaluate_checkpoint(tiny_checkpoint, num_episodes=3, workers=2, max_steps=4, num_videos=0, progress=False)
    assert [e["seed"] for e in s["episodes"]] == [100000, 100001, 100002]
    assert all(e["steps"] == 4 for e in s["episodes"])


def test_rollout_bad_arguments():
    with pytest.raises(SystemExit, match="checkpoint= is required"):
        rollout.main(["num_episodes=1"])
    with pytest.raises(SystemExit, match="unknown argument 'episodes'"):
        rollout.main(["checkpoint=x", "episodes=3"])
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        rollout.main(["checkpoint=/nonexistent"])


def test_rollout_attention_overrides(tiny_checkpoint, monkeypatch):
    seen = {}
    real = rollout.load_policy

    def spy(*args, **kwargs):
        seen["policy"] = real(*args, **kwargs)
        return seen["policy"]

    monkeypatch.setattr(rollout, "load_policy", spy)
    s = rollout.evaluate_checkpoint(tiny_checkpoint, num_episodes=1, max_steps=2, num_videos=0, w_max=7, progress=False)
    assert s["attention_overrides"] == {"w_max": 7}
    # the window reaches every layer's mask: no head attends farther than 7 patches
    patterns = [m.pattern for m in seen["policy"].modules() if hasattr(m, "pattern") and hasattr(m, "qkv")]
    assert patterns and all(p.w_max == 7 for p in patterns)
    assert max(max(offs) for p in patterns for offs in p.offsets((6, 6))) <= 7
    s = rollout.evaluate_checkpoint(tiny_checkpoint, num_episodes=1, max_steps=2, num_videos=0, image_size=120,
                                    offset_grid="train", progress=False)
    train_grid = seen["policy"].config.vit.base_grid
    assert s["attention_overrides"] == {"offset_grid": list(train_grid)}
    patterns = [m.pattern for m in seen["policy"].modules() if hasattr(m, "pattern") and hasattr(m, "qkv")]
    assert patterns and all(p.offset_grid == tuple(train_grid) for p in patterns)
    with pytest.raises(rollout.OverrideError, match="offset_grid='first': give 'train'"):
        rollout.evaluate_checkpoint(tiny_checkpoint, num_episodes=1, max_steps=2, num_videos=0, offset_grid="first", progress=False)
    with pytest.raises(rollout.OverrideError, match="global_slope= applies to lookhere attention.*'fibottention'"):
        rollout.evaluate_checkpoint(tiny_checkpoint, num_episodes=1, max_steps=2, num_videos=0, global_slope=0.5, progress=False)


def test_rollout_cli_override_error_is_one_line(tiny_checkpoint):
    """A user mistake ends with the message that names the fix, not a Python traceback."""
    root = Path(rollout.__file__).parent
    proc = subprocess.run([sys.executable, "rollout.py", f"checkpoint={tiny_checkpoint}", "global_slope=0.5"],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("rollout.py: global_slope= applies to lookhere attention")
