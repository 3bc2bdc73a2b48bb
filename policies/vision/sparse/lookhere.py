"""LookHere without the N x N bias: query tiles, fused SDPA per tile and run of heads.

The bias of a query/key pair depends only on their displacement (dy, dx), so a
(heads, 2H-1, 2W-1) *table* holds every value (O(N)); it comes from
``LookHerePattern.bias_at``, the same formula as the dense bias, so the values are
bit-identical. Queries are processed in rectangular tiles (``LOOKHERE_TILE_TOKENS`` patches);
for each tile, runs of adjacent heads that see the same keys share one call of the fused SDPA
kernel on (tile queries x visible keys), with the tile's bias gathered from the table. For
directed heads the key patches that no query of the tile can see are skipped (a box-OR of the
direction mask over the tile, via an integral image); in large tiles the directed heads run per
sub-tile (``LOOKHERE_SUBTILE_TOKENS`` queries), each with only the keys it can see, while the
undirected heads (which see every key) keep one call per tile. On CPU the forward keeps the log-sum-exp
and the backward calls the fused flash-attention backward per tile (bias rebuilt, never
stored); on other devices the backward recomputes each tile under autograd. Memory:
O(heads * tile * N) for one tile's bias. The prefix query rows: ``prefix.py``.
(``torch.nn.attention.flex_attention`` is not an option on CPU in torch 2.14: it has no CPU
backward, and its compiled forward was slower than the dense-bias SDPA here.)
Dimension names: see the package docstring.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .cache import AttentionCache
from .prefix import prefix_backward, prefix_forward

# Queries are processed in rectangular tiles of about this many patches; one fused-kernel call
# sees one tile, one run of heads and the keys that run can see from the tile.
LOOKHERE_TILE_TOKENS = 256
# Directed heads of a tile of at least 2x this many queries are processed in sub-tiles of about
# this many queries, each with only the keys it can see: at N = 4096 the directed heads' work
# drops by a third (LH-45) / a fifth (LH-90). Smaller tiles (the policy's 10x10 grid in one tile
# of 100) are left whole: there a second kernel call costs more than the keys it skips.
LOOKHERE_SUBTILE_TOKENS = 64


class HeadRun(NamedTuple):
    """Heads [first, stop) that see the same key patches from one tile (or one sub-tile of it):
    one kernel call."""

    first: int
    stop: int
    key_tok: torch.Tensor | None  # (L,) long: prefix tokens, then the visible patches' tokens; None: all N
    key_code: torch.Tensor  # (L - num_prefix,) int32: table code of each key patch (every patch if key_tok is None)
    q_tok: torch.Tensor | None = None  # (C',) long: the sub-tile's queries; None: the whole tile's
    q_code: torch.Tensor | None = None  # (C',) int32, like Tile.q_code; None: the tile's


class Tile(NamedTuple):
    """A rectangle of query patches. A *code* is a patch's (2W-1)-strided table coordinate,
    shifted for queries so that the table index of (query, key) is ``key_code - q_code``."""

    q_tok: torch.Tensor  # (C,) long: token of each query
    q_code: torch.Tensor  # (C,) int32
    runs: tuple[HeadRun, ...]


class LookHerePlan(NamedTuple):
    table: torch.Tensor  # (heads, (2H-1) * (2W-1)) bias of each displacement, (dy, dx) row-major
    tiles: tuple[Tile, ...]


def displacement_table(pattern, grid: tuple[int, int]) -> torch.Tensor:
    """(heads, 2H-1, 2W-1) bias of every displacement (dy, dx) = key - query, on the CPU."""
    gh, gw = grid
    dy = torch.arange(-(gh - 1), gh).float()[:, None].expand(2 * gh - 1, 2 * gw - 1)  # (2H-1, 2W-1)
    dx = torch.arange(-(gw - 1), gw).float()[None, :].expand(2 * gh - 1, 2 * gw - 1)  # (2H-1, 2W-1)
    return pattern.bias_at(dx, dy)


def _tile_shape(grid: tuple[int, int], tile_tokens: int) -> tuple[int, int]:
    """(rows, cols) of a tile of about ``tile_tokens`` patches, as square as the grid allows."""
    gh, gw = grid
    cols = min(gw, max(1, math.isqrt(max(1, tile_tokens))))
    rows = min(gh, max(1, tile_tokens // cols))
    # as many tiles as that, but of equal size: a 20x20 grid in 10x10 tiles, not 16x16 + 16x4 + ...
    cols = -(-gw // -(-gw // cols))
    rows = -(-gh // -(-gh // rows))
    return rows, cols


def default_subtile(tile_tokens: int) -> int | None:
    """Sub-tile size of the directed heads for query tiles of ``tile_tokens`` (None: none)."""
    return LOOKHERE_SUBTILE_TOKENS if tile_tokens >= 2 * LOOKHERE_SUBTILE_TOKENS else None


def lookhere_plan(pattern, grid: tuple[int, int], tile_tokens: int, num_prefix: int, device,
                  subtile_tokens: int | None = None) -> LookHerePlan:
    """The table and the query tiles of about ``tile_tokens`` patches on ``device``. For each
    tile, adjacent heads that see the same key patches from it share one run; a key patch is
    kept when some query of the tile sees it, so fully masked keys are never touched.
    ``subtile_tokens``: a directed head (one whose table has masked displacements) of a tile
    with at least twice as many queries gets one run per sub-tile of about that many queries,
    with the keys the sub-tile sees (None: no sub-tiles)."""
    gh, gw = grid
    table = displacement_table(pattern, grid)  # (heads, 2H-1, 2W-1)
    integral = torch.zeros(table.shape[0], 2 * gh, 2 * gw, dtype=torch.long)  # (heads, 2H, 2W)
    integral[:, 1:, 1:] = torch.isfinite(table).long().cumsum(1).cumsum(2)
    tile_rows, tile_cols = _tile_shape(grid, tile_tokens)
    tiles = tuple(
        _tile(integral, grid, (r0, min(gh, r0 + tile_rows)), (c0, min(gw, c0 + tile_cols)), num_prefix, device,
              subtile_tokens)
        for r0 in range(0, gh, tile_rows)
        for c0 in range(0, gw, tile_cols)
    )
    return LookHerePlan(table.reshape(table.shape[0], -1).to(device), tiles)  # table: (heads, (2H-1) * (2W-1))


def _seen_from_tile(integral, grid, rows: tuple[int, int], cols: tuple[int, int]) -> torch.Tensor:
    """(heads, P) bool: the key patch is visible from at least one query of the tile
    (query patch rows [rows[0], rows[1]), columns [cols[0], cols[1]))."""
    gh, gw = grid
    last_row, last_col = rows[1] - 1, cols[1] - 1
    ky = torch.arange(gh)[:, None]  # (H, 1)
    kx = torch.arange(gw)[None, :]  # (1, W)
    # key (y, x) is visible from the tile iff the mask has a hit in table rows
    # [y - last_row, y - rows[0]] + H - 1 and columns [x - last_col, x - cols[0]] + W - 1:
    # a box sum of the integral image (whose index is one past the table's)
    ya, yb = ky - last_row + gh - 1, ky - rows[0] + gh  # (H, 1)
    xa, xb = kx - last_col + gw - 1, kx - cols[0] + gw  # (1, W)
    hits = integral[:, yb, xb] - integral[:, ya, xb] - integral[:, yb, xa] + integral[:, ya, xa]  # (heads, H, W)
    return (hits > 0).reshape(hits.shape[0], -1)  # (heads, P)


def _queries(grid, rows, cols, num_prefix: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(C,) tokens and (C,) table codes of the query patches rows x cols, raster order."""
    gh, gw = grid
    qy, qx = torch.meshgrid(torch.arange(*rows), torch.arange(*cols), indexing="ij")  # (tile rows, tile cols)
    q_tok = (num_prefix + qy * gw + qx).reshape(-1)  # (C,)
    q_code = ((qy - (gh - 1)) * (2 * gw - 1) + qx - (gw - 1)).reshape(-1)  # (C,)
    return q_tok, q_code


def _tile(integral, grid, rows, cols, num_prefix: int, device, subtile_tokens: int | None = None) -> Tile:
    q_tok, q_code = _queries(grid, rows, cols, num_prefix)  # (C,), (C,)
    seen = _seen_from_tile(integral, grid, rows, cols)  # (heads, P)
    # undirected heads: every query sees every key (the last integral entry counts the table)
    everything = integral[:, -1, -1] == integral.shape[1] * integral.shape[2] - integral.shape[1] - integral.shape[2] + 1
    if subtile_tokens is None or q_tok.numel() < 2 * subtile_tokens or bool(everything.all()):
        return Tile(q_tok.to(device), q_code.to(device=device, dtype=torch.int32), _head_runs(seen, grid, num_prefix, device))
    # undirected heads keep one run over the whole tile; directed ones get one per sub-tile
    heads = torch.arange(seen.shape[0])
    runs = list(_head_runs(seen, grid, num_prefix, device, heads[everything]))
    sub_rows, sub_cols = _tile_shape((rows[1] - rows[0], cols[1] - cols[0]), subtile_tokens)
    for r0 in range(rows[0], rows[1], sub_rows):
        for c0 in range(cols[0], cols[1], sub_cols):
            sub = (r0, min(rows[1], r0 + sub_rows)), (c0, min(cols[1], c0 + sub_cols))
            sub_tok, sub_code = _queries(grid, *sub, num_prefix)
            sub_seen = _seen_from_tile(integral, grid, *sub)  # (heads, P)
            runs.extend(run._replace(q_tok=sub_tok.to(device), q_code=sub_code.to(device=device, dtype=torch.int32))
                        for run in _head_runs(sub_seen, grid, num_prefix, device, heads[~everything]))
    return Tile(q_tok.to(device), q_code.to(device=device, dtype=torch.int32), tuple(runs))


def _head_runs(seen: torch.Tensor, grid, num_prefix: int, device, heads: torch.Tensor | None = None) -> tuple[HeadRun, ...]:
    """Group adjacent heads whose visible key patches (rows of ``seen``, (heads, P)) are equal;
    ``heads``: only these (ascending; None: all), and only consecutive ones share a run."""
    gh, gw = grid
    patch_code = (torch.arange(gh)[:, None] * (2 * gw - 1) + torch.arange(gw)[None, :]).reshape(-1)  # (P,)
    groups: list[list] = []  # [first, stop, visible patches (L,) or None for all]
    for h in range(seen.shape[0]) if heads is None else heads.tolist():
        patches = None if bool(seen[h].all()) else seen[h].nonzero().flatten()
        if groups and groups[-1][1] == h and _same(groups[-1][2], patches):
            groups[-1][1] = h + 1
        else:
            groups.append([h, h + 1, patches])
    prefix = torch.arange(num_prefix)
    runs = []
    for first, stop, patches in groups:
        key_tok = None if patches is None else torch.cat([prefix, num_prefix + patches]).to(device)  # (L,)
        key_code = patch_code if patches is None else patch_code[patches]
        runs.append(HeadRun(first, stop, key_tok, key_code.to(device=device, dtype=torch.int32)))
    return tuple(runs)


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))


def _tile_bias(table, first: int, stop: int, q_code, key_code, num_prefix: int, dtype):
    """(1, stop - first, C, num_prefix + L) bias between a tile's queries and its keys (prefix keys: 0)."""
    index = key_code[None, :] - q_code[:, None]  # (C, L) into the flattened (dy, dx) table
    bias = table[first:stop].index_select(1, index.reshape(-1))  # (run heads, C * L)
    bias = bias.reshape(stop - first, q_code.numel(), key_code.numel())  # (run heads, C, L)
    if num_prefix:
        prefix_bias = bias.new_zeros(stop - first, q_code.numel(), num_prefix)  # (run heads, C, num_prefix)
        bias = torch.cat([prefix_bias, bias], dim=-1)  # (run heads, C, num_prefix + L)
    return bias.to(dtype).unsqueeze(0)


def _take(x, first: int, stop: int, tok):
    """Tokens ``tok`` (None: all) of heads [first, stop) of x (B, heads, N, ...): (B, run heads, len, ...)."""
    x = x[:, first:stop]
    return x if tok is None else x.index_select(2, tok)


def _flash_cpu_available(q) -> bool:
    return q.device.type == "cpu" and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward")


def lookhere_attend(q, k, v, pattern, grid, num_prefix, method=None, chunk_tokens=None, cache: AttentionCache | None = None,
                    subtile_tokens: int | None | str = "default"):
    """q, k, v: (B, heads, N, head_dim) -> (B, heads, N, head_dim).

    ``method``: ``"flash"`` (CPU: fused flash-attention backward) or ``"recompute"`` (any device:
    each tile recomputed under autograd); None: ``flash`` where available. ``chunk_tokens``: the
    query-tile size in patches (default ``LOOKHERE_TILE_TOKENS``). ``subtile_tokens``: the
    directed heads' sub-tile size (``"default"``: ``default_subtile(tile size)``; None: none)."""
    tile_tokens = int(chunk_tokens or LOOKHERE_TILE_TOKENS)
    subtile = default_subtile(tile_tokens) if subtile_tokens == "default" else subtile_tokens
    if method is None:
        method = "flash" if _flash_cpu_available(q) else "recompute"
    if method not in ("flash", "recompute"):
        raise ValueError(f"unknown LookHere sparse method {method!r}; use 'flash' or 'recompute'")
    if method == "flash" and not _flash_cpu_available(q):
        raise ValueError("LookHere method 'flash' needs CPU tensors (fused CPU flash-attention backward)")
    grid = (int(grid[0]), int(grid[1]))
    cache = AttentionCache() if cache is None else cache
    key = ("lookhere", pattern, grid, num_prefix, tile_tokens, subtile)
    plan = cache.get(key, q.device, lambda: lookhere_plan(pattern, grid, tile_tokens, num_prefix, q.device, subtile))
    scale = 1.0 / math.sqrt(q.shape[-1])
    return LookHereTileFn.apply(q, k, v, plan, num_prefix, scale, method == "flash")


def _queries_of(tile: Tile, run: HeadRun):
    """What holds the run's queries (``q_tok``, ``q_code``): its sub-tile, or else the tile."""
    return tile if run.q_tok is None else run


def _run_forward(q, k, v, table, tile: Tile, run: HeadRun, num_prefix: int, scale: float, out, lse) -> None:
    """One kernel call: the tile's queries of heads [run.first, run.stop) into ``out`` (and,
    with the flash kernel, their log-sum-exp into ``lse``; None: plain SDPA)."""
    q_run = _take(q, run.first, run.stop, tile.q_tok)  # (B, run heads, C, head_dim)
    k_run = _take(k, run.first, run.stop, run.key_tok)  # (B, run heads, L, head_dim)
    v_run = _take(v, run.first, run.stop, run.key_tok)  # (B, run heads, L, head_dim)
    bias = _tile_bias(table, run.first, run.stop, tile.q_code, run.key_code, num_prefix, q.dtype)  # (1, run heads, C, L)
    if lse is None:
        o_run = F.scaled_dot_product_attention(q_run, k_run, v_run, attn_mask=bias, scale=scale)
    else:
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        o_run, lse_run = flash(q_run, k_run, v_run, attn_mask=bias, scale=scale)  # (B, run heads, C, head_dim), (B, run heads, C)
        lse[:, run.first : run.stop].index_copy_(2, tile.q_tok, lse_run)
    out[:, run.first : run.stop].index_copy_(2, tile.q_tok, o_run)


def _head_grads(tensors, h: int, tile: Tile, run: HeadRun, bias, scale: float):
    """(dq, dk, dv) of head h on one tile: (B, 1, C, head_dim), (B, 1, L, head_dim) x 2."""
    q, k, v, grad_out, out, lse = tensors
    q_h, g_h = _take(q, h, h + 1, tile.q_tok), _take(grad_out, h, h + 1, tile.q_tok).contiguous()  # (B, 1, C, head_dim)
    k_h, v_h = _take(k, h, h + 1, run.key_tok), _take(v, h, h + 1, run.key_tok)  # (B, 1, L, head_dim)
    if lse is not None:
        o_h, lse_h = _take(out, h, h + 1, tile.q_tok), _take(lse, h, h + 1, tile.q_tok)  # (B, 1, C, head_dim), (B, 1, C)
        flash_bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
        return flash_bwd(g_h, q_h, k_h, v_h, o_h, lse_h, 0.0, False, attn_mask=bias, scale=scale)
    with torch.enable_grad():
        q_h, k_h, v_h = (t.detach().requires_grad_() for t in (q_h, k_h, v_h))
        o_h = F.scaled_dot_product_attention(q_h, k_h, v_h, attn_mask=bias, scale=scale)
        return torch.autograd.grad(o_h, (q_h, k_h, v_h), g_h)


class LookHereTileFn(torch.autograd.Function):
    """q, k, v: (B, heads, N, head_dim) -> (B, heads, N, head_dim); ``plan``: ``lookhere_plan``."""

    @staticmethod
    def forward(ctx, q, k, v, plan: LookHerePlan, num_prefix: int, scale: float, use_flash: bool):
        batch, heads, num_tokens, _ = q.shape
        out = q.new_empty(q.shape)  # (B, heads, N, head_dim)
        lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32  # what the flash kernel returns
        lse = q.new_empty(batch, heads, num_tokens, dtype=lse_dtype) if use_flash else None  # (B, heads, N)
        prefix_probs = prefix_forward(q, k, v, num_prefix, scale, out) if num_prefix else None
        for tile in plan.tiles:
            for run in tile.runs:
                _run_forward(q, k, v, plan.table, _queries_of(tile, run), run, num_prefix, scale, out, lse)
        ctx.plan, ctx.num_prefix, ctx.scale = plan, num_prefix, scale
        ctx.save_for_backward(q, k, v, out, lse, prefix_probs)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        plan, num_prefix, scale = ctx.plan, ctx.num_prefix, ctx.scale
        q, k, v, out, lse, prefix_probs = ctx.saved_tensors
        dq = q.new_empty(q.shape)  # (B, heads, N, head_dim): each row written once, by its tile or the prefix
        dk, dv = (torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (k, v))  # summed over tiles
        if num_prefix:
            prefix_backward(q, k, v, grad_out, out, prefix_probs, num_prefix, scale, dq, dk, dv)
        tensors = (q, k, v, grad_out, out, lse)
        for whole_tile in plan.tiles:
            for run in whole_tile.runs:
                tile = _queries_of(whole_tile, run)
                # one head at a time: the kernel's key/value gradients for a run of heads that
                # sees every key are as large as dk itself (per head: 1/heads of it)
                for h in range(run.first, run.stop):
                    bias = _tile_bias(plan.table, h, h + 1, tile.q_code, run.key_code, num_prefix, q.dtype)  # (1, 1, C, L)
                    dq_h, dk_h, dv_h = _head_grads(tensors, h, tile, run, bias, scale)
                    dq[:, h : h + 1].index_copy_(2, tile.q_tok, dq_h)
                    if run.key_tok is None:
                        dk[:, h : h + 1] += dk_h
                        dv[:, h : h + 1] += dv_h
                    else:
                        dk[:, h : h + 1].index_add_(2, run.key_tok, dk_h)
                        dv[:, h : h + 1].index_add_(2, run.key_tok, dv_h)
        return dq, dk, dv, None, None, None, None
