"""A timm VisionTransformer as the camera encoder (``policy.vit.backbone=timm:<model name>``).

timm builds the named model at the crop size and ``vit.patch_size`` (its width, depth and heads
are the named model's; ``vit.timm_kwargs`` overrides them), from scratch or from a local
safetensors file (``vit.pretrained``: timm resamples its position and patch embeddings to the new
grid and patch size; nothing is downloaded). ``swap_attention`` then gives every block the
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


def create_timm_vit(cfg: ViTConfig, crop_size: int) -> VisionTransformer:
    """timm's model named by ``cfg.backbone`` for ``crop_size`` crops, weights loaded, attention not yet swapped."""
    name = cfg.backbone[len(PREFIX):]
    if not timm.is_model(name):
        raise ValueError(f"vit.backbone={cfg.backbone!r}: timm has no model {name!r}; list them with timm.list_models('vit_*')")
    pretrained = {}
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
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"timm could not build {name!r} as a VisionTransformer with {kwargs}{' from ' + cfg.pretrained if cfg.pretrained else ''}: {detail}") from None
    if not isinstance(model, VisionTransformer):
        raise ValueError(f"vit.backbone={cfg.backbone!r} is a {type(model).__name__}, not a timm VisionTransformer: name a vit_* model")
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
