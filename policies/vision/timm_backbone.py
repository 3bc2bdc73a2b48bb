"""A timm VisionTransformer as the camera encoder (``policy.vit.backbone=timm:<model name>``).

timm builds the named model at the crop size and ``vit.patch_size`` (its width, depth and heads
are the named model's; ``vit.timm_kwargs`` overrides them), from scratch or from a local
safetensors file (``vit.pretrained``: timm resamples its position and patch embeddings to the new
grid and patch size; nothing is downloaded). ``vit.timm_kwargs`` may only shape the architecture
(``ARCHITECTURE_KWARGS``): a config, a checkpoint's included, cannot make timm read a file
(``checkpoint_path``, ``pretrained_cfg_overlay``) or download weights (``pretrained``).
``swap_attention`` then gives every block the
package's attention, and the read-outs (cls, mean, spatial_softmax) and head are ``ViT``'s own, so
the policy sees the same interface: images (B, C, H, W) in [0, 1] -> features (B, out_dim).
"""
from __future__ import annotations

from pathlib import Path

import timm
import torch
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from .swap import swap_attention
from .vit import INIT_STD, ViT, ViTConfig

PREFIX = "timm:"
WEIGHT_SUFFIX = ".safetensors"  # weights without pickles, as our checkpoints
EXAMPLE_VIT = "timm:vit_tiny_patch16_224"  # named when a backbone is not a ViT
# The timm.create_model arguments vit.timm_kwargs may give: VisionTransformer's arguments that take a
# plain value and only shape the model. Left out: create_model's own (pretrained, pretrained_cfg,
# pretrained_cfg_overlay, checkpoint_path, cache_dir: they read files or reach the network) and the
# layer classes, device and dtype (not data a config should carry).
ARCHITECTURE_KWARGS = (
    "img_size", "patch_size", "in_chans", "num_classes", "global_pool", "embed_dim", "depth", "num_heads",
    "mlp_ratio", "qkv_bias", "qk_norm", "scale_attn_norm", "scale_mlp_norm", "proj_bias", "init_values",
    "class_token", "pos_embed", "no_embed_class", "reg_tokens", "pre_norm", "final_norm", "fc_norm",
    "pool_include_prefix", "dynamic_img_size", "dynamic_img_pad", "drop_rate", "pos_drop_rate",
    "patch_drop_rate", "proj_drop_rate", "attn_drop_rate", "drop_path_rate", "weight_init", "fix_init",
)


def check_timm_kwargs(kwargs: dict, name: str) -> None:
    """Refuse, before timm sees them, ``vit.timm_kwargs`` that are not architecture settings."""
    refused = sorted(set(kwargs) - set(ARCHITECTURE_KWARGS))
    if not refused:
        return
    if "pretrained" in refused:  # a download: say how to get the file, which is then passed as vit.pretrained
        hub = getattr(timm.models.get_pretrained_cfg(name), "hf_hub_id", None) if timm.is_model(name) else None
        fetch = f"huggingface-cli download {hub} model.safetensors" if hub else "download the weights yourself"
        raise ValueError(f"vit.timm_kwargs.pretrained would download the weights of {name!r}, and the package "
                         f"downloads nothing: {fetch}, then pass policy.vit.pretrained=<that .safetensors file>")
    raise ValueError(f"vit.timm_kwargs {', '.join(refused)}: not an architecture setting; timm_kwargs may only shape "
                     f"the VisionTransformer (img_size, embed_dim, depth, num_heads, reg_tokens...: ARCHITECTURE_KWARGS "
                     f"in {__name__}), never name a file to read or a download; give local weights as "
                     f"policy.vit.pretrained=<a .safetensors file>")


def _not_a_vit(name: str) -> str | None:
    """The class of timm's model ``name`` when it is no VisionTransformer (built on the meta device:
    nothing is allocated), else None."""
    try:
        with torch.device("meta"):
            cls = type(timm.create_model(name, pretrained=False))
    except Exception:  # a model that cannot even be built with its defaults: the build's own error says why
        return None
    return None if issubclass(cls, VisionTransformer) else cls.__name__


def create_timm_vit(cfg: ViTConfig, crop_size: int) -> VisionTransformer:
    """timm's model named by ``cfg.backbone`` for ``crop_size`` crops, weights loaded, attention not yet swapped."""
    name = cfg.backbone[len(PREFIX):]
    if not timm.is_model(name):
        raise ValueError(f"vit.backbone={cfg.backbone!r}: timm has no model {name!r}; list them with timm.list_models('vit_*')")
    check_timm_kwargs(cfg.timm_kwargs, name)
    pretrained = dict(pretrained=False)
    if cfg.pretrained:
        path = Path(cfg.pretrained)
        if path.suffix != WEIGHT_SUFFIX:
            raise ValueError(f"vit.pretrained={path} is not a {WEIGHT_SUFFIX} file: convert the weights with safetensors.torch.save_file")
        if not path.is_file():
            raise FileNotFoundError(f"vit.pretrained={path} does not exist: give a local {WEIGHT_SUFFIX} file (nothing is downloaded)")
        # a local file takes priority over the hub in timm's loader; "source" is cleared so no hub id can win
        pretrained = dict(pretrained=True, pretrained_cfg_overlay=dict(file=str(path), source=""))
    img = crop_size // cfg.patch_size * cfg.patch_size  # Conv2d patches floor the crop as our ViT does
    # dynamic_img_size: larger evaluation renders resample the position embedding, as our ViT interpolates it
    kwargs = {**dict(img_size=img, patch_size=cfg.patch_size, num_classes=0, dynamic_img_size=True), **cfg.timm_kwargs}
    try:
        model = timm.create_model(name, **pretrained, **kwargs)
    except (RuntimeError, TypeError, KeyError, ValueError, AssertionError) as exc:
        other = _not_a_vit(name)
        if other is not None:
            raise ValueError(f"vit.backbone={cfg.backbone!r} is a {other}, and the policy's camera encoder needs a "
                             f"timm VisionTransformer: name one, e.g. policy.vit.backbone={EXAMPLE_VIT} "
                             f"(timm.list_models('vit_*') lists them)") from None
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"timm could not build {name!r} as a VisionTransformer with {kwargs}{' from ' + cfg.pretrained if cfg.pretrained else ''}: {detail}") from None
    if not isinstance(model, VisionTransformer):
        raise ValueError(f"vit.backbone={cfg.backbone!r} is a {type(model).__name__}, not a timm VisionTransformer: "
                         f"name one, e.g. policy.vit.backbone={EXAMPLE_VIT}")
    return model


class TimmViT(nn.Module):
    """``ViT``'s interface around a timm VisionTransformer with the package's attention."""

    # the read-outs are ViT's: they use cfg, num_prefix, keypoints, log_temperature and head
    read_out = ViT.read_out
    spatial_softmax = ViT.spatial_softmax

    def __init__(self, cfg: ViTConfig, crop_size: int):
        super().__init__()
        self.cfg = cfg
        self.model = swap_attention(create_timm_vit(cfg, crop_size), cfg.attention)
        self.num_prefix = self.model.num_prefix_tokens
        if cfg.pool != "mean" and cfg.use_cls and self.model.cls_token is None:
            raise ValueError(f"vit.pool={cfg.pool!r} reads the CLS token, which {cfg.backbone} has none of: set policy.vit.pool=mean")
        # "fixed" input normalisation is the model's own (timm's ViTs: mean = std = 0.5, our [-1, 1])
        for name in ("mean", "std"):
            value = torch.tensor(self.model.pretrained_cfg[name], dtype=torch.float32).reshape(1, -1, 1, 1)  # (1, C, 1, 1)
            self.register_buffer(name, value, persistent=False)
        dim = self.model.embed_dim
        self.keypoints = nn.Linear(dim, cfg.num_keypoints) if cfg.pool == "spatial_softmax" else None
        self.log_temperature = nn.Parameter(torch.zeros(())) if self.keypoints is not None else None
        self.head = nn.Linear(dim + (2 * cfg.num_keypoints if self.keypoints is not None else 0), cfg.out_dim)
        for layer in (self.keypoints, self.head):
            if layer is not None:  # as ViT._init_weights
                nn.init.trunc_normal_(layer.weight, std=INIT_STD)
                nn.init.zeros_(layer.bias)

    @property
    def blocks(self) -> nn.Sequential:
        """The timm blocks; each ``.attn`` is the package's attention (analyses read them as ViT's)."""
        return self.model.blocks

    def clear_attention_cache(self) -> None:
        """Free every layer's attention biases and sparse plans (rebuilt when next needed)."""
        for block in self.blocks:
            block.attn.clear_attention_cache()

    def normalize_input(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) in [0, 1] -> the patch embedding's input."""
        if self.cfg.input_norm == "per_image":
            return ViT.normalize_input(self, images)
        return (images - self.mean) / self.std

    def forward_tokens(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """images (B, C, H, W) in [0, 1] -> tokens (B, prefix + P, dim) after the final norm, and the grid."""
        p = self.cfg.patch_size
        grid = (images.shape[-2] // p, images.shape[-1] // p)
        images = images[..., : grid[0] * p, : grid[1] * p]  # (B, C, gh * p, gw * p): timm needs whole patches
        return self.model.forward_features(self.normalize_input(images)), grid

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, C, H, W) in [0, 1] -> features (B, out_dim)."""
        return self.read_out(*self.forward_tokens(images))
