"""Action heads for BC: conditioning vector (B, C) -> normalized action chunk (B, T, Da).

The GMM head follows robomimic's GMMActorNetwork (policy_nets.py): means (tanh-squashed),
std = activation(raw) + min_std, mixture logits, and the likelihood through
torch.distributions MixtureSameFamily(Categorical, Independent(Normal)). robomimic's network is
tied to its own observation encoders, so the head is rebuilt here on our conditioning vector.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributions as D
import torch.nn.functional as F
from torch import nn

LOW_NOISE_STD = 1e-4  # robomimic's low_noise_eval std
STD_ACTIVATIONS = ("softplus", "exp")


@dataclass
class GMMConfig:
    """The GMM head's settings (``policy.gmm``), shared by ``bc`` (head=gmm) and ``bc_rnn``:
    robomimic's BC-GMM defaults."""

    num_modes: int = 5
    min_std: float = 1e-4  # a floor on every Gaussian's std
    std_activation: str = "softplus"  # softplus | exp
    low_noise_eval: bool = True  # predict with std LOW_NOISE_STD: a sample is ~ the mean of one sampled mode

    def __post_init__(self):
        if self.std_activation not in STD_ACTIVATIONS:
            raise ValueError(f"policy.gmm.std_activation={self.std_activation!r} is unknown; choose one of {STD_ACTIVATIONS}")
        if self.num_modes < 1:
            raise ValueError(f"policy.gmm.num_modes must be >= 1, got {self.num_modes}")
        if not self.min_std > 0:
            raise ValueError(f"policy.gmm.min_std must be > 0 (a floor on every Gaussian's std), got {self.min_std}")


# checkpoints written before policy.gmm held its fields flat among the policy's (PolicyConfig.upgrade)
GMM_LEGACY_FIELDS = {"gmm": tuple(GMMConfig.__dataclass_fields__)}


def make_mlp(in_dim: int, hidden_dims: list[int], out_dim: int, dropout: float = 0.0) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in hidden_dims:
        layers += [nn.Linear(in_dim, h), nn.ReLU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        in_dim = h
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


class MLPHead(nn.Module):
    """Deterministic regression of the whole chunk."""

    def __init__(self, in_dim: int, horizon: int, action_dim: int, hidden_dims: list[int], dropout: float, tanh: bool):
        super().__init__()
        self.horizon, self.action_dim, self.tanh = horizon, action_dim, tanh
        self.net = make_mlp(in_dim, hidden_dims, horizon * action_dim, dropout)

    def forward(self, cond: torch.Tensor) -> torch.Tensor:
        out = self.net(cond).reshape(-1, self.horizon, self.action_dim)  # (B, T, Da)
        return torch.tanh(out) if self.tanh else out


class GMMHead(nn.Module):
    """A mixture of ``num_modes`` diagonal Gaussians over the normalized chunk.

    over='chunk': one mixture over the flattened chunk (G = 1 group of D = T * Da dims): a sampled
    chunk follows a single mode from start to end, so it cannot switch between demonstrated
    strategies mid-chunk. over='step': one mixture per step (G = T groups of D = Da dims), each
    step picks its own mode (robomimic's per-timestep factorization, as in its BC-RNN-GMM).
    """

    def __init__(self, in_dim: int, horizon: int, action_dim: int, hidden_dims: list[int], gmm: GMMConfig, *,
                 tanh: bool, over: str, dropout: float = 0.0):
        super().__init__()
        self.horizon, self.action_dim, self.num_modes = horizon, action_dim, gmm.num_modes
        self.min_std, self.std_activation, self.tanh = gmm.min_std, gmm.std_activation, tanh
        self.groups, self.event_dim = (1, horizon * action_dim) if over == "chunk" else (horizon, action_dim)
        per_group = self.num_modes * (2 * self.event_dim + 1)  # means, raw stds, logits
        self.net = make_mlp(in_dim, hidden_dims, self.groups * per_group, dropout)

    def forward(self, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """cond (B, C) -> means, stds (B, G, K, D) and mixture logits (B, G, K)."""
        b, g, k, d = cond.shape[0], self.groups, self.num_modes, self.event_dim
        out = self.net(cond).reshape(b, g, k, 2 * d + 1)
        means, raw_std, logits = out[..., :d], out[..., d : 2 * d], out[..., 2 * d]
        if self.tanh:
            means = torch.tanh(means)
        act = F.softplus if self.std_activation == "softplus" else torch.exp
        return means, act(raw_std) + self.min_std, logits

    def distribution(self, cond: torch.Tensor) -> D.MixtureSameFamily:
        """batch_shape (B, G), event_shape (D,)."""
        means, stds, logits = self(cond)
        components = D.Independent(D.Normal(loc=means, scale=stds), 1)
        return D.MixtureSameFamily(D.Categorical(logits=logits), components)

    def log_prob(self, cond: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """cond (B, C), normalized actions (B, T, Da) -> log-likelihood of each chunk (B,)."""
        x = actions.reshape(actions.shape[0], self.groups, self.event_dim)  # (B, G, D)
        return self.distribution(cond).log_prob(x).sum(dim=1)

    def sample(self, cond: torch.Tensor, low_noise: bool = True, generator: torch.Generator | None = None) -> torch.Tensor:
        """cond (B, C) -> normalized chunk (B, T, Da): pick a mode by its weight, then sample it;
        with low_noise its std is 1e-4 (robomimic's low_noise_eval), i.e. ~ that mode's mean.
        Written out (not dist.sample()) so a torch.Generator makes it reproducible."""
        means, stds, logits = self(cond)
        b, g, k, d = means.shape
        mode = torch.multinomial(logits.softmax(-1).reshape(b * g, k), 1, generator=generator)  # (B*G, 1)
        idx = mode.reshape(b, g, 1, 1).expand(b, g, 1, d)
        mean = means.gather(2, idx).squeeze(2)  # (B, G, D)
        std = torch.full_like(mean, LOW_NOISE_STD) if low_noise else stds.gather(2, idx).squeeze(2)
        noise = torch.randn(mean.shape, device=mean.device, dtype=mean.dtype, generator=generator)
        return (mean + std * noise).reshape(b, self.horizon, self.action_dim)
