"""A camera's pose as one observation vector, and the per-pixel rays it implies (Plücker coordinates).

Layout of ``<camera>_camera`` (``POSE_DIM`` floats): the camera's position in the world (3), its
camera-to-world rotation, row-major (9: the columns are the camera's x right, y up and z backward
axes, MuJoCo's convention: it looks along -z), and its vertical field of view in degrees (1).
Environments write it (``envs.robosuite_tasks``), policies read it (``policies.obs_encoder``): this
module is the one place the layout is written down, and it imports neither side.
"""
from __future__ import annotations

import numpy as np
import torch

POSE_DIM = 13
CAMERA_POSE_SUFFIX = "_camera"  # the pose of camera CAM is observation CAM_camera, beside CAM_image
RAY_CHANNELS = 6  # a ray's direction (3) and its moment, origin x direction (3)


def pose_vector(position, rotation, fovy_deg) -> np.ndarray:
    """(3,), (3, 3) or (9,), scalar -> (POSE_DIM,) float32."""
    return np.concatenate([np.asarray(position, np.float64).reshape(3), np.asarray(rotation, np.float64).reshape(9),
                           [float(np.asarray(fovy_deg).reshape(()))]]).astype(np.float32)


def pose_key(image_key: str, image_suffix: str = "_image") -> str:
    """``agentview_image`` -> ``agentview_camera``: where the pose of the camera behind an image is observed."""
    return image_key.removesuffix(image_suffix) + CAMERA_POSE_SUFFIX


def ray_map(pose: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(N, POSE_DIM) -> (N, RAY_CHANNELS, height, width): for each pixel of an upright image (row 0 at the
    top), the unit direction d of the ray through its centre and the ray's moment o x d (Plücker
    coordinates: they name the ray whatever point along it the camera sits at)."""
    pose = pose.float()
    origin, rot, fovy = pose[:, :3], pose[:, 3:12].reshape(-1, 3, 3), pose[:, 12]  # (N, 3), (N, 3, 3), (N,)
    focal = (height / 2.0) / torch.tan(torch.deg2rad(fovy) / 2.0)  # (N,) pixels
    cols = torch.arange(width, device=pose.device, dtype=pose.dtype) + 0.5 - width / 2.0  # (W,)
    rows = height / 2.0 - (torch.arange(height, device=pose.device, dtype=pose.dtype) + 0.5)  # (H,): up is +y
    x = cols[None, None, :].expand(len(pose), height, width) / focal[:, None, None]  # (N, H, W)
    y = rows[None, :, None].expand(len(pose), height, width) / focal[:, None, None]  # (N, H, W)
    d_cam = torch.stack([x, y, -torch.ones_like(x)], dim=-1)  # (N, H, W, 3): the camera looks along -z
    d = torch.einsum("nij,nhwj->nhwi", rot, d_cam)  # (N, H, W, 3) in the world
    d = d / d.norm(dim=-1, keepdim=True)
    moment = torch.cross(origin[:, None, None, :].expand_as(d), d, dim=-1)  # (N, H, W, 3)
    return torch.cat([d, moment], dim=-1).permute(0, 3, 1, 2)  # (N, 6, H, W)
