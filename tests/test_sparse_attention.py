"""The sparse attention paths (policies/vision/sparse.py) against the dense-bias reference."""
from __future__ import annotations

import itertools
import warnings

import pytest
import torch
import torch.nn.functional as F

from policies.vision import sparse
from policies.vision.attention import AttentionConfig, attend
from policies.vision.masks import BigBirdPattern, FibottentionPattern, FullPattern, LookHerePattern
from policies.vision.vit import ViT, ViTConfig

warnings.filterwarnings("ignore", message=".*[Ss]parse.*")

HEADS = (1, 3, 8)
GRIDS = ((3, 5), (4, 4), (7, 6))
PREFIX = (0, 1)
RTOL = 1e-5
# Norm-wise relative error; the tiny absolute floor only matters where the reference gradient
# is exactly zero (a key nobody attends to, a query with a single visible key).
ATOL = 1e-7


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny problems: intra-op threads only add synchronisation (very costly on a loaded machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / (b.norm() + ATOL / RTOL))


def reference(q, k, v, pattern, grid, num_prefix):
    bias = pattern.dense_bias(grid, num_prefix)
    bias = None if bias is None else bias.unsqueeze(0)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def check_against_dense(pattern, grid, num_prefix, batch=2, head_dim=8, seed=0, **kwargs):
    gen = torch.Generator().manual_seed(seed)
    n = num_prefix + grid[0] * grid[1]
    shape = (batch, pattern.num_heads, n, head_dim)
    q, k, v = (torch.randn(shape, generator=gen, requires_grad=True) for _ in range(3))
    g = torch.randn(shape, generator=gen)
    ref = reference(q, k, v, pattern, grid, num_prefix)
    ref_grads = torch.autograd.grad(ref, (q, k, v), g)
    out = sparse.sparse_attend(q, k, v, pattern, grid, num_prefix, **kwargs)
    grads = torch.autograd.grad(out, (q, k, v), g)
    assert out.shape == ref.shape
    errors = {"out": rel_err(out, ref)}
    errors.update({f"d{name}": rel_err(a, b) for name, a, b in zip("qkv", grads, ref_grads)})
    worst = max(errors.values())
    assert worst <= RTOL, f"{pattern} grid={grid} prefix={num_prefix} {kwargs}: {errors}"
    return worst


@pytest.mark.parametrize("method", ["csr", "loop"])
@pytest.mark.parametrize("modified", [False, True], ids=["standard", "modified"])
def test_fibottention_sparse_matches_dense(modified, method):
    for heads, grid, num_prefix in itertools.product(HEADS, GRIDS, PREFIX):
        for layer in (0, 2):
            pattern = FibottentionPattern(heads, layer=layer, modified=modified)
            check_against_dense(pattern, grid, num_prefix, method=method, seed=heads + layer)


@pytest.mark.parametrize("method", ["csr", "loop"])
def test_fibottention_edge_cases(method):
    """Offsets past the grid, rows that see nothing but themselves, custom windows, 2 prefixes."""
    cases = [
        (FibottentionPattern(3, modified=False), (1, 1), 0),
        (FibottentionPattern(3, modified=False), (1, 1), 1),
        (FibottentionPattern(8, modified=False), (2, 9), 0),  # row 1 offsets {1,2,3,5}: ok; others > P
        (FibottentionPattern(5, modified=True), (6, 1), 2),
        (FibottentionPattern(4, modified=False, w_min=0, w_max=40), (5, 9), 0),  # offsets up to ~P
        (FibottentionPattern(4, modified=True, shuffle=False), (9, 9), 1),
    ]
    for pattern, grid, num_prefix in cases:
        check_against_dense(pattern, grid, num_prefix, method=method)
    # a plan where some rows have no offset inside the grid: the fallback slot is present
    plan = sparse.fib_plan(FibottentionPattern(8, modified=False), (2, 9), 0)
    assert any(any(a > 0 and s == 0 for s, a, b in slots) for slots in plan.slots)


@pytest.mark.parametrize("variant", ["180", "90", "45"])
@pytest.mark.parametrize("method", ["flash", "recompute"])
def test_lookhere_efficient_matches_dense(variant, method):
    for heads, grid, num_prefix in itertools.product(HEADS, GRIDS, PREFIX):
        pattern = LookHerePattern(heads, layer=1, depth=3, variant=variant)
        # small tiles so that several tiles, head runs and skipped keys are exercised
        for tile in (2, 6, None):
            check_against_dense(pattern, grid, num_prefix, method=method, chunk_tokens=tile, seed=heads)


def test_lookhere_plan_skips_invisible_keys():
    pattern = LookHerePattern(8, variant="45")
    grid = (16, 16)
    plan = sparse.lookhere_plan(pattern, grid, 16, 0, "cpu")
    directed = sum(1 for d, _ in pattern.plan() if d is not None)
    skipped = sum(1 for tile in plan for g in tile.groups if g[2] is not None)
    assert skipped >= len(plan) * directed // 2
    # every query appears in exactly one tile
    tokens = torch.cat([tile.q_tok for tile in plan]).sort().values
    assert torch.equal(tokens, torch.arange(256))
    # the kept keys are a superset of every query's visible keys
    bias = pattern.dense_bias(grid, 0)
    for tile in plan:
        for h0, h1, k_tok, _ in tile.groups:
            seen = torch.isfinite(bias[h0:h1][:, tile.q_tok]).any(dim=(0, 1)).nonzero().flatten()
            kept = torch.arange(256) if k_tok is None else k_tok
            assert torch.isin(seen, kept).all()


def test_other_kinds_fall_back_to_dense():
    for pattern in (FullPattern(3), BigBirdPattern(3, layer=1)):
        check_against_dense(pattern, (4, 4), 1)


def test_sparse_never_builds_n_by_n():
    """No single allocation of a sparse forward+backward comes near heads x N x N floats."""
    grid, heads = (32, 32), 2
    n = grid[0] * grid[1]
    for pattern, kwargs in (
        (FibottentionPattern(heads, modified=True), {"method": "csr"}),
        (FibottentionPattern(heads, modified=True), {"method": "loop"}),
        (LookHerePattern(heads, variant="90"), {"chunk_tokens": 64}),  # bias: heads x 64 x N per call
    ):
        q, k, v = (torch.randn(1, heads, n, 8, requires_grad=True) for _ in range(3))
        sparse.sparse_attend(q, k, v, pattern, grid, 0, **kwargs)  # build the cached plans first
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
            out = sparse.sparse_attend(q, k, v, pattern, grid, 0, **kwargs)
            torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        sizes = [e.nbytes() for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
        assert sizes, "profiler recorded no allocations"
        assert max(sizes) < heads * n * n * 4 / 8, (pattern, max(sizes))


def test_choose_impl_is_deterministic_and_sane():
    patterns = [
        FullPattern(4),
        BigBirdPattern(4),
        FibottentionPattern(4, modified=True),
        FibottentionPattern(4, modified=False),
        LookHerePattern(4, variant="90"),
        LookHerePattern(4, variant="45"),
    ]
    for pattern, n, device in itertools.product(patterns, (17, 82, 101, 257, 1025, 4096, 16385), ("cpu", "cuda", torch.device("cpu"))):
        first = sparse.choose_impl(pattern, n, device)
        assert first in ("dense", "sparse")
        assert all(sparse.choose_impl(pattern, n, device) == first for _ in range(3))
        if pattern.kind in ("full", "bigbird"):
            assert first == "dense"
    # the policy's token counts (9x9 / 10x10 patches, with or without CLS) stay on the dense path
    for pattern, n in itertools.product(patterns, (81, 82, 100, 101)):
        assert sparse.choose_impl(pattern, n, "cpu") == "dense"
    # large grids use the sparse path on CPU
    assert sparse.choose_impl(FibottentionPattern(8, modified=True), 4096, "cpu") == "sparse"
    assert sparse.choose_impl(LookHerePattern(8, variant="90"), 4096, "cpu") == "sparse"


@pytest.mark.parametrize(
    "kind,options,use_cls,pool",
    [
        ("fibottention", {"modified": True}, True, "cls"),
        ("fibottention", {"modified": False}, False, "mean"),
        ("lookhere", {"variant": "90"}, True, "cls"),
        ("lookhere", {"variant": "45"}, False, "mean"),
        ("lookhere", {"variant": "180"}, True, "mean"),
    ],
)
def test_vit_sparse_equals_dense(kind, options, use_cls, pool):
    torch.manual_seed(0)
    outputs, grads = {}, {}
    images = torch.rand(2, 3, 56, 48)  # 7x6 patches of 8 pixels: non-square grid
    for impl in ("dense", "sparse", "auto"):
        cfg = ViTConfig(
            dim=48, depth=2, num_heads=3, use_cls=use_cls, pool=pool, base_grid=(7, 6),
            attention=AttentionConfig(kind=kind, impl=impl, **options),
        )
        model = ViT(cfg)
        if impl == "dense":
            state = model.state_dict()
        else:
            model.load_state_dict(state)
        out = model(images)
        out.square().sum().backward()
        outputs[impl] = out.detach()
        grads[impl] = torch.cat([p.grad.flatten() for p in model.parameters()])
    for impl in ("sparse", "auto"):
        assert rel_err(outputs[impl], outputs["dense"]) <= RTOL
        assert rel_err(grads[impl], grads["dense"]) <= 1e-4  # through two layers + LayerNorm


def test_attend_dispatch_matches_reference():
    """attend(impl=...) on the module's non-contiguous q/k/v (as produced by the qkv split)."""
    pattern = FibottentionPattern(4, modified=True)
    grid, n0 = (16, 16), 1
    n = n0 + grid[0] * grid[1]
    qkv = torch.randn(2, n, 3, 4, 8, requires_grad=True)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    ref = attend(q, k, v, pattern, grid, n0, "dense")
    g = torch.randn_like(ref)
    (ref_grad,) = torch.autograd.grad(ref, qkv, g)
    for impl in ("sparse", "auto"):
        out = attend(q, k, v, pattern, grid, n0, impl)
        (grad,) = torch.autograd.grad(out, qkv, g)
        assert rel_err(out, ref) <= RTOL and rel_err(grad, ref_grad) <= RTOL
