from __future__ import annotations

from dataclasses import dataclass, field

from ..base import PolicyConfig

PREDICTION_TYPES = ("epsilon", "sample")


@dataclass
class DiffusionConfig(PolicyConfig):
    """CNN Diffusion Policy (Chi et al., 2023) with a ViT observation encoder."""

    name: str = "diffusion"

    # 1D temporal U-Net; small by default so it trains on a CPU (the paper uses 256/512/1024)
    down_dims: list[int] = field(default_factory=lambda: [64, 128, 256])
    kernel_size: int = 5
    n_groups: int = 8
    diffusion_step_embed_dim: int = 64
    # noise schedule: DDPM for training, DDIM for fast sampling
    num_train_timesteps: int = 100
    num_inference_steps: int = 10
    beta_schedule: str = "squaredcos_cap_v2"
    prediction_type: str = "epsilon"
    clip_sample: bool = True

    def __post_init__(self):
        super().__post_init__()
        self.down_dims = list(self.down_dims)
        if not self.down_dims:
            raise ValueError("policy.down_dims must list at least one width")
        if any(d % self.n_groups for d in self.down_dims):
            raise ValueError(f"policy.down_dims {self.down_dims} must all be divisible by policy.n_groups ({self.n_groups})")
        if self.prediction_type not in PREDICTION_TYPES:
            raise ValueError(f"policy.prediction_type={self.prediction_type!r}; choose one of {PREDICTION_TYPES}")
        if not 1 <= self.num_inference_steps <= self.num_train_timesteps:
            raise ValueError(
                f"policy.num_inference_steps ({self.num_inference_steps}) must be in [1, num_train_timesteps={self.num_train_timesteps}]"
            )
        # each down level halves the time axis; the horizon must survive it
        if self.horizon % (2 ** (len(self.down_dims) - 1)):
            raise ValueError(
                f"policy.horizon ({self.horizon}) must be divisible by 2**(len(down_dims)-1) = {2 ** (len(self.down_dims) - 1)}"
            )
