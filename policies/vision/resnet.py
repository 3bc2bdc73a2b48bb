"""The field's default visuomotor encoder, as a baseline beside the ViTs (``encoder=resnet18``).

Diffusion Policy's, robomimic's and lerobot's image encoder: torchvision's ResNet-18 trained from
scratch, every BatchNorm a GroupNorm (batch statistics drift with the EMA weights and small
batches; Diffusion Policy's choice of ``channels // 16`` groups), the average pool and the
classifier removed, and robomimic's spatial-softmax read-out: a learned 1x1 convolution to K
keypoint maps, a softmax over the feature map's positions per keypoint, and each keypoint's
expected (x, y) in [-1, 1]; a linear layer maps the 2K coordinates to the policy's feature size.
Same interface as the ViTs: images (B, C, H, W) in [0, 1] -> features (B, out_dim). Fully
convolutional, and the coordinates are normalised, so larger evaluation renders work unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torchvision.models import resnet18

from .vit import ViT

GROUP_NORM_CHANNELS = 16  # channels per GroupNorm group (Diffusion Policy: num_groups = channels // 16)
TRUNK_CHANNELS = 512  # ResNet-18's last stage, the feature map the keypoints are read from


@dataclass
class ResNetConfig:
    num_keypoints: int = 32  # K, robomimic's SpatialSoftmax default
    out_dim: int = 64  # feature size handed to the policy (robomimic's feature_dimension)

    def __post_init__(self):
        for name in ("num_keypoints", "out_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"policy.resnet.{name} must be >= 1, got {getattr(self, name)}")


def group_norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(channels // GROUP_NORM_CHANNELS, channels)


class ResNet18(nn.Module):
    """ResNet-18 from scratch with GroupNorm and a spatial-softmax keypoint read-out."""

    # robomimic's read-out, shared with the ViTs': it reads self.keypoints and self.log_temperature
    spatial_softmax = ViT.spatial_softmax

    def __init__(self, cfg: ResNetConfig, in_chans: int = 3):
        super().__init__()
        self.cfg = cfg
        # torchvision builds the norms through norm_layer (and initialises GroupNorm as BatchNorm)
        trunk = resnet18(weights=None, norm_layer=group_norm)
        if in_chans != trunk.conv1.in_channels:  # the stem reads a ray map's channels beside the image's
            stem = trunk.conv1
            trunk.conv1 = nn.Conv2d(in_chans, stem.out_channels, stem.kernel_size, stem.stride, stem.padding, bias=False)
        self.trunk = nn.Sequential(*list(trunk.children())[:-2])  # without avgpool and fc: (B, 512, h, w)
        # a linear map of each position's channels is the 1x1 convolution to K keypoint logits
        self.keypoints = nn.Linear(TRUNK_CHANNELS, cfg.num_keypoints)
        # robomimic's softmax temperature is fixed at 1 (not learned)
        self.register_buffer("log_temperature", torch.zeros(()), persistent=False)
        self.head = nn.Linear(2 * cfg.num_keypoints, cfg.out_dim)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, C, H, W) in [0, 1] (fed as they are, as Diffusion Policy does) -> features (B, out_dim)."""
        fmap = self.trunk(images)  # (B, 512, h, w)
        grid = (fmap.shape[-2], fmap.shape[-1])
        positions = fmap.flatten(2).transpose(1, 2)  # (B, h*w, 512) in raster order
        return self.head(self.spatial_softmax(positions, grid))  # (B, 2K) -> (B, out_dim)
