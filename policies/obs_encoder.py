"""Observations -> one conditioning vector: a ViT per camera (+ crop) and normalized low-dim."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torchvision.transforms import v2

from .normalize import Normalizer
from .vision.vit import ViT, ViTConfig


def crop_images(x: torch.Tensor, size: int, random: bool) -> torch.Tensor:
    """(N, C, H, W) -> (N, C, size, size): a random crop per image in training, centre at evaluation."""
    n, c, h, w = x.shape
    if size > min(h, w):
        raise ValueError(f"crop {size} is larger than the image {h}x{w}")
    if not random:
        top, left = (h - size) // 2, (w - size) // 2
        return x[:, :, top : top + size, left : left + size]
    top = torch.randint(0, h - size + 1, (n,), device=x.device)
    left = torch.randint(0, w - size + 1, (n,), device=x.device)
    ar = torch.arange(size, device=x.device)
    rows = (top[:, None] + ar)[:, :, None]  # (N, size, 1)
    cols = (left[:, None] + ar)[:, None, :]  # (N, 1, size)
    batch = torch.arange(n, device=x.device)[:, None, None]
    return x.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2)  # (N, C, size, size)


def make_vit(cfg: ViTConfig, crop_size: int) -> nn.Module:
    """One camera's encoder: our ViT, or timm's named by ``vit.backbone`` (timm is imported only then)."""
    if cfg.backbone is None:
        return ViT(cfg, crop_size)
    from .vision.timm_backbone import TimmViT

    return TimmViT(cfg, crop_size)


@dataclass
class ImageAugConfig:
    """Photometric augmentation of every camera image, per sample, in training only (lerobot's
    ``image_transforms``). Off by default: the papers train without it. Each factor is drawn per
    image from U(1 - x, 1 + x), as torchvision's ``ColorJitter`` does; 0 turns that jitter off."""

    brightness: float = 0.0  # multiplies the image
    contrast: float = 0.0  # scales the image about its mean grey

    def __post_init__(self):
        for name in ("brightness", "contrast"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"policy.image_aug.{name} must be in [0, 1), got {getattr(self, name)}")

    @property
    def enabled(self) -> bool:
        return self.brightness > 0 or self.contrast > 0


def jitter_images(x: torch.Tensor, jitter: v2.ColorJitter) -> torch.Tensor:
    """(N, C, H, W) in [0, 1] -> the same, each image with factors of its own (a batched call of
    ``ColorJitter`` would draw one factor for the whole batch)."""
    return torch.stack([jitter(img) for img in x])


class ObsEncoder(nn.Module):
    def __init__(self, config, normalizer: Normalizer):
        super().__init__()
        self.config = config
        # a bound method, not a submodule: the policy owns the normalizer (one copy in the state dict)
        self._normalize = normalizer.normalize
        self.image_keys = config.image_keys
        self.lowdim_keys = config.lowdim_keys
        n_vits = 1 if config.share_vit else len(self.image_keys)
        self.vits = nn.ModuleList(make_vit(config.vit, config.crop_size) for _ in range(n_vits))
        self.image_steps = config.image_obs_steps
        aug = config.image_aug
        self.jitter = v2.ColorJitter(brightness=aug.brightness or None, contrast=aug.contrast or None) if aug.enabled else None
        # conditioning size: the last image_steps frames of each camera + To steps of every low-dim key
        self.output_dim = (self.image_steps * len(self.image_keys) * config.vit.out_dim
                           + config.n_obs_steps * sum(config.input_shapes[k][0] for k in self.lowdim_keys))

    def crop_size_for(self, key: str, height: int) -> int:
        """The training crop, scaled with the image when evaluating on larger renders."""
        train_h = self.config.input_shapes[key][1]
        return round(self.config.crop_size * height / train_h)

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """obs[key]: (B, To, H, W, C) uint8 images or (B, To, D) low-dim -> (B, output_dim)."""
        feats = []
        for i, key in enumerate(self.image_keys):
            img = obs[key][:, -self.image_steps :]  # (B, To_img, H, W, C): the latest frames
            b, t = img.shape[:2]
            x = img.reshape(b * t, *img.shape[2:]).permute(0, 3, 1, 2).float() / 255.0  # (B*To, C, H, W)
            x = crop_images(x, self.crop_size_for(key, x.shape[-2]), random=self.training)
            if self.training and self.jitter is not None:
                x = jitter_images(x, self.jitter)
            vit = self.vits[0 if self.config.share_vit else i]
            feats.append(vit(x).reshape(b, -1))  # (B, To_img * out_dim)
        for key in self.lowdim_keys:
            feats.append(self._normalize(key, obs[key].float()).flatten(1))  # (B, To * D)
        return torch.cat(feats, dim=-1)  # (B, output_dim)
