"""BC-RNN (robomimic's BC_RNN_GMM): the shared ObsEncoder at every step -> LSTM -> GMM head.

Training unrolls the LSTM from a zero state over a window (``BCRNNConfig.rnn_steps`` steps);
rollouts (``select_action``) carry one LSTM state per environment as that environment's carry in
``plan`` (see policies/base.py). Glossary: To = n_obs_steps, T = horizon,
Ta = n_action_steps, Da = action_dim, S = LSTM steps, L = LSTM layers, H = LSTM units.
"""
from __future__ import annotations

import torch
from torch import nn

from ..base import Policy
from ..bc.heads import GMMHead
from .configuration import BCRNNConfig


class BCRNNPolicy(Policy):
    name = BCRNNConfig.name
    config_class = BCRNNConfig

    def __init__(self, config: BCRNNConfig):
        super().__init__(config)
        c = config
        self.rnn = nn.LSTM(self.obs_encoder.output_dim, c.rnn_hidden_dim, c.rnn_num_layers, batch_first=True)
        # one mixture over each step's Ta actions (Ta=1: robomimic's per-step GMM)
        self.head = GMMHead(c.rnn_hidden_dim, c.n_action_steps, c.action_dim, c.hidden_dims, c.gmm, tanh=c.tanh, over="chunk")

    # --- recurrent state, one carry per environment ---------------------------------------
    def _initial_state(self, carries: list, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """The environments' carried states as (L, B, H) tensors, zeros for one that starts (or restarts
        every ``reset_every`` steps, as robomimic's rollouts do). A carry: (h (L, H), c (L, H), LSTM
        steps taken since its episode start)."""
        c = self.config
        zeros = like.new_zeros(c.rnn_num_layers, c.rnn_hidden_dim)
        every = c.state_reset_every
        hs, cs, counts = [], [], []
        for carry in carries:
            h, cell, count = carry if carry is not None else (zeros, zeros, 0)
            if every and count % every == 0:
                h, cell = zeros, zeros
            hs.append(h)
            cs.append(cell)
            counts.append(count)
        return torch.stack(hs, dim=1), torch.stack(cs, dim=1), counts

    # --- shared pieces -------------------------------------------------------------------
    def _step_features(self, obs: dict[str, torch.Tensor], starts: list[int]) -> torch.Tensor:
        """obs[key] (B, F, ...) -> (B, S, output_dim): the ObsEncoder on frames [s, s + To) for each start s."""
        to = self.config.n_obs_steps
        first = next(iter(obs.values()))
        idx = torch.as_tensor(starts, device=first.device)[:, None] + torch.arange(to, device=first.device)  # (S, To)
        b, s = first.shape[0], len(starts)
        steps = {k: obs[k][:, idx].flatten(0, 1) for k in self.config.input_shapes}  # (B*S, To, ...)
        return self.obs_encoder(steps).reshape(b, s, -1)

    def _num_steps(self, obs: dict[str, torch.Tensor]) -> int:
        """LSTM steps the frames of ``obs`` allow, at most the training window's."""
        c = self.config
        frames = next(iter(obs.values())).shape[1]
        if frames < c.n_obs_steps:
            raise ValueError(f"bc_rnn needs at least n_obs_steps={c.n_obs_steps} observation frames, got {frames}")
        return min(c.rnn_steps, (frames - c.n_obs_steps) // c.n_action_steps + 1)

    def _actions(self, features: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """LSTM outputs (B, H) -> unnormalized actions (B, Ta, Da)."""
        x = self.head.sample(features, low_noise=self.config.gmm.low_noise_eval, generator=generator)
        return self.normalizer.unnormalize("action", x)

    # --- the interface -------------------------------------------------------------------
    def compute_loss(self, batch):
        """Negative log-likelihood of each step's Ta actions, unrolled from a zero state over the
        window; averaged over steps and per action dimension (robomimic averages over steps)."""
        c = self.config
        to, ta = c.n_obs_steps, c.n_action_steps
        s = self._num_steps(batch)
        feats = self._step_features(batch, [j * ta for j in range(s)])  # (B, S, F)
        out, _ = self.rnn(feats)  # (B, S, H)
        actions = self.normalizer.normalize("action", batch["action"])[:, to - 1 : to - 1 + s * ta]  # (B, S*Ta, Da)
        b = out.shape[0]
        log_prob = self.head.log_prob(out.reshape(b * s, -1), actions.reshape(b * s, ta, c.action_dim))  # (B*S,)
        nll = -log_prob.mean()  # per step
        loss = nll / (ta * c.action_dim)
        return loss, {"loss": loss.item(), "nll_step": nll.item()}

    @torch.no_grad()
    def predict_action_chunk(self, obs, generator: torch.Generator | None = None):
        """Stateless: unroll from a zero state over the latest frames (as many LSTM steps as they
        allow, at most ``rnn_steps``; To frames: one step) -> the next Ta actions (B, Ta, Da)."""
        c = self.config
        s = self._num_steps(obs)
        frames = next(iter(obs.values())).shape[1]
        first = frames - c.n_obs_steps - (s - 1) * c.n_action_steps
        feats = self._step_features(obs, [first + j * c.n_action_steps for j in range(s)])
        out, _ = self.rnn(feats)
        return self._actions(out[:, -1], generator)

    @torch.no_grad()
    def plan(self, obs, carries):
        """One LSTM step per environment on its latest To frames, from the state it carries ->
        (the next Ta actions (B, Ta, Da), the new states)."""
        frames = next(iter(obs.values())).shape[1]
        feats = self._step_features(obs, [frames - self.config.n_obs_steps])  # (B, 1, F)
        h0, c0, counts = self._initial_state(carries, feats)
        out, (h1, c1) = self.rnn(feats, (h0, c0))
        carries = [(h1[:, j], c1[:, j], counts[j] + 1) for j in range(len(counts))]
        return self._actions(out[:, -1], None), carries
