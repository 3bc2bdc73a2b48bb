"""Attention patterns against their closed forms (Fibottention offsets, LookHere directions)."""
import dataclasses
import inspect
import json
import math

import pytest
import torch

from policies.vision import masks
from policies.vision.masks import cli
from policies.vision.attention import AttentionConfig
from policies.vision.masks import (
    KINDS,
    BigBirdPattern,
    FibottentionPattern,
    LookHerePattern,
    fibottention_head_offsets,
    lookhere_head_plan,
    make_pattern,
    wythoff_row_start,
)


def make(kind: str, heads: int, layer: int = 0, depth: int = 1, **settings):
    """A pattern with ``AttentionConfig``'s defaults for every setting not given."""
    return AttentionConfig(kind=kind, **settings).pattern(heads, layer, depth)


def offsets(num_patches: int, heads: int, modified: bool = False):
    """``fibottention_head_offsets`` with the config's default window (w_min 5, w_max N // 3)."""
    cfg = AttentionConfig(kind="fibottention", modified=modified)
    return fibottention_head_offsets(num_patches, heads, modified=cfg.modified, w_min=cfg.w_min, w_max=cfg.w_max,
                                     windows=cfg.windows)


def head_plan(heads: int, variant: str, **settings):
    return make("lookhere", heads, variant=variant, **settings).plan()


def test_wythoff_rows_start_as_published():
    assert [wythoff_row_start(i) for i in range(1, 6)] == [(1, 2), (4, 7), (6, 10), (9, 15), (12, 20)]


def test_wythoff_rows_are_disjoint_and_cover_the_integers():
    seen = {}
    for i in range(1, 40):
        a, b = wythoff_row_start(i)
        while a <= 2000:
            assert a not in seen, f"{a} in rows {seen[a]} and {i}"
            seen[a] = i
            a, b = b, a + b
    # every integer up to the first entry of row 40 appears somewhere among rows 1..39
    assert set(range(1, wythoff_row_start(40)[0])) <= set(seen)


def test_reference_offsets_n196_h12():
    heads = offsets(196, 12)
    assert heads[0] == [1, 2, 3, 5]
    assert heads[1] == [4, 7]
    assert heads[2] == [6, 10]
    assert heads[-1] == [30, 49]
    assert heads == [
        [1, 2, 3, 5], [4, 7], [6, 10], [9, 15], [12, 20], [14, 23],
        [17, 28], [19, 31], [22, 36], [25, 41], [27, 44], [30, 49],
    ]


def test_modified_variant_runs_the_recurrence_backwards():
    heads = offsets(196, 12, modified=True)
    assert heads[0] == [0, 1, 2, 3, 5]  # 0, 1, 1, 2, 3, 5: includes the diagonal
    assert heads[1] == [1, 3, 4, 7]


def test_first_term_kept_even_beyond_window():
    heads = offsets(9, 12)  # w_max = max(9 // 3, w_min) = 5
    assert heads[-1] == [30]


def test_fibottention_dense_bias_matches_offsets_and_is_minus_inf():
    grid = (14, 14)
    pat = make("fibottention", 12, layer=3, modified=False)
    bias = pat.dense_bias(grid, num_prefix=1)
    assert bias.shape == (12, 197, 197)
    # CLS row and column fully visible, unpenalised
    assert torch.all(bias[:, 0, :] == 0) and torch.all(bias[:, :, 0] == 0)
    idx = torch.arange(196)
    dist = (idx[None] - idx[:, None]).abs()
    for h, offs in enumerate(pat.offsets(grid)):
        allowed = torch.isin(dist, torch.tensor(offs))
        block = bias[h, 1:, 1:]
        assert torch.all(block[allowed] == 0)
        assert torch.all(torch.isneginf(block[~allowed]))
    # about 2% of patch pairs are visible on average
    frac = cli.summarize(make("fibottention", 12, modified=False, shuffle=False), grid)["visible_fraction"]
    assert 0.015 < frac < 0.025


def _displacements(bias_patch: torch.Tensor, grid, query: tuple[int, int]) -> set[tuple[int, int]]:
    """2-D (dy, dx) from one query patch to every key it may attend to."""
    qy, qx = query
    row = bias_patch[qy * grid[1] + qx]
    return {(int(k) // grid[1] - qy, int(k) % grid[1] - qx) for k in torch.nonzero(row == 0).flatten()}


def test_fibottention_offset_grid_keeps_the_training_grids_2d_displacements():
    train, big = (10, 10), (14, 14)
    plain = make("fibottention", 4, layer=1, modified=False)
    remap = make("fibottention", 4, layer=1, modified=False, offset_grid=list(train))
    # on its own grid the remapped pattern is the 1-D pattern, entry for entry
    assert torch.equal(remap.dense_bias(train, 1), plain.dense_bias(train, 1))
    assert remap.offsets(big) == plain.offsets(train)  # the training window, not N // 3 of the big grid
    b_train, b_big, b_plain = (p.dense_bias(g, 0) for p, g in ((plain, train), (remap, big), (plain, big)))
    for h in range(4):
        seen = set().union(*(_displacements(b_train[h], train, (y, x)) for y in range(10) for x in range(10)))
        assert len(seen) > 1
        # a query on the larger grid reaches exactly the displacements the head had in training ...
        in_bounds = {(dy, dx) for dy, dx in seen if 0 <= 7 + dy < 14 and 0 <= 7 + dx < 14}
        assert _displacements(b_big[h], big, (7, 7)) == in_bounds
    # ... whereas 1-D offsets on a 14-wide grid mean other neighbours (offset 10 is no longer "one row down")
    assert any(_displacements(b_plain[h], big, (7, 7)) != _displacements(b_train[h], train, (5, 5)) for h in range(4))


def test_attention_config_checks_offset_grid():
    with pytest.raises(ValueError, match="attention.offset_grid must be"):
        AttentionConfig(kind="fibottention", offset_grid=[10])
    assert AttentionConfig(kind="fibottention", offset_grid=[10, 10]).pattern(4, 0, 3).offset_grid == (10, 10)


def test_fibottention_shuffle_is_a_deterministic_per_layer_permutation():
    grid = (14, 14)
    base = make("fibottention", 12, shuffle=False).offsets(grid)
    l0 = make("fibottention", 12, layer=0).offsets(grid)
    l1 = make("fibottention", 12, layer=1).offsets(grid)
    assert sorted(l0) == sorted(base) == sorted(l1)
    assert l0 != l1
    assert l0 == make("fibottention", 12, layer=0).offsets(grid)


def _closed_form(direction, dx, dy):
    """Direction tests written out case by case, independent of masks.LOOKHERE_DIRECTIONS."""
    ax, ay = abs(dx), abs(dy)
    return {
        ("180", "up"): dy <= 0, ("180", "down"): dy >= 0, ("180", "left"): dx <= 0, ("180", "right"): dx >= 0,
        ("180", "up-left"): dx + dy <= 0, ("180", "down-right"): dx + dy >= 0,
        ("180", "up-right"): dy <= dx, ("180", "down-left"): dy >= dx,
        ("90", "up"): dy <= -ax, ("90", "down"): dy >= ax, ("90", "left"): dx <= -ay, ("90", "right"): dx >= ay,
        ("90", "up-left"): dx <= 0 and dy <= 0, ("90", "up-right"): dx >= 0 and dy <= 0,
        ("90", "down-left"): dx <= 0 and dy >= 0, ("90", "down-right"): dx >= 0 and dy >= 0,
        ("45", "up-left"): dy <= -ax and dx <= 0, ("45", "up-right"): dy <= -ax and dx >= 0,
        ("45", "down-left"): dy >= ax and dx <= 0, ("45", "down-right"): dy >= ax and dx >= 0,
        ("45", "left-up"): dx <= -ay and dy <= 0, ("45", "left-down"): dx <= -ay and dy >= 0,
        ("45", "right-up"): dx >= ay and dy <= 0, ("45", "right-down"): dx >= ay and dy >= 0,
    }[direction]


@pytest.mark.parametrize("variant", ["180", "90", "45"])
def test_lookhere_matches_closed_form_on_non_square_grid(variant):
    gh, gw = 4, 7
    pat = make("lookhere", 12, 1, 3, variant=variant, global_slope=0.8)
    bias = pat.dense_bias((gh, gw), num_prefix=1)
    assert bias.shape == (12, 1 + gh * gw, 1 + gh * gw)
    assert torch.all(bias[:, 0, :] == 0) and torch.all(bias[:, :, 0] == 0)
    plan = pat.plan()
    s_layer = 1.0  # layer 1 of 3: halfway from 1.5 to 0.5
    for h, (direction, s_head) in enumerate(plan):
        for q in range(gh * gw):
            qy, qx = divmod(q, gw)
            for k in range(gh * gw):
                ky, kx = divmod(k, gw)
                dx, dy = kx - qx, ky - qy
                value = bias[h, 1 + q, 1 + k].item()
                visible = direction is None or _closed_form((variant, direction), dx, dy)
                if visible:
                    expected = -0.8 * s_layer * s_head * math.hypot(dx, dy)
                    assert value == pytest.approx(expected, abs=1e-5)
                else:
                    assert value == -math.inf


def test_lookhere_head_plan_for_any_head_count():
    # the paper's plan with the config's defaults: a third of the heads undirected, slopes 1/2, 1/8, ...
    assert head_plan(12, "90") == [(d, 1.0) for d in masks.LOOKHERE_DIRECTIONS["90"]] + [
        (None, 0.5), (None, 0.125), (None, 0.03125), (None, 0.0078125)
    ]
    for h in (1, 3, 6, 8, 12, 16):
        plan = head_plan(h, "45")
        assert len(plan) == h
        assert sum(d is not None for d, _ in plan) >= 1
    assert [d for d, _ in head_plan(3, "180")] == ["up", "down", None]
    assert lookhere_head_plan(4, "90", undirected_fraction=0.5, undirected_slope=1.0, undirected_slope_ratio=0.5,
                              layer=0, rotate_directions=False) == [("up", 1.0), ("down", 1.0), (None, 1.0), (None, 0.5)]


@pytest.mark.parametrize("variant", ["180", "90", "45"])
def test_lookhere_rotated_directions_cover_all_eight_across_layers(variant):
    names = set(masks.LOOKHERE_DIRECTIONS[variant])
    plans = [make("lookhere", 4, l, 3, variant=variant, rotate_directions=r).plan()
             for r in (False, True) for l in range(3)]
    fixed, rotated = plans[:3], plans[3:]
    # without rotation a 4-head ViT has 3 directed heads looking the same 3 ways in every layer
    assert {d for p in fixed for d, _ in p if d} == set(list(masks.LOOKHERE_DIRECTIONS[variant])[:3])
    assert {d for p in rotated for d, _ in p if d} == names
    assert rotated[0] == fixed[0]  # layer 0 is unchanged, and so is every undirected head
    assert [h for h in rotated[1] if h[0] is None] == [(None, 0.5)]
    assert AttentionConfig(kind="lookhere", variant=variant, rotate_directions=True).pattern(4, 1, 3).plan() == rotated[1]
    # 8 directed heads already cover every direction in each layer: rotation changes nothing
    assert all(make("lookhere", 12, l, 4, variant=variant, rotate_directions=True).plan()
               == make("lookhere", 12, l, 4, variant=variant).plan() for l in range(4))


@pytest.mark.parametrize("variant,expected", [("180", 0.5), ("90", 0.25), ("45", 0.125)])
def test_lookhere_directed_heads_see_their_share_on_a_large_grid(variant, expected):
    pat = make("lookhere", 8, variant=variant, undirected_fraction=0.0)
    s = cli.summarize(pat, (31, 31))
    assert s["visible_fraction"] == pytest.approx(expected, abs=0.04)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("heads", [1, 3, 6, 8, 12])
@pytest.mark.parametrize("num_prefix", [0, 1])
def test_every_row_keeps_a_visible_key(kind, heads, num_prefix):
    pat = make(kind, heads, layer=2, depth=4)
    for grid in [(3, 3), (2, 5), (9, 9)]:
        bias = pat.dense_bias(grid, num_prefix)
        n = num_prefix + grid[0] * grid[1]
        if kind == "full":  # nothing masked: no bias at all
            assert bias is None
            continue
        assert bias is not None and bias.shape == (heads, n, n)
        assert not torch.isnan(bias).any() and not torch.isposinf(bias).any()
        assert torch.isfinite(bias).any(dim=-1).all()


def test_attention_settings_have_their_default_in_attention_config_only():
    """The pattern classes and the functions they call take every setting without a default."""
    settings = {f.name for f in dataclasses.fields(AttentionConfig)} - {"kind", "impl"}  # kind: the class itself
    for cls in (FibottentionPattern, LookHerePattern, BigBirdPattern):
        fields = {f.name: f for f in dataclasses.fields(cls) if f.name in settings}
        assert fields, cls
        for name, f in fields.items():
            assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING, (cls.__name__, name)
    for fn in (fibottention_head_offsets, lookhere_head_plan):
        params = inspect.signature(fn).parameters
        assert all(p.default is inspect.Parameter.empty for n, p in params.items() if n in settings), fn.__name__
    with pytest.raises(TypeError):
        LookHerePattern(4, variant="90")  # the slopes must come from the config


def test_unknown_kind_lists_known():
    with pytest.raises(ValueError, match="known kinds: full, fibottention, lookhere, bigbird"):
        make_pattern("sparse-magic", 4)


@pytest.mark.parametrize("kind", list(cli.CLI_KINDS))
def test_cli_json_answers_for_every_kind(kind, capsys, tmp_path):
    png = tmp_path / "missing" / "folder" / "p.png"  # the CLI makes the folder
    assert cli.main([kind, "--grid", "6x5", "--heads", "3", "--depth", "2", "--json", "--png", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["grid"] == [6, 5]
    assert len(out["heads"]) == 3
    assert out["visible_fraction"] == pytest.approx(sum(h["visible_fraction"] for h in out["heads"]) / 3)
    if kind == "full":
        assert out["visible_fraction"] == 1.0
    if kind == "fibottention":
        assert all("offsets" in h for h in out["heads"])
    assert png.stat().st_size > 1000


def test_robot_windows_reproduce_the_authors_robot_learning_offsets():
    # exp.py of the authors' robot-learning encoder on a 9x9 grid with 4 heads (modified): every
    # head's window is N = 81, and only heads i > 1 get the local offsets i - 1 and a - (i - 1)
    rows = fibottention_head_offsets(81, 4, modified=True, w_min=5, w_max=None, windows="robot")
    assert rows == [[1, 2, 3, 5, 8, 13, 21, 34, 55], [1, 3, 4, 7, 11, 18, 29, 47, 76],
                    [2, 4, 6, 10, 16, 26, 42, 68], [3, 6, 9, 15, 24, 39, 63]]
    robot = make("fibottention", 4, windows="robot", shuffle=False).dense_bias((9, 9), 0)
    paper = make("fibottention", 4, shuffle=False).dense_bias((9, 9), 0)
    visible = lambda b: torch.isfinite(b).float().mean().item()  # noqa: E731
    assert visible(robot) == pytest.approx(0.153, abs=0.001)  # the 15.3% of pairs
    assert visible(paper) == pytest.approx(0.110, abs=0.001)  # against 11.0% for our default
    with pytest.raises(ValueError, match="attention.windows='wide' is unknown"):
        fibottention_head_offsets(81, 4, modified=True, w_min=5, w_max=None, windows="wide")


def test_multiplicative_mask_keeps_weight_on_masked_pairs():
    """The public code's logits x 0/1 mask: masked pairs get exp(0), so the head is not sparse."""
    from policies.vision.attention import attend, naive_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 17, 8) for _ in range(3))
    pat = make("fibottention", 4)
    bias = pat.dense_bias((4, 4), 1).unsqueeze(0)  # (1, heads, N, N)
    mult = attend(q, k, v, pat, (4, 4), 1, mask_mode="multiplicative")
    scores = (q @ k.transpose(-2, -1) / 8 ** 0.5) * torch.isfinite(bias)
    torch.testing.assert_close(mult, scores.softmax(-1) @ v)
    additive = attend(q, k, v, pat, (4, 4), 1)
    torch.testing.assert_close(additive, naive_attention(q, k, v, bias))
    assert (mult - additive).abs().max() > 0.1  # a different model, not a rounding difference
    # every masked pair carries weight in the multiplicative variant
    weights = scores.softmax(-1)
    assert (weights[torch.isinf(bias).expand_as(weights)] > 0).all()


@pytest.mark.parametrize("settings, message", [
    (dict(kind="lookhere", mask_mode="multiplicative"), "needs a 0/1 mask"),
    (dict(kind="fibottention", mask_mode="multiplicative", impl="sparse"), "use attention.impl=dense"),
    (dict(kind="fibottention", mask_mode="product"), "mask_mode='product' is unknown"),
])
def test_mask_mode_is_refused_where_it_cannot_apply(settings, message):
    with pytest.raises(ValueError, match=message):
        AttentionConfig(**settings)


def test_python_m_runs_the_cli_and_imports_no_circle():
    from tests.helpers import run_command

    proc = run_command(["-m", "policies.vision.masks", "lookhere-90", "--grid", "4x4", "--heads", "3", "--json"])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["kind"] == "lookhere-90"
    # the patterns load without the attention module (which imports them): no import circle
    proc = run_command(["-c", "import sys, policies.vision.masks; print('policies.vision.attention' in sys.modules)"])
    assert proc.stdout.strip() == "False", proc.stderr
