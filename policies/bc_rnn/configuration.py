from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

from ..base import PolicyConfig
from ..bc.heads import GMM_LEGACY_FIELDS, GMMConfig


@dataclass
class BCRNNConfig(PolicyConfig):
    """robomimic's BC-RNN-GMM on the shared ViT observation encoder.

    At every step the shared ``ObsEncoder`` reads the To latest observations (To=1: robomimic's
    frame_stack of 1), an LSTM carries the history, and a GMM head predicts the next Ta actions
    (Ta=1: robomimic's one action per step). Training unrolls the LSTM from a zero state over
    windows of T = horizon frames: ``rnn_steps = (T - To + 1) // Ta`` steps, one every Ta frames,
    step j reading frames [j*Ta, j*Ta + To) and predicting actions [j*Ta + To - 1, +Ta). The defaults
    T=10, To=1, Ta=1 are robomimic's ``seq_length`` 10. At rollout every environment slot carries its
    own LSTM state; it is reset at the slot's episode start and, as robomimic's ``BC_RNN.get_action``
    does, every ``reset_every`` steps (the training unroll length by default), so the LSTM never
    runs longer from a zero state than it was trained to.

    robomimic's defaults: 2 LSTM layers of 400 units, no MLP between the LSTM and the GMM (its paper
    configs' ``actor_layer_dims=()``), 5 modes, softplus std + 1e-4, tanh-squashed means, low-noise
    sampling at evaluation.
    """

    name: str = "bc_rnn"

    n_obs_steps: int = 1  # To per LSTM step
    horizon: int = 10  # T: the training window; (T - To + 1) // Ta LSTM steps
    n_action_steps: int = 1  # Ta per LSTM step
    inference_action_steps: ClassVar[bool] = False  # the GMM head outputs Ta x Da actions per LSTM step
    rnn_hidden_dim: int = 400
    rnn_num_layers: int = 2
    hidden_dims: list[int] = field(default_factory=list)  # MLP between the LSTM and the GMM outputs
    # LSTM steps between state resets at rollout; None: rnn_steps (robomimic), 0: only at episode start
    reset_every: Optional[int] = None
    # gmm head: one mixture over each step's Ta x Da actions
    gmm: GMMConfig = field(default_factory=GMMConfig)
    tanh: bool = True  # squash the mixture means into the normalized range [-1, 1]
    legacy_fields: ClassVar[dict] = GMM_LEGACY_FIELDS

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.gmm, dict):
            self.gmm = GMMConfig(**self.gmm)
        self.hidden_dims = [int(d) for d in self.hidden_dims]
        for name in ("rnn_hidden_dim", "rnn_num_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"policy.{name} must be >= 1, got {getattr(self, name)}")
        if any(d < 1 for d in self.hidden_dims):
            raise ValueError(f"policy.hidden_dims {self.hidden_dims} must all be >= 1")
        if self.reset_every is not None and self.reset_every < 0:
            raise ValueError(f"policy.reset_every must be >= 0 (0: reset only at episode start) or null, got {self.reset_every}")

    @property
    def rnn_steps(self) -> int:
        """LSTM steps of a training window (PolicyConfig ensures To - 1 + Ta <= T, so at least 1)."""
        return (self.horizon - self.n_obs_steps + 1) // self.n_action_steps

    @property
    def window_obs_steps(self) -> int:
        """The frames the last LSTM step of a window reads up to: To + (rnn_steps - 1) * Ta."""
        return self.n_obs_steps + (self.rnn_steps - 1) * self.n_action_steps

    @property
    def state_reset_every(self) -> int:
        return self.rnn_steps if self.reset_every is None else self.reset_every
