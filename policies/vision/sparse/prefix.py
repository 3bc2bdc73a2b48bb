"""The prefix (CLS) query rows, for both sparse algorithms.

A prefix query sees every key with no bias, so its rows are plain dense attention: only
``num_prefix`` rows per head, O(num_prefix * N) memory, nothing to gain from a sparse kernel.
The kernels (``fibottention_csr``, ``fibottention_loop``, ``lookhere``) compute the patch rows
and call these two functions for the prefix rows of the same output / gradient tensors. The
tensors may have any leading dimensions: ``(B, heads, N, head_dim)`` for every head at once, or
one head's ``(B, N, head_dim)`` views, which the Fibottention kernels pass from inside their
per-head loops while that head's keys and values are still in cache (measurably faster).
Dimension names: see the package docstring.
"""
from __future__ import annotations

import torch


def prefix_forward(q, k, v, num_prefix: int, scale: float, out: torch.Tensor) -> torch.Tensor:
    """Writes the prefix rows of ``out`` (like q: (..., N, head_dim)) and returns the
    probabilities (..., num_prefix, N) that ``prefix_backward`` needs."""
    q_prefix = q[..., :num_prefix, :]  # (..., num_prefix, head_dim)
    scores = torch.matmul(q_prefix, k.transpose(-2, -1)) * scale  # (..., num_prefix, N)
    probs = torch.softmax(scores, dim=-1)  # (..., num_prefix, N)
    out[..., :num_prefix, :] = torch.matmul(probs, v)
    return probs


def prefix_backward(q, k, v, grad_out, out, probs, num_prefix: int, scale: float, dq, dk, dv) -> None:
    """The prefix rows' share of the gradients: sets the prefix rows of ``dq`` (no other path
    touches them) and adds to ``dk`` and ``dv`` (every key); all (..., N, head_dim)."""
    grad_prefix = grad_out[..., :num_prefix, :]  # (..., num_prefix, head_dim)
    dv += torch.matmul(probs.transpose(-2, -1), grad_prefix)  # (..., N, head_dim)
    dprobs = torch.matmul(grad_prefix, v.transpose(-2, -1))  # (..., num_prefix, N)
    # softmax backward: dS = P * (dP - sum_j P_j dP_j), and sum_j P_j dP_j = dO . O
    delta = (grad_prefix * out[..., :num_prefix, :]).sum(-1, keepdim=True)  # (..., num_prefix, 1)
    dscores = dprobs.sub_(delta).mul_(probs).mul_(scale)  # (..., num_prefix, N)
    dq[..., :num_prefix, :] = torch.matmul(dscores, k)
    dk += torch.matmul(dscores.transpose(-2, -1), q[..., :num_prefix, :])
