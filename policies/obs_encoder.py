"""Observations -> one conditioning vector: an encoder per camera (+ crop and training augmentation) and normalized low-dim."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torchvision.transforms import v2

from .normalize import Normalizer
from .vision.resnet import ResNet18
from .vision.vit import ViT

# ColorJitter's settings -> the bound each must stay below: a factor's range U(1 - x, 1 + x) must stay
# positive; the hue shift U(-x, x) is a fraction of a turn, and half a turn already reaches every hue
COLOUR_RANGES = {"brightness": 1.0, "contrast": 1.0, "saturation": 1.0, "hue": 0.5}


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


def make_camera_encoder(config) -> nn.Module:
    """One camera's encoder (a PolicyConfig's ``encoder``): the ResNet-18 baseline, our ViT, or
    timm's named by ``vit.backbone`` (timm is imported only then)."""
    if config.encoder == "resnet18":
        return ResNet18(config.resnet)
    if config.vit.backbone is None:
        return ViT(config.vit, config.crop_size)
    from .vision.timm_backbone import TimmViT

    return TimmViT(config.vit, config.crop_size)


@dataclass
class ImageAugConfig:
    """Augmentation of every camera image, per sample, in training only (lerobot's
    ``image_transforms``), by torchvision v2 transforms. Off by default: the papers train without
    it, and a checkpoint written before a field existed reads it as off.

    Photometric (``ColorJitter``): each factor is drawn per image from U(1 - x, 1 + x), the hue
    shift from U(-x, x); 0 turns that jitter off. Positional (DrQ's random shift): the crop the
    encoder sees is padded by ``shift`` pixels on every side, replicating its border, and a crop of
    the same size is taken back at a random place, so the view moves by up to ``shift`` pixels."""

    brightness: float = 0.0  # multiplies the image
    contrast: float = 0.0  # scales the image about its mean grey
    saturation: float = 0.0  # scales the image about its own greyscale version
    hue: float = 0.0  # rotates the hue by this fraction of a full turn, at most
    shift: int = 0  # pixels (DrQ: 4 on 84-px images)

    def __post_init__(self):
        for name, high in COLOUR_RANGES.items():
            if not 0.0 <= getattr(self, name) < high:
                raise ValueError(f"policy.image_aug.{name} must be in [0, {high:g}), got {getattr(self, name)}")
        if self.shift < 0:
            raise ValueError(f"policy.image_aug.shift must be >= 0 pixels (0: no shift), got {self.shift}")

    def transform(self, crop_size: int) -> v2.Transform | None:
        """The per-image transform of ``crop_size`` crops (None when nothing is enabled): shift, then colour."""
        steps = []
        if self.shift:
            steps.append(v2.RandomCrop(crop_size, padding=self.shift, padding_mode="edge"))
        colour = {name: getattr(self, name) for name in COLOUR_RANGES if getattr(self, name) > 0}
        if colour:
            steps.append(v2.ColorJitter(**colour))
        return v2.Compose(steps) if steps else None


def jitter_images(x: torch.Tensor, transform: v2.Transform) -> torch.Tensor:
    """(N, C, H, W) in [0, 1] -> the same, each image through a draw of its own (a batched call of
    a v2 transform would draw one crop or factor for the whole batch)."""
    return torch.stack([transform(img) for img in x])


class ObsEncoder(nn.Module):
    def __init__(self, config, normalizer: Normalizer):
        super().__init__()
        self.config = config
        # a bound method, not a submodule: the policy owns the normalizer (one copy in the state dict)
        self._normalize = normalizer.normalize
        self.image_keys = config.image_keys
        self.lowdim_keys = config.lowdim_keys
        n_vits = 1 if config.share_vit else len(self.image_keys)
        # the camera encoders, ViT or ResNet: "vits" is the name checkpoints store their weights under
        self.vits = nn.ModuleList(make_camera_encoder(config) for _ in range(n_vits))
        self.image_steps = config.image_obs_steps
        self.augment = config.image_aug.transform(config.crop_size)
        # conditioning size: the last image_steps frames of each camera + To steps of every low-dim key
        self.output_dim = (self.image_steps * len(self.image_keys) * config.feature_dim
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
            if self.training and self.augment is not None:
                x = jitter_images(x, self.augment)
            vit = self.vits[0 if self.config.share_vit else i]
            feats.append(vit(x).reshape(b, -1))  # (B, To_img * out_dim)
        for key in self.lowdim_keys:
            feats.append(self._normalize(key, obs[key].float()).flatten(1))  # (B, To * D)
        return torch.cat(feats, dim=-1)  # (B, output_dim)
