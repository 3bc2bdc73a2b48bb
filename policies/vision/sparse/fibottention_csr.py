"""Fibottention's CPU kernel: visible keys as fixed-width rows, sampled matmul + embedding-bag.

Each head's visible keys are laid out as rows of equal width (prefix columns, one column per
valid slot, then masked padding columns): the CSR layout of the (P, N) mask. The scores are a
sampled dense-dense matmul at exactly those entries (``torch.sparse.sampled_addmm``), the
softmax runs on the (B, P, width) score block, and every weighted sum (P V, dS K, dS^T Q,
P^T dO) is one fused gather-multiply-add (``F.embedding_bag`` with per-sample weights; the
transposed ones use a precomputed key-major order). Nothing larger than B x P x width is
allocated. Dimension names: see the package docstring.
"""
from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .prefix import prefix_backward, prefix_forward


class HeadRows(NamedTuple):
    """One head's visible keys as fixed-width rows: patch query p sees key tokens
    ``col[p * width : (p + 1) * width]`` (prefix first, then p + shift for its valid slots, then
    distinct padding columns that the softmax masks out). ``key_*`` is the same valid entries
    grouped by key (the transposed layout), for dK and dV."""

    width: int  # entries per row: num_prefix + the head's largest number of valid slots in a row
    crow: torch.Tensor  # (P + 1,) CSR row pointers, p * width
    col: torch.Tensor  # (P * width,) key token of each entry, increasing within a row
    pad: torch.Tensor  # (P, width) bool, True on padding entries
    key_query: torch.Tensor  # (nnz,) query token of each valid entry, in key-major order
    key_start: torch.Tensor  # (N,) first entry of each key in key_query
    key_entry: torch.Tensor  # (nnz,) row-major position (in P * width) of each key-major entry
    num_keys: int  # N

    @property
    def row_start(self) -> torch.Tensor:
        """(P,) first entry of each row: the embedding-bag offsets of the row-major layout."""
        return self.crow[:-1]


def csr_rows(plan, num_prefix: int, device) -> tuple[HeadRows, ...]:
    """The row layout of every head of a ``FibPlan``, on ``device``."""
    return tuple(_head_rows(slots, plan.num_patches, num_prefix, device) for slots in plan.slots)


def _slot_columns(slots, num_patches: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(P, slots) patch column p + shift of every slot, and whether query p is in the slot."""
    patch = torch.arange(num_patches)  # (P,)
    if not slots:
        return torch.zeros(num_patches, 0, dtype=torch.long), torch.zeros(num_patches, 0, dtype=torch.bool)  # (P, 0)
    shift, start, stop = (torch.tensor(field) for field in zip(*slots))  # (slots,) each
    cols = patch[:, None] + shift[None, :]  # (P, slots)
    valid = (patch[:, None] >= start[None, :]) & (patch[:, None] < stop[None, :])  # (P, slots)
    return cols, valid


def _pad_rows(cols: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's valid patch columns, increasing, padded to the widest row with unused columns
    (CSR rows need distinct columns). Returns the columns and the padding flags, (P, width)."""
    num_patches = cols.shape[0]
    used = valid.sum(1)  # (P,) valid slots per row
    width = int(used.max()) if cols.shape[1] else 0
    if not width:
        return torch.zeros(num_patches, 0, dtype=torch.long), torch.zeros(num_patches, 0, dtype=torch.bool)  # (P, 0)
    # Padding columns: the first free ones among (p + t) mod P, t < min(2 width, P). At most
    # used[p] of those candidates are taken, so at least width - used[p] are free.
    patch = torch.arange(num_patches)  # (P,)
    cand = (patch[:, None] + torch.arange(min(2 * width, num_patches))[None, :]) % num_patches  # (P, C)
    taken = (cand[:, :, None] == torch.where(valid, cols, -1)[:, None, :]).any(-1)  # (P, C)
    free = ~taken
    chosen = free & (free.cumsum(1) <= (width - used)[:, None])  # (P, C)
    all_cols = torch.cat([cols, cand], dim=1)  # (P, slots + C)
    keep = torch.cat([valid, chosen], dim=1)  # (P, slots + C)
    is_pad = torch.cat([torch.zeros_like(valid), torch.ones_like(chosen)], dim=1)  # (P, slots + C)
    # sort the kept columns up; the dropped ones get a key past every column and fall off the end
    sort_key = torch.where(keep, all_cols, num_patches + all_cols.shape[1] + 1)  # (P, slots + C)
    sort_key, order = sort_key.sort(dim=1)
    return sort_key[:, :width], is_pad.gather(1, order[:, :width])  # (P, width) each


def _key_major(col: torch.Tensor, pad: torch.Tensor, num_prefix: int, num_keys: int):
    """The valid entries of the (P, width) layout grouped by key: (query token of each entry,
    first entry of each key, row-major position of each entry)."""
    width = col.shape[1]
    entries = (~pad).reshape(-1).nonzero().flatten()  # (nnz,) row-major positions of valid entries
    keys = col.reshape(-1)[entries]  # (nnz,) key token of each
    key_entry = entries[torch.sort(keys, stable=True).indices]  # (nnz,) in key-major order
    counts = torch.bincount(keys, minlength=num_keys)  # (N,) entries per key
    key_start = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)[:-1]])  # (N,)
    key_query = num_prefix + torch.div(key_entry, width, rounding_mode="floor")  # (nnz,)
    return key_query, key_start, key_entry


def _head_rows(slots, num_patches: int, num_prefix: int, device) -> HeadRows:
    num_keys = num_prefix + num_patches
    patch_col, patch_pad = _pad_rows(*_slot_columns(slots, num_patches))  # (P, width - num_prefix) each
    prefix_col = torch.arange(num_prefix).expand(num_patches, num_prefix)  # (P, num_prefix)
    col = torch.cat([prefix_col, patch_col + num_prefix], dim=1)  # (P, width) key tokens
    pad = torch.cat([torch.zeros(num_patches, num_prefix, dtype=torch.bool), patch_pad], dim=1)  # (P, width)
    width = col.shape[1]
    key_query, key_start, key_entry = _key_major(col, pad, num_prefix, num_keys)
    index_dtype = torch.int32 if num_patches * width < 2**31 - 1 else torch.long  # half the memory when it fits

    def index(t):
        return t.to(device=device, dtype=index_dtype)

    return HeadRows(
        width=width,
        crow=index(torch.arange(0, num_patches * width + 1, width)),
        col=index(col.reshape(-1)),  # (P * width,)
        pad=pad.to(device),
        key_query=index(key_query),
        key_start=index(key_start),
        key_entry=index(key_entry),
        num_keys=num_keys,
    )


def _csr_pattern(rows: HeadRows, dtype) -> torch.Tensor:
    """The (P, N) sparsity pattern as a CSR tensor with zero values: sampled_addmm's ``input``."""
    zeros = torch.zeros(rows.col.numel(), dtype=dtype, device=rows.col.device)  # (P * width,)
    size = (rows.crow.numel() - 1, rows.num_keys)
    with warnings.catch_warnings():  # "sparse CSR support is in beta": it is only a pattern here
        warnings.simplefilter("ignore")
        return torch.sparse_csr_tensor(rows.crow, rows.col, zeros, size=size, check_invariants=False)


def _sddmm(csr_pattern, a, b_t, scale: float, out) -> None:
    """out (P, width) = scale * (a @ b_t) at the pattern's entries (a: (P, head_dim), b_t: (head_dim, N))."""
    out.view(-1).copy_(torch.sparse.sampled_addmm(csr_pattern, a, b_t, beta=0.0, alpha=scale).values())  # (P * width,)


def _bag(index, table, offsets, weights):
    """Row i = sum over the entries e of bag i of weights[e] * table[index[e]] (fused gather + sum)."""
    return F.embedding_bag(index, table.contiguous(), offsets, mode="sum", per_sample_weights=weights)


def _softmax_(scores):
    """In-place softmax over the last dimension (no second (B, P, width) buffer)."""
    scores.sub_(scores.amax(dim=-1, keepdim=True)).exp_()
    return scores.div_(scores.sum(dim=-1, keepdim=True))


def _head_forward(qh, kh, vh, rows: HeadRows, num_prefix: int, scale: float, out_h):
    """One head (qh, kh, vh: (B, N, head_dim)): writes the patch rows of out_h (B, N, head_dim)
    and returns the probabilities (B, P, width)."""
    batch, num_tokens, _ = qh.shape
    csr_pattern = _csr_pattern(rows, qh.dtype)
    scores = qh.new_empty(batch, num_tokens - num_prefix, rows.width)  # (B, P, width)
    for sample in range(batch):  # sampled_addmm takes 2-D operands only
        _sddmm(csr_pattern, qh[sample, num_prefix:], kh[sample].transpose(0, 1), scale, scores[sample])
    probs = _softmax_(scores.masked_fill_(rows.pad, -math.inf))  # (B, P, width)
    for sample in range(batch):
        out_h[sample, num_prefix:] = _bag(rows.col, vh[sample], rows.row_start, probs[sample].view(-1))  # (P, head_dim)
    return probs


def _head_backward(h: int, tensors, grads, probs, rows: HeadRows, num_prefix: int, scale: float, delta) -> None:
    """Head ``h``'s patch-row share of dq, dk, dv. tensors: (q, k, v, grad_out), grads: (dq, dk,
    dv), all (B, heads, N, head_dim); probs: (B, P, width); delta: (B, P) scratch."""
    qh, kh, vh, gh = (t[:, h] for t in tensors)  # (B, N, head_dim) each
    dqh, dkh, dvh = (t[:, h] for t in grads)  # (B, N, head_dim) views, written here
    csr_pattern = _csr_pattern(rows, qh.dtype)
    dscores = qh.new_empty(probs.shape)  # (B, P, width), first dP
    for sample in range(qh.shape[0]):
        _sddmm(csr_pattern, gh[sample, num_prefix:], vh[sample].transpose(0, 1), 1.0, dscores[sample])
    # softmax backward: dS = P (dP - sum_j P_j dP_j) * scale
    torch.linalg.vecdot(probs, dscores, out=delta)
    dscores.sub_(delta.unsqueeze(-1)).mul_(probs).mul_(scale)
    for sample in range(qh.shape[0]):
        ds, pr = dscores[sample].view(-1), probs[sample].view(-1)  # (P * width,) each
        dqh[sample, num_prefix:] = _bag(rows.col, kh[sample], rows.row_start, ds)
        # dK and dV sum over the queries of each key: the key-major order of the same entries
        dkh[sample] = _bag(rows.key_query, qh[sample], rows.key_start, ds.index_select(0, rows.key_entry))
        dvh[sample] = _bag(rows.key_query, gh[sample], rows.key_start, pr.index_select(0, rows.key_entry))


class FibCsrFn(torch.autograd.Function):
    """q, k, v: (B, heads, N, head_dim) -> (B, heads, N, head_dim); ``rows``: ``csr_rows``."""

    @staticmethod
    def forward(ctx, q, k, v, rows, num_prefix: int, scale: float):
        out = q.new_empty(q.shape)  # (B, heads, N, head_dim)
        probs, prefix_probs = [], []  # heads x (B, P, width), heads x (B, num_prefix, N)
        for h, head_rows in enumerate(rows):
            probs.append(_head_forward(q[:, h], k[:, h], v[:, h], head_rows, num_prefix, scale, out[:, h]))
            if num_prefix:
                prefix_probs.append(prefix_forward(q[:, h], k[:, h], v[:, h], num_prefix, scale, out[:, h]))
        ctx.rows, ctx.num_prefix, ctx.scale = rows, num_prefix, scale
        ctx.save_for_backward(q, k, v, out, *probs, *prefix_probs)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        rows, num_prefix, scale = ctx.rows, ctx.num_prefix, ctx.scale
        q, k, v, out, *saved = ctx.saved_tensors
        probs, prefix_probs = saved[: len(rows)], saved[len(rows) :]
        grad_out = grad_out.contiguous()
        # every entry is written exactly once: dq's patch rows and all of dk, dv by _head_backward,
        # dq's prefix rows by prefix_backward (which then adds its share to dk, dv)
        dq, dk, dv = (t.new_empty(t.shape) for t in (q, k, v))  # (B, heads, N, head_dim) each
        delta = q.new_empty(q.shape[0], q.shape[2] - num_prefix)  # (B, P)
        for h, head_rows in enumerate(rows):
            _head_backward(h, (q, k, v, grad_out), (dq, dk, dv), probs[h], head_rows, num_prefix, scale, delta)
            if num_prefix:
                prefix_backward(*(t[:, h] for t in (q, k, v, grad_out, out)), prefix_probs[h], num_prefix, scale,
                                dq[:, h], dk[:, h], dv[:, h])
        return dq, dk, dv, None, None, None
