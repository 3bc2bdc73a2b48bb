"""SIGKILL a tiny training at random moments (checkpoint writes included); every time, resume must
work from the newest complete checkpoint, no checkpoint may hold a half-written file or non-finite
weights, and the resumed run must end with the weights of an uninterrupted run."""
import multiprocessing as mp
import os
import random
import shutil
import signal
import threading
import time

import pytest
import torch
from safetensors.torch import load_file
from tqdm import tqdm

from core.training import train
from policies.checkpoint import CHECKPOINT_FILES, is_complete, load_training_state, newest_checkpoint
from tests.helpers import tiny_train_cfg

STEPS = 8
TRIALS = 20
EXTRA = [f"train.steps={STEPS}", "train.checkpoint_every=1", "train.val_every=4", "train.num_threads=1"]


def _train(cfg):
    # tqdm's default lock is a multiprocessing lock that forked children share with this process: a
    # child SIGKILLed while it holds it (any progress bar's creation or update takes it) would leave
    # it held for good, and the next child, then the next progress bar of the whole test session,
    # would wait on it forever. A thread lock is the child's own.
    tqdm.set_lock(threading.RLock())
    torch.set_num_threads(1)
    train(cfg)


def _cfg(tmp, data, extra=()):
    return tiny_train_cfg(tmp, data, policy="bc", extra=EXTRA + list(extra))


def _in_child(target, *args) -> mp.Process:
    # fork: the child starts with everything imported, so a trial costs a second, not an interpreter start
    proc = mp.get_context("fork").Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


def _wait_for_checkpoints(ckpts, count: int, proc, limit: float = 120.0) -> None:
    """Until the run in ``proc`` has written ``count`` step checkpoints (or ended): the kill that
    follows then lands mid-run however fast or loaded the machine is, which a fixed delay does not."""
    deadline = time.perf_counter() + limit
    while count and proc.is_alive() and time.perf_counter() < deadline:
        if ckpts.exists() and sum(p.name.startswith("step_") for p in ckpts.iterdir()) >= count:
            return
        time.sleep(0.005)


def _weights(ckpt) -> dict:
    return load_file(str(ckpt / "model.safetensors"))


def _check_after_kill(ckpts):
    """Every checkpoint under a final name is complete, readable and finite."""
    for c in sorted(ckpts.iterdir()) if ckpts.exists() else []:
        if c.name.startswith("."):
            continue  # a write in progress: cleaned up on resume
        assert is_complete(c), f"{c} is missing one of {CHECKPOINT_FILES}"
        assert all(torch.isfinite(t).all() for t in _weights(c).values() if t.is_floating_point()), c
        load_training_state(c)


@pytest.mark.timeout(600)
def test_sigkill_at_random_moments_then_resume_matches_an_uninterrupted_run(tmp_path, tiny_pusht_zarr):
    ref_dir = tmp_path / "reference"
    proc = _in_child(_train, _cfg(ref_dir, tiny_pusht_zarr))
    proc.join(120)
    assert proc.exitcode == 0
    reference = _weights(ref_dir / "run" / "checkpoints" / "last")
    written = [c.stat().st_mtime for c in sorted((ref_dir / "run" / "checkpoints").glob("step_*"))]
    step_time = (written[-1] - written[0]) / (len(written) - 1)  # one step and its checkpoint, start-up left out
    # every trial runs in one folder, emptied before it: its three configs are composed once, not per child
    tmp = tmp_path / "trial"
    ckpts = tmp / "run" / "checkpoints"
    fresh, resume, overwrite = (_cfg(tmp, tiny_pusht_zarr, extra) for extra in ([], ["resume=true"], ["overwrite=true"]))
    rng = random.Random(0)
    killed_during_write, resumed = 0, 0
    for trial in range(TRIALS):
        shutil.rmtree(tmp, ignore_errors=True)
        proc = _in_child(_train, fresh)
        # anywhere from start-up to the last checkpoint: after a random number of checkpoints, a
        # random part of one step's time later (in a step or in a checkpoint write)
        _wait_for_checkpoints(ckpts, rng.randrange(STEPS), proc)
        time.sleep(rng.uniform(0.0, step_time))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
        killed_during_write += bool(ckpts.exists() and any(p.name.startswith(".") for p in ckpts.iterdir()))
        _check_after_kill(ckpts)
        newest = newest_checkpoint(ckpts)
        if newest is not None and load_training_state(newest)["step"] >= STEPS:
            continue  # killed after the end: nothing to resume
        resumed += newest is not None
        proc = _in_child(_train, resume if newest is not None else overwrite)
        proc.join(120)
        assert proc.exitcode == 0, f"trial {trial}: resume from {newest} failed"
        assert not [p for p in ckpts.iterdir() if p.name.startswith(".")]  # stale writes cleaned up
        final = _weights(ckpts / "last")
        for k, v in reference.items():
            # the data order, RNG, optimizer, scheduler and EMA all resume: the result is the same run's
            torch.testing.assert_close(final[k], v, rtol=0, atol=0, msg=f"trial {trial}: {k}")
    print(f"{TRIALS} kills: {resumed} resumed, {killed_during_write} during a checkpoint write")
    assert resumed >= TRIALS // 2  # most kills land mid-run, not before the first or after the last checkpoint
