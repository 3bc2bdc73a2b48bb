"""Min/max normalization to [-1, 1], kept as buffers so it travels inside the checkpoint."""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

EPS = 1e-4  # dimensions that never move in the data map to 0 instead of dividing by ~0


class Normalizer(nn.Module):
    def __init__(self, dims: dict[str, int]):
        super().__init__()
        self.keys = list(dims)
        for key, d in dims.items():
            # NaN until statistics are set: using an unfitted normalizer fails loudly
            self.register_buffer(f"{key}__min", torch.full((d,), math.nan))
            self.register_buffer(f"{key}__max", torch.full((d,), math.nan))

    def set_stats(self, stats: dict[str, dict[str, np.ndarray]]) -> None:
        for key in self.keys:
            if key not in stats:
                raise KeyError(f"normalization statistics lack {key!r}; have {sorted(stats)}")
            getattr(self, f"{key}__min").copy_(torch.as_tensor(np.asarray(stats[key]["min"]).reshape(-1)))
            getattr(self, f"{key}__max").copy_(torch.as_tensor(np.asarray(stats[key]["max"]).reshape(-1)))

    def _centre_scale(self, key: str):
        lo, hi = getattr(self, f"{key}__min"), getattr(self, f"{key}__max")
        if torch.isnan(lo).any():
            raise RuntimeError(f"normalization statistics for {key!r} were never set (call set_stats or load a checkpoint)")
        return (hi + lo) / 2, ((hi - lo) / 2).clamp(min=EPS)

    def normalize(self, key: str, x: torch.Tensor) -> torch.Tensor:
        centre, scale = self._centre_scale(key)
        return (x - centre) / scale

    def unnormalize(self, key: str, x: torch.Tensor) -> torch.Tensor:
        centre, scale = self._centre_scale(key)
        return x * scale + centre
