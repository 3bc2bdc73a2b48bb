"""The policy interface every policy implements, its shared config, and the registry.

Interface (lerobot-style): ``reset()``, ``select_action(obs)`` (one step, keeps an action queue),
``predict_action_chunk(obs)`` (batched, stateless), ``compute_loss(batch)``.
Recurrent policies keep a state per environment "slot" (any hashable id, e.g. the index of an
environment in an EnvPool): ``predict_action_chunk_for(obs, slots)`` reads and advances the state of
the slots in the batch, ``reset_slots(slots)`` forgets it when they start new episodes. A stateless
policy ignores both (the defaults below), so a rollout loop can call them for every policy.
Glossary: To = n_obs_steps, T = horizon, Ta = n_action_steps, Da = action_dim.
"""
from __future__ import annotations

import dataclasses
import warnings
from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar, Optional

import torch
from torch import nn

from .normalize import Normalizer
from .obs_encoder import ImageAugConfig, ObsEncoder
from .vision.vit import ViTConfig


@dataclass
class PolicyConfig:
    name: str = ""  # the registry name; each policy's config sets it
    # From the task (the training config interpolates them from task.*): key -> shape, images
    # (C, H, W), low-dim (D,); a None entry is dropped
    input_shapes: dict[str, Optional[list[int]]] = field(default_factory=dict)
    action_dim: int = 2
    n_obs_steps: int = 2  # To
    # camera frames among the To steps (the latest ones); None: all To. 1 keeps the encoder's cost
    # at one frame while the low-dim history still shows velocities (is the gripper still closing?)
    n_image_obs_steps: int | None = None
    horizon: int = 16  # T
    n_action_steps: int = 8  # Ta
    # whether Ta may change at rollout without retraining (it only sets how often the policy replans);
    # False where the network's output size depends on it
    inference_action_steps: ClassVar[bool] = True
    crop_size: int = 84
    share_vit: bool = False  # one ViT for all cameras, or one each
    image_aug: ImageAugConfig = field(default_factory=ImageAugConfig)
    vit: ViTConfig = field(default_factory=ViTConfig)

    def __post_init__(self):
        if isinstance(self.vit, dict):
            self.vit = ViTConfig(**self.vit)
        if isinstance(self.image_aug, dict):
            self.image_aug = ImageAugConfig(**self.image_aug)
        self.input_shapes = {k: list(v) for k, v in self.input_shapes.items() if v is not None}
        for name in ("n_obs_steps", "horizon", "n_action_steps", "action_dim", "crop_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"policy.{name} must be >= 1, got {getattr(self, name)}")
        if self.n_image_obs_steps is not None and not 1 <= self.n_image_obs_steps <= self.n_obs_steps:
            raise ValueError(
                f"policy.n_image_obs_steps ({self.n_image_obs_steps}) must be between 1 and n_obs_steps ({self.n_obs_steps}), "
                "or null for all of them"
            )
        if self.n_obs_steps - 1 + self.n_action_steps > self.horizon:
            raise ValueError(
                f"policy.horizon ({self.horizon}) must cover n_obs_steps - 1 + n_action_steps "
                f"({self.n_obs_steps - 1 + self.n_action_steps})"
            )
        for key in self.image_keys:
            c, h, w = self.input_shapes[key]
            if self.crop_size > min(h, w):
                raise ValueError(f"policy.crop_size ({self.crop_size}) is larger than camera {key!r} ({h}x{w})")
        if self.crop_size < self.vit.patch_size:
            raise ValueError(f"task.crop_size ({self.crop_size}) is smaller than one {self.vit.patch_size}-px patch; "
                             "lower policy.vit.patch_size or raise the crop")
        if self.crop_size % self.vit.patch_size:
            warnings.warn(f"task.crop_size {self.crop_size} is not a multiple of the {self.vit.patch_size}-px patch: "
                          f"the last {self.crop_size % self.vit.patch_size} pixel rows and columns are never seen")
        # the patch grid of the training crop: the learned position embedding is made for it
        self.vit.base_grid = (self.crop_size // self.vit.patch_size,) * 2

    @property
    def image_obs_steps(self) -> int:
        return self.n_obs_steps if self.n_image_obs_steps is None else self.n_image_obs_steps

    @property
    def window_obs_steps(self) -> int:
        """Observation frames a training window carries (from its start): To here; a recurrent
        policy, which reads one at every step it unrolls, asks for more."""
        return self.n_obs_steps

    @property
    def image_keys(self) -> list[str]:
        return [k for k, s in self.input_shapes.items() if len(s) == 3]

    @property
    def lowdim_keys(self) -> list[str]:
        return [k for k, s in self.input_shapes.items() if len(s) == 1]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class Policy(nn.Module):
    name: ClassVar[str]
    config_class: ClassVar[type[PolicyConfig]]

    def __init__(self, config: PolicyConfig):
        super().__init__()
        self.config = config
        dims = {k: config.input_shapes[k][0] for k in config.lowdim_keys}
        dims["action"] = config.action_dim
        self.normalizer = Normalizer(dims)
        self.obs_encoder = ObsEncoder(config, self.normalizer)
        self.reset()

    # --- the interface -------------------------------------------------------------------
    def compute_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError

    def predict_action_chunk(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """obs[key]: (B, To, ...) -> unnormalized actions (B, Ta, Da) to execute from now on."""
        raise NotImplementedError

    def reset(self) -> None:
        """Start over: empty the queues of ``select_action`` (and, in a recurrent policy, every slot's state)."""
        self._obs_queue: deque = deque(maxlen=self.config.n_obs_steps)
        self._action_queue: deque = deque()

    # --- per-environment state (recurrent policies override these; stateless ones keep them) ---
    def reset_slots(self, slots) -> None:
        """The environments ``slots`` start new episodes: forget whatever state they carried."""

    def predict_action_chunk_for(self, obs: dict[str, torch.Tensor], slots) -> torch.Tensor:
        """``predict_action_chunk`` for a batch whose row j is environment ``slots[j]``; a recurrent
        policy reads and advances each slot's own state. Called once per replanning (every Ta steps)."""
        return self.predict_action_chunk(obs)

    @torch.no_grad()
    def select_action(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """obs[key]: (B, ...) for one step -> action (B, Da); replans every Ta steps."""
        if not self._obs_queue:  # first step of an episode: repeat it To times, as the sampler pads
            self._obs_queue.extend([obs] * self.config.n_obs_steps)
        else:
            self._obs_queue.append(obs)
        if not self._action_queue:
            stacked = {k: torch.stack([o[k] for o in self._obs_queue], dim=1) for k in obs}  # (B, To, ...)
            slots = list(range(len(next(iter(obs.values())))))  # row j is slot j (one recurrent state each)
            chunk = self.predict_action_chunk_for(stacked, slots)  # (B, Ta, Da)
            self._action_queue.extend(chunk.unbind(1))
        return self._action_queue.popleft()

    # --- shared helpers ------------------------------------------------------------------
    def encode_obs(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """obs[key]: (B, >=To, ...) -> (B, cond_dim); extra steps (a training window) are cut."""
        to = self.config.n_obs_steps
        return self.obs_encoder({k: obs[k][:, :to] for k in self.config.input_shapes})

    def actions_to_execute(self, chunk: torch.Tensor) -> torch.Tensor:
        """Normalized (B, T, Da) chunk -> the Ta unnormalized actions from "now" on. The chunk starts
        at the oldest observation, so its first To-1 actions are history."""
        actions = self.normalizer.unnormalize("action", chunk)
        start = self.config.n_obs_steps - 1
        return actions[:, start : start + self.config.n_action_steps]  # (B, Ta, Da)

    def set_normalization(self, stats) -> None:
        self.normalizer.set_stats(stats)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device


POLICIES: dict[str, type[Policy]] = {}


def register_policy(cls: type[Policy]) -> type[Policy]:
    if cls.name in POLICIES:
        raise ValueError(f"policy {cls.name!r} is registered twice")
    POLICIES[cls.name] = cls
    return cls


def load_builtin_policies() -> None:
    # importing the folders registers them; adding a policy = one folder + one import here
    from . import bc, bc_rnn, diffusion  # noqa: F401


def get_policy_class(name: str) -> type[Policy]:
    load_builtin_policies()
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; known policies: {', '.join(sorted(POLICIES))}")
    return POLICIES[name]


def make_policy_config(name: str, **fields) -> PolicyConfig:
    cls = get_policy_class(name).config_class
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"policy {name!r} has no config fields {unknown}; known fields: {sorted(known)}")
    return cls(**fields)


def make_policy(config: PolicyConfig | dict, stats=None, name: str | None = None) -> Policy:
    """Build the policy a config names (a dict, as read from a checkpoint, needs ``name``)."""
    if isinstance(config, dict):
        config = make_policy_config(name or config["name"], **{k: v for k, v in config.items() if k != "name"})
    policy = get_policy_class(config.name)(config)
    if stats is not None:
        policy.set_normalization(stats)
    return policy
