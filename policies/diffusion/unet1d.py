"""1D temporal U-Net with FiLM conditioning (the CNN backbone of Diffusion Policy)."""
from __future__ import annotations

import math

import torch
from torch import nn

SINCOS_BASE = 10000  # the diffusion step embedding's frequency base (the Transformer's)
STEP_MLP_RATIO = 4  # hidden width of the step encoder's MLP, in step embeddings (Diffusion Policy's)
DOWNSAMPLE_KERNEL, UPSAMPLE_KERNEL = 3, 4  # stride-2 convolutions that halve and double the time axis


class SinusoidalPosEmb(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.dim // 2
        freq = torch.exp(-math.log(SINCOS_BASE) * torch.arange(half, device=t.device) / (half - 1))
        ang = t.float()[:, None] * freq[None]  # (B, half)
        return torch.cat([ang.sin(), ang.cos()], dim=-1)  # (B, dim)


class Conv1dBlock(nn.Sequential):
    def __init__(self, c_in: int, c_out: int, kernel: int, groups: int):
        super().__init__(nn.Conv1d(c_in, c_out, kernel, padding=kernel // 2), nn.GroupNorm(groups, c_out), nn.Mish())


class FiLMResBlock(nn.Module):
    """Two conv blocks; the condition predicts a per-channel scale and bias between them."""

    def __init__(self, c_in: int, c_out: int, cond_dim: int, kernel: int, groups: int):
        super().__init__()
        self.block1 = Conv1dBlock(c_in, c_out, kernel, groups)
        self.block2 = Conv1dBlock(c_out, c_out, kernel, groups)
        self.film = nn.Sequential(nn.Mish(), nn.Linear(cond_dim, 2 * c_out))
        self.skip = nn.Conv1d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = self.block1(x)  # (B, c_out, T)
        scale, bias = self.film(cond).unsqueeze(-1).chunk(2, dim=1)  # 2 x (B, c_out, 1)
        h = self.block2(h * scale + bias)
        return h + self.skip(x)


class ConditionalUnet1D(nn.Module):
    def __init__(self, action_dim: int, global_cond_dim: int, down_dims: list[int], kernel: int, groups: int, step_embed_dim: int):
        super().__init__()
        self.step_encoder = nn.Sequential(
            SinusoidalPosEmb(step_embed_dim),
            nn.Linear(step_embed_dim, STEP_MLP_RATIO * step_embed_dim),
            nn.Mish(),
            nn.Linear(STEP_MLP_RATIO * step_embed_dim, step_embed_dim),
        )
        cond_dim = step_embed_dim + global_cond_dim
        dims = [action_dim] + list(down_dims)
        self.down = nn.ModuleList()
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            last = i == len(down_dims) - 1
            self.down.append(nn.ModuleList([
                FiLMResBlock(a, b, cond_dim, kernel, groups),
                FiLMResBlock(b, b, cond_dim, kernel, groups),
                nn.Conv1d(b, b, DOWNSAMPLE_KERNEL, stride=2, padding=1) if not last else nn.Identity(),
            ]))
        mid = down_dims[-1]
        self.mid = nn.ModuleList([FiLMResBlock(mid, mid, cond_dim, kernel, groups) for _ in range(2)])
        self.up = nn.ModuleList()
        for a, b in reversed(list(zip(down_dims[:-1], down_dims[1:]))):
            self.up.append(nn.ModuleList([
                FiLMResBlock(2 * b, a, cond_dim, kernel, groups),
                FiLMResBlock(a, a, cond_dim, kernel, groups),
                nn.ConvTranspose1d(a, a, UPSAMPLE_KERNEL, stride=2, padding=1),
            ]))
        self.final = nn.Sequential(Conv1dBlock(down_dims[0], down_dims[0], kernel, groups), nn.Conv1d(down_dims[0], action_dim, 1))

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor, global_cond: torch.Tensor) -> torch.Tensor:
        """sample (B, T, Da), timestep (B,), global_cond (B, G) -> (B, T, Da)."""
        x = sample.transpose(1, 2)  # (B, Da, T): convolve over time
        cond = torch.cat([self.step_encoder(timestep), global_cond], dim=-1)  # (B, step_dim + G)
        skips = []
        for res1, res2, downsample in self.down:
            x = res2(res1(x, cond), cond)
            skips.append(x)
            x = downsample(x)
        for block in self.mid:
            x = block(x, cond)
        for res1, res2, upsample in self.up:
            x = torch.cat([x, skips.pop()], dim=1)  # (B, 2C, T')
            x = upsample(res2(res1(x, cond), cond))
        return self.final(x).transpose(1, 2)  # (B, T, Da)
