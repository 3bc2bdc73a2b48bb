"""Writers killed at any moment leave one complete dataset at the output path (the old or the new).

A write goes: new data under ``.NAME.tmp-*``; the old dataset renamed to ``.NAME.old-*`` (a file is
simply replaced); the new renamed into place; the old renamed to ``.NAME.del-*`` and deleted. The
next write to the path (and ``datasets.generate.generate`` before it starts) restores a lone ``.old-*`` and
deletes stale siblings. Kills here are real SIGKILLs of subprocesses, so no ``finally`` runs.
"""
import json
import os
import random
import subprocess
import sys
import time

import pytest

from datasets.episodes import atomic_output, recover_output, stale_siblings
from datasets.factory import read_dataset
from tests.helpers import REPO

DEAD_PID = 999_999_999  # above any pid_max: never a running process

# The child writes a dataset of `episodes` episodes over `path` (overwrite=True) and SIGKILLs itself
# at the n-th `event`, before or after it happens: write (an array created inside the writer), move (a
# rename/replace beside the output path), delete (an unlink/rmdir while the old data is deleted).
CHILD = r"""
import json, os, shutil, signal, sys
import numpy as np
spec = json.loads(sys.argv[1])
parent = os.path.dirname(os.path.abspath(spec["path"]))
counts, deleting = {}, [0]

def check(event, when):
    if when == "before":
        counts[event] = counts.get(event, 0) + 1
    if (spec["event"], spec["n"], spec["when"]) == (event, counts.get(event, 0), when):
        os.kill(os.getpid(), signal.SIGKILL)

def wrap(owner, name, event_of):
    real = getattr(owner, name)
    def wrapper(*args, **kwargs):
        event = event_of(*args, **kwargs)
        if event:
            check(event, "before")
        result = real(*args, **kwargs)
        if event:
            check(event, "after")
        return result
    setattr(owner, name, wrapper)

def beside(p):
    return os.path.dirname(os.path.abspath(os.fspath(p))) == parent

real_rmtree = shutil.rmtree
def rmtree(*args, **kwargs):
    deleting[0] += 1
    try:
        return real_rmtree(*args, **kwargs)
    finally:
        deleting[0] -= 1
shutil.rmtree = rmtree
for name in ("rename", "replace"):
    wrap(os, name, lambda src, dst, *a, **k: "move" if beside(src) and beside(dst) else None)
for name in ("unlink", "rmdir"):
    wrap(os, name, lambda p, *a, **k: "delete" if deleting[0] or (not k.get("dir_fd") and beside(p)) else None)

n = spec["episodes"]
if spec["fmt"] == "zarr":
    import zarr
    from datasets.zarr_replay import write_pusht_zarr
    wrap(zarr.Group, "create_array", lambda *a, **k: "write")
    eps = [dict(img=np.full((4, 4, 4, 3), i, np.uint8), state=np.zeros((4, 5), np.float32),
                action=np.zeros((4, 2), np.float32), keypoint=np.zeros((4, 9, 2), np.float32),
                n_contacts=np.zeros((4, 1), np.float32)) for i in range(n)]
    write_pusht_zarr(spec["path"], eps, overwrite=True)
else:
    import h5py
    from datasets.robomimic_hdf5 import write_robomimic_hdf5
    wrap(h5py.Group, "create_dataset", lambda *a, **k: "write")
    eps = [{"actions": np.zeros((4, 7), np.float32), "obs": {"agentview_image": np.full((4, 4, 4, 3), i, np.uint8)}}
           for i in range(n)]
    write_robomimic_hdf5(spec["path"], eps, {"env_name": "Lift"}, overwrite=True)
"""

# kill point -> episodes at the path once the next write has recovered (old dataset: 2, new: 3)
POINTS = {
    ("write", 2, "after"): 2,  # new data half written
    ("move", 1, "before"): 2,  # new data complete, nothing moved yet
    ("move", 1, "after"): {"zarr": 2, "hdf5": 3},  # zarr: old moved aside (path empty); hdf5: file replaced
    ("move", 2, "after"): 3,  # new renamed into place, old still aside
    ("move", 3, "after"): 3,  # old renamed for deletion
    ("delete", 2, "after"): 3,  # old half deleted
}
# the points each case actually reaches (the others run to completion)
REACHED = {
    ("zarr", False): set(POINTS),
    ("zarr", True): {("write", 2, "after"), ("move", 1, "before"), ("move", 1, "after")},
    ("hdf5", False): {("write", 2, "after"), ("move", 1, "before"), ("move", 1, "after")},
    ("hdf5", True): {("write", 2, "after"), ("move", 1, "before"), ("move", 1, "after")},
}


def _episodes(path) -> int:
    return read_dataset(path).num_episodes  # reads every array: a partial dataset raises


def _write_whole(fmt, path, n):
    subprocess.run([sys.executable, "-c", CHILD, json.dumps(
        {"fmt": fmt, "path": str(path), "episodes": n, "event": None, "n": 0, "when": None})],
        cwd=REPO, check=True, timeout=60)


@pytest.mark.parametrize("first_write", [True, False], ids=["first-write", "overwrite"])
@pytest.mark.parametrize("fmt", ["zarr", "hdf5"])
def test_writer_killed_at_each_step_leaves_one_complete_dataset(tmp_path, fmt, first_write):
    for i, ((event, n, when), expected) in enumerate(POINTS.items()):
        folder = tmp_path / f"case{i}"
        folder.mkdir()
        final = folder / ("d.zarr" if fmt == "zarr" else "d.hdf5")
        if not first_write:
            _write_whole(fmt, final, 2)
            assert _episodes(final) == 2
        spec = {"fmt": fmt, "path": str(final), "episodes": 3, "event": event, "n": n, "when": when}
        rc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], cwd=REPO, timeout=60).returncode
        reached = (event, n, when) in REACHED[(fmt, first_write)]
        assert rc == (-9 if reached else 0), f"kill point {event} {n} {when}: rc {rc}"
        # right after the kill: the path holds a complete dataset, or (only between the two renames
        # of a directory overwrite) nothing, with the complete old one beside it
        if os.path.lexists(final):
            assert _episodes(final) in ((3,) if first_write else (2, 3))
        elif not first_write:
            assert (fmt, event, n, when) == ("zarr", "move", 1, "after")
            olds = stale_siblings(final)["old"]
            assert len(olds) == 1 and _episodes(olds[0]) == 2
        # the next write (here: its first step) restores or cleans up, leaving only the dataset
        if os.path.lexists(final) or not stale_siblings(final)["old"]:
            recover_output(final)
        else:
            with pytest.warns(UserWarning, match="restored .* left by an overwrite that was interrupted"):
                recover_output(final)
        if first_write and (event, n, when) in {("write", 2, "after"), ("move", 1, "before")}:
            assert list(folder.iterdir()) == []  # killed before anything was at the path
        else:
            want = 3 if first_write else expected[fmt] if isinstance(expected, dict) else expected
            assert [p.name for p in folder.iterdir()] == [final.name]
            assert _episodes(final) == want


def test_failed_rename_puts_the_old_dataset_back(tmp_path, monkeypatch):
    final = tmp_path / "d.zarr"
    _write_whole("zarr", final, 2)
    real = os.rename

    def rename(src, dst):
        if ".tmp-" in str(src):  # moving the new data into place fails (after the old moved aside)
            raise OSError("disk gone")
        return real(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="disk gone"):
        with atomic_output(final, overwrite=True) as tmp:
            tmp.mkdir()
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["d.zarr"] and _episodes(final) == 2


def test_recovery_restores_a_lone_old_dataset_and_spares_live_writers(tmp_path):
    final = tmp_path / "d.zarr"
    _write_whole("zarr", final, 2)
    old = tmp_path / f".d.zarr.old-{DEAD_PID}-0123abcd"
    os.rename(final, old)  # as a writer killed between its two renames leaves it
    with pytest.raises(FileNotFoundError, match=r"interrupted overwrite left the previous dataset at .*\.old-"):
        read_dataset(final)
    live_tmp = tmp_path / f".d.zarr.tmp-{os.getppid()}-89abcdef"  # a writer still running
    live_tmp.mkdir()
    dead_tmp = tmp_path / f".d.zarr.tmp-{DEAD_PID}-89abcdef"
    dead_tmp.mkdir()
    other = tmp_path / f".d.zarr.x.tmp-{DEAD_PID}-89abcdef"  # the temp file of another path, d.zarr.x
    other.touch()
    with pytest.warns(UserWarning, match="restored"):
        assert recover_output(final) == old
    assert _episodes(final) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["d.zarr", live_tmp.name, other.name])


def test_stale_siblings_are_cleaned_on_the_next_write(tmp_path):
    final = tmp_path / "f.txt"
    final.write_text("current")
    for kind in ("tmp", "old", "del"):
        (tmp_path / f".f.txt.{kind}-{DEAD_PID}-0123abcd").write_text("stale")
    with pytest.raises(FileExistsError):  # refused, but cleaned first
        with atomic_output(final) as tmp:
            tmp.write_text("new")
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"] and final.read_text() == "current"


def test_generate_sigkilled_at_random_moments_never_leaves_a_partial_dataset(tmp_path):
    """A real `python generate_demos.py` (2 PushT episodes) SIGKILLed at random moments, several
    of them just after its temporary output appears; after each kill the path holds nothing (first
    write) or a complete dataset of 2 episodes."""
    data_dir, work_dir = tmp_path / "data", tmp_path / "cwd"  # whatever the CLI writes in its cwd stays aside
    data_dir.mkdir()
    work_dir.mkdir()
    out = data_dir / "demos.zarr"
    cmd = [sys.executable, str(REPO / "generate_demos.py"), "task=pusht", "num_episodes=2", f"out={out}",
           "overwrite=true", "workers=1"]
    env = dict(os.environ, MUJOCO_GL="egl", PYTHONPATH=str(REPO))  # the package runs from its root, not site-packages
    rng = random.Random(0)

    def writing(inside: str) -> bool:
        return any(p.name.startswith(".demos.zarr.tmp-") and (p / inside).exists() for p in data_dir.iterdir())

    def run(kill_at=None, after_tmp=None, inside=".") -> bool:
        """Run generate; SIGKILL it `kill_at` s after start, or `after_tmp` s after its .tmp-* output
        appears (with `inside` in it: "meta" is written last, just before the renames)."""
        proc = subprocess.Popen(cmd, cwd=work_dir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        t0 = time.monotonic()
        try:
            while proc.poll() is None and time.monotonic() - t0 < 60:
                if kill_at is not None and time.monotonic() - t0 >= kill_at:
                    break
                if after_tmp is not None and writing(inside):
                    time.sleep(after_tmp)
                    break
                time.sleep(0.001)
            killed = proc.poll() is None
            if killed:
                proc.kill()  # SIGKILL
            err = proc.communicate(timeout=60)[1].decode(errors="replace")
        finally:
            if proc.poll() is None:
                proc.kill()
        if not killed:
            assert proc.returncode == 0, err[-3000:]
        return killed

    def check(first_write: bool) -> None:
        if os.path.lexists(out):
            assert _episodes(out) == 2
        else:  # nothing at the path: only a first write, or a kill between an overwrite's two renames
            olds = stale_siblings(out)["old"]
            assert first_write or (len(olds) == 1 and _episodes(olds[0]) == 2)

    run(kill_at=rng.uniform(0.5, 2.0))  # first write
    check(first_write=True)
    start = time.monotonic()
    assert not run()  # a complete run (also cleans up after the kill above)
    duration = time.monotonic() - start
    assert [p.name for p in data_dir.iterdir()] == ["demos.zarr"]
    kills = 0
    for trial in range(5):  # with the first write above: 6 kills
        if trial % 3 == 0:
            killed = run(kill_at=rng.uniform(0.2, duration))
        elif trial % 3 == 1:
            killed = run(after_tmp=rng.uniform(0.0, 0.03))  # while the new dataset is written
        else:
            killed = run(after_tmp=rng.uniform(0.0, 0.005), inside="meta")  # about when it is renamed
        kills += killed
        check(first_write=False)
    assert kills >= 3, "most trials should have been killed before finishing"
    assert not run()
    assert [p.name for p in data_dir.iterdir()] == ["demos.zarr"] and _episodes(out) == 2
