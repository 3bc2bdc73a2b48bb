"""Attention that never builds the (heads, N, N) bias: the ``impl="sparse"`` path of ``attend``.

``masks.py`` stays the reference (``dense_bias``); this package computes the same
softmax(q k^T / sqrt(head_dim) + bias) v, forward and backward, with memory linear in N.

Dimension names (used in every file of this package, and in its shape comments):

==============  ==========================================================================
``B``           batch size
``heads``       attention heads (``pattern.num_heads``)
``head_dim``    features per head
``grid``        the patch grid ``(H, W)`` = ``(gh, gw)``, patches in raster order
``P``           patch tokens, ``H * W``
``num_prefix``  prefix (CLS) tokens; they come first
``N``           all tokens, ``num_prefix + P``; a *token* indexes [0, N), a *patch* [0, P)
``slot``        Fibottention: one diagonal of a head's mask (``fibottention.Slot``): patch
                queries p in [start, stop) see patch p + shift
``width``       Fibottention CSR layout: visible keys per query row (padded to equal width)
``nnz``         Fibottention CSR layout: valid (non-padding) entries of one head
``tile``        LookHere: a rectangle of ``C`` query patches processed together
``run``         LookHere: adjacent heads [first, stop) that see the same ``L`` keys from a tile
``table``       LookHere: bias of every displacement (dy, dx), (heads, 2H-1, 2W-1)
==============  ==========================================================================

Files: ``fibottention.py`` (offsets -> slots, kernel choice) with its two kernels
``fibottention_csr.py`` (CPU: sampled matmul + embedding-bag) and ``fibottention_loop.py``
(any device: one shifted slice per slot); ``lookhere.py`` (tiled fused SDPA); ``prefix.py``
(the prefix query rows, for both); ``dispatch.py`` (``choose_impl``, ``sparse_attend``);
``cache.py`` (``AttentionCache``: what a module builds, owned by that module).

``choose_impl`` is a deterministic rule on (kind, N, device type), calibrated with
``benchmarks/attention.py`` (see ``results/attention_benchmark/cpu.md``).
"""
from .cache import AttentionCache
from .dispatch import AUTO_MIN_TOKENS, can_run, choose_impl, sparse_attend
from .fibottention import CSR_MIN_PATCHES, FibPlan, Slot, fib_plan, fibottention_attend
from .fibottention_csr import HeadRows, csr_rows
from .lookhere import LOOKHERE_TILE_TOKENS, HeadRun, LookHerePlan, Tile, displacement_table, lookhere_attend, lookhere_plan

__all__ = [
    "AUTO_MIN_TOKENS",
    "CSR_MIN_PATCHES",
    "LOOKHERE_TILE_TOKENS",
    "AttentionCache",
    "FibPlan",
    "HeadRows",
    "HeadRun",
    "LookHerePlan",
    "Slot",
    "Tile",
    "can_run",
    "choose_impl",
    "csr_rows",
    "displacement_table",
    "fib_plan",
    "fibottention_attend",
    "lookhere_attend",
    "lookhere_plan",
    "sparse_attend",
]
