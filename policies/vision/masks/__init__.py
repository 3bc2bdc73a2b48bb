"""Attention patterns: which keys each head may see, and with what additive bias.

Every pattern answers one question, ``dense_bias(grid, num_prefix)``: a float tensor of
shape ``(heads, N, N)`` (``N = num_prefix + H*W``; prefix tokens such as CLS come first,
patches follow in raster order) holding ``0`` or a finite penalty where a key is visible and
``-inf`` where it is not, or ``None`` when nothing is masked (full attention).
Masks are additive: a 0 logit still receives softmax weight, which is the bug in the public
Fibottention code that multiplies logits by a 0/1 mask (``attention.mask_mode=multiplicative``
reproduces it as an ablation, in ``attention.py``).

Run ``python -m policies.vision.masks KIND --grid 14x14 --heads 12 --json`` to inspect one (``cli.py``).
"""
from __future__ import annotations

import math
from dataclasses import KW_ONLY, MISSING, dataclass, fields

import torch

PHI = (1.0 + math.sqrt(5.0)) / 2.0
# Per-layer seeds of the fixed random choices (prime strides, so layers never share a stream): the
# same in training and at evaluation, and part of what a checkpoint's masks are
FIB_SHUFFLE_SEED_STRIDE = 10_007  # Fibottention's head-to-row shuffle of layer l: seed stride * (l + 1)
BIGBIRD_RANDOM_SEED_STRIDE = 7919  # BigBird's random keys of layer l: seed stride * (l + 1)

# ------------------------------------------------------------------------------------------
# Fibottention (Rahimian et al., 2024)
# ------------------------------------------------------------------------------------------


def wythoff_row_start(i: int) -> tuple[int, int]:
    """First two entries (a, b) of row ``i`` (1-based) of the Wythoff array.

    Row 1 is 1, 2, 3, 5, 8, ...; row 2 is 4, 7, 11, ...; the rows partition the positive
    integers, which is what makes Fibottention's heads complementary.
    """
    if i < 1:
        raise ValueError(f"Wythoff rows are 1-based, got row {i}")
    # Exact integer arithmetic would need sqrt(5) in rationals; float64 is exact far beyond
    # any head count used here (errors appear only past ~1e15).
    lower = math.floor(i * PHI)
    return math.floor(lower * PHI), math.floor(lower * PHI * PHI)


def fibonacci_offsets(a: int, b: int, window: int) -> list[int]:
    """Generalized Fibonacci sequence a, b, a+b, ... with terms <= window (first always kept)."""
    seq = [a]
    while b <= window:
        seq.append(b)
        a, b = b, a + b
    return sorted(set(seq))


def default_w_max(num_patches: int) -> int:
    """Fibottention's widest head window when ``w_max`` is not given: N // 3 patch tokens."""
    return num_patches // 3


FIB_WINDOWS = ("paper", "robot")


def fibottention_head_offsets(
    num_patches: int, num_heads: int, *, modified: bool, w_min: int, w_max: int | None, windows: str
) -> list[list[int]]:
    """Offsets |p - q| each head i = 1..h may attend to, before the per-layer shuffle.

    ``windows="paper"`` (the paper's classification setting): window
    ``w_i = w_min + floor((w_max - w_min) / (h - 1) * (i - 1))``, ``w_max=None`` meaning ``N // 3``
    (the settings' defaults: ``attention.AttentionConfig``); the modified variant runs the
    recurrence two steps backwards, so low rows also see their neighbours (and head 1 its own token).

    ``windows="robot"`` reproduces the authors' robot-learning encoder (``exp.py`` of their public
    code): every head's window is the patch count N, and the modification adds the two local
    offsets ``i - 1`` and ``a - (i - 1)`` (``a`` the row's first Wythoff entry) for heads i > 1 only,
    so head 1 keeps no offset 0.
    """
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    if windows not in FIB_WINDOWS:
        raise ValueError(f"attention.windows={windows!r} is unknown; choose one of {', '.join(FIB_WINDOWS)}")
    if windows == "robot":
        heads = []
        for i in range(1, num_heads + 1):
            a, b = wythoff_row_start(i)
            offs = set(fibonacci_offsets(a, b, num_patches))
            if modified and i > 1:
                offs |= {i - 1, a - (i - 1)}
            heads.append(sorted(offs))
        return heads
    w_max = default_w_max(num_patches) if w_max is None else w_max
    w_max = max(w_max, w_min)
    step = (w_max - w_min) / (num_heads - 1) if num_heads > 1 else 0.0
    heads = []
    for i in range(1, num_heads + 1):
        window = w_min + math.floor(step * (i - 1))
        a, b = wythoff_row_start(i)
        if modified:
            a, b = a - (b - a), b - a
        heads.append(fibonacci_offsets(a, b, window))
    return heads


def layer_permutation(num_heads: int, layer: int) -> list[int]:
    """Deterministic per-layer assignment of Wythoff rows to heads (same in train and eval)."""
    gen = torch.Generator().manual_seed(FIB_SHUFFLE_SEED_STRIDE * (layer + 1))
    return torch.randperm(num_heads, generator=gen).tolist()


# ------------------------------------------------------------------------------------------
# LookHere (Fuller et al., NeurIPS 2024)
# ------------------------------------------------------------------------------------------

# Each direction is a closed-form test on (dx, dy) = key - query, y growing downward.
# Inclusive inequalities: the query always sees itself.
LOOKHERE_DIRECTIONS: dict[str, dict[str, callable]] = {
    "180": {
        "up": lambda dx, dy: dy <= 0,
        "down": lambda dx, dy: dy >= 0,
        "left": lambda dx, dy: dx <= 0,
        "right": lambda dx, dy: dx >= 0,
        "up-left": lambda dx, dy: dx + dy <= 0,
        "down-right": lambda dx, dy: dx + dy >= 0,
        "up-right": lambda dx, dy: dy <= dx,
        "down-left": lambda dx, dy: dy >= dx,
    },
    "90": {
        "up": lambda dx, dy: dy <= -dx.abs(),
        "down": lambda dx, dy: dy >= dx.abs(),
        "left": lambda dx, dy: dx <= -dy.abs(),
        "right": lambda dx, dy: dx >= dy.abs(),
        "up-left": lambda dx, dy: (dx <= 0) & (dy <= 0),
        "up-right": lambda dx, dy: (dx >= 0) & (dy <= 0),
        "down-left": lambda dx, dy: (dx <= 0) & (dy >= 0),
        "down-right": lambda dx, dy: (dx >= 0) & (dy >= 0),
    },
    "45": {
        "up-left": lambda dx, dy: (dy <= -dx.abs()) & (dx <= 0),
        "up-right": lambda dx, dy: (dy <= -dx.abs()) & (dx >= 0),
        "down-left": lambda dx, dy: (dy >= dx.abs()) & (dx <= 0),
        "down-right": lambda dx, dy: (dy >= dx.abs()) & (dx >= 0),
        "left-up": lambda dx, dy: (dx <= -dy.abs()) & (dy <= 0),
        "left-down": lambda dx, dy: (dx <= -dy.abs()) & (dy >= 0),
        "right-up": lambda dx, dy: (dx >= dy.abs()) & (dy <= 0),
        "right-down": lambda dx, dy: (dx >= dy.abs()) & (dy >= 0),
    },
}


def lookhere_head_plan(
    num_heads: int,
    variant: str,
    *,
    undirected_fraction: float,
    undirected_slope: float,
    undirected_slope_ratio: float,
    layer: int,
    rotate_directions: bool,
) -> list[tuple[str | None, float]]:
    """(direction or None, head slope) per head: directed heads first, then undirected.

    Directed heads cycle through the variant's eight directions with slope 1; undirected heads
    see everything with geometrically smaller slopes (``undirected_slope`` times powers of
    ``undirected_slope_ratio``: 1/2, 1/8, ... with ``AttentionConfig``'s defaults). With fewer than
    eight directed heads (a 4-head ViT has 3) every layer would look the same three ways and no
    head would ever look right; ``rotate_directions`` starts each layer where the previous one
    stopped, so the layers together cover all eight (the paper's 12 heads cover them per layer).
    """
    if variant not in LOOKHERE_DIRECTIONS:
        raise ValueError(f"unknown LookHere variant {variant!r}; known: {sorted(LOOKHERE_DIRECTIONS)}")
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    n_undirected = min(num_heads - 1, math.floor(num_heads * undirected_fraction + 0.5))
    n_directed = num_heads - n_undirected
    names = list(LOOKHERE_DIRECTIONS[variant])
    start = layer * n_directed if rotate_directions else 0
    plan: list[tuple[str | None, float]] = [(names[(start + i) % len(names)], 1.0) for i in range(n_directed)]
    plan += [(None, undirected_slope * undirected_slope_ratio**k) for k in range(n_undirected)]
    return plan


def lookhere_layer_slope(layer: int, depth: int, first: float, last: float) -> float:
    """s_layer falls linearly from ``first`` (layer 0) to ``last`` (layer depth-1)."""
    if depth <= 1:
        return first
    return first + (last - first) * layer / (depth - 1)


def patch_coords(grid: tuple[int, int], device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) of each patch in raster order, as float tensors of shape (H*W,)."""
    gh, gw = grid
    y, x = torch.meshgrid(torch.arange(gh, device=device), torch.arange(gw, device=device), indexing="ij")
    return x.reshape(-1).float(), y.reshape(-1).float()


# ------------------------------------------------------------------------------------------
# Pattern objects: one per (kind, layer), stateless apart from their configuration.
# ------------------------------------------------------------------------------------------


def _embed_patch_bias(patch_bias: torch.Tensor, num_prefix: int) -> torch.Tensor:
    """Pad a (heads, P, P) patch bias with prefix tokens that see and are seen by all, unpenalised."""
    heads, p, _ = patch_bias.shape
    n = num_prefix + p
    bias = patch_bias.new_zeros(heads, n, n)
    bias[:, num_prefix:, num_prefix:] = patch_bias
    return bias


def _ensure_visible(patch_bias: torch.Tensor, num_prefix: int) -> torch.Tensor:
    """Without prefix tokens a query row may see nothing (e.g. a Fibottention offset larger
    than the grid): let such rows see themselves so softmax never returns NaN."""
    if num_prefix > 0:
        return patch_bias
    empty = torch.isinf(patch_bias).all(dim=-1)  # (heads, P)
    if empty.any():
        diag = torch.diagonal(patch_bias, dim1=-2, dim2=-1)  # view into patch_bias
        diag[empty] = 0.0
    return patch_bias


@dataclass(frozen=True)
class FullPattern:
    num_heads: int
    kind: str = "full"
    uses_pos_embed: bool = True

    def dense_bias(self, grid, num_prefix, device=None):
        return None


# The pattern classes take every attention setting as a required keyword argument: their
# defaults are written once, in ``attention.AttentionConfig`` (build patterns with its
# ``pattern()``). ``layer`` and ``depth`` place the pattern in the network; they are not settings.


@dataclass(frozen=True)
class FibottentionPattern:
    num_heads: int
    _: KW_ONLY
    modified: bool
    w_min: int
    w_max: int | None  # None: N // 3
    shuffle: bool
    # None: offsets are distances along the flattened patch sequence of whatever grid comes in.
    # (rows, cols): keep the 2-D displacements those 1-D offsets mean on this grid (the training
    # grid) when the grid changes, since offset 10 is "one row down" only on a 10-wide grid.
    offset_grid: tuple[int, int] | None
    windows: str  # "paper" | "robot" (the authors' robot-learning code): see fibottention_head_offsets
    layer: int = 0
    kind: str = "fibottention"
    uses_pos_embed: bool = True

    def offsets(self, grid: tuple[int, int]) -> list[list[int]]:
        """Per-head offsets in head order (after this layer's shuffle)."""
        grid = self.offset_grid or grid
        rows = fibottention_head_offsets(
            grid[0] * grid[1], self.num_heads, modified=self.modified, w_min=self.w_min, w_max=self.w_max,
            windows=self.windows,
        )
        if not self.shuffle:
            return rows
        return [rows[j] for j in layer_permutation(self.num_heads, self.layer)]

    def dense_bias(self, grid, num_prefix, device=None):
        p = grid[0] * grid[1]
        patch = torch.full((self.num_heads, p, p), -math.inf, device=device)
        ref_grid = tuple(self.offset_grid or grid)  # the grid on which the 1-D offsets are read
        i0 = torch.arange(ref_grid[0] * ref_grid[1], device=device)
        dist0 = (i0[None, :] - i0[:, None]).abs()  # (P0, P0)
        remap = ref_grid != tuple(grid)
        if remap:  # every (dy, dx) a head's offsets produce on the offset grid is allowed on this grid
            span = (max(grid[0], ref_grid[0]), max(grid[1], ref_grid[1]))
            code = _displacement_code(grid, span, device)  # (P, P)
            ref = _displacement_code(ref_grid, span, device)  # (P0, P0)
        for h, offs in enumerate(self.offsets(grid)):
            allowed = torch.isin(dist0, torch.tensor(offs, device=device))  # (P0, P0)
            if remap:
                allowed = torch.isin(code, ref[allowed].unique())  # (P, P)
            patch[h].masked_fill_(allowed, 0.0)
        return _embed_patch_bias(_ensure_visible(patch, num_prefix), num_prefix)


def _displacement_code(grid: tuple[int, int], span: tuple[int, int], device=None) -> torch.Tensor:
    """(P, P) integer id of each query-to-key displacement (dy, dx) on ``grid``, unique for
    |dy| < span[0] and |dx| < span[1], so ids from two grids within the span compare."""
    xs, ys = (c.long() for c in patch_coords(grid, device))  # (P,), (P,)
    dy = ys[None, :] - ys[:, None] + span[0]  # (P, P), in (0, 2 * span[0])
    dx = xs[None, :] - xs[:, None] + span[1]  # (P, P), in (0, 2 * span[1])
    return dy * (2 * span[1] + 1) + dx


@dataclass(frozen=True)
class LookHerePattern:
    num_heads: int
    _: KW_ONLY
    variant: str
    global_slope: float
    undirected_fraction: float
    undirected_slope: float
    undirected_slope_ratio: float
    rotate_directions: bool
    first_layer_slope: float
    last_layer_slope: float
    layer: int = 0
    depth: int = 1
    kind: str = "lookhere"
    uses_pos_embed: bool = False  # the point of LookHere: position lives in the bias only

    def plan(self) -> list[tuple[str | None, float]]:
        return lookhere_head_plan(
            self.num_heads,
            self.variant,
            undirected_fraction=self.undirected_fraction,
            undirected_slope=self.undirected_slope,
            undirected_slope_ratio=self.undirected_slope_ratio,
            layer=self.layer,
            rotate_directions=self.rotate_directions,
        )

    def head_slopes(self) -> list[float]:
        """Total slope s_global * s_layer * s_head per head."""
        s_layer = lookhere_layer_slope(self.layer, self.depth, self.first_layer_slope, self.last_layer_slope)
        return [self.global_slope * s_layer * s for _, s in self.plan()]

    def bias_at(self, dx: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
        """The LookHere formula, the one place it is written: (heads, *dx.shape) bias of the
        key-minus-query displacements (dx, dy) (float tensors of any one shape): ``-slope *
        distance`` where the head's direction test passes, ``-inf`` where it fails. Both the dense
        bias below and the sparse path's per-displacement table (``sparse/lookhere.py``) call it,
        so their values are bit-identical."""
        dist = torch.sqrt(dx * dx + dy * dy)
        tests = LOOKHERE_DIRECTIONS[self.variant]
        heads = []
        for (direction, _), slope in zip(self.plan(), self.head_slopes()):
            bias = -slope * dist
            if direction is not None:
                bias = bias.masked_fill(~tests[direction](dx, dy), -math.inf)
            heads.append(bias)
        return torch.stack(heads)

    def dense_bias(self, grid, num_prefix, device=None):
        x, y = patch_coords(grid, device)  # (P,), (P,)
        dx = x[None, :] - x[:, None]  # (P, P): key minus query
        dy = y[None, :] - y[:, None]  # (P, P)
        return _embed_patch_bias(self.bias_at(dx, dy), num_prefix)  # (heads, N, N)


@dataclass(frozen=True)
class BigBirdPattern:
    """Local band + global prefix + seeded random keys (the baseline Fibottention compares to)."""

    num_heads: int
    _: KW_ONLY
    band: int
    random_per_row: int
    layer: int = 0
    kind: str = "bigbird"
    uses_pos_embed: bool = True

    def dense_bias(self, grid, num_prefix, device=None):
        p = grid[0] * grid[1]
        idx = torch.arange(p, device=device)
        allowed = (idx[None, :] - idx[:, None]).abs() <= self.band  # (P, P)
        allowed = allowed.expand(self.num_heads, p, p).clone()
        gen = torch.Generator().manual_seed(BIGBIRD_RANDOM_SEED_STRIDE * (self.layer + 1))
        rand = torch.randint(0, p, (self.num_heads, p, self.random_per_row), generator=gen).to(device)
        allowed.scatter_(-1, rand, True)
        patch = torch.zeros(self.num_heads, p, p, device=device).masked_fill_(~allowed, -math.inf)
        return _embed_patch_bias(patch, num_prefix)


PATTERNS = {"full": FullPattern, "fibottention": FibottentionPattern, "lookhere": LookHerePattern,
            "bigbird": BigBirdPattern}
KINDS = tuple(PATTERNS)


def settings_of(kind: str) -> tuple[str, ...]:
    """The attention settings ``kind`` owns: its pattern's required keyword fields (the rule above the
    pattern classes), so a new setting is owned by the kind whose pattern takes it, and nothing else says so."""
    return tuple(f.name for f in fields(PATTERNS[kind]) if f.kw_only and f.default is MISSING)


def make_pattern(kind: str, num_heads: int, layer: int = 0, depth: int = 1, **options):
    """Pattern for one layer. ``options`` are the attention config's fields for that kind."""
    if kind == "full":
        return FullPattern(num_heads)
    if kind == "fibottention":
        return FibottentionPattern(num_heads, layer=layer, **options)
    if kind == "lookhere":
        return LookHerePattern(num_heads, layer=layer, depth=depth, **options)
    if kind == "bigbird":
        return BigBirdPattern(num_heads, layer=layer, **options)
    raise ValueError(f"unknown attention kind {kind!r}; known kinds: {', '.join(KINDS)}")
