"""One training run per directory: a lock, a clean start on overwrite, and the resume checks.

    run_dir/.lock            held (flock) by the training process; a second one is refused
    run_dir/checkpoints/     step_NNNNNNN/ and last/, each complete or absent (written by rename)
    run_dir/config.json, tb/, eval/
"""
from __future__ import annotations

import dataclasses
import fcntl
import os
import shutil
from pathlib import Path

from policies.checkpoint import clean_stale_writes, newest_checkpoint

# Settings that may change when a run is resumed; every other one defines the model or the data.
RESUMABLE = ("run_dir", "resume", "overwrite", "device", "eval", "train.steps", "train.log_every", "train.val_every",
             "train.checkpoint_every", "train.num_workers", "train.num_threads", "train.compile", "task.env", "task.fps",
             "policy.drop_crop_remainder")  # the last: an acknowledgement, not a setting of the model


class RunDirectory:
    def __init__(self, path: Path, is_main: bool = True):
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"
        self.is_main = is_main
        self._lock = None

    def claim(self, *, resume: bool, overwrite: bool) -> Path | None:
        """Lock the directory (rank 0) and return the checkpoint to resume from, or None to start fresh."""
        if not self.is_main:
            return None
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.path / ".lock", "a+")
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
        if self.checkpoints.exists():
            clean_stale_writes(self.checkpoints)  # half-written checkpoints of a killed run
        existing = newest_checkpoint(self.checkpoints)
        if overwrite:  # asked for: start from an empty directory (the lock file stays)
            for child in self.path.iterdir():
                if child.name != ".lock":
                    shutil.rmtree(child) if child.is_dir() else child.unlink()
            return None
        if resume:
            if existing is None:
                raise FileNotFoundError(f"resume=true but {self.checkpoints} holds no complete checkpoint; "
                                        f"drop resume=true to start this run")
            return existing
        if existing is not None or (self.path / "config.json").exists():
            raise FileExistsError(f"{self.path} already holds a run ({existing or 'config.json'}): pass resume=true to "
                                  f"continue it, overwrite=true to delete it and start over, or choose another run_dir=")
        return None

    def release(self) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _field_default(cfg, key: str):
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
    return _NO_DEFAULT


_NO_DEFAULT = object()


def check_resume_config(saved: dict, current: dict, checkpoint: Path, schema=None) -> None:
    """Refuse to resume with settings that change the model or the data, naming each one.

    ``schema``: the current config object; a setting the saved config lacks (added to the package
    since that checkpoint) is no change if the run now has its default, which is what it trained with.
    """
    def resumable(key: str) -> bool:
        return any(key == r or key.startswith(r + ".") for r in RESUMABLE)

    def same(key: str) -> bool:
        if key not in old and key in new and schema is not None:
            return new[key] == _field_default(schema, key)
        return old.get(key) == new.get(key)

    old, new = _flatten(saved), _flatten(current)
    changed = sorted(k for k in set(old) | set(new) if not resumable(k) and not same(k))
    if changed:
        shown = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in changed[:6])
        more = f" and {len(changed) - 6} more" if len(changed) > 6 else ""
        raise ValueError(f"cannot resume {checkpoint} with a different model or data ({shown}{more}); "
                         f"only {', '.join(RESUMABLE[3:])} may change: drop those overrides or start a new run_dir=")
