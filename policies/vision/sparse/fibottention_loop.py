"""Fibottention's slot-loop kernel (any device; the CPU default on small grids).

Per head and slot, a row-wise dot product between the queries and a *slice* of the keys
shifted by the slot's offset (a view: no padding, no copy), and in-place ``addcmul_`` for the
weighted sums; hand-written backward. Scores are laid out (B, num_prefix + slots, P): one row
per prefix key and per slot, contiguous along the P queries, so that every slot is a slice.
Memory: O(B * heads * N * slots) for the probabilities kept for backward, never N x N.
Dimension names: see the package docstring.
"""
from __future__ import annotations

import math

import torch

from .prefix import prefix_backward, prefix_forward


def _queries(x, slot):
    """The rows of x (B, P, head_dim) that are the slot's queries: (B, stop - start, head_dim)."""
    return x[:, slot.start : slot.stop]


def _keys(x, slot):
    """The rows of x (B, P, head_dim) that the slot's queries see: the same range shifted."""
    return x[:, slot.start + slot.shift : slot.stop + slot.shift]


def _slot_dot(a, b, slot, row, fill: float, scratch) -> None:
    """row (B, P) = a[p] . b[p + shift] on the slot's queries, ``fill`` on the other queries
    (a, b: (B, P, head_dim); scratch: (B, P, head_dim))."""
    if slot.start > 0:
        row[:, : slot.start].fill_(fill)
    if slot.stop < row.shape[1]:
        row[:, slot.stop :].fill_(fill)
    products = scratch[:, : slot.stop - slot.start]  # (B, slot queries, head_dim)
    torch.mul(_queries(a, slot), _keys(b, slot), out=products)
    torch.sum(products, dim=-1, out=row[:, slot.start : slot.stop])


def _head_forward(h: int, q, k, v, out, slots, num_prefix: int, scale: float, scratch):
    """Head h (q, k, v, out: (B, heads, N, head_dim)): writes the patch rows of out and returns
    the probabilities (B, num_prefix + slots, P). Views are sliced once, straight from the 4-D
    tensors: on small grids the per-op overhead is what this kernel spends its time on."""
    batch, _, num_tokens, _ = q.shape
    q_patch, k_patch, v_patch = q[:, h, num_prefix:], k[:, h, num_prefix:], v[:, h, num_prefix:]  # (B, P, head_dim) views
    scores = q.new_empty(batch, num_prefix + len(slots), num_tokens - num_prefix)  # (B, num_prefix + slots, P)
    if num_prefix:
        scores[:, :num_prefix] = torch.matmul(k[:, h, :num_prefix], q_patch.transpose(1, 2))
    for j, slot in enumerate(slots):
        _slot_dot(q_patch, k_patch, slot, scores[:, num_prefix + j], -math.inf, scratch)
    probs = torch.softmax(scores.mul_(scale), dim=1)  # (B, num_prefix + slots, P)
    del scores
    out_patch = out[:, h, num_prefix:]  # (B, P, head_dim) view
    if num_prefix:
        out_patch.copy_(torch.matmul(probs[:, :num_prefix].transpose(1, 2), v[:, h, :num_prefix]))
    else:
        out_patch.zero_()
    for j, slot in enumerate(slots):
        weights = probs[:, num_prefix + j, slot.start : slot.stop].unsqueeze(-1)  # (B, slot queries, 1)
        _queries(out_patch, slot).addcmul_(weights, _keys(v_patch, slot))
    return probs


def _head_backward(h: int, tensors, grads, probs, slots, num_prefix: int, scale: float, scratch, delta) -> None:
    """Head ``h``'s patch-row share of dq, dk, dv. tensors: (q, k, v, grad_out, out), grads:
    (dq, dk, dv) (zero-initialised), all (B, heads, N, head_dim); probs: (B, num_prefix + slots,
    P); scratch (B, P, head_dim) and delta (B, P): buffers shared by the heads."""
    q, k, v, grad_out, out = tensors
    q_patch, k_patch, v_patch, g_patch = (t[:, h, num_prefix:] for t in (q, k, v, grad_out))  # (B, P, head_dim) views
    dq_patch, dk_patch, dv_patch = (t[:, h, num_prefix:] for t in grads)
    # softmax backward: dS = P (dP - delta) * scale, with delta = sum_j P_j dP_j = dO . O per query
    torch.sum(torch.mul(g_patch, out[:, h, num_prefix:], out=scratch), dim=-1, out=delta)
    dprobs = q.new_empty(probs.shape)  # (B, num_prefix + slots, P)
    if num_prefix:
        dprobs[:, :num_prefix] = torch.matmul(v[:, h, :num_prefix], g_patch.transpose(1, 2))
    for j, slot in enumerate(slots):
        _slot_dot(g_patch, v_patch, slot, dprobs[:, num_prefix + j], 0.0, scratch)
    dscores = dprobs.sub_(delta.unsqueeze(1)).mul_(probs).mul_(scale)  # (B, num_prefix + slots, P)
    if num_prefix:
        _prefix_key_rows_backward(h, tensors, grads, probs, dscores, num_prefix)
    for j, slot in enumerate(slots):
        ds = dscores[:, num_prefix + j, slot.start : slot.stop].unsqueeze(-1)  # (B, slot queries, 1)
        weights = probs[:, num_prefix + j, slot.start : slot.stop].unsqueeze(-1)
        _queries(dq_patch, slot).addcmul_(ds, _keys(k_patch, slot))
        _keys(dk_patch, slot).addcmul_(ds, _queries(q_patch, slot))
        _keys(dv_patch, slot).addcmul_(weights, _queries(g_patch, slot))


def _prefix_key_rows_backward(h: int, tensors, grads, probs, dscores, num_prefix: int) -> None:
    """The first num_prefix rows of probs / dscores (B, num_prefix + slots, P): the patch
    queries' scores with the prefix *keys*, dense along P (the prefix queries: prefix.py)."""
    q, k, _, grad_out, _ = tensors
    dq, dk, dv = grads
    dq[:, h, num_prefix:].add_(torch.matmul(dscores[:, :num_prefix].transpose(1, 2), k[:, h, :num_prefix]))
    dk[:, h, :num_prefix] += torch.matmul(dscores[:, :num_prefix], q[:, h, num_prefix:])
    dv[:, h, :num_prefix] += torch.matmul(probs[:, :num_prefix], grad_out[:, h, num_prefix:])


class FibLoopFn(torch.autograd.Function):
    """q, k, v: (B, heads, N, head_dim) -> (B, heads, N, head_dim); ``plan``: a ``FibPlan``."""

    @staticmethod
    def forward(ctx, q, k, v, plan, num_prefix: int, scale: float):
        batch, _, num_tokens, head_dim = q.shape
        out = q.new_empty(q.shape)  # (B, heads, N, head_dim)
        scratch = q.new_empty(batch, num_tokens - num_prefix, head_dim)  # (B, P, head_dim)
        probs, prefix_probs = [], []  # heads x (B, num_prefix + slots, P), heads x (B, num_prefix, N)
        for h, slots in enumerate(plan.slots):
            probs.append(_head_forward(h, q, k, v, out, slots, num_prefix, scale, scratch))
            if num_prefix:
                prefix_probs.append(prefix_forward(q[:, h], k[:, h], v[:, h], num_prefix, scale, out[:, h]))
        ctx.plan, ctx.num_prefix, ctx.scale = plan, num_prefix, scale
        ctx.save_for_backward(q, k, v, out, *probs, *prefix_probs)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        plan, num_prefix, scale = ctx.plan, ctx.num_prefix, ctx.scale
        q, k, v, out, *saved = ctx.saved_tensors
        probs, prefix_probs = saved[: len(plan.slots)], saved[len(plan.slots) :]
        batch, _, num_tokens, head_dim = q.shape
        grad_out = grad_out.contiguous()
        # zeros: the slots accumulate into dq, dk, dv with addcmul_
        dq, dk, dv = (torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))  # (B, heads, N, head_dim)
        scratch = q.new_empty(batch, num_tokens - num_prefix, head_dim)  # (B, P, head_dim)
        delta = q.new_empty(batch, num_tokens - num_prefix)  # (B, P)
        for h, slots in enumerate(plan.slots):
            _head_backward(h, (q, k, v, grad_out, out), (dq, dk, dv), probs[h], slots, num_prefix, scale, scratch, delta)
            if num_prefix:
                prefix_backward(*(t[:, h] for t in (q, k, v, grad_out, out)), prefix_probs[h], num_prefix, scale,
                                dq[:, h], dk[:, h], dv[:, h])
        return dq, dk, dv, None, None, None
