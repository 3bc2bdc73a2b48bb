"""Observations -> one conditioning vector: an encoder per camera (+ crop and training augmentation) and normalized low-dim."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torchvision.transforms import v2

from common.camera_pose import RAY_CHANNELS, pose_key, ray_map

from .normalize import Normalizer
from .vision.resnet import ResNet18
from .vision.vit import ViT

IMAGE_CHANNELS = 3  # RGB
# ColorJitter's settings -> the bound each must stay below: a factor's range U(1 - x, 1 + x) must stay
# positive; the hue shift U(-x, x) is a fraction of a turn, and half a turn already reaches every hue
COLOUR_RANGES = {"brightness": 1.0, "contrast": 1.0, "saturation": 1.0, "hue": 0.5}
# the geometric settings' bounds: a turn beyond 45 degrees or a zoom by half is no longer "the camera moved a little"
GEOMETRIC_RANGES = {"rotate": 45.0, "scale": 0.5}


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
    timm's named by ``vit.backbone`` (timm is imported only then). With ray maps, the encoder's first
    layer (the ViT's patch embedding, the ResNet's stem) reads the image's channels and its rays'."""
    in_chans = IMAGE_CHANNELS + (RAY_CHANNELS if config.ray_maps else 0)
    if config.encoder == "resnet18":
        return ResNet18(config.resnet, in_chans)
    if config.vit.backbone is None:
        return ViT(config.vit, config.crop_size, in_chans)
    from .vision.timm_backbone import TimmViT

    return TimmViT(config.vit, config.crop_size)


@dataclass
class ImageAugConfig:
    """Augmentation of every camera image, per sample, in training only (lerobot's
    ``image_transforms``), by torchvision v2 transforms. Off by default: the papers train without
    it, and a checkpoint written before a field existed reads it as off.

    Photometric (``ColorJitter``): each factor is drawn per image from U(1 - x, 1 + x), the hue
    shift from U(-x, x); 0 turns that jitter off. Geometric, applied to an image with probability
    ``geometric_p``: DrQ's random shift alone (the crop padded by ``shift`` pixels on every side,
    replicating its border, and a crop of the same size taken back at a random place), or with
    ``rotate``/``scale`` set an affine warp (``RandomAffine``: a turn of up to ``rotate`` degrees, a zoom
    in U(1 - scale, 1 + scale) and a move of up to ``shift`` pixels), which is what a moved camera does
    to the view (a turn, a field-of-view change and a move)."""

    brightness: float = 0.0  # multiplies the image
    contrast: float = 0.0  # scales the image about its mean grey
    saturation: float = 0.0  # scales the image about its own greyscale version
    hue: float = 0.0  # rotates the hue by this fraction of a full turn, at most
    shift: int = 0  # pixels (DrQ: 4 on 84-px images)
    rotate: float = 0.0  # degrees, at most, either way
    scale: float = 0.0  # zoom factor drawn in U(1 - scale, 1 + scale)
    geometric_p: float = 1.0  # the probability that an image is moved at all (the rest are seen as rendered)

    def __post_init__(self):
        for name, high in {**COLOUR_RANGES, **GEOMETRIC_RANGES}.items():
            if not 0.0 <= getattr(self, name) < high:
                raise ValueError(f"policy.image_aug.{name} must be in [0, {high:g}), got {getattr(self, name)}")
        if self.shift < 0:
            raise ValueError(f"policy.image_aug.shift must be >= 0 pixels (0: no shift), got {self.shift}")
        if not 0.0 <= self.geometric_p <= 1.0:
            raise ValueError(f"policy.image_aug.geometric_p must be a probability in [0, 1], got {self.geometric_p}")

    @property
    def geometric(self) -> bool:
        return bool(self.shift or self.rotate or self.scale) and self.geometric_p > 0

    def geometric_transform(self, crop_size: int) -> v2.Transform | None:
        """The per-image move of ``crop_size`` crops (None when off). It may see more channels than the
        image's three (a ray map stacked below it), which it moves together with the image."""
        if not self.geometric:
            return None
        if self.rotate or self.scale:
            move = v2.RandomAffine(degrees=self.rotate, translate=(self.shift / crop_size,) * 2,
                                   scale=(1.0 - self.scale, 1.0 + self.scale))
        else:
            move = v2.RandomCrop(crop_size, padding=self.shift, padding_mode="edge")
        return move if self.geometric_p == 1.0 else v2.RandomApply([move], p=self.geometric_p)

    def transform(self, crop_size: int) -> v2.Transform | None:
        """The whole per-image transform of ``crop_size`` crops (None when nothing is enabled): move, then colour."""
        steps = [t for t in (self.geometric_transform(crop_size), self.colour_transform()) if t is not None]
        return v2.Compose(steps) if steps else None

    def colour_transform(self) -> v2.Transform | None:
        colour = {name: getattr(self, name) for name in COLOUR_RANGES if getattr(self, name) > 0}
        return v2.ColorJitter(**colour) if colour else None


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
        # a camera's pose feeds its ray map, not the low-dim vector, when the policy draws ray maps
        self.pose_keys = config.ray_map_keys
        self.lowdim_keys = [k for k in config.lowdim_keys if k not in self.pose_keys]
        n_vits = 1 if config.share_vit else len(self.image_keys)
        # the camera encoders, ViT or ResNet: "vits" is the name checkpoints store their weights under
        self.vits = nn.ModuleList(make_camera_encoder(config) for _ in range(n_vits))
        self.image_steps = config.image_obs_steps
        self.move = config.image_aug.geometric_transform(config.crop_size)
        self.recolour = config.image_aug.colour_transform()
        # camera dropout: a learned "absent" feature per camera stands in for a dropped camera's frames
        self.absent = (nn.Parameter(torch.zeros(len(self.image_keys), config.feature_dim))
                       if config.camera_dropout > 0 else None)
        # conditioning size: the last image_steps frames of each camera + To steps of every low-dim key
        self.output_dim = (self.image_steps * len(self.image_keys) * config.feature_dim
                           + config.n_obs_steps * sum(config.input_shapes[k][0] for k in self.lowdim_keys))

    @property
    def augment(self) -> v2.Transform | None:
        """The whole training augmentation of an image (the move, then the colour); None when off."""
        return self.config.image_aug.transform(self.config.crop_size)

    def crop_size_for(self, key: str, height: int) -> int:
        """The training crop, scaled with the image when evaluating on larger renders."""
        train_h = self.config.input_shapes[key][1]
        return round(self.config.crop_size * height / train_h)

    def camera_input(self, obs: dict[str, torch.Tensor], key: str) -> torch.Tensor:
        """One camera's latest frames -> what its encoder reads, (B*To_img, C, crop, crop): the image in [0, 1]
        (C = 3), with its ray map below it (C = 3 + RAY_CHANNELS) when the policy draws ray maps. The map is
        drawn at the image's size and cropped and moved with it, so each pixel keeps its ray."""
        img = obs[key][:, -self.image_steps :]  # (B, To_img, H, W, C): the latest frames
        b, t = img.shape[:2]
        x = img.reshape(b * t, *img.shape[2:]).permute(0, 3, 1, 2).float() / 255.0  # (B*To, 3, H, W)
        if self.pose_keys:
            pose = obs[pose_key(key)][:, -self.image_steps :].reshape(b * t, -1)  # (B*To, POSE_DIM)
            x = torch.cat([x, ray_map(pose, x.shape[-2], x.shape[-1])], dim=1)  # (B*To, 3 + 6, H, W)
        x = crop_images(x, self.crop_size_for(key, x.shape[-2]), random=self.training)
        if self.training and self.move is not None:
            x = jitter_images(x, self.move)
        if self.training and self.recolour is not None:
            x = torch.cat([jitter_images(x[:, :3], self.recolour), x[:, 3:]], dim=1)  # colour: the image's channels only
        return x

    def drop_cameras(self, feats: torch.Tensor, camera: int) -> torch.Tensor:
        """(B, To_img, D) -> the same, each sample's frames replaced by the camera's absent feature with
        probability ``camera_dropout`` (training only): the policy learns to act without this camera."""
        if self.absent is None or not self.training:
            return feats
        dropped = torch.rand(feats.shape[0], 1, 1, device=feats.device) < self.config.camera_dropout  # (B, 1, 1)
        return torch.where(dropped, self.absent[camera].to(feats.dtype), feats)

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """obs[key]: (B, To, H, W, C) uint8 images or (B, To, D) low-dim -> (B, output_dim)."""
        feats = []
        for i, key in enumerate(self.image_keys):
            x = self.camera_input(obs, key)
            b = obs[key].shape[0]
            vit = self.vits[0 if self.config.share_vit else i]
            f = vit(x).reshape(b, self.image_steps, -1)  # (B, To_img, out_dim)
            feats.append(self.drop_cameras(f, i).reshape(b, -1))  # (B, To_img * out_dim)
        for key in self.lowdim_keys:
            feats.append(self._normalize(key, obs[key].float()).flatten(1))  # (B, To * D)
        return torch.cat(feats, dim=-1)  # (B, output_dim)
