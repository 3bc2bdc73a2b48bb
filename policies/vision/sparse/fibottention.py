"""Fibottention without the N x N bias: offsets -> slots, and the choice of kernel.

A head sees the prefix keys and, among the patches, only those on a few diagonals
``key = query +- offset`` (the prefix *queries* see everything: ``prefix.py``). ``fib_plan``
turns a head's offsets into *slots*; the kernels walk them:

* ``fibottention_csr`` (CPU, from ``CSR_MIN_PATCHES`` patches): the visible keys of each query
  as fixed-width rows, sampled matmul + embedding-bag kernels.
* ``fibottention_loop`` (any device, small grids): one shifted slice view per slot.

Dimension names: see the package docstring.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

import torch

from .cache import AttentionCache
from .fibottention_csr import FibCsrFn, csr_rows
from .fibottention_loop import FibLoopFn

# On CPU the row-sparse kernels (sampled matmul + embedding-bag, one call per batch element and
# head) win from this many patches on; below it the per-slot loop has less call overhead
# (crossover measured at 13x13 patches, batch 8, 8 heads, head dim 32).
CSR_MIN_PATCHES = 160


class Slot(NamedTuple):
    """One diagonal of a head's P x P mask: patch queries p in [start, stop) see patch p + shift."""

    shift: int  # signed offset: +o (key after the query), -o (key before it), 0 (the query itself)
    start: int
    stop: int


class FibPlan(NamedTuple):
    num_patches: int  # P
    slots: tuple[tuple[Slot, ...], ...]  # per head, in head order


@lru_cache(maxsize=512)  # ints only, no tensors: safe to share between models
def fib_plan(pattern, grid: tuple[int, int], num_prefix: int) -> FibPlan:
    """The slots of every head of a ``FibottentionPattern`` on ``grid``."""
    num_patches = grid[0] * grid[1]
    heads = tuple(_head_slots(offsets, num_patches, num_prefix) for offsets in pattern.offsets(grid))
    return FibPlan(num_patches, heads)


def _head_slots(offsets: list[int], num_patches: int, num_prefix: int) -> tuple[Slot, ...]:
    # The dense reference allows |key - query| in offsets: offsets outside [0, P) never match.
    used = sorted({int(o) for o in offsets if 0 <= o < num_patches})
    slots = []
    for offset in used:
        if offset == 0:
            slots.append(Slot(0, 0, num_patches))
        else:
            slots.append(Slot(offset, 0, num_patches - offset))
            slots.append(Slot(-offset, offset, num_patches))
    if num_prefix == 0 and 0 not in used:
        # Without prefix keys a query row may see nothing; like masks._ensure_visible, such rows
        # see themselves. Row p sees nothing iff p >= P - o and p < o for every offset o: one
        # contiguous range, set by the smallest offset.
        smallest = used[0] if used else num_patches
        start, stop = max(0, num_patches - smallest), min(num_patches, smallest)
        if start < stop:
            slots.append(Slot(0, start, stop))
    return tuple(slots)


def fibottention_attend(q, k, v, pattern, grid, num_prefix, method=None, cache: AttentionCache | None = None):
    """q, k, v: (B, heads, N, head_dim) -> (B, heads, N, head_dim).

    ``method``: ``"csr"`` (CPU float32/float64: fused sampled-matmul + embedding-bag kernels) or
    ``"loop"`` (any device: one shifted slice view per slot); None: ``csr`` on CPU from
    ``CSR_MIN_PATCHES`` patches on, else ``loop``."""
    grid = (int(grid[0]), int(grid[1]))
    plan = fib_plan(pattern, grid, num_prefix)
    scale = 1.0 / math.sqrt(q.shape[-1])
    csr_ok = q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64)  # sampled_addmm's dtypes
    if method is None:
        method = "csr" if csr_ok and plan.num_patches >= CSR_MIN_PATCHES else "loop"
    if method == "csr" and not csr_ok:
        raise ValueError(f"Fibottention method 'csr' needs float32/float64 CPU tensors, got {q.dtype} on {q.device}")
    if method == "loop":
        return FibLoopFn.apply(q, k, v, plan, num_prefix, scale)
    if method == "csr":
        cache = AttentionCache() if cache is None else cache
        key = ("fibottention-csr", pattern, grid, num_prefix)
        rows = cache.get(key, q.device, lambda: csr_rows(plan, num_prefix, q.device))
        return FibCsrFn.apply(q, k, v, rows, num_prefix, scale)
    raise ValueError(f"unknown Fibottention sparse method {method!r}; use 'csr' or 'loop'")
