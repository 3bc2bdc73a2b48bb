"""Diffusion Policy: denoise an action chunk conditioned on encoded observations."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers import DDIMScheduler, DDPMScheduler

from ..base import Policy
from .configuration import DiffusionConfig
from .unet1d import ConditionalUnet1D


class DiffusionPolicy(Policy):
    name = DiffusionConfig.name
    config_class = DiffusionConfig

    def __init__(self, config: DiffusionConfig):
        super().__init__(config)
        c = config
        self.unet = ConditionalUnet1D(
            c.action_dim, self.obs_encoder.output_dim, c.down_dims, c.kernel_size, c.n_groups, c.diffusion_step_embed_dim
        )
        sched = dict(
            num_train_timesteps=c.num_train_timesteps,
            beta_schedule=c.beta_schedule,
            clip_sample=c.clip_sample,
            prediction_type=c.prediction_type,
        )
        self.noise_scheduler = DDPMScheduler(**sched)
        self.inference_scheduler = DDIMScheduler(**sched)

    def compute_loss(self, batch):
        c = self.config
        cond = self.encode_obs(batch)  # (B, To * F)
        actions = self.normalizer.normalize("action", batch["action"])  # (B, T, Da)
        noise = torch.randn_like(actions)
        t = torch.randint(0, c.num_train_timesteps, (actions.shape[0],), device=actions.device)
        noisy = self.noise_scheduler.add_noise(actions, noise, t)
        pred = self.unet(noisy, t, cond)
        target = noise if c.prediction_type == "epsilon" else actions
        loss = F.mse_loss(pred, target)
        return loss, {"loss": loss.item()}

    @torch.no_grad()
    def predict_action_chunk(self, obs, generator: torch.Generator | None = None):
        c = self.config
        cond = self.encode_obs(obs)  # (B, To * F)
        b = cond.shape[0]
        x = torch.randn(b, c.horizon, c.action_dim, device=cond.device, generator=generator)  # (B, T, Da)
        sched = self.inference_scheduler
        sched.set_timesteps(c.num_inference_steps, device=cond.device)
        for t in sched.timesteps:
            eps = self.unet(x, t.expand(b).to(cond.device), cond)
            x = sched.step(eps, t, x, generator=generator).prev_sample
        return self.actions_to_execute(x)  # (B, Ta, Da)
