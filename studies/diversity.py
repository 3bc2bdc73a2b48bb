"""Head diversity: how different are the heads of an encoder (both papers argue diverse heads help)?

Score per layer = 1 - mean pairwise linear CKA between the heads' outputs (every token of every image):
identical heads give 0, orthogonal ones approach 1. ``python -m studies.feature_shift`` reports it per block.
"""
from __future__ import annotations

import torch


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """x, y: (samples, features). Kornblith et al. (2019), linear kernel."""
    x = x - x.mean(0, keepdim=True)
    y = y - y.mean(0, keepdim=True)
    num = (y.T @ x).pow(2).sum()
    den = (x.T @ x).pow(2).sum().sqrt() * (y.T @ y).pow(2).sum().sqrt()
    return float(num / den) if den > 0 else 1.0


def head_diversity(per_head: torch.Tensor) -> dict:
    """per_head: (B, heads, N, head_dim) -> {"diversity", "mean_cka", "cka": heads x heads}."""
    b, h, n, d = per_head.shape
    feats = [per_head[:, i].reshape(b * n, d).double() for i in range(h)]
    cka = [[1.0 if i == j else linear_cka(feats[i], feats[j]) for j in range(h)] for i in range(h)]
    off = [cka[i][j] for i in range(h) for j in range(h) if i != j]
    mean = sum(off) / len(off) if off else 1.0
    return {"diversity": 1.0 - mean, "mean_cka": mean, "cka": cka}
