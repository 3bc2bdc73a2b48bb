"""Attention that never builds the (heads, N, N) bias: the ``impl="sparse"`` path of ``attend``.

``masks.py`` stays the reference (``dense_bias``); this module computes the same
softmax(q k^T / sqrt(d) + bias) v, forward and backward, with memory linear in N.

**Fibottention.** A head sees, besides the prefix (CLS) tokens, only the patches on a few
diagonals ``key = query +- offset`` (the CLS *query* sees everything). ``fib_plan`` turns the
offsets into per-head *slots* (signed offset, valid query range); without prefix tokens the rows
that would see nothing get a self slot, exactly like ``masks._ensure_visible``. Two kernels:

* ``csr`` (CPU default from ``CSR_MIN_PATCHES`` patches): each head's visible keys are laid out
  as fixed-width rows (prefix columns, one column per valid slot, masked padding columns); the
  scores are a sampled dense-dense matmul at exactly those entries
  (``torch.sparse.sampled_addmm``), the softmax runs on the (B, P, width) score block, and every
  weighted sum (P V, dS K, dS^T Q, P^T dO) is one fused gather-multiply-add
  (``F.embedding_bag`` with per-sample weights; the transposed ones use a precomputed key-major
  permutation). Hand-written backward; nothing larger than B x P x width is ever allocated.
* ``loop`` (any device, small grids): per head and slot, a row-wise dot product between the
  queries and a *slice* of the keys shifted by the offset (a view: no padding, no copy), and
  in-place ``addcmul_`` for the weighted sums; same hand-written backward.

Memory: O(B * heads * N * slots) for the probabilities kept for backward, plus the index
plan (O(heads * N * slots) integers, cached per grid), never N x N.

**LookHere.** The bias of a query/key pair depends only on (dx, dy), so a
(heads, 2H-1, 2W-1) table holds every value (O(N)). Queries are processed in rectangular
tiles (``LOOKHERE_TILE_TOKENS`` patches); for each tile, runs of adjacent heads that see the
same keys share one call of the fused SDPA kernel on (tile queries x visible keys), with the
tile's bias gathered from the table. For directed heads the key patches that no query of the
tile can see are skipped (a box-OR of the direction mask over the tile, via an integral image).
On CPU the forward keeps the log-sum-exp and the backward calls the fused flash-attention
backward per tile (bias rebuilt, never stored); on other devices the backward recomputes each
tile under autograd. Memory: O(heads * tile * N) for one tile's bias.
(``torch.nn.attention.flex_attention`` is not an option on CPU in torch 2.14: it has no CPU
backward, and its compiled forward was slower than the dense-bias SDPA here.)

``choose_impl`` is a deterministic rule on (kind, N, device type), calibrated with
``benchmarks/attention.py`` (see ``results/attention_benchmark/cpu.md``).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F

from .masks import LOOKHERE_DIRECTIONS, FibottentionPattern, LookHerePattern, cached_dense_bias

# ------------------------------------------------------------------------------------------
# impl selection
# ------------------------------------------------------------------------------------------

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


def _prefix_rows(q, k, v, h: int, n0: int, scale: float, out) -> torch.Tensor:
    """Prefix (CLS) queries of head ``h`` see every key: dense attention on their n0 rows only.
    Writes ``out[:, h, :n0]`` and returns the probabilities (B, n0, N) for the backward."""
    p0 = torch.softmax(torch.matmul(q[:, h, :n0], k[:, h].transpose(1, 2)) * scale, dim=-1)  # (B, n0, N)
    out[:, h, :n0] = torch.matmul(p0, v[:, h])
    return p0


def choose_impl(pattern, n_tokens: int, device) -> str:
    """``"dense"`` or ``"sparse"`` for this pattern, token count and device (pure function)."""
    kind = getattr(pattern, "kind", "full")
    table = AUTO_MIN_TOKENS.get(kind)
    if table is None:  # full and bigbird: nothing sparse to gain here
        return "dense"
    dev = torch.device(device).type
    threshold = table.get(dev, table[_DEFAULT_DEVICE_RULE])
    return "sparse" if int(n_tokens) >= threshold else "dense"


def sparse_attend(q, k, v, pattern, grid, num_prefix: int, *, method: str | None = None, chunk_tokens: int | None = None):
    """q, k, v: (B, heads, N, head_dim) -> (B, heads, N, head_dim), without an N x N bias.

    Optional, for tests and benchmarks: ``method`` -- Fibottention ``"csr"`` | ``"loop"``,
    LookHere ``"flash"`` (CPU fused backward) | ``"recompute"`` (generic backward); default by
    device and size. ``chunk_tokens`` -- LookHere query-tile size in patches.
    Patterns without a sparse algorithm (full, bigbird) use the dense reference path.
    """
    grid = (int(grid[0]), int(grid[1]))
    num_prefix = int(num_prefix)
    n = num_prefix + grid[0] * grid[1]
    if q.shape[-2] != n or k.shape[-2] != n or v.shape[-2] != n:
        raise ValueError(f"expected {n} tokens ({num_prefix} prefix + grid {grid[0]}x{grid[1]}), got q {tuple(q.shape)}")
    if q.shape[1] != pattern.num_heads:
        raise ValueError(f"pattern has {pattern.num_heads} heads but q has {q.shape[1]}")
    if isinstance(pattern, FibottentionPattern):
        return fibottention_attend(q, k, v, pattern, grid, num_prefix, method=method)
    if isinstance(pattern, LookHerePattern):
        return lookhere_attend(q, k, v, pattern, grid, num_prefix, method=method, chunk_tokens=chunk_tokens)
    # full / bigbird: no sparse algorithm here, use the reference path.
    bias = cached_dense_bias(pattern, grid, num_prefix, q.device)
    if bias is not None:
        bias = bias.to(q.dtype).unsqueeze(0)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


# ------------------------------------------------------------------------------------------
# Fibottention
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _FibPlan:
    """Per head, the slots (signed offset s, first query a, end query b): query p in [a, b) sees
    patch p + s. Regular offsets give s = +o (p < P - o) and s = -o (p >= o); the fallback slot
    (s = 0 on the rows that would otherwise see nothing) exists only without prefix tokens."""

    num_patches: int
    slots: tuple[tuple[tuple[int, int, int], ...], ...]

    @property
    def max_slots(self) -> int:
        return max((len(s) for s in self.slots), default=0)

    @property
    def total_slots(self) -> int:
        return sum(len(s) for s in self.slots)


@lru_cache(maxsize=512)
def fib_plan(pattern: FibottentionPattern, grid: tuple[int, int], num_prefix: int) -> _FibPlan:
    p = grid[0] * grid[1]
    heads = []
    for offs in pattern.offsets(grid):
        # The dense reference allows |key - query| in offs: offsets outside [0, P) never match.
        used = sorted({int(o) for o in offs if 0 <= o < p})
        slots = []
        for o in used:
            if o == 0:
                slots.append((0, 0, p))
            else:
                slots.append((o, 0, p - o))
                slots.append((-o, o, p))
        if num_prefix == 0 and 0 not in used:
            # Row r sees nothing iff r >= P - o and r < o for every offset o: one contiguous range.
            o_min = used[0] if used else p
            a, b = max(0, p - o_min), min(p, o_min)
            if a < b:
                slots.append((0, a, b))
        heads.append(tuple(slots))
    return _FibPlan(p, tuple(heads))


# On CPU the row-sparse kernels (sampled matmul + embedding-bag, one call per batch element and
# head) win from this many patches on; below it the per-offset loop has less call overhead
# (crossover measured at 13x13 patches, batch 8, 8 heads, head dim 32).
CSR_MIN_PATCHES = 160


def fibottention_attend(q, k, v, pattern, grid, num_prefix, method=None):
    """``method``: ``"csr"`` (CPU: fused sampled-matmul + embedding-bag kernels) or ``"loop"``
    (any device: one shifted slice view per offset); None: ``csr`` on CPU from
    ``CSR_MIN_PATCHES`` patches on, else ``loop``."""
    grid = tuple(grid)
    plan = fib_plan(pattern, grid, num_prefix)
    scale = 1.0 / math.sqrt(q.shape[-1])
    csr_ok = q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64)  # sampled_addmm dtypes
    if method is None:
        method = "csr" if csr_ok and plan.num_patches >= CSR_MIN_PATCHES else "loop"
    if method == "csr" and not csr_ok:
        raise ValueError(f"Fibottention method 'csr' needs float32/float64 CPU tensors, got {q.dtype} on {q.device}")
    if method == "loop":
        return _FibLoopFn.apply(q, k, v, plan, num_prefix, scale)
    if method == "csr":
        rows = _fib_rows(pattern, grid, num_prefix, str(q.device))
        return _FibRowsFn.apply(q, k, v, rows, num_prefix, scale)
    raise ValueError(f"unknown Fibottention sparse method {method!r}; use 'csr' or 'loop'")


def _rowdot(x, y, out, tmp):
    """out[...] = sum_d x[..., d] * y[..., d] for (B, n, D) views; tmp: scratch of x's shape."""
    torch.mul(x, y, out=tmp)
    torch.sum(tmp, dim=-1, out=out)


class _FibLoopFn(torch.autograd.Function):
    """Slot-loop Fibottention: per head, per signed offset, views + row-wise dot products."""

    @staticmethod
    def forward(ctx, q, k, v, plan: _FibPlan, n0: int, scale: float):
        B, H, N, D = q.shape
        P = N - n0
        out = q.new_empty(B, H, N, D)
        tmp = q.new_empty(B, P, D)
        probs, prefix_probs = [], []
        for h in range(H):
            slots = plan.slots[h]
            qh, kh, vh = q[:, h, n0:], k[:, h, n0:], v[:, h, n0:]  # (B, P, D) views
            # Scores laid out (B, n0 + slots, P): each slot's row is contiguous along P.
            s = q.new_empty(B, n0 + len(slots), P)
            if n0:
                s[:, :n0] = torch.matmul(k[:, h, :n0], qh.transpose(1, 2))
            for j, (off, a, b) in enumerate(slots):
                row = s[:, n0 + j]
                if a > 0:
                    row[:, :a].fill_(-math.inf)
                if b < P:
                    row[:, b:].fill_(-math.inf)
                _rowdot(qh[:, a:b], kh[:, a + off : b + off], row[:, a:b], tmp[:, : b - a])
            s.mul_(scale)
            pr = torch.softmax(s, dim=1)
            del s
            oh = out[:, h, n0:]
            if n0:
                oh.copy_(torch.matmul(pr[:, :n0].transpose(1, 2), v[:, h, :n0]))
            else:
                oh.zero_()
            for j, (off, a, b) in enumerate(slots):
                oh[:, a:b].addcmul_(pr[:, n0 + j, a:b].unsqueeze(-1), vh[:, a + off : b + off])
            probs.append(pr)
            if n0:
                prefix_probs.append(_prefix_rows(q, k, v, h, n0, scale, out))
        ctx.plan, ctx.n0, ctx.scale = plan, n0, scale
        ctx.save_for_backward(q, k, v, out, *probs, *prefix_probs)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        plan, n0, scale = ctx.plan, ctx.n0, ctx.scale
        q, k, v, out, *saved = ctx.saved_tensors
        B, H, N, D = q.shape
        P = N - n0
        probs, prefix_probs = saved[:H], saved[H:]
        grad_out = grad_out.contiguous()
        dq = torch.zeros(B, H, N, D, dtype=q.dtype, device=q.device)
        dk = torch.zeros(B, H, N, D, dtype=k.dtype, device=k.device)
        dv = torch.zeros(B, H, N, D, dtype=v.dtype, device=v.device)
        tmp = q.new_empty(B, P, D)
        delta = q.new_empty(B, P)
        for h in range(H):
            slots, pr = plan.slots[h], probs[h]
            qh, kh, vh = q[:, h, n0:], k[:, h, n0:], v[:, h, n0:]
            gh, oh = grad_out[:, h, n0:], out[:, h, n0:]
            dqh, dkh, dvh = dq[:, h, n0:], dk[:, h, n0:], dv[:, h, n0:]
            _rowdot(gh, oh, delta, tmp)  # sum_j p_j dP_j = dO . O
            dp = q.new_empty(B, n0 + len(slots), P)
            if n0:
                dp[:, :n0] = torch.matmul(v[:, h, :n0], gh.transpose(1, 2))
            for j, (off, a, b) in enumerate(slots):
                row = dp[:, n0 + j]
                if a > 0:
                    row[:, :a].zero_()
                if b < P:
                    row[:, b:].zero_()
                _rowdot(gh[:, a:b], vh[:, a + off : b + off], row[:, a:b], tmp[:, : b - a])
            ds = dp.sub_(delta.unsqueeze(1)).mul_(pr).mul_(scale)  # dS = P (dP - delta) * scale
            if n0:
                dqh.add_(torch.matmul(ds[:, :n0].transpose(1, 2), k[:, h, :n0]))
                dk[:, h, :n0] += torch.matmul(ds[:, :n0], qh)
                dv[:, h, :n0] += torch.matmul(pr[:, :n0], gh)
            for j, (off, a, b) in enumerate(slots):
                w = ds[:, n0 + j, a:b].unsqueeze(-1)
                dqh[:, a:b].addcmul_(w, kh[:, a + off : b + off])
                dkh[:, a + off : b + off].addcmul_(w, qh[:, a:b])
                dvh[:, a + off : b + off].addcmul_(pr[:, n0 + j, a:b].unsqueeze(-1), gh[:, a:b])
            del dp, ds
            if n0:  # prefix query rows: full attention, plain backward
                p0 = prefix_probs[h]  # (B, n0, N)
                g0 = grad_out[:, h, :n0]  # (B, n0, D)
                dv[:, h] += torch.matmul(p0.transpose(1, 2), g0)
                dp0 = torch.matmul(g0, v[:, h].transpose(1, 2))  # (B, n0, N)
                d0 = (g0 * out[:, h, :n0]).sum(-1, keepdim=True)
                ds0 = dp0.sub_(d0).mul_(p0).mul_(scale)
                dq[:, h, :n0] += torch.matmul(ds0, k[:, h])
                dk[:, h] += torch.matmul(ds0.transpose(1, 2), q[:, h, :n0])
        return dq, dk, dv, None, None, None


@dataclass(frozen=True)
class _HeadRows:
    """One head's visible keys as fixed-width rows: patch query p sees columns ``col[p]`` of the
    N keys (prefix first, then p + s for its valid slots, then distinct padding columns that the
    softmax masks out). ``idx_t``/``offsets_t``/``perm`` is the transposed (key-major) layout of
    the valid entries, used for dK and dV."""

    width: int
    crow: torch.Tensor  # (P + 1,) CSR row pointers
    col: torch.Tensor  # (P * width,) column of each entry, sorted within a row
    offsets: torch.Tensor  # (P,) start of each row (embedding-bag offsets)
    pad: torch.Tensor  # (P, width) bool, True on padding entries
    idx_t: torch.Tensor  # (nnz,) query token (row of the N tokens) of each valid entry, key-major
    offsets_t: torch.Tensor  # (N,) start of each key's entries in idx_t
    perm: torch.Tensor  # (nnz,) position in the row-major (P * width) layout of each idx_t entry
    num_keys: int

    def csr_like(self, dtype) -> torch.Tensor:
        """The (P, N) sparsity pattern as a CSR tensor with zero values (built once per dtype)."""
        cache = self.__dict__.setdefault("_csr", {})
        if dtype not in cache:
            zeros = torch.zeros(self.col.numel(), dtype=dtype, device=self.col.device)
            shape = (self.crow.numel() - 1, self.num_keys)
            with warnings.catch_warnings():  # "sparse CSR support is in beta": it is only a pattern here
                warnings.simplefilter("ignore")
                cache[dtype] = torch.sparse_csr_tensor(self.crow, self.col, zeros, size=shape, check_invariants=False)
        return cache[dtype]


@lru_cache(maxsize=64)
def _fib_rows(pattern: FibottentionPattern, grid: tuple[int, int], num_prefix: int, device_str: str) -> tuple[_HeadRows, ...]:
    plan = fib_plan(pattern, grid, num_prefix)
    p, n0 = plan.num_patches, num_prefix
    n = n0 + p
    rows = torch.arange(p)
    heads = []
    for slots in plan.slots:
        if slots:
            s = torch.tensor([sl[0] for sl in slots])
            a = torch.tensor([sl[1] for sl in slots])
            b = torch.tensor([sl[2] for sl in slots])
            cols = rows[:, None] + s[None, :]  # (P, K)
            valid = (rows[:, None] >= a[None, :]) & (rows[:, None] < b[None, :])
        else:
            cols = torch.zeros(p, 0, dtype=torch.long)
            valid = torch.zeros(p, 0, dtype=torch.bool)
        used = valid.sum(1)
        wp = int(used.max()) if slots else 0
        if wp:
            # Padding columns: the first free ones among (p + t) mod P, t < min(2 wp, P). At most
            # used[p] of those candidates are taken, so at least wp - used[p] are free.
            cand = (rows[:, None] + torch.arange(min(2 * wp, p))[None, :]) % p  # (P, C)
            taken = (cand[:, :, None] == torch.where(valid, cols, -1)[:, None, :]).any(-1)
            free = ~taken
            chosen = free & (free.cumsum(1) <= (wp - used)[:, None])
            allc = torch.cat([cols, cand], dim=1)
            keep = torch.cat([valid, chosen], dim=1)
            is_pad = torch.cat([torch.zeros_like(valid), torch.ones_like(chosen)], dim=1)
            key = torch.where(keep, allc, p + allc.shape[1] + 1)
            key, order = key.sort(dim=1)
            patch_col = key[:, :wp]
            patch_pad = is_pad.gather(1, order[:, :wp])
        else:
            patch_col = torch.zeros(p, 0, dtype=torch.long)
            patch_pad = torch.zeros(p, 0, dtype=torch.bool)
        col = torch.cat([torch.arange(n0).expand(p, n0), patch_col + n0], dim=1)  # (P, W)
        pad = torch.cat([torch.zeros(p, n0, dtype=torch.bool), patch_pad], dim=1)
        width = col.shape[1]
        flat = col.reshape(-1)
        entries = (~pad).reshape(-1).nonzero().flatten()
        keys = flat[entries]
        order = torch.sort(keys, stable=True).indices
        perm = entries[order]
        counts = torch.bincount(keys, minlength=n)
        offsets_t = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)[:-1]])
        idx_t = n0 + torch.div(perm, width, rounding_mode="floor")
        itype = torch.int32 if p * width < 2**31 - 1 else torch.long
        dev = torch.device(device_str)
        cvt = lambda t: t.to(device=dev, dtype=itype)
        heads.append(
            _HeadRows(
                width=width,
                crow=cvt(torch.arange(0, p * width + 1, width)),
                col=cvt(flat),
                offsets=cvt(torch.arange(0, p * width, width)),
                pad=pad.to(dev),
                idx_t=cvt(idx_t),
                offsets_t=cvt(offsets_t),
                perm=cvt(perm),
                num_keys=n,
            )
        )
    return tuple(heads)


def _sddmm(hr: _HeadRows, a, b_t, scale, out):
    """out (P, W) = scale * (a @ b_t) at the entries of hr (a: (P, d), b_t: (d, N))."""
    csr = hr.csr_like(a.dtype)
    out.view(-1).copy_(torch.sparse.sampled_addmm(csr, a, b_t, beta=0.0, alpha=scale).values())


def _bag(idx, table, offsets, weights):
    """Row i = sum over entries e of bag i of weights[e] * table[idx[e]] (fused gather + sum)."""
    return F.embedding_bag(idx, table.contiguous(), offsets, mode="sum", per_sample_weights=weights)


def _softmax_(s):
    s.sub_(s.amax(dim=-1, keepdim=True)).exp_()
    return s.div_(s.sum(dim=-1, keepdim=True))


class _FibRowsFn(torch.autograd.Function):
    """Fibottention with fused CPU kernels: scores by a sampled dense-dense matmul (only the
    visible entries), weighted sums of values/keys/queries by embedding-bag."""

    @staticmethod
    def forward(ctx, q, k, v, rows, n0: int, scale: float):
        B, H, N, D = q.shape
        P = N - n0
        out = q.new_empty(B, H, N, D)
        probs, prefix_probs = [], []
        for h, hr in enumerate(rows):
            s = q.new_empty(B, P, hr.width)
            for b in range(B):
                _sddmm(hr, q[b, h, n0:], k[b, h].transpose(0, 1), scale, s[b])
            pr = _softmax_(s.masked_fill_(hr.pad, -math.inf))
            for b in range(B):
                out[b, h, n0:] = _bag(hr.col, v[b, h], hr.offsets, pr[b].view(-1))
            probs.append(pr)
            if n0:
                prefix_probs.append(_prefix_rows(q, k, v, h, n0, scale, out))
        ctx.rows, ctx.n0, ctx.scale = rows, n0, scale
        ctx.save_for_backward(q, k, v, out, *probs, *prefix_probs)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        rows, n0, scale = ctx.rows, ctx.n0, ctx.scale
        q, k, v, out, *saved = ctx.saved_tensors
        B, H, N, D = q.shape
        P = N - n0
        probs, prefix_probs = saved[:H], saved[H:]
        grad_out = grad_out.contiguous()
        dq = torch.empty(B, H, N, D, dtype=q.dtype, device=q.device)
        dk = torch.empty(B, H, N, D, dtype=k.dtype, device=k.device)
        dv = torch.empty(B, H, N, D, dtype=v.dtype, device=v.device)
        delta = q.new_empty(B, P)
        for h, hr in enumerate(rows):
            pr = probs[h]
            ds = q.new_empty(B, P, hr.width)
            for b in range(B):
                _sddmm(hr, grad_out[b, h, n0:], v[b, h].transpose(0, 1), 1.0, ds[b])
            # softmax backward: dS = P (dP - sum_j P_j dP_j) * scale
            torch.linalg.vecdot(pr, ds, out=delta)
            ds.sub_(delta.unsqueeze(-1)).mul_(pr).mul_(scale)
            for b in range(B):
                dsb, prb = ds[b].view(-1), pr[b].view(-1)
                dq[b, h, n0:] = _bag(hr.col, k[b, h], hr.offsets, dsb)
                dk[b, h] = _bag(hr.idx_t, q[b, h], hr.offsets_t, dsb.index_select(0, hr.perm))
                dv[b, h] = _bag(hr.idx_t, grad_out[b, h], hr.offsets_t, prb.index_select(0, hr.perm))
            del ds
            if n0:  # prefix query rows: full attention, plain backward
                p0 = prefix_probs[h]  # (B, n0, N)
                g0 = grad_out[:, h, :n0]  # (B, n0, D)
                dv[:, h] += torch.matmul(p0.transpose(1, 2), g0)
                dp0 = torch.matmul(g0, v[:, h].transpose(1, 2))  # (B, n0, N)
                d0 = (g0 * out[:, h, :n0]).sum(-1, keepdim=True)
                ds0 = dp0.sub_(d0).mul_(p0).mul_(scale)
                dq[:, h, :n0] = torch.matmul(ds0, k[:, h])
                dk[:, h] += torch.matmul(ds0.transpose(1, 2), q[:, h, :n0])
        return dq, dk, dv, None, None, None


# ------------------------------------------------------------------------------------------
# LookHere
# ------------------------------------------------------------------------------------------

# Queries are processed in rectangular tiles of about this many patches; one fused-kernel call
# sees one tile, one run of heads and the keys that run can see from the tile.
LOOKHERE_TILE_TOKENS = 256


@lru_cache(maxsize=128)
def _lookhere_table(pattern: LookHerePattern, grid: tuple[int, int], device_str: str):
    """Bias of every (dy, dx) per head, flattened to (heads, (2H-1)(2W-1)) on the device, and
    the (heads, 2H-1, 2W-1) visibility mask on the CPU."""
    gh, gw = grid
    dy = torch.arange(-(gh - 1), gh).float()[:, None].expand(2 * gh - 1, 2 * gw - 1)
    dx = torch.arange(-(gw - 1), gw).float()[None, :].expand(2 * gh - 1, 2 * gw - 1)
    # Same float expressions as LookHerePattern.dense_bias, so the values are bit-identical.
    dist = torch.sqrt(dx * dx + dy * dy)
    tests = LOOKHERE_DIRECTIONS[pattern.variant]
    heads = []
    for (direction, _), slope in zip(pattern.plan(), pattern.head_slopes()):
        b = -slope * dist
        if direction is not None:
            b = b.masked_fill(~tests[direction](dx, dy), -math.inf)
        heads.append(b)
    table = torch.stack(heads)
    return table.reshape(len(heads), -1).to(torch.device(device_str)), torch.isfinite(table)


def _tile_shape(grid: tuple[int, int], tile_tokens: int) -> tuple[int, int]:
    gh, gw = grid
    tw = min(gw, max(1, math.isqrt(max(1, tile_tokens))))
    th = min(gh, max(1, tile_tokens // tw))
    return th, tw


@dataclass(frozen=True)
class _LHTile:
    """Query tokens of one tile and, per run of heads [h0, h1), the key tokens they can see
    from it (None: every token). ``*_code`` are the patches' (2W-1)-strided table coordinates,
    so the bias index of (query, key) is ``k_code - q_code``."""

    q_tok: torch.Tensor  # (C,) long
    q_code: torch.Tensor  # (C,) int32
    groups: tuple  # ((h0, h1, k_tok (L,) long | None, k_code (L,) int32), ...)


@lru_cache(maxsize=128)
def lookhere_plan(pattern: LookHerePattern, grid: tuple[int, int], tile_tokens: int, num_prefix: int, device_str: str):
    """Query tiles of about ``tile_tokens`` patches. For each tile, adjacent heads that see the
    same key patches from it share one kernel call. A key patch is kept when some query of the
    tile sees it (a box-OR of the visibility mask over the tile, via an integral image), so
    fully masked keys are never touched."""
    gh, gw = grid
    n0 = num_prefix
    dev = torch.device(device_str)
    _, visible = _lookhere_table(pattern, grid, "cpu")
    integral = torch.zeros(visible.shape[0], 2 * gh, 2 * gw, dtype=torch.long)
    integral[:, 1:, 1:] = visible.long().cumsum(1).cumsum(2)
    th, tw = _tile_shape(grid, tile_tokens)
    ky = torch.arange(gh)[:, None]
    kx = torch.arange(gw)[None, :]
    all_code = (ky * (2 * gw - 1) + kx).reshape(-1)
    prefix = torch.arange(n0)
    tiles = []
    for r0 in range(0, gh, th):
        r1 = min(gh, r0 + th) - 1
        for c0 in range(0, gw, tw):
            c1 = min(gw, c0 + tw) - 1
            qy, qx = torch.meshgrid(torch.arange(r0, r1 + 1), torch.arange(c0, c1 + 1), indexing="ij")
            q_tok = (n0 + qy * gw + qx).reshape(-1)
            q_code = ((qy - (gh - 1)) * (2 * gw - 1) + qx - (gw - 1)).reshape(-1)
            # key (y, x) is visible from the tile iff the mask has a hit in rows
            # [y - r1, y - r0] + gh - 1 and columns [x - c1, x - c0] + gw - 1.
            ya, yb = ky - r1 + gh - 1, ky - r0 + gh
            xa, xb = kx - c1 + gw - 1, kx - c0 + gw
            hits = integral[:, yb, xb] - integral[:, ya, xb] - integral[:, yb, xa] + integral[:, ya, xa]
            groups = []
            for h in range(hits.shape[0]):
                seen = (hits[h] > 0).reshape(-1)
                keys = None if bool(seen.all()) else seen.nonzero().flatten()
                if groups and (
                    (keys is None and groups[-1][2] is None)
                    or (keys is not None and groups[-1][2] is not None and torch.equal(keys, groups[-1][2]))
                ):
                    groups[-1][1] = h + 1
                else:
                    groups.append([h, h + 1, keys])
            entries = []
            for h0, h1, keys in groups:
                if keys is None:
                    entries.append((h0, h1, None, all_code.to(device=dev, dtype=torch.int32)))
                else:
                    tok = torch.cat([prefix, n0 + keys])
                    entries.append((h0, h1, tok.to(dev), all_code[keys].to(device=dev, dtype=torch.int32)))
            tiles.append(_LHTile(q_tok.to(dev), q_code.to(device=dev, dtype=torch.int32), tuple(entries)))
    return tuple(tiles)


def _tile_bias(table, h0, h1, q_code, k_code, n0, dtype):
    """(1, h1-h0, C, n0 + L) bias between a tile's queries and its keys (prefix keys: 0)."""
    idx = k_code[None, :] - q_code[:, None]  # (C, L) index into the flattened (dy, dx) table
    patch = table[h0:h1].index_select(1, idx.reshape(-1)).reshape(h1 - h0, q_code.numel(), k_code.numel())
    if n0:
        patch = torch.cat([patch.new_zeros(h1 - h0, q_code.numel(), n0), patch], dim=-1)
    return patch.to(dtype).unsqueeze(0)


def _flash_cpu_available(q) -> bool:
    return q.device.type == "cpu" and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward")


def lookhere_attend(q, k, v, pattern, grid, num_prefix, method=None, chunk_tokens=None):
    tile_tokens = int(chunk_tokens or LOOKHERE_TILE_TOKENS)
    if method is None:
        method = "flash" if _flash_cpu_available(q) else "recompute"
    if method not in ("flash", "recompute"):
        raise ValueError(f"unknown LookHere sparse method {method!r}; use 'flash' or 'recompute'")
    if method == "flash" and not _flash_cpu_available(q):
        raise ValueError("LookHere method 'flash' needs CPU tensors (fused CPU flash-attention backward)")
    grid = tuple(grid)
    table, _ = _lookhere_table(pattern, grid, str(q.device))
    plan = lookhere_plan(pattern, grid, tile_tokens, num_prefix, str(q.device))
    scale = 1.0 / math.sqrt(q.shape[-1])
    return _LookHereTileFn.apply(q, k, v, table, grid, plan, num_prefix, scale, method == "flash")


def _take(x, h0, h1, tok):
    """Tokens ``tok`` (None: all) of heads [h0, h1): (B, h, len, d)."""
    x = x[:, h0:h1]
    return x if tok is None else x.index_select(2, tok)


class _LookHereTileFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, table, grid, plan, n0, scale, use_flash):
        B, H, N, D = q.shape
        out = q.new_empty(B, H, N, D)
        lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32  # what the kernel returns
        lse = q.new_empty(B, H, N, dtype=lse_dtype) if use_flash else None
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        if n0:  # prefix queries: every key, no bias
            if use_flash:
                o, l = flash(q[:, :, :n0], k, v, scale=scale)
                lse[:, :, :n0] = l
            else:
                o = F.scaled_dot_product_attention(q[:, :, :n0], k, v, scale=scale)
            out[:, :, :n0] = o
        for tile in plan:
            q_tok = tile.q_tok
            for h0, h1, k_tok, k_code in tile.groups:
                qt = _take(q, h0, h1, q_tok)
                ks, vs = _take(k, h0, h1, k_tok), _take(v, h0, h1, k_tok)
                bias = _tile_bias(table, h0, h1, tile.q_code, k_code, n0, q.dtype)
                if use_flash:
                    o, l = flash(qt, ks, vs, attn_mask=bias, scale=scale)
                    lse[:, h0:h1].index_copy_(2, q_tok, l)
                else:
                    o = F.scaled_dot_product_attention(qt, ks, vs, attn_mask=bias, scale=scale)
                out[:, h0:h1].index_copy_(2, q_tok, o)
        ctx.table, ctx.grid, ctx.plan, ctx.n0, ctx.scale, ctx.use_flash = table, grid, plan, n0, scale, use_flash
        if use_flash:
            ctx.save_for_backward(q, k, v, out, lse)
        else:
            ctx.save_for_backward(q, k, v)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        table, grid, plan, n0, scale, use_flash = ctx.table, ctx.grid, ctx.plan, ctx.n0, ctx.scale, ctx.use_flash
        if use_flash:
            q, k, v, out, lse = ctx.saved_tensors
        else:
            (q, k, v), out, lse = ctx.saved_tensors, None, None
        B, H, N, D = q.shape
        dq = torch.empty(B, H, N, D, dtype=q.dtype, device=q.device)
        dk = torch.zeros(B, H, N, D, dtype=k.dtype, device=k.device)
        dv = torch.zeros(B, H, N, D, dtype=v.dtype, device=v.device)
        flash_bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward

        def grads(h0, h1, q_tok, k_tok, bias):
            qt, gt = _take(q, h0, h1, q_tok), _take(grad_out, h0, h1, q_tok).contiguous()
            ks, vs = _take(k, h0, h1, k_tok), _take(v, h0, h1, k_tok)
            if use_flash:
                ot, lt = _take(out, h0, h1, q_tok), _take(lse, h0, h1, q_tok)
                return flash_bwd(gt, qt, ks, vs, ot, lt, 0.0, False, attn_mask=bias, scale=scale)
            with torch.enable_grad():
                qt, ks, vs = (t.detach().requires_grad_() for t in (qt, ks, vs))
                o = F.scaled_dot_product_attention(qt, ks, vs, attn_mask=bias, scale=scale)
                return torch.autograd.grad(o, (qt, ks, vs), gt)

        if n0:
            prefix = torch.arange(n0, device=q.device)
            g = grads(0, H, prefix, None, None)
            dq[:, :, :n0] = g[0]
            dk += g[1]
            dv += g[2]
        for tile in plan:
            q_tok = tile.q_tok
            for g0, g1, k_tok, k_code in tile.groups:
                # one head at a time: the kernel's key/value gradients for a run of heads that
                # sees every key are as large as dk itself (per head: 1/heads of it)
                for h in range(g0, g1):
                    bias = _tile_bias(table, h, h + 1, tile.q_code, k_code, n0, q.dtype)
                    g = grads(h, h + 1, q_tok, k_tok, bias)
                    dq[:, h : h + 1].index_copy_(2, q_tok, g[0])
                    if k_tok is None:
                        dk[:, h : h + 1] += g[1]
                        dv[:, h : h + 1] += g[2]
                    else:
                        dk[:, h : h + 1].index_add_(2, k_tok, g[1])
                        dv[:, h : h + 1].index_add_(2, k_tok, g[2])
        return dq, dk, dv, None, None, None, None, None, None
