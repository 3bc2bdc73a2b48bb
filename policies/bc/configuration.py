from __future__ import annotations

from dataclasses import dataclass, field

from ..base import PolicyConfig

HEADS = ("mlp", "gmm")
LOSSES = ("l2", "l1")
STD_ACTIVATIONS = ("softplus", "exp")
GMM_OVER = ("chunk", "step")


@dataclass
class BCConfig(PolicyConfig):
    """Behaviour cloning: the diffusion policy's observation encoder followed by an action head.

    ``head='mlp'``: a deterministic MLP regresses the whole normalized action chunk (T x Da),
    trained with ``loss`` (l2 | l1).
    ``head='gmm'``: robomimic's BC-GMM head, a mixture of ``num_modes`` diagonal Gaussians
    trained by log-likelihood. ``gmm_over='chunk'`` (default) puts one mixture over the flattened
    chunk, so a whole chunk follows one mode; ``'step'`` puts an independent mixture on every step.
    The chunk is executed ``n_action_steps`` at a time, as the diffusion policy does.
    """

    name: str = "bc"

    head: str = "mlp"  # mlp | gmm
    hidden_dims: list[int] = field(default_factory=lambda: [256, 256])
    dropout: float = 0.0
    # squash predicted actions (mlp) / mixture means (gmm) into the normalized range [-1, 1]
    # (robomimic's default for both of its BC heads)
    tanh: bool = True
    # mlp head
    loss: str = "l2"  # l2 | l1
    # gmm head (robomimic's BC-GMM defaults)
    num_modes: int = 5
    min_std: float = 1e-4
    std_activation: str = "softplus"  # softplus | exp
    low_noise_eval: bool = True  # predict with std 1e-4: a sample is ~ the mean of one sampled mode
    gmm_over: str = "chunk"  # chunk | step

    def __post_init__(self):
        super().__post_init__()
        self.hidden_dims = [int(d) for d in self.hidden_dims]
        for name, value, choices in (
            ("head", self.head, HEADS),
            ("loss", self.loss, LOSSES),
            ("std_activation", self.std_activation, STD_ACTIVATIONS),
            ("gmm_over", self.gmm_over, GMM_OVER),
        ):
            if value not in choices:
                raise ValueError(f"policy.{name}={value!r} is unknown; choose one of {choices}")
        if any(d < 1 for d in self.hidden_dims):
            raise ValueError(f"policy.hidden_dims {self.hidden_dims} must all be >= 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"policy.dropout ({self.dropout}) must be in [0, 1)")
        if self.num_modes < 1:
            raise ValueError(f"policy.num_modes must be >= 1, got {self.num_modes}")
        if not self.min_std > 0:
            raise ValueError(f"policy.min_std must be > 0 (a floor on every Gaussian's std), got {self.min_std}")
