from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ..base import PolicyConfig
from .heads import GMM_LEGACY_FIELDS, GMMConfig

HEADS = ("mlp", "gmm")
LOSSES = ("l2", "l1")
GMM_OVER = ("chunk", "step")


@dataclass
class BCConfig(PolicyConfig):
    """Behaviour cloning: the diffusion policy's observation encoder followed by an action head.

    ``head='mlp'``: a deterministic MLP regresses the whole normalized action chunk (T x Da),
    trained with ``loss`` (l2 | l1).
    ``head='gmm'``: robomimic's BC-GMM head, a mixture of ``gmm.num_modes`` diagonal Gaussians
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
    # gmm head
    gmm: GMMConfig = field(default_factory=GMMConfig)
    gmm_over: str = "chunk"  # chunk | step
    legacy_fields: ClassVar[dict] = GMM_LEGACY_FIELDS

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.gmm, dict):
            self.gmm = GMMConfig(**self.gmm)
        self.hidden_dims = [int(d) for d in self.hidden_dims]
        for name, value, choices in (
            ("head", self.head, HEADS),
            ("loss", self.loss, LOSSES),
            ("gmm_over", self.gmm_over, GMM_OVER),
        ):
            if value not in choices:
                raise ValueError(f"policy.{name}={value!r} is unknown; choose one of {choices}")
        if any(d < 1 for d in self.hidden_dims):
            raise ValueError(f"policy.hidden_dims {self.hidden_dims} must all be >= 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"policy.dropout ({self.dropout}) must be in [0, 1)")
