"""A dataset's fingerprint: what a checkpoint records of the data it trained on, compared on resume.

The fingerprint is the episode count, the frame count, a hash of ``episode_ends`` and a hash of
every key's contents (shape, dtype and bytes, images included: a second or so for 1000 PushT
demonstrations), taken of the data as training uses it (after ``train.max_episodes``). A file
replaced at the same path, with one episode more or one action changed, no longer matches.
"""
from __future__ import annotations

import hashlib

import numpy as np

from .episodes import EpisodeData

FINGERPRINT_KEY = "data_fingerprint"  # its key in a checkpoint's training state


def _digest(arr: np.ndarray) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{arr.dtype.str}{arr.shape}".encode())
    h.update(memoryview(np.ascontiguousarray(arr)).cast("B"))
    return h.hexdigest()


def data_fingerprint(data: EpisodeData) -> dict:
    return {
        "episodes": int(data.num_episodes),
        "frames": int(data.num_frames),
        "episode_ends": _digest(np.asarray(data.episode_ends, dtype=np.int64)),
        "keys": {k: _digest(v) for k, v in sorted(data.data.items())},
    }


def _changes(old: dict, new: dict) -> list[str]:
    changes = [f"{name} {old[name]} -> {new[name]}" for name in ("episodes", "frames") if old[name] != new[name]]
    if not changes and old["episode_ends"] != new["episode_ends"]:
        changes.append("episode ends")
    gone = sorted(set(old["keys"]) - set(new["keys"]))
    added = sorted(set(new["keys"]) - set(old["keys"]))
    changes += [f"key {k!r} gone" for k in gone] + [f"key {k!r} added" for k in added]
    if not changes:
        changes += [f"the contents of {k!r}" for k in sorted(old["keys"]) if old["keys"][k] != new["keys"].get(k, old["keys"][k])]
    return changes


def check_resume_data(checkpoint, saved: dict | None, data: EpisodeData) -> dict:
    """Refuse to resume ``checkpoint``, whose training state recorded the fingerprint ``saved``, on
    data that differs from what it trained on, naming what changed; return the data's fingerprint
    (which the run's next checkpoints record)."""
    current = data_fingerprint(data)
    if checkpoint is None:
        return current
    if saved is None:
        print(f"note: {checkpoint} records no data fingerprint (written before they were): "
              f"the data cannot be compared, resuming on {data.meta.get('path', 'the task dataset')} as it is now")
        return current
    changes = _changes(saved, current)
    if changes:
        raise ValueError(
            f"cannot resume {checkpoint}: the dataset {data.meta.get('path', '')} changed since it was written "
            f"({', '.join(changes[:4])}); put back the data it trained on, or start a new run_dir=")
    return current
