"""Which path runs: ``choose_impl`` (``impl="auto"``), ``can_run`` and ``sparse_attend``.

Dimension names: see the package docstring.
"""
from __future__ import annotations

import torch

from ..masks import FibottentionPattern, LookHerePattern
from .cache import AttentionCache
from .fibottention import fibottention_attend
from .lookhere import lookhere_attend

# Smallest token count N (prefix included) from which the sparse path is faster than the
# dense-bias path, per pattern kind and device type. Calibrated on CPU with
# benchmarks/attention.py (batch 8, 8 heads, head dim 32, forward+backward; see
# results/attention_benchmark/cpu.md). No GPU was available to calibrate CUDA: there the fused
# dense kernels are fast and the bias only hurts through memory, so the thresholds are set
# where the (heads, N, N) bias starts to cost hundreds of MB.
AUTO_MIN_TOKENS = {
    "fibottention": {"cpu": 120, "cuda": 4096},
    "lookhere": {"cpu": 576, "cuda": 4096},
}
_DEFAULT_DEVICE_RULE = "cuda"  # unknown device types (mps, xpu, ...) follow the CUDA rule


def choose_impl(pattern, n_tokens: int, device) -> str:
    """``"dense"`` or ``"sparse"`` for this pattern, token count and device (pure function)."""
    thresholds = AUTO_MIN_TOKENS.get(getattr(pattern, "kind", "full"))
    if thresholds is None:  # full and bigbird: nothing sparse to gain here
        return "dense"
    device_type = torch.device(device).type
    threshold = thresholds.get(device_type, thresholds[_DEFAULT_DEVICE_RULE])
    return "sparse" if int(n_tokens) >= threshold else "dense"


def can_run(pattern, grid: tuple[int, int], dropout_p: float = 0.0) -> bool:
    """Whether ``sparse_attend`` computes this call exactly: the pattern has a sparse algorithm,
    there is no attention dropout (the kernels have none), and Fibottention's offsets are read
    on this grid (the 2-D displacements of another ``offset_grid`` exist only as a dense bias)."""
    if dropout_p or not isinstance(pattern, (FibottentionPattern, LookHerePattern)):
        return False
    offset_grid = getattr(pattern, "offset_grid", None)
    return offset_grid is None or tuple(offset_grid) == tuple(grid)


def sparse_attend(q, k, v, pattern, grid, num_prefix: int, *, method: str | None = None, chunk_tokens: int | None = None,
                  cache: AttentionCache | None = None):
    """q, k, v: (B, heads, N, head_dim) -> (B, heads, N, head_dim), without an N x N bias.

    ``cache`` keeps the plans between calls (None: built for this call). Optional, for tests and
    benchmarks: ``method`` -- Fibottention ``"csr"`` | ``"loop"``, LookHere ``"flash"`` (CPU
    fused backward) | ``"recompute"`` (generic backward); default by device and size.
    ``chunk_tokens`` -- LookHere query-tile size in patches. Patterns that ``can_run`` refuses
    (full, bigbird, a remapped ``offset_grid``) raise: ``attention.attend`` runs them dense.
    """
    grid = (int(grid[0]), int(grid[1]))
    num_prefix = int(num_prefix)
    n_tokens = num_prefix + grid[0] * grid[1]
    if q.shape[-2] != n_tokens or k.shape[-2] != n_tokens or v.shape[-2] != n_tokens:
        raise ValueError(f"expected {n_tokens} tokens ({num_prefix} prefix + grid {grid[0]}x{grid[1]}), got q {tuple(q.shape)}")
    if q.shape[1] != pattern.num_heads:
        raise ValueError(f"pattern has {pattern.num_heads} heads but q has {q.shape[1]}")
    if not can_run(pattern, grid):
        raise ValueError(f"no sparse algorithm for {pattern} on grid {grid}; attention.attend uses the dense path for it")
    if isinstance(pattern, FibottentionPattern):
        return fibottention_attend(q, k, v, pattern, grid, num_prefix, method=method, cache=cache)
    return lookhere_attend(q, k, v, pattern, grid, num_prefix, method=method, chunk_tokens=chunk_tokens, cache=cache)
