"""A 2-process gloo run on CPU: identical parameters on both ranks, rank-0-only outputs, and a
checkpoint that a 1-process run resumes."""
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file

from policies.checkpoint import load_training_state
from core.training import train
from tests.helpers import REPO, tiny_train_cfg


def test_two_process_gloo_training_then_single_process_resume(tmp_path, tiny_pusht_zarr):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # --standalone: a free port of torchrun's own choosing, as `make demo` runs it (a fixed port would collide
    # with another test run on the machine, or a second pytest-xdist worker)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "tests.ddp_worker", str(tmp_path), str(tiny_pusht_zarr), "train.steps=3", "train.checkpoint_every=3"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0 = load_file(str(tmp_path / "params_rank0.safetensors"))
    r1 = load_file(str(tmp_path / "params_rank1.safetensors"))
    assert r0.keys() == r1.keys()
    for k in r0:
        torch.testing.assert_close(r0[k], r1[k], rtol=0, atol=0, msg=k)
    # rank 0 alone wrote logs and checkpoints: one startup line, one TensorBoard event file
    assert proc.stdout.count("policy=diffusion") == 1
    assert "processes=2 batch=2x2" in proc.stdout
    assert len(list((tmp_path / "run" / "tb").iterdir())) == 1
    state = load_training_state(tmp_path / "run" / "checkpoints" / "last")
    assert state["step"] == 3 and state["world_size"] == 2
    # ... and a single process resumes it
    cfg = tiny_train_cfg(tmp_path, tiny_pusht_zarr, extra=["resume=true", "train.steps=5"])
    result = train(cfg)
    assert result.step == 5
    assert load_training_state(result.checkpoint)["world_size"] == 1
