"""timm ViTs with the package's attention: swap_attention on a user's model, and vit.backbone=timm:<name>.

Every model here is tiny and built from scratch (pretrained=False): nothing is downloaded."""
import pytest
import timm
import torch
from safetensors.torch import save_file

from policies.vision import swap_attention
from policies.vision.attention import AttentionConfig, naive_attention
from policies.vision.masks import KINDS
from policies.vision.swap import SwappedAttention, token_grid
from policies.vision.timm_backbone import TimmViT
from policies.vision.vit import ViTConfig

NAME = "vit_tiny_patch16_224"
TINY = dict(depth=2, embed_dim=32, num_heads=4)  # timm's ViT-Ti, shrunk
PATCH, CROP = 8, 24  # a 3 x 3 grid


def _timm(**kwargs):
    torch.manual_seed(0)
    return timm.create_model(NAME, pretrained=False, img_size=CROP, patch_size=PATCH, **{"num_classes": 0, **TINY, **kwargs})


def _encoder(kind="fibottention", pool="cls", **vit):
    torch.manual_seed(0)
    cfg = ViTConfig(patch_size=PATCH, backbone=f"timm:{NAME}", timm_kwargs=dict(TINY), out_dim=16, pool=pool,
                    attention=AttentionConfig(kind=kind), **vit)
    return TimmViT(cfg, CROP)


@pytest.mark.parametrize("extra", [{}, dict(reg_tokens=2), dict(class_token=False, global_pool="avg"), dict(dynamic_img_size=True)],
                         ids=["cls", "cls+registers", "no-prefix", "dynamic"])
def test_full_attention_swap_leaves_the_output_unchanged(extra):
    model = _timm(**extra).eval()
    images = torch.rand(2, 3, CROP, CROP)
    with torch.no_grad():
        before = model(images)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    swap_attention(model, AttentionConfig(kind="full"))
    assert all(isinstance(b.attn, SwappedAttention) for b in model.blocks)
    assert set(model.state_dict()) == set(weights), "the swap keeps the state dict's keys (timm weights load as before)"
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights[k]), k
    with torch.no_grad():
        after = model(images)
    assert before.abs().max() > 0
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["fibottention", "lookhere", "bigbird"])
def test_each_block_attends_with_its_layer_pattern_and_the_prefix_tokens(kind):
    """A block's swapped attention = softmax(q k^T / sqrt(d) + the layer's bias for CLS + 2 registers) v."""
    depth = 3
    model = swap_attention(_timm(reg_tokens=2, depth=depth), AttentionConfig(kind=kind)).eval()
    assert model.num_prefix_tokens == 3
    x = torch.randn(2, 3 + 9, TINY["embed_dim"])  # (B, prefix + P, dim)
    for layer, block in enumerate(model.blocks):
        attn = block.attn
        assert attn.pattern == AttentionConfig(kind=kind).pattern(TINY["num_heads"], layer, depth)
        q, k, v = attn.qkv(x).reshape(2, 12, 3, 4, 8).permute(2, 0, 3, 1, 4)  # 3 x (B, heads, N, head_dim)
        bias = attn.pattern.dense_bias((3, 3), 3)  # (heads, N, N)
        assert torch.isinf(bias[:, 3:, 3:]).any() and not torch.isinf(bias[:, :3]).any()  # sparse among patches; prefix sees all
        expected = attn.proj(naive_attention(q, k, v, bias).transpose(1, 2).reshape(2, 12, -1))  # (B, N, dim)
        torch.testing.assert_close(attn(x), expected, rtol=1e-4, atol=1e-5)
    if kind == "fibottention":  # the per-layer head shuffle: layers differ
        assert len({b.attn.pattern for b in model.blocks}) == depth
    if kind == "lookhere":  # per-layer slopes
        assert len({tuple(b.attn.pattern.head_slopes()) for b in model.blocks}) == depth


def test_lookhere_drops_the_position_embedding_and_others_keep_it():
    assert swap_attention(_timm(), AttentionConfig(kind="lookhere")).pos_embed is None
    assert "pos_embed" not in swap_attention(_timm(), AttentionConfig(kind="lookhere")).state_dict()
    assert swap_attention(_timm(), AttentionConfig(kind="fibottention")).pos_embed is not None


@pytest.mark.parametrize("model, message", [
    (lambda: _timm(qk_norm=True), "q_norm, k_norm"),
    (lambda: timm.create_model("vit_small_patch16_rope_224", pretrained=False, img_size=CROP, patch_size=PATCH, **TINY), "needs timm's Attention"),
    (lambda: torch.nn.Linear(3, 3), "needs a timm VisionTransformer"),
    (lambda: swap_attention(_timm(), AttentionConfig(kind="full")), "already swapped"),
])
def test_other_attentions_are_refused_in_one_line(model, message):
    with pytest.raises(ValueError, match=message) as err:
        swap_attention(model(), AttentionConfig(kind="fibottention"))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kind", ["fibottention", "lookhere"])
def test_swapped_models_train(kind):
    """The loss on one fixed batch falls: gradients flow through the swapped attention."""
    model = swap_attention(_timm(num_classes=4), AttentionConfig(kind=kind))
    torch.manual_seed(1)
    images, labels = torch.rand(8, 3, CROP, CROP), torch.arange(8) % 4
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(40):
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert model.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
    assert losses[-1] < 0.5 * losses[0], losses


def test_token_grid_keeps_the_built_aspect_ratio():
    assert token_grid(9, (3, 3)) == (3, 3)
    assert token_grid(16, (3, 3)) == (4, 4)
    assert token_grid(24, (2, 3)) == (4, 6)
    assert token_grid(6, (2, 3)) == (2, 3)


@pytest.mark.parametrize("pool", ["cls", "mean", "spatial_softmax"])
@pytest.mark.parametrize("kind", KINDS)
def test_the_timm_encoder_reads_out_like_our_vit_at_any_size(kind, pool):
    enc = _encoder(kind, pool).eval()
    assert enc.num_prefix == 1 and len(enc.blocks) == TINY["depth"]
    out = enc(torch.rand(2, 3, CROP, CROP))
    assert out.shape == (2, 16) and torch.isfinite(out).all()
    tokens, grid = enc.forward_tokens(torch.rand(2, 3, 36, 36))  # a larger render: 4 x 4 (4 px dropped, as Conv2d patches)
    assert grid == (4, 4) and tokens.shape == (2, 1 + 16, TINY["embed_dim"])
    assert torch.isfinite(enc.read_out(tokens, grid)).all()


@pytest.mark.parametrize("kind", ["fibottention", "lookhere"])
def test_the_sparse_path_matches_the_dense_one_in_a_timm_model(kind):
    dense, sparse = _timm(reg_tokens=1).eval(), _timm(reg_tokens=1).eval()  # the same seed: the same weights
    swap_attention(dense, AttentionConfig(kind=kind, impl="dense"))
    swap_attention(sparse, AttentionConfig(kind=kind, impl="sparse"))
    images = torch.rand(2, 3, CROP, CROP)
    torch.testing.assert_close(sparse(images), dense(images), rtol=1e-4, atol=1e-5)


def test_the_timm_encoder_normalises_input_as_our_vit():
    enc = _encoder()
    images = torch.rand(2, 3, CROP, CROP)
    torch.testing.assert_close(enc.normalize_input(images), images * 2 - 1)  # timm's ViT mean = std = 0.5


def test_pretrained_weights_load_from_a_local_file_at_another_patch_size(tmp_path):
    source = timm.create_model(NAME, pretrained=False, img_size=32, patch_size=16, **TINY)  # 2 x 2 grid, 1000 classes
    path = tmp_path / "vit.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    enc = _encoder("full", pretrained=str(path))
    torch.testing.assert_close(enc.model.blocks[1].attn.qkv.weight, source.blocks[1].attn.qkv.weight)
    assert enc.model.patch_embed.proj.weight.shape == (TINY["embed_dim"], 3, PATCH, PATCH)  # resampled by timm
    assert enc.model.pos_embed.shape == (1, 1 + 9, TINY["embed_dim"])  # resampled to the 3 x 3 grid
    assert torch.isfinite(enc(torch.rand(1, 3, CROP, CROP))).all()


@pytest.mark.parametrize("vit, error, message", [
    (dict(pretrained="/nonexistent/vit.safetensors"), FileNotFoundError, "does not exist"),
    (dict(pretrained="/tmp/vit.pth"), ValueError, "not a .safetensors file"),
    (dict(backbone="timm:no_such_vit"), ValueError, "timm has no model"),
    (dict(backbone="timm:resnet18"), ValueError, "is a ResNet, and the policy's camera encoder needs a timm VisionTransformer"),
    (dict(backbone="timm:vit_small_patch16_rope_224"), ValueError, "is a Eva, not a timm VisionTransformer"),
    (dict(timm_kwargs=dict(class_token=False, global_pool="avg")), ValueError, "pool=mean"),
])
def test_encoder_errors_are_one_line(vit, error, message):
    with pytest.raises(error, match=message) as err:
        _build(vit)
    assert "\n" not in str(err.value)


def _build(vit):
    cfg = dict(patch_size=PATCH, backbone=f"timm:{NAME}", timm_kwargs=dict(TINY))
    cfg.update(vit)
    return TimmViT(ViTConfig(**cfg), CROP)


@pytest.mark.parametrize("vit, message", [
    (dict(backbone="resnet18"), "timm:<name>"),
    (dict(pretrained="/tmp/vit.safetensors"), "need a timm encoder"),
])
def test_config_errors_are_one_line(vit, message):
    with pytest.raises(ValueError, match=message):
        ViTConfig(**vit)


def test_a_policy_with_a_timm_encoder_trains_saves_and_loads(tmp_path, tiny_pusht_zarr):
    """train -> checkpoint -> load_policy gives the same actions, without the pretrained file it started from."""
    from core.training import train
    from policies.checkpoint import load_policy
    from tests.helpers import tiny_train_cfg

    weights = tmp_path / "vit.safetensors"
    source = timm.create_model(NAME, pretrained=False, img_size=32, patch_size=16, **TINY)
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(weights))
    timm_vit = [f"policy.vit.backbone=timm:{NAME}", f"policy.vit.pretrained={weights}", "policy.vit.patch_size=12",
                "policy.vit.pool=mean", *(f"+policy.vit.timm_kwargs.{k}={v}" for k, v in TINY.items())]
    cfg = tiny_train_cfg(tmp_path, tiny_pusht_zarr, "bc", "fibottention", extra=timm_vit)
    last = train(cfg).checkpoint
    weights.unlink()
    a, b = load_policy(last), load_policy(last)
    vit = a.obs_encoder.vits[0]
    assert isinstance(vit, TimmViT) and len(vit.blocks) == 2 and vit.model.patch_embed.grid_size == (7, 7)
    assert all(isinstance(blk.attn, SwappedAttention) and blk.attn.pattern.kind == "fibottention" for blk in vit.blocks)
    obs = {"image": torch.randint(0, 256, (2, 2, 96, 96, 3), dtype=torch.uint8), "agent_pos": torch.rand(2, 2, 2) * 512}
    torch.testing.assert_close(a.predict_action_chunk(obs), b.predict_action_chunk(obs), rtol=0, atol=0)


def test_timm_kwargs_override_the_encoders_own_arguments():
    enc = _build(dict(timm_kwargs={**TINY, "dynamic_img_size": False, "reg_tokens": 2}, pool="cls"))
    assert enc.num_prefix == 3 and not enc.model.dynamic_img_size
    assert enc(torch.rand(2, 3, CROP, CROP)).shape == (2, 64)


def test_the_authors_encoder_preset_names_timm_vit_b_with_8px_patches_and_a_mean_read_out():
    from core.config import compose

    cfg = compose("config", ["task=pusht", "policy=diffusion", "attention=fibottention", "recipe=paper",
                             "+recipe/preset@_global_=authors_vit"])
    vit = cfg.policy.vit
    assert (vit.backbone, vit.patch_size, vit.pool, vit.pretrained) == ("timm:vit_base_patch16_224", 8, "mean", None)
    assert cfg.train.lr == 1e-4  # still the paper's protocol
