"""The policy interface every policy implements, its shared config, and the registry.

Interface (lerobot-style): ``reset()``, ``select_action(obs)`` (one step, keeps an action queue),
``predict_action_chunk(obs)`` (batched, stateless), ``compute_loss(batch)``.
``select_action`` is what every rollout runs, batched over environments: each environment (row j of
the batch, or ``envs[j]``) has its own observation history, action queue and, in a recurrent policy,
state; ``reset(envs)`` starts new episodes in some of them. A policy with state across replanning
steps overrides one hook, ``plan(obs, carries)``; a stateless one keeps the default.
Glossary: To = n_obs_steps, T = horizon, Ta = n_action_steps, Da = action_dim.
"""
from __future__ import annotations

import dataclasses
import warnings
from collections import deque
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

import torch
from torch import nn

from common.camera_pose import POSE_DIM, pose_key

from .normalize import Normalizer
from .obs_encoder import ImageAugConfig, ObsEncoder
from .vision.resnet import ResNetConfig
from .vision.vit import ViTConfig, patch_grid

# the camera encoders: the ViT under study (vit.*, its attention the run's attention=), or the field's
# default ResNet-18 baseline (resnet.*; it has no attention). Chosen with encoder=<name> (configs/encoder/)
ENCODERS = ("vit", "resnet18")


@dataclass
class PolicyConfig:
    name: str = ""  # the registry name; each policy's config sets it
    # The task's facts, always given (TaskConfig owns their meaning and checks; the training tree fills
    # them in from task.*, a checkpoint stores them): key -> shape (images (C, H, W), low-dim (D,); a
    # None entry is dropped), the action size, the square crop the encoders see
    input_shapes: dict[str, Optional[list[int]]] = field(kw_only=True)
    action_dim: int = field(kw_only=True)
    crop_size: int = field(kw_only=True)
    n_obs_steps: int = 2  # To
    # camera frames among the To steps (the latest ones); None: all To. 1 keeps the encoder's cost
    # at one frame while the low-dim history still shows velocities (is the gripper still closing?)
    n_image_obs_steps: int | None = None
    horizon: int = 16  # T
    n_action_steps: int = 8  # Ta
    # whether Ta may change at rollout without retraining (it only sets how often the policy replans);
    # False where the network's output size depends on it
    inference_action_steps: ClassVar[bool] = True
    # nested config -> the flat fields it held in checkpoints written before it existed (see upgrade)
    legacy_fields: ClassVar[dict[str, tuple[str, ...]]] = {}
    # true: the last crop_size % patch_size pixel rows and columns are knowingly left unseen (the ViT's
    # patch grid covers crop_size // patch_size patches); false: such a crop is warned about
    drop_crop_remainder: bool = False
    share_vit: bool = False  # one camera encoder for all cameras, or one each
    image_aug: ImageAugConfig = field(default_factory=ImageAugConfig)
    # camera-aware input: each camera's pose (its <camera>_camera observation, common/camera_pose.py) drawn as a
    # per-pixel ray map (Plücker coordinates) that enters the encoder's first layer beside the image
    ray_maps: bool = False
    # camera dropout: in training, each camera's features are replaced by a learned "absent" feature with this
    # probability per sample, so the policy learns to act from the other cameras when one misleads
    camera_dropout: float = 0.0
    encoder: str = "vit"  # one of ENCODERS
    vit: ViTConfig = field(default_factory=ViTConfig)
    resnet: ResNetConfig = field(default_factory=ResNetConfig)

    def __post_init__(self):
        if isinstance(self.vit, dict):
            self.vit = ViTConfig(**self.vit)
        if isinstance(self.resnet, dict):
            self.resnet = ResNetConfig(**self.resnet)
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
        if self.image_aug.shift >= self.crop_size:
            raise ValueError(f"policy.image_aug.shift ({self.image_aug.shift}) must be smaller than the "
                             f"{self.crop_size}-px crop, or nothing of the image is left in view")
        self.check_camera_inputs()
        if self.encoder not in ENCODERS:
            raise ValueError(f"policy.encoder={self.encoder!r} is unknown; choose one of {', '.join(ENCODERS)} (encoder=<name>)")
        if self.encoder == "vit":
            if self.image_keys:  # a policy without a camera crops nothing
                self.check_vit_crop()
        elif self.vit.backbone is not None:
            raise ValueError(f"encoder={self.encoder} replaces the ViT, so policy.vit.backbone={self.vit.backbone} "
                             "cannot apply: drop one of them")
        elif self.vit.attention.kind != "full":
            raise ValueError(f"encoder={self.encoder} has no attention, so attention={self.vit.attention.kind} cannot "
                             f"apply: pass encoder={self.encoder} alone (not policy.encoder=, which keeps the default attention)")

    def check_camera_inputs(self) -> None:
        """Ray maps need each camera's pose; camera dropout is a probability and needs a camera."""
        if not 0.0 <= self.camera_dropout < 1.0:
            raise ValueError(f"policy.camera_dropout must be in [0, 1) (a probability per sample), got {self.camera_dropout}")
        if self.camera_dropout > 0 and not self.image_keys:
            raise ValueError("policy.camera_dropout is set but the policy has no camera: drop it, or give the task a camera")
        if not self.ray_maps:
            return
        missing = [pose_key(k) for k in self.image_keys if self.input_shapes.get(pose_key(k)) != [POSE_DIM]]
        if missing or not self.image_keys:
            raise ValueError(f"policy.ray_maps=true draws each camera's rays from its pose, but the policy does not read "
                             f"{', '.join(missing) or 'any camera'}: add +task.input_shapes.{(missing or ['<camera>_camera'])[0]}="
                             f"[{POSE_DIM}] and train on demonstrations that record camera poses (generate_demos.py "
                             "scene_randomization=camera)")
        if self.vit.backbone is not None:
            raise ValueError(f"policy.ray_maps=true needs the package's own encoders: timm's {self.vit.backbone} reads "
                             "three channels; drop policy.vit.backbone or policy.ray_maps")

    @property
    def ray_map_keys(self) -> list[str]:
        """The pose observations that feed ray maps (not the low-dim vector); none without ray maps."""
        return [pose_key(k) for k in self.image_keys] if self.ray_maps else []

    def check_vit_crop(self) -> None:
        """The ViT's patches must fit the crop."""
        if self.crop_size < self.vit.patch_size:
            raise ValueError(f"task.crop_size ({self.crop_size}) is smaller than one {self.vit.patch_size}-px patch; "
                             "lower policy.vit.patch_size or raise the crop")
        if self.crop_size % self.vit.patch_size and not self.drop_crop_remainder:
            warnings.warn(f"task.crop_size {self.crop_size} is not a multiple of the {self.vit.patch_size}-px patch: "
                          f"the last {self.crop_size % self.vit.patch_size} pixel rows and columns are never seen; "
                          f"choose a multiple, or pass policy.drop_crop_remainder=true if that is what you want")

    @property
    def feature_dim(self) -> int:
        """Features per camera frame that the chosen encoder hands the policy."""
        return self.resnet.out_dim if self.encoder == "resnet18" else self.vit.out_dim

    @property
    def patch_grid(self) -> tuple[int, int]:
        """The ViT's patch grid on the training crop (its learned position embedding is made for it)."""
        return patch_grid(self.crop_size, self.vit.patch_size)

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

    @classmethod
    def upgrade(cls, fields: dict) -> dict:
        """A saved config's fields in today's layout: flat fields an older checkpoint holds move
        into the nested config that owns them now (``legacy_fields``); the ``vit.base_grid`` it
        holds is dropped, since it is derived (``patch_grid``)."""
        fields = dict(fields)
        for nested, names in cls.legacy_fields.items():
            moved = {name: fields.pop(name) for name in names if name in fields}
            if moved:
                fields[nested] = {**moved, **(fields.get(nested) or {})}
        vit = dict(fields.get("vit") or {})
        if "base_grid" in vit:
            saved = tuple(vit.pop("base_grid"))
            derived = patch_grid(fields["crop_size"], vit.get("patch_size", ViTConfig.patch_size))
            if saved != derived:  # only a hand-built config could hold another grid
                raise ValueError(f"this checkpoint's ViT was made for a {saved} patch grid, but its crop_size "
                                 f"{fields['crop_size']} gives {derived}: its position embedding does not fit the model")
            fields["vit"] = vit
        return fields


class Acting:
    """One environment's acting state inside ``select_action``: its To latest observations (the
    first repeated To times, as the training sampler pads), its queued actions and a policy's carry."""

    def __init__(self, n_obs_steps: int):
        self.obs: deque = deque(maxlen=n_obs_steps)
        self.actions: deque = deque()
        self.carry = None

    def observe(self, obs: dict[str, torch.Tensor]) -> None:
        if not self.obs:
            self.obs.extend([obs] * self.obs.maxlen)
        else:
            self.obs.append(obs)

    def history(self, key: str) -> torch.Tensor:
        return torch.stack([o[key] for o in self.obs])  # (To, ...)


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

    def reset(self, envs=None) -> None:
        """Start new episodes in environments ``envs`` (any hashable ids; None: all): forget their
        observation history, queued actions and recurrent state."""
        if envs is None:
            self._acting: dict[Any, Acting] = {}
        for env in envs or ():
            self._acting.pop(env, None)

    def plan(self, obs: dict[str, torch.Tensor], carries: list) -> tuple[torch.Tensor, list]:
        """One replanning step of ``select_action``: obs[key] (B, To, ...) with row j's carried state
        ``carries[j]`` (None at an episode start) -> (actions (B, Ta, Da), the new carries).
        Stateless policies carry nothing; a recurrent policy carries its hidden state."""
        return self.predict_action_chunk(obs), carries

    @torch.no_grad()
    def select_action(self, obs: dict[str, torch.Tensor], envs=None) -> torch.Tensor:
        """obs[key]: (B, ...) one step of B environments -> actions (B, Da). Row j is environment
        ``envs[j]`` (default: j); the environments whose action queue is empty replan together in
        one batched forward pass, every Ta steps each."""
        rows = next(iter(obs.values())).shape[0]
        envs = list(range(rows)) if envs is None else list(envs)
        if len(envs) != rows or len(set(envs)) != rows:
            raise ValueError(f"select_action needs one distinct environment per batch row, got {envs}")
        acting = [self._acting.setdefault(env, Acting(self.config.n_obs_steps)) for env in envs]
        for j, state in enumerate(acting):
            state.observe({k: v[j] for k, v in obs.items()})
        need = [j for j, state in enumerate(acting) if not state.actions]
        if need:
            stacked = {k: torch.stack([acting[j].history(k) for j in need]) for k in obs}  # (B', To, ...)
            chunk, carries = self.plan(stacked, [acting[j].carry for j in need])  # (B', Ta, Da)
            for row, j in enumerate(need):
                acting[j].actions.extend(chunk[row].unbind(0))
                acting[j].carry = carries[row]
        return torch.stack([state.actions.popleft() for state in acting])  # (B, Da)

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
