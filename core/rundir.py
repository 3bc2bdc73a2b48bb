"""One training run per directory: a lock, a start over that deletes only a run, and the resume checks.

    run_dir/.lock            held (flock) by the training process; a second one is refused
    run_dir/.run             the marker: this folder holds a run of train_policy.py (written when the
                             run starts writing, after every check has passed)
    run_dir/checkpoints/     step_NNNNNNN/ and last/, each complete or absent (written by rename)
    run_dir/config.json, tb/, eval/
    run_dir/environment.json where each session trained: CPU, torch's kernels, versions (common/provenance.py)

``overwrite=true`` deletes only a folder recognised as a run (the marker, or the checkpoints/ +
config.json of a run written before the marker existed), only the entries a run writes, and only
when ``start`` is called, after the new run's config, data and paths have been checked.

Every refusal names the one command line that works next: ``resume=true`` where a complete
checkpoint exists, ``overwrite=true`` (saying what it deletes) where a run stopped before its first
one (a kill, a full disk), so no message sends the user back to the one before it.
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shutil
import time
import weakref
from pathlib import Path

from common.provenance import environment
from policies.checkpoint import checkpoint_step, clean_stale_writes, newest_checkpoint

from .cli import NOTHING_WRITTEN
from .preflight import check_output_dir, contents, replace_file

RUN_MARKER = ".run"
ENVIRONMENT_FILE = "environment.json"  # where each training session ran (common.provenance), one entry per start
RUN_ENTRIES = (RUN_MARKER, "checkpoints", "config.json", ENVIRONMENT_FILE, "tb", "eval")  # all a run writes, but .lock
# Settings that may change when a run is resumed; every other one defines the model or the data.
RESUMABLE = ("run_dir", "resume", "overwrite", "device", "eval", "train.steps", "train.log_every", "train.val_every",
             "train.checkpoint_every", "train.num_workers", "train.num_threads", "train.compile", "task.env", "task.fps",
             "policy.drop_crop_remainder")  # the last: an acknowledgement, not a setting of the model


class RunPathError(ValueError):
    """A path inside a run directory that is a symbolic link or leaves the run: one line in every CLI."""


def run_path(run_dir, *parts: str) -> Path:
    """``run_dir / parts``, checked part by part: a run directory may come from elsewhere (a copy, an archive),
    so a symbolic link inside it, a ``..`` or an absolute part is refused, never followed, whether the package
    would read the path or write it (a linked ``.lock`` or ``config.json`` would truncate a file elsewhere).
    The run directory itself is the user's choice and may be a link."""
    root = Path(run_dir)
    path = root
    for part in (p for text in parts for p in Path(text).parts):
        if part in ("..", ".") or Path(part).is_absolute():
            raise RunPathError(f"{part!r} in {Path(*parts)} leads outside run {root}: every path of a run stays inside it")
        path = path / part
        if path.is_symlink():
            raise RunPathError(f"{path} is a symbolic link (to {os.readlink(path)}) inside run {root}; the package never "
                               f"follows a link inside a run: replace the link with the file or folder itself, or "
                               f"choose another run")
    return path


def is_run(path: Path) -> bool:
    """Whether ``path`` holds a run of this package: the marker, or (a run from before the marker)
    a checkpoints/ folder beside a config.json."""
    p = Path(path)
    return (p / RUN_MARKER).is_file() or ((p / "checkpoints").is_dir() and (p / "config.json").is_file())


def read_environment(run_dir) -> list:
    """The training sessions run_dir/environment.json lists; [] where it is absent, unreadable, not a list, or
    a symbolic link (a run directory from elsewhere: its link is never followed)."""
    path = Path(run_dir) / ENVIRONMENT_FILE
    try:
        sessions = json.loads(path.read_text()) if path.is_file() and not path.is_symlink() else []
    except (OSError, ValueError):
        return []
    return sessions if isinstance(sessions, list) else []


def _holds_only_lock(path: Path) -> bool:
    return path.is_dir() and all(c.name == ".lock" for c in path.iterdir())


def _drop_unused(path: Path, made_dir: bool, made_lock: bool, started: dict) -> None:
    """A run refused or failed before it wrote anything leaves neither its lock file nor the folder it made."""
    if started["yes"]:
        return
    try:
        if made_lock:
            (path / ".lock").unlink(missing_ok=True)
        if made_dir and path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    except OSError:
        pass


class RunDirectory:
    def __init__(self, path: Path, is_main: bool = True):
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"
        self.is_main = is_main
        self._lock = None
        self._start_over = False
        self._started = {"yes": False}

    def claim(self, *, resume: bool, overwrite: bool) -> Path | None:
        """Lock the directory (rank 0) and return the checkpoint to resume from, or None to start
        fresh. Deletes nothing: with ``overwrite`` the old run goes in ``start``."""
        if not self.is_main:
            return None
        check_output_dir(self.path, "run_dir")
        for name in (".lock", *RUN_ENTRIES):  # a copied run's links are refused before anything opens them
            run_path(self.path, name)
        made_dir, made_lock = not self.path.exists(), not (self.path / ".lock").exists()
        self.path.mkdir(parents=True, exist_ok=True)
        weakref.finalize(self, _drop_unused, self.path, made_dir, made_lock, self._started)
        self._lock = open(run_path(self.path, ".lock"), "a+")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.seek(0)
            owner = self._lock.read().strip() or "another process"
            self._lock.close()
            self._lock = None
            raise FileExistsError(f"run_dir {self.path} is in use by a training running now (pid {owner}); "
                                  f"wait for it or choose another run_dir=") from None
        self._lock.seek(0)
        self._lock.truncate()
        self._lock.write(str(os.getpid()))
        self._lock.flush()
        try:
            return self._decide(resume, overwrite)
        except BaseException:
            self.release()
            raise

    def _decide(self, resume: bool, overwrite: bool) -> Path | None:
        if self.checkpoints.exists():
            clean_stale_writes(self.checkpoints)  # half-written checkpoints of a killed run
        existing = newest_checkpoint(self.checkpoints)
        if overwrite:
            if not is_run(self.path) and not _holds_only_lock(self.path):
                raise FileExistsError(
                    f"run_dir {self.path} is {contents(self.path)}, not a run of train_policy.py (no {RUN_MARKER} "
                    f"marker, no checkpoints/ + config.json); overwrite=true deletes only a run: choose another run_dir=")
            self._start_over = True
            return None
        started = (self.path / "config.json").exists()  # a run that stopped before its first checkpoint
        if resume:
            if existing is None and started:
                raise FileNotFoundError(f"resume=true but {self.path} holds a run that stopped before its first complete "
                                        f"checkpoint: nothing to resume; {start_over_hint(self.path)}")
            if existing is None:
                raise FileNotFoundError(f"resume=true but {self.checkpoints} holds no complete checkpoint; "
                                        f"drop resume=true to start this run")
            return existing
        if existing is not None:
            raise FileExistsError(f"{self.path} already holds a run ({existing}): pass resume=true to continue it, "
                                  f"overwrite=true to delete it and start over, or choose another run_dir=")
        if started:
            raise FileExistsError(f"{self.path} already holds a run that stopped before its first complete checkpoint "
                                  f"(config.json, no checkpoint to resume); {start_over_hint(self.path)}")
        return None

    def start(self) -> None:
        """Every check has passed and the run is about to write: delete the old run's entries
        (overwrite=true; anything else in the folder stays) and write the marker."""
        if not self.is_main:
            return
        self._started["yes"] = True
        if self._start_over:
            for name in RUN_ENTRIES:
                child = self.path / name
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                elif child.exists() or child.is_symlink():
                    child.unlink()
            self._start_over = False
        marker = self.path / RUN_MARKER
        if not marker.exists():
            marker.write_text(json.dumps({"written_by": "train_policy.py", "pid": os.getpid()}) + "\n")

    def record_environment(self, step: int) -> None:
        """Add where this session trains from ``step`` on (CPU, torch's kernels, library versions) to
        environment.json: a run resumed on another machine lists both, so weights that differ can be told apart
        from a changed config."""
        if not self.is_main:
            return
        sessions = read_environment(self.path)  # a link is not followed: this file replaces it
        sessions.append({"from_step": step, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                         **environment()})
        replace_file(self.path / ENVIRONMENT_FILE, json.dumps(sessions, indent=2) + "\n")

    def release(self) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None


def start_over_hint(run_dir) -> str:
    """The way on for a run with no complete checkpoint: what ``overwrite=true`` deletes."""
    return (f"overwrite=true starts it over (it deletes {', '.join(RUN_ENTRIES)} in {run_dir} and nothing else), "
            f"or choose another run_dir=")


def way_on(run_dir) -> str:
    """After a run stopped (a full disk...): the command line that continues it, or starts it over."""
    newest = newest_checkpoint(Path(run_dir) / "checkpoints")
    if newest is not None:
        return f"the newest complete checkpoint is {newest} (step {checkpoint_step(newest)}): resume=true continues from it"
    return f"the run has no complete checkpoint: {start_over_hint(run_dir)}"


def interrupted_message(run_dir) -> str:
    """What a training stopped by Ctrl-C leaves in ``run_dir``, as the command's last line."""
    path = Path(run_dir)
    newest = newest_checkpoint(path / "checkpoints")
    if newest is not None:
        return (f"interrupted; the newest checkpoint is {newest} (step {checkpoint_step(newest)}): "
                f"resume=true continues from it")
    if not path.is_dir() or _holds_only_lock(path) or not (path / "config.json").exists():
        return NOTHING_WRITTEN
    return f"interrupted before the first checkpoint; {path} holds only config.json and tb/ (overwrite=true starts over)"


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def field_default(cfg, key: str):
    """The dataclass default of the dotted ``key`` of the config object ``cfg`` (a sentinel if it has none)."""
    *path, name = key.split(".")
    obj = cfg
    for part in path:
        obj = getattr(obj, part, None)
    for f in dataclasses.fields(obj) if dataclasses.is_dataclass(obj) else ():
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    return NO_DEFAULT


NO_DEFAULT = object()


def check_resume_config(saved: dict, current: dict, checkpoint: Path, schema=None) -> None:
    """Refuse to resume with settings that change the model or the data, naming each one.

    ``schema``: the current config object; a setting the saved config lacks (added to the package
    since that checkpoint) is no change if the run now has its default, which is what it trained with.
    """
    def resumable(key: str) -> bool:
        return any(key == r or key.startswith(r + ".") for r in RESUMABLE)

    def same(key: str) -> bool:
        if key not in old and key in new and schema is not None:
            return new[key] == field_default(schema, key)
        return old.get(key) == new.get(key)

    old, new = flatten(saved), flatten(current)
    changed = sorted(k for k in set(old) | set(new) if not resumable(k) and not same(k))
    if changed:
        shown = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in changed[:6])
        more = f" and {len(changed) - 6} more" if len(changed) > 6 else ""
        raise ValueError(f"cannot resume {checkpoint} with a different model or data ({shown}{more}); "
                         f"only {', '.join(RESUMABLE[3:])} may change: drop those overrides or start a new run_dir=")
