"""Behaviour cloning: encoded observations -> an action chunk, from an MLP or a GMM head."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..base import Policy
from .configuration import BCConfig
from .heads import GMMHead, MLPHead


class BCPolicy(Policy):
    name = BCConfig.name
    config_class = BCConfig

    def __init__(self, config: BCConfig):
        super().__init__(config)
        c = config
        cond_dim = self.obs_encoder.output_dim
        if c.head == "mlp":
            self.head = MLPHead(cond_dim, c.horizon, c.action_dim, c.hidden_dims, c.dropout, c.tanh)
        else:
            self.head = GMMHead(cond_dim, c.horizon, c.action_dim, c.hidden_dims, c.gmm, tanh=c.tanh, over=c.gmm_over,
                                dropout=c.dropout)

    def compute_loss(self, batch):
        c = self.config
        cond = self.encode_obs(batch)  # (B, To * F)
        actions = self.normalizer.normalize("action", batch["action"])  # (B, T, Da)
        if c.head == "mlp":
            pred = self.head(cond)  # (B, T, Da)
            loss = F.mse_loss(pred, actions) if c.loss == "l2" else F.l1_loss(pred, actions)
            return loss, {"loss": loss.item()}
        # negative log-likelihood of the chunk, averaged per action dimension so its scale does
        # not grow with horizon * action_dim (robomimic sums over its single step's dims)
        nll = -self.head.log_prob(cond, actions).mean()  # (,) per chunk
        loss = nll / actions[0].numel()
        return loss, {"loss": loss.item(), "nll_chunk": nll.item()}

    @torch.no_grad()
    def predict_action_chunk(self, obs, generator: torch.Generator | None = None):
        c = self.config
        cond = self.encode_obs(obs)  # (B, To * F)
        if c.head == "mlp":
            x = self.head(cond)
        else:
            x = self.head.sample(cond, low_noise=c.gmm.low_noise_eval, generator=generator)
        return self.actions_to_execute(x)  # (B, Ta, Da)
