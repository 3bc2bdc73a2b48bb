"""The sparse attention paths (policies/vision/sparse/) against the dense-bias reference, and
the model-owned cache of biases and plans."""
from __future__ import annotations

import gc
import importlib
import itertools
import pkgutil
import warnings
import weakref

import pytest
import torch
import torch.nn.functional as F

import policies.vision
from policies.vision import sparse
from policies.vision.attention import AttentionConfig, attend
from policies.vision.masks import KINDS
from policies.vision.sparse import AttentionCache
from policies.vision.sparse.cache import first_tensor
from policies.vision.vit import ViT, ViTConfig

warnings.filterwarnings("ignore", message=".*[Ss]parse.*")

HEADS = (1, 3, 8)
GRIDS = ((3, 5), (4, 4), (7, 6))
PREFIX = (0, 1)
RTOL = 1e-5
# Norm-wise relative error; the tiny absolute floor only matters where the exact gradient is zero (a
# key nobody attends to, a query with a single visible key). There our sparse paths return exactly 0,
# while a float32 reference's rounding depends on the CPU's kernels (SDPA's float32 backward gave
# 3.8e-7 with AVX2 kernels), so the reference is computed in float64.
ATOL = 1e-7


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny problems: intra-op threads only add synchronisation (very costly on a loaded machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make(kind: str, heads: int, layer: int = 0, depth: int = 1, **settings):
    """A pattern with ``AttentionConfig``'s defaults for every setting not given."""
    return AttentionConfig(kind=kind, **settings).pattern(heads, layer, depth)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / (b.norm() + ATOL / RTOL))


def reference(q, k, v, pattern, grid, num_prefix):
    """SDPA with the pattern's dense bias, in float64 so that the reference's own rounding is negligible."""
    bias = pattern.dense_bias(grid, num_prefix)
    bias = None if bias is None else bias.unsqueeze(0).double()
    out = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=bias)
    return out.to(q.dtype)


def check_against_dense(pattern, grid, num_prefix, batch=2, head_dim=8, seed=0, run=sparse.sparse_attend, **kwargs):
    gen = torch.Generator().manual_seed(seed)
    n = num_prefix + grid[0] * grid[1]
    shape = (batch, pattern.num_heads, n, head_dim)
    q, k, v = (torch.randn(shape, generator=gen, requires_grad=True) for _ in range(3))
    g = torch.randn(shape, generator=gen)
    ref = reference(q, k, v, pattern, grid, num_prefix)
    ref_grads = torch.autograd.grad(ref, (q, k, v), g)
    out = run(q, k, v, pattern, grid, num_prefix, **kwargs)
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
            pattern = make("fibottention", heads, layer, modified=modified)
            check_against_dense(pattern, grid, num_prefix, method=method, seed=heads + layer)


@pytest.mark.parametrize("method", ["csr", "loop"])
def test_fibottention_edge_cases(method):
    """Offsets past the grid, rows that see nothing but themselves, custom windows, 2 prefixes."""
    cases = [
        (make("fibottention", 3, modified=False), (1, 1), 0),
        (make("fibottention", 3, modified=False), (1, 1), 1),
        (make("fibottention", 8, modified=False), (2, 9), 0),  # row 1 offsets {1,2,3,5}: ok; others > P
        (make("fibottention", 5, modified=True), (6, 1), 2),
        (make("fibottention", 4, modified=False, w_min=0, w_max=40), (5, 9), 0),  # offsets up to ~P
        (make("fibottention", 4, modified=True, shuffle=False), (9, 9), 1),
    ]
    for pattern, grid, num_prefix in cases:
        check_against_dense(pattern, grid, num_prefix, method=method)
    # a plan where some rows have no offset inside the grid: the fallback slot is present
    plan = sparse.fib_plan(make("fibottention", 8, modified=False), (2, 9), 0)
    assert any(any(slot.start > 0 and slot.shift == 0 for slot in slots) for slots in plan.slots)


@pytest.mark.parametrize("variant", ["180", "90", "45"])
@pytest.mark.parametrize("method", ["flash", "recompute"])
def test_lookhere_efficient_matches_dense(variant, method):
    for heads, grid, num_prefix in itertools.product(HEADS, GRIDS, PREFIX):
        pattern = make("lookhere", heads, 1, 3, variant=variant)
        # small tiles so that several tiles, head runs and skipped keys are exercised
        for tile in (2, 6, None):
            check_against_dense(pattern, grid, num_prefix, method=method, chunk_tokens=tile, seed=heads)


def test_lookhere_plan_skips_invisible_keys():
    pattern = make("lookhere", 8, variant="45")
    grid = (16, 16)
    plan = sparse.lookhere_plan(pattern, grid, 16, 0, "cpu")
    directed = sum(1 for d, _ in pattern.plan() if d is not None)
    skipped = sum(1 for tile in plan.tiles for run in tile.runs if run.key_tok is not None)
    assert skipped >= len(plan.tiles) * directed // 2
    # every query appears in exactly one tile
    tokens = torch.cat([tile.q_tok for tile in plan.tiles]).sort().values
    assert torch.equal(tokens, torch.arange(256))
    # the kept keys are a superset of every query's visible keys
    bias = pattern.dense_bias(grid, 0)
    for tile in plan.tiles:
        for run in tile.runs:
            seen = torch.isfinite(bias[run.first : run.stop][:, tile.q_tok]).any(dim=(0, 1)).nonzero().flatten()
            kept = torch.arange(256) if run.key_tok is None else run.key_tok
            assert torch.isin(seen, kept).all()


@pytest.mark.parametrize("variant", ["180", "90", "45"])
def test_lookhere_table_is_bit_identical_to_the_dense_bias(variant):
    """One formula (LookHerePattern.bias_at) for both: every (query, key) value is equal, not close."""
    gh, gw = 5, 7
    pattern = make("lookhere", 6, 1, 3, variant=variant, global_slope=0.7)
    table = sparse.displacement_table(pattern, (gh, gw))  # (heads, 2H-1, 2W-1)
    dense = pattern.dense_bias((gh, gw), 0)  # (heads, P, P)
    y, x = torch.div(torch.arange(gh * gw), gw, rounding_mode="floor"), torch.arange(gh * gw) % gw
    dy, dx = y[None, :] - y[:, None] + gh - 1, x[None, :] - x[:, None] + gw - 1  # (P, P) table indices
    assert torch.equal(table[:, dy, dx], dense)


@pytest.mark.parametrize("kind", KINDS)
def test_sparse_impl_of_every_kind_matches_dense(kind):
    """attend(impl="sparse") is exact for every kind; those without a sparse algorithm run dense."""
    pattern = make(kind, 3, layer=1, depth=2)

    def run(q, k, v, pattern, grid, num_prefix):
        return attend(q, k, v, pattern, grid, num_prefix, "sparse")

    check_against_dense(pattern, (4, 4), 1, run=run)
    assert sparse.can_run(pattern, (4, 4)) == (kind in ("fibottention", "lookhere"))
    if not sparse.can_run(pattern, (4, 4)):
        q = torch.zeros(1, 3, 17, 8)
        with pytest.raises(ValueError, match="no sparse algorithm"):
            sparse.sparse_attend(q, q, q, pattern, (4, 4), 1)


def test_sparse_never_builds_n_by_n():
    """No single allocation of a sparse forward+backward comes near heads x N x N floats."""
    grid, heads = (32, 32), 2
    n = grid[0] * grid[1]
    for pattern, kwargs in (
        (make("fibottention", heads, modified=True), {"method": "csr"}),
        (make("fibottention", heads, modified=True), {"method": "loop"}),
        (make("lookhere", heads, variant="90"), {"chunk_tokens": 64}),  # bias: heads x 64 x N per call
    ):
        q, k, v = (torch.randn(1, heads, n, 8, requires_grad=True) for _ in range(3))
        cache = AttentionCache()
        sparse.sparse_attend(q, k, v, pattern, grid, 0, cache=cache, **kwargs)  # build the plans first
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
            out = sparse.sparse_attend(q, k, v, pattern, grid, 0, cache=cache, **kwargs)
            torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        sizes = [e.nbytes() for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
        assert sizes, "profiler recorded no allocations"
        assert max(sizes) < heads * n * n * 4 / 8, (pattern, max(sizes))


def test_choose_impl_at_real_token_counts():
    """The calibrated rule (results/attention_benchmark/cpu.md) at the token counts that occur."""
    fib, fib_std = make("fibottention", 8, modified=True), make("fibottention", 8, modified=False)
    lh90, lh45 = make("lookhere", 8, variant="90"), make("lookhere", 8, variant="45")

    def tokens(side, cls):
        return side * side + int(cls)

    # the policy's token counts (9x9 / 10x10 patches, with or without CLS) stay dense everywhere
    for pattern, side, cls, device in itertools.product((fib, fib_std, lh90, lh45), (9, 10), (0, 1), ("cpu", "cuda")):
        assert sparse.choose_impl(pattern, tokens(side, cls), device) == "dense", (pattern.kind, side, cls, device)
    # Fibottention on CPU: sparse from 120 tokens (crossover at 11x11 patches)
    for pattern in (fib, fib_std):
        assert sparse.choose_impl(pattern, 119, "cpu") == "dense"
        assert sparse.choose_impl(pattern, 120, "cpu") == "sparse"
        for side, cls in itertools.product((11, 16, 32, 64), (0, 1)):
            assert sparse.choose_impl(pattern, tokens(side, cls), torch.device("cpu")) == "sparse"
    # LookHere on CPU: sparse from 576 tokens (crossover between 20x20 and 24x24 patches)
    for pattern in (lh90, lh45):
        for side, cls, expected in ((16, 1, "dense"), (20, 0, "dense"), (23, 1, "dense"), (24, 0, "sparse"),
                                    (24, 1, "sparse"), (32, 0, "sparse"), (64, 1, "sparse")):
            assert sparse.choose_impl(pattern, tokens(side, cls), "cpu") == expected, (side, cls)
        assert sparse.choose_impl(pattern, 575, "cpu") == "dense"
    # CUDA (not calibrated) and unknown device types: sparse only from 4096 tokens (64x64)
    for pattern, device in itertools.product((fib, lh90), ("cuda", "cuda:1", torch.device("cuda"), "mps")):
        assert sparse.choose_impl(pattern, tokens(32, 1), device) == "dense"
        assert sparse.choose_impl(pattern, 4095, device) == "dense"
        assert sparse.choose_impl(pattern, tokens(64, 0), device) == "sparse"
    # only the kinds with a sparse algorithm ever leave the dense path (full, bigbird never do)
    leave = {kind for kind in KINDS for n, device in itertools.product((82, 1025, 4096, 16385), ("cpu", "cuda"))
             if sparse.choose_impl(make(kind, 8), n, device) == "sparse"}
    assert leave == {"fibottention", "lookhere"}


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
            dim=48, depth=2, num_heads=3, use_cls=use_cls, pool=pool,
            attention=AttentionConfig(kind=kind, impl=impl, **options),
        )
        model = ViT(cfg, crop_size=48)  # a 6x6 position embedding, resampled to the 7x6 grid
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
    pattern = make("fibottention", 4, modified=True)
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


# ------------------------------------------------------------------------------------------
# the cache of biases and plans belongs to the model
# ------------------------------------------------------------------------------------------

# 14x16 patches: every kind builds something to cache (Fibottention's csr layout needs
# CSR_MIN_PATCHES patches; below it the loop kernel only uses the pure-python slot plan).
CACHE_IMAGES = (2, 3, 112, 128)
CACHE_CASES = [(kind, "dense") for kind in KINDS if kind != "full"] + [("fibottention", "sparse"), ("lookhere", "sparse")]


def small_vit(kind: str, impl: str, seed: int = 0) -> ViT:
    torch.manual_seed(seed)
    cfg = ViTConfig(dim=16, depth=2, num_heads=2, mlp_ratio=1.0, attention=AttentionConfig(kind=kind, impl=impl))
    return ViT(cfg, crop_size=CACHE_IMAGES[-2])


def cached_tensors(vit: ViT) -> list[torch.Tensor]:
    """The first tensor of every cache entry of every layer."""
    return [first_tensor(value) for block in vit.blocks for value in block.attn.cache.values()]


@pytest.mark.parametrize("kind,impl", CACHE_CASES)
def test_each_model_owns_its_cache(kind, impl):
    images = torch.rand(*CACHE_IMAGES)
    vit = small_vit(kind, impl)
    with torch.no_grad():
        vit(images)
        built = cached_tensors(vit)
        assert len(built) == len(vit.blocks) and all(t is not None for t in built)
        vit(images)  # the same grid again: the same objects, nothing rebuilt
        assert all(a is b for a, b in zip(cached_tensors(vit), built))
        other = small_vit(kind, impl)  # same config, equal patterns: still its own tensors
        other(images)
    assert all(a is not b for a, b in zip(cached_tensors(other), built))
    # nothing else holds them (no process-wide cache): clearing the model frees them
    refs = [weakref.ref(t) for t in built]
    del built
    vit.clear_attention_cache()
    gc.collect()
    assert all(len(block.attn.cache) == 0 for block in vit.blocks)
    assert all(ref() is None for ref in refs)
    # ... and so does dropping the model
    refs = [weakref.ref(t) for t in cached_tensors(other)]
    del other
    gc.collect()
    assert all(ref() is None for ref in refs)


def test_the_same_bias_object_per_grid_and_a_new_one_per_grid():
    attn = small_vit("lookhere", "dense").blocks[0].attn
    bias = attn.dense_bias((9, 9), 1, "cpu")
    assert attn.dense_bias((9, 9), 1, "cpu") is bias
    assert attn.dense_bias((12, 12), 1, "cpu").shape == (1, 2, 145, 145)
    assert attn.dense_bias((9, 9), 1, "cpu") is bias and len(attn.cache) == 2
    # an entry asked for on another device is rebuilt there, not handed out from the old one
    assert attn.dense_bias((9, 9), 1, "meta").device.type == "meta"
    assert attn.dense_bias((9, 9), 1, "cpu").device.type == "cpu"


@pytest.mark.parametrize("kind,impl", [("lookhere", "dense"), ("fibottention", "sparse"), ("lookhere", "sparse")])
def test_cache_follows_to_and_stays_out_of_the_state_dict(kind, impl):
    images = torch.rand(*CACHE_IMAGES)
    vit = small_vit(kind, impl)
    keys = set(vit.state_dict())
    with torch.no_grad():
        out32 = vit(images)
    assert set(vit.state_dict()) == keys  # non-persistent: checkpoints do not change
    assert all(len(block.attn.cache) for block in vit.blocks)
    vit.to(torch.float64)  # what was built for float32 is dropped, then rebuilt for float64
    assert all(len(block.attn.cache) == 0 for block in vit.blocks)
    with torch.no_grad():
        out64 = vit(images.double())
    assert out64.dtype == torch.float64 and rel_err(out64.float(), out32) <= 1e-4
    if impl == "dense":
        assert all(t.dtype == torch.float64 for t in cached_tensors(vit))
    assert all(t.device.type == "cpu" for t in cached_tensors(vit))
    vit.to("cpu")
    assert all(len(block.attn.cache) == 0 for block in vit.blocks)
    fresh = small_vit(kind, impl)
    fresh.load_state_dict(vit.float().state_dict())  # strict: the same keys


def test_no_tensor_holding_lru_cache_in_policies_vision():
    """Every functools cache left in policies.vision is a pure-python lookup (ints, not tensors)."""
    cached = set()
    for info in pkgutil.walk_packages(policies.vision.__path__, "policies.vision."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if hasattr(obj, "cache_info") and getattr(obj, "__module__", None) == info.name:
                cached.add(f"{info.name}.{name}")
    assert cached == {"policies.vision.sparse.fibottention.fib_plan"}
    plan = sparse.fib_plan(make("fibottention", 4), (6, 6), 1)
    assert first_tensor(plan) is None


def test_copies_of_a_model_start_with_an_empty_cache():
    import copy
    import io

    vit = small_vit("lookhere", "dense")
    with torch.no_grad():
        vit(torch.rand(*CACHE_IMAGES))
    twin = copy.deepcopy(vit)  # e.g. an EMA copy: derived data is not duplicated
    assert all(len(block.attn.cache) == 0 for block in twin.blocks)
    assert all(len(block.attn.cache) == 1 for block in vit.blocks)
    buffer = io.BytesIO()
    torch.save(vit, buffer)
    restored = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
    assert all(len(block.attn.cache) == 0 for block in restored.blocks)
    with torch.no_grad():
        images = torch.rand(*CACHE_IMAGES)
        assert torch.equal(restored(images), vit(images))


# LookHere sub-tiles: the directed heads of a large query tile get one run per sub-tile


@pytest.mark.parametrize("variant", ["90", "45"])
@pytest.mark.parametrize("method", ["flash", "recompute"])
def test_lookhere_subtiles_match_dense(variant, method):
    from policies.vision.sparse.lookhere import lookhere_attend

    for heads, grid, num_prefix in itertools.product((3, 8), ((7, 6), (12, 11)), PREFIX):
        pattern = make("lookhere", heads, 1, 3, variant=variant)
        for tile, subtile in ((None, 4), (40, 6), (64, 16), (None, None)):
            check_against_dense(pattern, grid, num_prefix, method=method, chunk_tokens=tile, seed=heads,
                                run=lookhere_attend, subtile_tokens=subtile)


def test_lookhere_subtile_plan_covers_each_query_once_with_its_keys():
    pattern = make("lookhere", 8, variant="45")
    grid, n = (16, 16), 256
    plan = sparse.lookhere_plan(pattern, grid, 256, 0, "cpu", subtile_tokens=32)
    assert any(run.q_tok is not None for tile in plan.tiles for run in tile.runs), "no sub-tile runs"
    bias = pattern.dense_bias(grid, 0)
    covered = torch.zeros(8, n, dtype=torch.long)
    for tile in plan.tiles:
        for run in tile.runs:
            q_tok = tile.q_tok if run.q_tok is None else run.q_tok
            covered[run.first : run.stop, q_tok] += 1
            seen = torch.isfinite(bias[run.first : run.stop][:, q_tok]).any(dim=(0, 1)).nonzero().flatten()
            kept = torch.arange(n) if run.key_tok is None else run.key_tok
            assert torch.isin(seen, kept).all()
    assert torch.equal(covered, torch.ones_like(covered))  # every (head, query) row exactly once
    # the sub-tiles keep fewer keys than whole tiles would
    whole = sparse.lookhere_plan(pattern, grid, 256, 0, "cpu")

    def work(p):
        return sum((run.stop - run.first) * (tile.q_tok if run.q_tok is None else run.q_tok).numel()
                   * (n if run.key_tok is None else run.key_tok.numel()) for tile in p.tiles for run in tile.runs)

    assert work(plan) < 0.9 * work(whole)


def test_lookhere_default_subtiles_leave_policy_sized_grids_alone():
    """The policy's grids (<= 10x10 patches: one tile of <= 100 queries) keep one run per head group."""
    from policies.vision.sparse.lookhere import LOOKHERE_TILE_TOKENS, default_subtile

    subtile = default_subtile(LOOKHERE_TILE_TOKENS)
    for side in (9, 10):
        plan = sparse.lookhere_plan(make("lookhere", 8, variant="90"), (side, side), LOOKHERE_TILE_TOKENS, 1, "cpu", subtile)
        assert len(plan.tiles) == 1 and all(run.q_tok is None for run in plan.tiles[0].runs)
