"""Training windows as in Diffusion Policy: To observations and T actions per sample.

Glossary: To = n_obs_steps, T = horizon, Ta = n_action_steps. A window starts up to To-1 frames
before an episode's start and may run Ta-1 frames past its end; frames outside the episode
repeat the edge frame, so the first and last actions of every demonstration are trained on.
"""
from __future__ import annotations

import numpy as np
import torch

from .episodes import EpisodeData

# epoch e of a run seeded s draws its permutation from seed s * EPOCH_SEED_STRIDE + e: a prime far above any
# run's epoch count, so two (seed, epoch) pairs never share a stream (s + e would give seed 1's epoch 0 to
# seed 0's epoch 1)
EPOCH_SEED_STRIDE = 1_000_003


def window_indices(episode_ends: np.ndarray, episodes: np.ndarray, horizon: int, pad_before: int, pad_after: int) -> np.ndarray:
    """Global frame indices (num_windows, horizon) with edge padding by clipping into the episode."""
    rows = []
    offs = np.arange(horizon)
    for ep in episodes:
        start = int(episode_ends[ep - 1]) if ep > 0 else 0
        end = int(episode_ends[ep])
        length = end - start
        first, last = -pad_before, length - horizon + pad_after
        starts = np.arange(first, max(first, last) + 1)
        rows.append(start + np.clip(starts[:, None] + offs[None, :], 0, length - 1))
    return np.concatenate(rows).astype(np.int64) if rows else np.zeros((0, horizon), np.int64)


def split_episodes(num_episodes: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train/validation split by episode (never by frame: neighbouring frames are near copies)."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    order = np.random.default_rng(seed).permutation(num_episodes)
    n_val = int(round(num_episodes * val_fraction))
    if num_episodes > 1:
        n_val = min(max(n_val, 1 if val_fraction > 0 else 0), num_episodes - 1)
    else:
        n_val = 0
    return np.sort(order[n_val:]), np.sort(order[:n_val])


class SequenceDataset(torch.utils.data.Dataset):
    """Samples ``{obs_key: (To, ...), "action": (T, Da)}``; images stay uint8 HWC (the policy
    converts them, which keeps batches small to move). ``obs_steps`` (default To) observation
    frames from the window's start instead: a recurrent policy reads one at every step it unrolls."""

    def __init__(self, data: EpisodeData, obs_keys: list[str], episodes=None, *, n_obs_steps: int, horizon: int, n_action_steps: int,
                 obs_steps: int | None = None):
        if horizon < n_obs_steps:
            raise ValueError(f"horizon ({horizon}) must be >= n_obs_steps ({n_obs_steps})")
        obs_steps = n_obs_steps if obs_steps is None else obs_steps
        if not n_obs_steps <= obs_steps <= horizon:
            raise ValueError(f"obs_steps ({obs_steps}) must be between n_obs_steps ({n_obs_steps}) and horizon ({horizon})")
        missing = [k for k in list(obs_keys) + ["action"] if k not in data.data]
        if missing:
            raise KeyError(f"dataset lacks keys {missing}; it has {sorted(data.data)}")
        self.data = data
        self.obs_keys = list(obs_keys)
        self.obs_steps = obs_steps
        self.episodes = np.arange(data.num_episodes) if episodes is None else np.asarray(episodes)
        self.indices = window_indices(data.episode_ends, self.episodes, horizon, n_obs_steps - 1, n_action_steps - 1)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        idx = self.indices[i]
        obs_idx = idx[: self.obs_steps]
        item = {k: torch.from_numpy(self.data.data[k][obs_idx]) for k in self.obs_keys}
        item["action"] = torch.from_numpy(self.data.data["action"][idx])
        return item


def compute_stats(data: EpisodeData, keys: list[str], episodes=None) -> dict[str, dict[str, np.ndarray]]:
    """Per-dimension min/max of low-dim keys over the given episodes."""
    if episodes is None:
        rows = slice(None)
    else:
        rows = np.concatenate([np.arange(*data.episode_bounds(int(e))) for e in episodes])
    stats = {}
    for k in keys:
        arr = data.data[k][rows].astype(np.float32)
        flat = arr.reshape(len(arr), -1)
        stats[k] = {"min": flat.min(0), "max": flat.max(0)}
    return stats


class StepBatchSampler(torch.utils.data.Sampler):
    """Endless batches of window indices whose order is a function of the step alone.

    Epoch ``e`` is a permutation drawn from ``seed`` and ``e``; process ``rank`` of ``world_size``
    takes every world_size-th index of it, in batches of ``batch_size`` (the last partial batch of
    an epoch is dropped when a full one exists). Starting at ``start_step`` yields exactly the
    batches an uninterrupted run would have drawn from that step on, so a resumed run continues
    the same data order (a checkpoint needs only the step, not the sampler's state).
    """

    def __init__(self, num_samples: int, batch_size: int, *, seed: int, rank: int = 0, world_size: int = 1,
                 start_step: int = 0):
        if num_samples < 1:
            raise ValueError("no training windows: the dataset's training episodes are empty")
        self.num_samples, self.batch_size = num_samples, batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.start_step = start_step
        per_rank = num_samples // world_size if num_samples >= world_size else 1
        self.batches_per_epoch = max(1, per_rank // batch_size) if per_rank >= batch_size else 1

    def _epoch(self, epoch: int) -> list[list[int]]:
        g = torch.Generator().manual_seed(self.seed * EPOCH_SEED_STRIDE + epoch)
        perm = torch.randperm(self.num_samples, generator=g)
        if len(perm) < self.world_size:  # fewer windows than processes: everyone repeats them
            perm = perm.repeat(self.world_size)
        mine = perm[self.rank :: self.world_size].tolist()
        return [mine[i * self.batch_size : (i + 1) * self.batch_size] for i in range(self.batches_per_epoch)]

    def __iter__(self):
        epoch, offset = divmod(self.start_step, self.batches_per_epoch)
        while True:
            yield from self._epoch(epoch)[offset:]
            epoch, offset = epoch + 1, 0

    def __len__(self) -> int:  # an epoch; the iterator itself never ends
        return self.batches_per_epoch
