"""A small plain ViT whose attention pattern comes from config.

Grid-size aware: the token grid is derived from the input image on every call, so an image
larger than the training crop works without retraining (LookHere rebuilds its bias from
patch coordinates; learned position embeddings are interpolated, sin-cos ones recomputed).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .attention import Attention, AttentionConfig
from .masks import patch_coords

POS_EMBEDS = ("learned", "sincos", "none")
POOLS = ("cls", "mean", "spatial_softmax")
# fixed: [0, 1] -> [-1, 1] for every image. per_image: each image's channels standardized by their own
# mean and std, which cancels a uniform brightness shift and a contrast change (up to clipping)
INPUT_NORMS = ("fixed", "per_image")
# per_image: a floor on the std, not an added eps: exact for any contrast, finite for a flat image
PER_IMAGE_MIN_STD = 1e-3
RGB = 3  # the image's channels; any after them (a ray map) are not an image's and are not normalised as one
INIT_STD = 0.02  # truncated-normal init of the linear layers, CLS token and position embedding (timm's ViT)
SINCOS_BASE = 10000  # the sin-cos embedding's frequency base (the Transformer's)


def patch_grid(crop_size: int, patch_size: int) -> tuple[int, int]:
    """The patch grid of a square ``crop_size`` crop (the Conv2d patches floor it): the grid the
    learned position embedding is created for, and Fibottention's ``offset_grid=train``."""
    return (crop_size // patch_size,) * 2


@dataclass
class ViTConfig:
    patch_size: int = 8
    dim: int = 96
    depth: int = 3
    num_heads: int = 4
    mlp_ratio: float = 2.0
    use_cls: bool = True
    pool: str = "cls"  # cls | mean | spatial_softmax (cls/mean token + keypoint coordinates)
    num_keypoints: int = 32  # spatial_softmax only: keypoints read out of the patch tokens
    pos_embed: str = "learned"  # learned | sincos | none (LookHere never adds one)
    input_norm: str = "fixed"  # fixed | per_image (see INPUT_NORMS)
    out_dim: int = 64  # feature size handed to the policy
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    # timm:<model name>: timm's ViT at the crop size and patch_size, with this attention (timm_backbone.py);
    # its width, depth and heads are the named model's (dim, depth, num_heads, mlp_ratio, pos_embed unused)
    backbone: str | None = None
    pretrained: str | None = None  # timm backbone: a local safetensors weights file (nothing is downloaded)
    timm_kwargs: dict[str, Any] = field(default_factory=dict)  # timm backbone: timm.create_model overrides

    def __post_init__(self):
        if isinstance(self.attention, dict):
            self.attention = AttentionConfig(**self.attention)
        for name in ("patch_size", "dim", "depth", "num_heads", "out_dim", "num_keypoints"):
            if getattr(self, name) < 1:
                raise ValueError(f"vit.{name} must be >= 1, got {getattr(self, name)}")
        if self.dim % self.num_heads:
            raise ValueError(f"vit.dim ({self.dim}) must be divisible by vit.num_heads ({self.num_heads})")
        if self.pos_embed not in POS_EMBEDS:
            raise ValueError(f"vit.pos_embed={self.pos_embed!r} is unknown; choose one of {POS_EMBEDS}")
        if self.input_norm not in INPUT_NORMS:
            raise ValueError(f"vit.input_norm={self.input_norm!r} is unknown; choose one of {INPUT_NORMS}")
        if self.pool not in POOLS:
            raise ValueError(f"vit.pool={self.pool!r} is unknown; choose one of {POOLS}")
        if self.backbone is not None and not self.backbone.startswith("timm:"):
            raise ValueError(f"vit.backbone={self.backbone!r} is unknown; name a timm model as timm:<name>, or null for this ViT")
        if self.backbone is None and (self.pretrained or self.timm_kwargs):
            raise ValueError("vit.pretrained and vit.timm_kwargs need a timm encoder: set vit.backbone=timm:<name>")
        if self.pool == "cls" and not self.use_cls:
            raise ValueError("vit.pool='cls' needs vit.use_cls=true (or set vit.pool='mean')")


def sincos_2d(grid: tuple[int, int], dim: int, device=None) -> torch.Tensor:
    """2D sin-cos position embedding, (H*W, dim) in raster order."""
    if dim % 4:
        raise ValueError(f"sin-cos position embedding needs dim divisible by 4, got {dim}")
    gh, gw = grid
    y, x = torch.meshgrid(torch.arange(gh, device=device), torch.arange(gw, device=device), indexing="ij")
    omega = 1.0 / (SINCOS_BASE ** (torch.arange(dim // 4, device=device) / (dim // 4)))
    out = []
    for coord in (y.reshape(-1), x.reshape(-1)):
        ang = coord[:, None].float() * omega[None]  # (P, dim/4)
        out += [ang.sin(), ang.cos()]
    return torch.cat(out, dim=1)  # (P, dim)


class Block(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, pattern, impl: str, mask_mode: str = "additive"):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads, pattern, impl, mask_mode=mask_mode)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x, grid, num_prefix):
        x = x + self.attn(self.norm1(x), grid, num_prefix)
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """The encoder of ``crop_size`` crops (its learned position embedding is made for their patch grid)."""

    def __init__(self, cfg: ViTConfig, crop_size: int, in_chans: int = 3):
        super().__init__()
        self.cfg = cfg
        self.base_grid = patch_grid(crop_size, cfg.patch_size)
        att = cfg.attention
        self.patch_embed = nn.Conv2d(in_chans, cfg.dim, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.num_prefix = 1 if cfg.use_cls else 0
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.dim)) if cfg.use_cls else None
        patterns = [att.pattern(cfg.num_heads, layer, cfg.depth) for layer in range(cfg.depth)]
        # LookHere carries position in its bias alone; adding an embedding would break its
        # translation equivariance and its extrapolation to larger grids.
        self.pos_embed_kind = cfg.pos_embed if patterns[0].uses_pos_embed else "none"
        if self.pos_embed_kind == "learned":
            gh, gw = self.base_grid
            self.pos_embed = nn.Parameter(torch.randn(1, gh * gw, cfg.dim) * INIT_STD)
        else:
            self.pos_embed = None
        self.blocks = nn.ModuleList(Block(cfg.dim, cfg.num_heads, cfg.mlp_ratio, p, att.impl, att.mask_mode) for p in patterns)
        self.norm = nn.LayerNorm(cfg.dim)
        if cfg.pool == "spatial_softmax":
            # robomimic's SpatialSoftmax read-out on patch tokens: each keypoint is a softmax over
            # the grid, reduced to its expected (x, y). It hands the policy absolute positions,
            # which a translation-equivariant encoder (LookHere, no position embedding) otherwise
            # keeps only through border effects; coordinates are normalised, so any grid works.
            self.keypoints = nn.Linear(cfg.dim, cfg.num_keypoints)
            self.log_temperature = nn.Parameter(torch.zeros(()))
            head_in = cfg.dim + 2 * cfg.num_keypoints
        else:
            self.keypoints = None
            head_in = cfg.dim
        self.head = nn.Linear(head_in, cfg.out_dim)
        self._init_weights()

    def _init_weights(self):
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=INIT_STD)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=INIT_STD)

    def clear_attention_cache(self) -> None:
        """Free every layer's attention biases and sparse plans (rebuilt when next needed)."""
        for block in self.blocks:
            block.attn.clear_attention_cache()

    def _position(self, grid: tuple[int, int], device, dtype) -> torch.Tensor | None:
        if self.pos_embed_kind == "sincos":
            return sincos_2d(grid, self.cfg.dim, device).to(dtype)[None]
        if self.pos_embed_kind != "learned":
            return None
        base = self.base_grid
        if tuple(grid) == base:
            return self.pos_embed
        pe = self.pos_embed.reshape(1, base[0], base[1], -1).permute(0, 3, 1, 2)  # (1, dim, gh, gw)
        pe = F.interpolate(pe, size=grid, mode="bicubic", align_corners=False)
        return pe.permute(0, 2, 3, 1).reshape(1, grid[0] * grid[1], -1)  # (1, P, dim)

    def normalize_input(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W), the first three an image in [0, 1] -> the patch embedding's input."""
        rays = images[:, RGB:]  # (B, C - 3, H, W): a ray map's channels (none without one) enter as they are
        images = images[:, :RGB]  # (B, 3, H, W)
        if self.cfg.input_norm == "per_image":
            mean = images.mean(dim=(-2, -1), keepdim=True)  # (B, 3, 1, 1)
            std = images.std(dim=(-2, -1), keepdim=True)  # (B, 3, 1, 1)
            images = (images - mean) / std.clamp_min(PER_IMAGE_MIN_STD)
        else:
            images = images * 2.0 - 1.0
        return torch.cat([images, rays], dim=1) if rays.shape[1] else images

    def embed(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """images (B, C, H, W) in [0, 1] -> the first block's input (B, prefix + P, dim) and the patch grid."""
        x = self.patch_embed(self.normalize_input(images))  # (B, dim, gh, gw)
        grid = (x.shape[-2], x.shape[-1])
        x = x.flatten(2).transpose(1, 2)  # (B, P, dim)
        pos = self._position(grid, x.device, x.dtype)
        if pos is not None:
            x = x + pos
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)  # (B, 1 + P, dim)
        return x, grid

    def forward_tokens(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """images (B, C, H, W) in [0, 1] -> tokens (B, prefix + P, dim) after the last block."""
        x, grid = self.embed(images)
        for block in self.blocks:
            x = block(x, grid, self.num_prefix)
        return self.norm(x), grid

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, C, H, W) in [0, 1] -> features (B, out_dim)."""
        return self.read_out(*self.forward_tokens(images))

    def read_out(self, tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """tokens (B, prefix + P, dim) after the final norm -> features (B, out_dim)."""
        patches = tokens[:, self.num_prefix :]  # (B, P, dim)
        pooled = tokens[:, 0] if self.cfg.use_cls and self.cfg.pool != "mean" else patches.mean(dim=1)
        if self.keypoints is not None:
            pooled = torch.cat([pooled, self.spatial_softmax(patches, grid)], dim=-1)  # (B, dim + 2K)
        return self.head(pooled)

    def spatial_softmax(self, patches: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """patches (B, P, dim) -> expected keypoint coordinates in [-1, 1], (B, 2K) as x0, y0, x1, ..."""
        logits = self.keypoints(patches) / self.log_temperature.exp()  # (B, P, K)
        attn = logits.softmax(dim=1)  # (B, P, K): one distribution over the grid per keypoint
        x, y = patch_coords(grid, patches.device)  # (P,), (P,) in patch units, raster order
        coords = torch.stack([x / max(grid[1] - 1, 1), y / max(grid[0] - 1, 1)], dim=-1) * 2 - 1  # (P, 2)
        coords = coords.to(patches.dtype)
        kp = torch.einsum("bpk,pc->bkc", attn, coords)  # (B, K, 2)
        return kp.flatten(1)  # (B, 2K)
