"""Training windows as in Diffusion Policy: To observations and T actions per sample.

Glossary: To = n_obs_steps, T = horizon, Ta = n_action_steps. A window starts up to To-1 frames
before an episode's start and may run Ta-1 frames past its end; frames outside the episode
repeat the edge frame, so the first and last actions of every demonstration are trained on.
"""
from __future__ import annotations

import numpy as np
import torch

from .episodes import EpisodeData


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
    converts them, which keeps batches small to move)."""

    def __init__(self, data: EpisodeData, obs_keys: list[str], episodes=None, *, n_obs_steps: int, horizon: int, n_action_steps: int):
        if horizon < n_obs_steps:
            raise ValueError(f"horizon ({horizon}) must be >= n_obs_steps ({n_obs_steps})")
        missing = [k for k in list(obs_keys) + ["action"] if k not in data.data]
        if missing:
            raise KeyError(f"dataset lacks keys {missing}; it has {sorted(data.data)}")
        self.data = data
        self.obs_keys = list(obs_keys)
        self.n_obs_steps = n_obs_steps
        self.episodes = np.arange(data.num_episodes) if episodes is None else np.asarray(episodes)
        self.indices = window_indices(data.episode_ends, self.episodes, horizon, n_obs_steps - 1, n_action_steps - 1)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        idx = self.indices[i]
        obs_idx = idx[: self.n_obs_steps]
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
