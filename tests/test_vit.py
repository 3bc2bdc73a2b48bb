"""The ViT encoder with every attention kind: finite, differentiable, grid-size aware."""
import math

import pytest
import torch

from policies.vision.attention import AttentionConfig, attend, naive_attention
from policies.vision.masks import KINDS as KIND_NAMES
from policies.vision.masks import LOOKHERE_DIRECTIONS
from policies.vision.vit import ViT, ViTConfig
from tests.helpers import VIT_CROP


def _variants(kind: str) -> list[dict]:
    """The settings that change a kind's pattern qualitatively (the rest keep their defaults)."""
    if kind == "fibottention":
        return [dict(modified=False), dict(modified=True)]
    if kind == "lookhere":
        return [dict(variant=v) for v in LOOKHERE_DIRECTIONS]
    return [{}]


# every registered kind, in each of its variants
KINDS = [dict(kind=kind, **variant) for kind in KIND_NAMES for variant in _variants(kind)]


def _pattern(kind: str, heads: int, layer: int = 0, depth: int = 1, **settings):
    return AttentionConfig(kind=kind, **settings).pattern(heads, layer, depth)


def _vit(att, heads=4, use_cls=True, pos="learned"):
    torch.manual_seed(0)
    cfg = ViTConfig(patch_size=8, dim=48 if heads != 12 else 96, depth=2, num_heads=heads, use_cls=use_cls,
                    pool="cls" if use_cls else "mean", pos_embed=pos, attention=AttentionConfig(**att))
    return ViT(cfg, VIT_CROP)


def _unmasked(vit: ViT) -> ViT:
    """The same encoder (same weights, position embedding, read-out) with every mask removed: what an
    encoder that ignored its attention pattern would compute."""
    import copy

    from policies.vision.attention import Attention
    from policies.vision.masks import FullPattern

    twin = copy.deepcopy(vit)
    for module in twin.modules():
        if isinstance(module, Attention):
            module.pattern = FullPattern(module.pattern.num_heads)
            module.clear_attention_cache()
    return twin


def _assert_the_mask_acts(att: dict, vit: ViT, images: torch.Tensor) -> None:
    out, free = vit(images), _unmasked(vit)(images)
    assert out.shape == free.shape == (images.shape[0], 64)
    assert torch.isfinite(out).all()
    if att["kind"] == "full":
        torch.testing.assert_close(out, free, rtol=0, atol=0)
    else:  # the pattern changes what the encoder computes
        assert (out - free).abs().max() > 1e-4, att


@pytest.mark.parametrize("att", KINDS, ids=lambda a: "-".join(str(v) for v in a.values()))
@pytest.mark.parametrize("heads", [1, 3, 6, 8, 12])
def test_forward_any_head_count_applies_the_mask(att, heads):
    _assert_the_mask_acts(att, _vit(att, heads).eval(), torch.rand(2, 3, 72, 72))


@pytest.mark.parametrize("att", KINDS, ids=lambda a: "-".join(str(v) for v in a.values()))
@pytest.mark.parametrize("use_cls", [True, False])
def test_grid_change_9x9_to_12x12_applies_the_mask_of_the_new_grid(att, use_cls):
    vit = _vit(att, use_cls=use_cls).eval()
    _assert_the_mask_acts(att, vit, torch.rand(2, 3, 72, 72))  # 9 x 9 patches
    _assert_the_mask_acts(att, vit, torch.rand(2, 3, 96, 96))  # 12 x 12 patches, never seen in training
    _, grid = vit.forward_tokens(torch.rand(1, 3, 96, 96))
    assert grid == (12, 12)
    if att["kind"] != "full":  # the bias was rebuilt for 12 x 12: (1, heads, prefix + 144, prefix + 144)
        attention = next(m for m in vit.modules() if hasattr(m, "dense_bias") and hasattr(m, "cache"))
        n = int(use_cls) + 144
        assert attention.dense_bias((12, 12), int(use_cls), "cpu").shape[-2:] == (n, n)


@pytest.mark.parametrize("att", KINDS, ids=lambda a: "-".join(str(v) for v in a.values()))
def test_gradients_reach_every_parameter(att):
    vit = _vit(att)
    vit(torch.rand(2, 3, 72, 72)).square().sum().backward()
    for name, p in vit.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_lookhere_has_no_position_embedding():
    vit = _vit(dict(kind="lookhere"))
    assert vit.pos_embed is None and vit.pos_embed_kind == "none"
    assert _vit(dict(kind="fibottention")).pos_embed is not None


def test_lookhere_without_cls_is_translation_equivariant():
    """No position embedding + relative bias: shifting the image shifts the interior tokens."""
    vit = _vit(dict(kind="lookhere", variant="90"), use_cls=False).eval()
    torch.manual_seed(1)
    img = torch.rand(1, 3, 96, 96)
    shifted = torch.roll(img, shifts=8, dims=-1)  # one patch to the right
    t0, _ = vit.forward_tokens(img)
    t1, _ = vit.forward_tokens(shifted)
    g0 = t0.reshape(12, 12, -1)
    g1 = t1.reshape(12, 12, -1)
    # far from the borders the bias (hence the output) is identical up to the shift; borders differ
    # because the visible set is clipped by the grid, and the penalty makes far tokens negligible
    diff = (g0[4:8, 4:8] - g1[4:8, 5:9]).abs().max()
    ref = g0[4:8, 4:8].abs().max()
    assert diff < 0.05 * ref


@pytest.mark.parametrize("kind", KIND_NAMES)
@pytest.mark.parametrize("num_prefix", [0, 1])
def test_fused_sdpa_matches_naive_softmax(kind, num_prefix):
    torch.manual_seed(0)
    grid = (5, 7)
    n = num_prefix + 35
    pat = _pattern(kind, 6, layer=1, depth=3)
    q, k, v = (torch.randn(2, 6, n, 16, dtype=torch.float64) for _ in range(3))
    fused = attend(q, k, v, pat, grid, num_prefix)
    bias = pat.dense_bias(grid, num_prefix)
    ref = naive_attention(q, k, v, None if bias is None else bias.double())
    assert torch.isfinite(fused).all()
    torch.testing.assert_close(fused, ref, rtol=1e-10, atol=1e-10)


def test_masked_logits_get_exactly_zero_weight():
    """-inf masks, not multiplicative 0/1 ones: a masked key with a huge value changes nothing."""
    torch.manual_seed(0)
    pat = _pattern("fibottention", 4, modified=False, shuffle=False)
    grid, n = (4, 4), 16
    q, k, v = (torch.randn(1, 4, n, 8) for _ in range(3))
    bias = pat.dense_bias(grid, 0)
    base = attend(q, k, v, pat, grid, 0)
    # head 0 sees offsets {1, 2, 3, 5} only; token 0 never sees token 4 in head 0
    assert torch.isneginf(bias[0, 0, 4])
    v2 = v.clone()
    v2[0, 0, 4] += 1e6
    out = attend(q, k, v2, pat, grid, 0)
    assert torch.equal(out[0, 0, 0], base[0, 0, 0])


def test_bias_is_cached_and_rebuilt_for_a_new_grid():
    vit = _vit(dict(kind="lookhere")).eval()
    attn = vit.blocks[0].attn
    with torch.no_grad():
        vit(torch.rand(1, 3, 72, 72))  # 9 x 9 patches + CLS
    a = attn.dense_bias((9, 9), 1, "cpu")
    assert a.shape == (1, 4, 82, 82) and len(attn.cache) == 1  # the forward built exactly this one
    with torch.no_grad():
        vit(torch.rand(1, 3, 72, 72))
    assert attn.dense_bias((9, 9), 1, "cpu") is a and len(attn.cache) == 1
    with torch.no_grad():
        vit(torch.rand(1, 3, 96, 96))  # a new grid: a new bias, the old one kept
    assert attn.dense_bias((12, 12), 1, "cpu").shape == (1, 4, 145, 145) and len(attn.cache) == 2
    vit.clear_attention_cache()
    assert all(len(block.attn.cache) == 0 for block in vit.blocks)


def test_sincos_position_embedding_interpolates_any_grid():
    vit = _vit(dict(kind="fibottention"), pos="sincos")
    assert vit.pos_embed is None
    assert torch.isfinite(vit(torch.rand(1, 3, 64, 88))).all()


def test_spatial_softmax_reads_the_peak_patch_coordinates():
    """A keypoint that fires on one patch reads that patch's normalised (x, y), on any grid."""
    torch.manual_seed(0)
    vit = ViT(ViTConfig(dim=48, num_heads=4, pool="spatial_softmax", num_keypoints=2,
                        attention=AttentionConfig(kind="lookhere")), VIT_CROP)
    with torch.no_grad():
        vit.keypoints.weight.zero_()
        vit.keypoints.bias.zero_()
        vit.keypoints.weight[0, 0] = 100.0  # keypoint 0 follows feature 0
        vit.keypoints.weight[1, 1] = 100.0  # keypoint 1 follows feature 1
    for grid in [(9, 9), (5, 7)]:
        patches = torch.zeros(1, grid[0] * grid[1], 48)
        patches[0, 2 * grid[1] + 3, 0] = 1.0  # row 2, column 3
        patches[0, (grid[0] - 1) * grid[1], 1] = 1.0  # bottom-left corner
        kp = vit.spatial_softmax(patches, grid)
        expect = torch.tensor([[-1 + 2 * 3 / (grid[1] - 1), -1 + 2 * 2 / (grid[0] - 1), -1.0, 1.0]])
        torch.testing.assert_close(kp, expect, atol=1e-4, rtol=0)


def test_spatial_softmax_gives_lookhere_absolute_position():
    """Without a position embedding the CLS read-out barely tells where an object is; the
    keypoint read-out moves with it: shifting a bright square right raises keypoint x."""
    torch.manual_seed(0)
    vit = ViT(ViTConfig(dim=48, num_heads=4, depth=2, pool="spatial_softmax", num_keypoints=8,
                        attention=AttentionConfig(kind="lookhere")), VIT_CROP).eval()
    with torch.no_grad():
        vit.log_temperature.fill_(-3.0)  # sharp keypoints
    img = torch.zeros(1, 3, 72, 72)
    img[..., 32:40, 8:16] = 1.0
    shifted = torch.roll(img, shifts=40, dims=-1)
    with torch.no_grad():
        t0, grid = vit.forward_tokens(img)
        t1, _ = vit.forward_tokens(shifted)
        x0 = vit.spatial_softmax(t0[:, vit.num_prefix :], grid)[0, 0::2]
        x1 = vit.spatial_softmax(t1[:, vit.num_prefix :], grid)[0, 0::2]
    assert (x1 - x0).mean() > 0.2


def test_spatial_softmax_config_is_checked():
    with pytest.raises(ValueError, match="vit.num_keypoints must be >= 1"):
        ViTConfig(pool="spatial_softmax", num_keypoints=0)
    with pytest.raises(ValueError, match="vit.pool='max' is unknown"):
        ViTConfig(pool="max")


def test_per_image_input_norm_cancels_a_brightness_shift_and_a_contrast_change():
    torch.manual_seed(0)
    images = 0.2 + 0.5 * torch.rand(3, 3, 72, 72)  # away from 0 and 1, so neither change clips
    shifted, flattened = images + 0.1, 0.5 + 0.5 * (images - 0.5)  # brightness +0.1, contrast x0.5 (the robustness study's)
    for kind in ("full", "fibottention"):
        per_image = ViT(ViTConfig(dim=48, depth=2, num_heads=4, input_norm="per_image", attention=AttentionConfig(kind=kind)), VIT_CROP).eval()
        fixed = ViT(ViTConfig(dim=48, depth=2, num_heads=4, attention=AttentionConfig(kind=kind)), VIT_CROP).eval()
        with torch.no_grad():
            out = per_image(images)
            for changed in (shifted, flattened):
                assert torch.allclose(per_image(changed), out, atol=1e-4)  # the same features
                assert (fixed(changed) - fixed(images)).abs().max() > 1e-2  # where the fixed scaling moves them
    with pytest.raises(ValueError, match="vit.input_norm='imagenet' is unknown"):
        ViTConfig(input_norm="imagenet")
