"""The in-memory form every dataset reader returns, and safe writing helpers.

Readers (zarr replay buffers, robomimic hdf5) flatten episodes into one array per key, as the
Diffusion Policy replay buffer does, with ``episode_ends`` marking exclusive episode ends. Keys
use the policy's observation names (``image``, ``agent_pos``, ``agentview_image`` ...) plus
``action``; readers know nothing of policies, policies know nothing of file formats.
"""
from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class EpisodeData:
    data: dict[str, np.ndarray]  # key -> (T_total, ...) over all episodes, concatenated
    episode_ends: np.ndarray  # (E,) int64, exclusive end index of each episode
    meta: dict = field(default_factory=dict)  # task name, env_args, source path ...

    def __post_init__(self):
        self.episode_ends = np.asarray(self.episode_ends, dtype=np.int64)
        total = int(self.episode_ends[-1]) if len(self.episode_ends) else 0
        for key, arr in self.data.items():
            if len(arr) != total:
                raise ValueError(f"key {key!r} has {len(arr)} frames but episode_ends says {total}")
        if len(self.episode_ends) and np.any(np.diff(self.episode_ends) <= 0):
            raise ValueError("episode_ends must be strictly increasing (no empty episodes)")

    @property
    def num_episodes(self) -> int:
        return len(self.episode_ends)

    @property
    def num_frames(self) -> int:
        return int(self.episode_ends[-1]) if len(self.episode_ends) else 0

    def episode_bounds(self, i: int) -> tuple[int, int]:
        start = int(self.episode_ends[i - 1]) if i > 0 else 0
        return start, int(self.episode_ends[i])

    def episode(self, i: int) -> dict[str, np.ndarray]:
        start, end = self.episode_bounds(i)
        return {k: v[start:end] for k, v in self.data.items()}

    @staticmethod
    def from_episodes(episodes: list[dict[str, np.ndarray]], meta: dict | None = None) -> "EpisodeData":
        if not episodes:
            raise ValueError("no episodes given")
        keys = episodes[0].keys()
        data = {k: np.concatenate([ep[k] for ep in episodes]) for k in keys}
        ends = np.cumsum([len(ep["action"]) for ep in episodes])
        return EpisodeData(data, ends, dict(meta or {}))


@contextmanager
def atomic_output(path: str | os.PathLike, overwrite: bool = False):
    """Yield a temporary path beside ``path``; move it into place only if the block succeeds.

    An interrupted or failing writer never leaves a half-written file under the final name,
    and an existing file is never replaced unless ``overwrite`` is set.
    """
    final = Path(path)
    if final.exists() and not overwrite:
        raise FileExistsError(f"{final} already exists; pass overwrite=true to replace it, or choose another out=")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    _remove(tmp)
    try:
        yield tmp
        if final.exists():
            _remove(final)
        os.replace(tmp, final)
    finally:
        _remove(tmp)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif p.exists() or p.is_symlink():
        p.unlink()
