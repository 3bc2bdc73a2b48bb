"""One attention module for every pattern: qkv projection, then SDPA with an additive bias.

The pattern (full, Fibottention, LookHere, BigBird) only decides the bias; the arithmetic is
shared, so the baseline and the sparse methods differ in nothing else. ``impl`` picks how the
pattern is applied: ``dense`` materialises the (heads, N, N) bias once per grid and runs the
fused SDPA kernel, ``sparse`` never builds N x N (see the ``sparse`` package), ``auto`` picks the
faster.

What is built for a grid (the dense bias, the sparse plans) is owned by the ``Attention`` module
that uses it, in its ``cache`` (an ``AttentionCache``): freed with the model, rebuilt after
``.to()``, emptied by ``clear_attention_cache()``; never a process-wide cache. It holds no
parameters or buffers, so checkpoints (state_dict keys) do not see it.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .masks import KINDS, LOOKHERE_DIRECTIONS, make_pattern, settings_of
from .sparse import AttentionCache, can_run, choose_impl, sparse_attend

IMPLS = ("dense", "sparse", "auto")
SPARSE_KINDS = ("fibottention", "lookhere")  # the patterns sparse.can_run computes
MASK_MODES = ("additive", "multiplicative")


@dataclass
class AttentionConfig:
    """The ``attention`` config group. Only the fields of the chosen ``kind`` are used.

    The one place the attention settings' defaults are written: the pattern classes and
    functions of ``masks.py`` take them as required arguments, through ``pattern()``."""

    kind: str = "full"  # full | fibottention | lookhere | bigbird
    impl: str = "dense"  # dense | sparse | auto
    # additive: masked logits are -inf (the paper's method). multiplicative: logits x 0/1 mask before
    # the softmax, as the public Fibottention code does, so masked pairs keep weight exp(0): an
    # ablation of the sparsity (dense path only; fibottention and bigbird, whose masks are 0/1)
    mask_mode: str = "additive"
    # Fibottention
    modified: bool = True  # the variant the paper uses for video and robot learning
    w_min: int = 5
    w_max: int | None = None  # None: N // 3
    shuffle: bool = True
    offset_grid: list[int] | None = None  # (rows, cols) whose 2-D displacements the offsets keep; None: 1-D
    windows: str = "paper"  # paper (per-head windows) | robot (window N for every head, as the authors' robot code)
    # LookHere
    variant: str = "90"  # 180 | 90 | 45 (field of view in degrees)
    global_slope: float = 1.0
    undirected_fraction: float = 1 / 3
    undirected_slope: float = 0.5
    undirected_slope_ratio: float = 0.25
    rotate_directions: bool = False  # each layer's directed heads continue where the last layer's stopped
    # s_layer falls linearly from the first layer's slope to the last's (the paper's 1.5 -> 0.5)
    first_layer_slope: float = 1.5
    last_layer_slope: float = 0.5
    # BigBird
    band: int = 3
    random_per_row: int = 3

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"attention.kind={self.kind!r} is unknown; known kinds: {', '.join(KINDS)}")
        if self.impl not in IMPLS:
            raise ValueError(f"attention.impl={self.impl!r} is unknown; choose one of {', '.join(IMPLS)}")
        if self.impl == "sparse" and self.kind not in SPARSE_KINDS:  # it would run dense while recorded as sparse
            raise ValueError(f"attention.impl=sparse: {self.kind} attention has no sparse path (only "
                             f"{', '.join(SPARSE_KINDS)}); use attention.impl=dense or auto")
        if self.mask_mode not in MASK_MODES:
            raise ValueError(f"attention.mask_mode={self.mask_mode!r} is unknown; choose one of {', '.join(MASK_MODES)}")
        if self.mask_mode == "multiplicative":
            if self.kind not in ("fibottention", "bigbird"):
                raise ValueError(f"attention.mask_mode=multiplicative needs a 0/1 mask (fibottention, bigbird), not "
                                 f"{self.kind!r}; drop attention.mask_mode=")
            if self.impl == "sparse":
                raise ValueError("attention.mask_mode=multiplicative computes every pair: use attention.impl=dense")
        self.variant = str(self.variant)
        if self.variant not in LOOKHERE_DIRECTIONS:
            raise ValueError(f"attention.variant={self.variant!r} is unknown; choose one of {sorted(LOOKHERE_DIRECTIONS)}")
        if self.w_min < 0:
            raise ValueError(f"attention.w_min must be >= 0, got {self.w_min}")
        if self.w_max is not None and self.w_max < self.w_min:
            raise ValueError(f"attention.w_max ({self.w_max}) must be >= attention.w_min ({self.w_min})")
        if self.offset_grid is not None:
            if len(self.offset_grid) != 2 or min(self.offset_grid) < 1:
                raise ValueError(f"attention.offset_grid must be [rows, cols] of positive ints, got {self.offset_grid}")
            self.offset_grid = [int(v) for v in self.offset_grid]
        if self.global_slope < 0:
            raise ValueError(f"attention.global_slope must be >= 0, got {self.global_slope}")
        if not 0 <= self.undirected_fraction < 1:
            raise ValueError(f"attention.undirected_fraction must be in [0, 1), got {self.undirected_fraction}")

    def pattern_options(self) -> dict:
        """The settings of this ``kind`` (``masks.settings_of``), as ``masks.make_pattern`` takes them
        (lists as tuples: a pattern is hashable, part of the cache keys)."""
        values = {name: getattr(self, name) for name in settings_of(self.kind)}
        return {name: tuple(v) if isinstance(v, list) else v for name, v in values.items()}

    def pattern(self, num_heads: int, layer: int, depth: int):
        """The frozen pattern of one layer (hashable: it is part of the cache keys)."""
        return make_pattern(self.kind, num_heads, layer, depth, **self.pattern_options())

    def to_dict(self) -> dict:
        return asdict(self)


def naive_attention(q, k, v, bias=None):
    """Reference softmax(q k^T / sqrt(d) + bias) v, used by tests against the fused path."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, heads, N, N)
    if bias is not None:
        scores = scores + bias
    return scores.softmax(dim=-1) @ v  # (B, heads, N, head_dim)


def dense_bias(pattern, grid: tuple[int, int], num_prefix: int, device, dtype=torch.float32, cache=None):
    """(1, heads, N, N) additive bias in ``dtype`` on ``device`` (None for full attention), built
    once per ``cache`` (an ``AttentionCache``; None: built for this call only). The bias is
    computed in float32 and then cast, as SDPA needs it in q's dtype."""

    def build():
        bias = pattern.dense_bias(grid, num_prefix, device)  # (heads, N, N) float32
        return None if bias is None else bias.to(dtype).unsqueeze(0)  # broadcast over the batch

    cache = AttentionCache() if cache is None else cache
    return cache.get(("dense", pattern, grid, num_prefix, dtype), device, build)


def multiplicative_attention(q, k, v, bias, dropout_p: float = 0.0):
    """softmax((q k^T / sqrt(d)) * mask) v with mask = 1 where ``bias`` is finite, 0 elsewhere: the
    public Fibottention code's masking. A masked pair's logit becomes 0, so it still gets weight."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, heads, N, N)
    if bias is not None:
        scores = scores * torch.isfinite(bias).to(scores.dtype)
    weights = F.dropout(scores.softmax(dim=-1), p=dropout_p)
    return weights @ v  # (B, heads, N, head_dim)


def attend(q, k, v, pattern, grid: tuple[int, int], num_prefix: int, impl: str = "dense", dropout_p: float = 0.0,
           cache: AttentionCache | None = None, mask_mode: str = "additive"):
    """q, k, v: (B, heads, N, head_dim) -> (B, heads, N, head_dim).

    ``cache`` keeps the bias / sparse plans between calls (``Attention`` passes its own); None
    builds them for this call only. ``mask_mode="multiplicative"`` is the ablation above."""
    grid = (int(grid[0]), int(grid[1]))
    if mask_mode == "multiplicative":
        return multiplicative_attention(q, k, v, dense_bias(pattern, grid, num_prefix, q.device, q.dtype, cache), dropout_p)
    if impl == "auto":
        impl = choose_impl(pattern, num_prefix + grid[0] * grid[1], q.device)
    if impl == "sparse" and can_run(pattern, grid, dropout_p):
        return sparse_attend(q, k, v, pattern, grid, num_prefix, cache=cache)
    bias = dense_bias(pattern, grid, num_prefix, q.device, q.dtype, cache)  # (1, heads, N, N) | None
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int, pattern, impl: str = "dense", qkv_bias: bool = True, attn_drop: float = 0.0,
                 mask_mode: str = "additive"):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embedding dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.pattern = pattern
        self.impl = impl
        self.mask_mode = mask_mode
        self.attn_drop = attn_drop
        self.capture = False  # analysis hook: keep this call's q, k and per-head outputs
        self.captured: dict | None = None
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.cache = AttentionCache()  # bias / sparse plans per (grid, num_prefix); see the module doc

    def _apply(self, fn, recurse=True):
        # .to(), .cuda(), .double(), ... go through here: what the cache holds was built for the
        # old device and dtype, so drop it (freeing it now) and let the next call rebuild it.
        self.cache.clear()
        return super()._apply(fn, recurse)

    def clear_attention_cache(self) -> None:
        """Free the biases and sparse plans built so far (they are rebuilt when next needed)."""
        self.cache.clear()

    def dense_bias(self, grid: tuple[int, int], num_prefix: int, device, dtype=torch.float32):
        """This layer's (1, heads, N, N) bias (None: full attention), from the module's cache."""
        return dense_bias(self.pattern, (int(grid[0]), int(grid[1])), int(num_prefix), torch.device(device), dtype, self.cache)

    def forward(self, x: torch.Tensor, grid: tuple[int, int], num_prefix: int) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim)  # (B, N, 3, heads, head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, heads, N, head_dim)
        drop = self.attn_drop if self.training else 0.0
        out = attend(q, k, v, self.pattern, grid, num_prefix, self.impl, drop, self.cache, self.mask_mode)  # (B, heads, N, head_dim)
        if self.capture:
            self.captured = {"q": q.detach(), "k": k.detach(), "out": out.detach(), "grid": grid, "num_prefix": num_prefix}
        out = out.transpose(1, 2).reshape(B, N, C)  # (B, N, C)
        return self.proj(out)
