"""The one typed config tree of the package, parsed the same way by every command.

Every default is written once, in a dataclass here (train, eval, task, rollout) or beside its
module (``PolicyConfig`` subclasses in ``policies/<name>/configuration.py``, ``AttentionConfig`` in
``policies/vision/attention.py``, ``GenerateConfig`` in ``datasets/generate.py``). The dataclasses
are registered with Hydra's ConfigStore; the YAML files under ``configs/`` only select and override:

    configs/config.yaml      training: task x policy x attention x recipe
    configs/task/*.yaml      each task's data (cameras, action size, dataset path)
    configs/recipe/          what the package has measured (cpu, paper), per task and policy
    configs/rollout.yaml     rollout.py            configs/generate.yaml   generate_demos.py

Composition refuses wrong types with the field's name (OmegaConf validates against the
dataclasses) and ``to_object`` refuses unknown keys, given with or without ``+`` (Hydra lets a
``+key`` through a structured config), then builds the dataclasses, whose ``__post_init__``
refuses values that can never work.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field, fields, is_dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

from datasets.generate import GenerateConfig  # the generator's settings live with it (datasets imports no core)
from envs.factory import EVAL_SEED_START  # demonstrations use seeds below it, evaluation from it
from envs.shifts import parse_shifts

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def _at_least(owner: str, obj, names: tuple[str, ...], low: int) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is not None and value < low:
            raise ValueError(f"{owner + '.' if owner else ''}{name} must be >= {low}, got {value}")


# --- task ---------------------------------------------------------------------------------------
@dataclass
class DatasetConfig:
    format: Optional[str] = None  # pusht_zarr | robomimic_hdf5 | lerobot; null: told from the path
    path: str = MISSING
    # LeRobotDataset features that feed the policy's inputs and actions (policy key -> feature name);
    # a key not named here is read under its own name. Other formats use the policy's names.
    features: dict[str, str] = field(default_factory=dict)


@dataclass
class EnvConfig:
    max_episode_steps: int = MISSING


@dataclass
class TaskConfig:
    name: str = MISSING  # pusht | lift | can
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    # what the policy reads: images (C, H, W) as rendered, low-dim (D,); a null entry drops that
    # key (a recipe's way to leave out a camera the task offers)
    input_shapes: dict[str, Optional[list[int]]] = field(default_factory=dict)
    action_dim: int = MISSING
    crop_size: int = MISSING  # random crop in training, centre crop at evaluation; = image size: no crop
    fps: int = 10  # of the rollout videos
    env: EnvConfig = field(default_factory=EnvConfig)

    def __post_init__(self):
        self.input_shapes = {k: list(v) for k, v in self.input_shapes.items() if v is not None}
        if not self.input_shapes:
            raise ValueError(f"task.input_shapes of {self.name!r} is empty: the policy would observe nothing")
        _at_least("task", self, ("action_dim", "crop_size", "fps"), 1)
        _at_least("task.env", self.env, ("max_episode_steps",), 1)


# --- training -----------------------------------------------------------------------------------
PRECISIONS = ("fp32", "bf16")


@dataclass
class TrainConfig:
    steps: int = 20000
    batch_size: int = 64  # effective (global) batch: split over torchrun's processes
    scale_lr_with_world_size: bool = False  # true: every process takes batch_size and lr x process count
    lr: float = 3.0e-4
    weight_decay: float = 1.0e-4
    warmup_steps: int = 500
    grad_clip: float = 1.0
    ema: bool = True
    ema_power: float = 0.75  # diffusers EMAModel warm-up power (Diffusion Policy's value)
    ema_max_decay: float = 0.9999
    val_fraction: float = 0.05
    num_workers: int = 0
    log_every: int = 50
    val_every: int = 1000
    checkpoint_every: int = 2000
    max_episodes: Optional[int] = None  # use only the first N demonstrations (data-efficiency studies)
    num_threads: Optional[int] = None  # torch intra-op threads on CPU (None: torch's default)
    precision: str = "fp32"  # fp32 | bf16 (autocast; for GPUs)
    compile: bool = False  # torch.compile the loss computation
    # fine-tuning: start from the weights (and normalisation) of this checkpoint or run, with a fresh optimizer
    # and schedule; the policy must have the same shapes (augmentation and budget may differ)
    init_from: Optional[str] = None

    def __post_init__(self):
        _at_least("train", self, ("steps", "batch_size", "log_every", "val_every", "checkpoint_every",
                                  "max_episodes", "num_threads"), 1)
        _at_least("train", self, ("warmup_steps", "num_workers"), 0)
        if not self.lr > 0:
            raise ValueError(f"train.lr must be > 0, got {self.lr}")
        if not 0 <= self.val_fraction < 1:
            raise ValueError(f"train.val_fraction must be in [0, 1), got {self.val_fraction}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"train.precision={self.precision!r} is unknown; choose one of {', '.join(PRECISIONS)}")


@dataclass
class RolloutOptions:
    """What every rollout takes, during training (``eval.``) or from ``rollout.py``."""

    num_episodes: int = 50
    seed: int = EVAL_SEED_START  # episodes use seeds seed, seed+1, ...
    workers: int = 0  # environment worker processes (0: in this process)
    num_videos: int = 3  # MP4s of the first episodes

    def __post_init__(self):
        _at_least("", self, ("workers", "num_videos"), 0)


@dataclass
class EvalConfig(RolloutOptions):
    """Rollouts during training: ``eval.num_episodes > 0`` turns them on."""

    num_episodes: int = 0
    every: int = 0  # every N steps (0: only at the end)

    def __post_init__(self):
        super().__post_init__()
        _at_least("eval", self, ("num_episodes", "every"), 0)


# The policy's fields that are settings of the run owned elsewhere in the tree (the task's facts, the
# attention group): the policy node refers to them (``${task.input_shapes}``...), so each is set once
POLICY_REFERENCES = {"input_shapes": "task.input_shapes", "action_dim": "task.action_dim",
                     "crop_size": "task.crop_size", "vit.attention": "attention"}


@dataclass
class TrainRunConfig:
    """``python train_policy.py``: one config group per axis (task, policy, attention, recipe)."""

    task: TaskConfig = MISSING
    policy: Any = MISSING  # the chosen policy's PolicyConfig subclass (policies registry)
    attention: Any = MISSING  # AttentionConfig: the policy's encoder's (policy.vit.attention refers to it)
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    run_dir: str = "outputs/${task.name}/${policy.name}_${attention.kind}_s${seed}"
    resume: bool = False  # continue from run_dir's newest complete checkpoint (optimizer, EMA, RNG)
    overwrite: bool = False  # empty run_dir and start over
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self):
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device={self.device!r} is unknown; choose auto, cpu or cuda")
        if self.resume and self.overwrite:
            raise ValueError("resume=true and overwrite=true contradict each other; pass one of them")
        for key, owner in POLICY_REFERENCES.items():
            if attrgetter(key)(self.policy) != attrgetter(owner)(self):
                raise ValueError(f"policy.{key} is the run's {owner}: set {owner}= instead of policy.{key}=")
        self.policy.vit.attention = self.attention  # one object

    def to_stored(self) -> dict:
        """The run's config as its config.json stores it: each setting once, where it is owned (the
        policy's references are left out; a checkpoint's own policy config holds them all)."""
        stored = to_dict(self)
        for key in POLICY_REFERENCES:
            *path, name = key.split(".")
            node = stored["policy"]
            for part in path:
                node = node[part]
            del node[name]
        return stored


# --- rollout.py ---------------------------------------------------------------------------------
CAMERA_POSE_OPTIONS = (None, "nominal")


@dataclass
class InferenceOverrides:
    """Changes to a checkpoint at rollout, without retraining: ``rollout.py``'s options, a study's
    evaluation settings and ``core.evaluation.evaluate_checkpoint``'s, recorded in the summary."""

    image_size: Optional[int] = None  # render the cameras at N x N
    n_action_steps: Optional[int] = None  # Ta: replan more or less often
    num_inference_steps: Optional[int] = None  # diffusion: DDIM steps
    global_slope: Optional[float] = None  # LookHere's s_global
    w_max: Optional[int] = None  # Fibottention's widest window
    offset_grid: Optional[Any] = None  # Fibottention: "train" or [rows, cols]
    # what changes before the policy sees a frame: KIND:SEVERITY or a list of them, each a pixel corruption of
    # every camera image or a scene shift the environment renders (envs/shifts.py names the kinds and severities)
    corruption: Optional[Any] = None
    # a camera-aware policy (policy.ray_maps) is told the pose its camera is at; "nominal": the unshifted pose,
    # as a bumped camera nobody recalibrated reports it (the honest worst case under a camera shift)
    camera_pose: Optional[str] = None

    def __post_init__(self):
        if self.camera_pose not in CAMERA_POSE_OPTIONS:
            raise ValueError(f"camera_pose={self.camera_pose!r}: give camera_pose=nominal (the unshifted pose) or leave "
                             "it out (the pose that rendered the frame)")

        # parsed once, here: refused before the checkpoint loads or an episode runs; [(kind, severity), ...] after
        self.corruption = parse_shifts(self.corruption)
        _at_least("", self, ("image_size", "n_action_steps", "num_inference_steps"), 1)
        _at_least("", self, ("w_max",), 0)
        if self.offset_grid is not None and self.offset_grid != "train":
            grid = list(self.offset_grid) if isinstance(self.offset_grid, (list, tuple)) else []
            if len(grid) != 2 or not all(isinstance(v, int) and v >= 1 for v in grid):
                raise ValueError(f"offset_grid={self.offset_grid!r}: give train or [rows, cols]")
            self.offset_grid = grid

    def overrides(self) -> "InferenceOverrides":
        """The overrides alone (a ``RolloutConfig`` carries them among its other options)."""
        return InferenceOverrides(**{f.name: getattr(self, f.name) for f in fields(InferenceOverrides)})


@dataclass
class RolloutConfig(InferenceOverrides, RolloutOptions):
    """``python rollout.py checkpoint=...``: evaluate a checkpoint, optionally changed at inference
    (the options of ``InferenceOverrides``)."""

    checkpoint: str = MISSING  # a checkpoint directory, or a run directory (its newest complete checkpoint)
    out_dir: Optional[str] = None  # default: <run>/eval/<checkpoint>_seed<seed>[_<options>]
    overwrite: bool = False  # replace an earlier evaluation in out_dir
    device: str = "auto"
    max_steps: Optional[int] = None  # cap on episode length (default: the task's)
    # torch intra-op threads on CPU (None: torch's default, one per core). On a machine that runs anything else
    # (another evaluation, a training, the environment workers) give 1: idle threads spin against the busy ones
    num_threads: Optional[int] = None
    task: Optional[Any] = None  # never set: the checkpoint fixes the task (here so task= gets that answer)

    def __post_init__(self):
        if self.task is not None:
            raise ValueError("task= cannot be chosen at rollout: the checkpoint fixes the task (it is evaluated on the "
                             "task it was trained on, recorded in its config.json); drop task=")
        RolloutOptions.__post_init__(self)
        InferenceOverrides.__post_init__(self)
        _at_least("", self, ("num_episodes", "max_steps", "num_threads"), 1)


# --- registration and composition ---------------------------------------------------------------
def register_configs() -> None:
    """Put the schemas and the policy / attention options into Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    from policies.registry import POLICIES
    from policies.vision.attention import KINDS, AttentionConfig

    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainRunConfig)
    cs.store(name="rollout_schema", node=RolloutConfig)
    generate = OmegaConf.structured(GenerateConfig)
    generate.task = OmegaConf.structured(TaskConfig)  # the data layer takes any task; the command's is typed
    cs.store(name="generate_schema", node=generate)
    for name, cls in POLICIES.items():
        node = OmegaConf.structured(cls.config_class)
        for key, owner in POLICY_REFERENCES.items():
            OmegaConf.update(node, key, f"${{{owner}}}")
        cs.store(group="policy", name=name, node=node)
    for kind in KINDS:
        cs.store(group="attention", name=kind, node=OmegaConf.structured(AttentionConfig(kind=kind)))


def check_known_keys(cfg: DictConfig, prefix: str = "") -> None:
    """Refuse a key its dataclass does not have (``+train.stepz=5`` would otherwise vanish),
    naming the closest known key."""
    schema = OmegaConf.get_type(cfg)
    known = [f.name for f in fields(schema)] if is_dataclass(schema) else None
    for key in cfg.keys():
        name = f"{prefix}{key}"
        if known is not None and key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {prefix}{close[0]}? " if close else ""
            raise ValueError(f"unknown key {name} (given with or without +): {prefix.rstrip('.') or 'the config'} has no "
                             f"such setting; {hint}--cfg job lists every key")
        node = cfg._get_node(key)
        if isinstance(node, DictConfig) and not node._is_missing() and not node._is_none() and not node._is_interpolation():
            check_known_keys(node, name + ".")


def to_object(cfg: DictConfig):
    """A composed DictConfig -> its dataclass tree (runs every ``__post_init__`` check)."""
    check_known_keys(cfg)
    return OmegaConf.to_object(cfg)


def compose_dict(config_name: str = "config", overrides: list[str] | tuple[str, ...] = (),
                 with_hydra: bool = False) -> DictConfig:
    """Compose exactly as the command of ``config_name`` does from its command line (Hydra's errors untouched);
    ``with_hydra`` keeps Hydra's own node (``hydra.runtime.choices``: the option each group took)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    if GlobalHydra.instance().is_initialized():  # inside an entry point (a Hydra app on configs/): its search path
        return hydra_compose(config_name=config_name, overrides=list(overrides), return_hydra_config=with_hydra)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=list(overrides), return_hydra_config=with_hydra)


def compose(config_name: str = "config", overrides: list[str] | tuple[str, ...] = ()):
    """``compose_dict``, as dataclasses."""
    return to_object(compose_dict(config_name, overrides))


def recipe_report(choices: dict, overrides: list[str], task: TaskConfig) -> list[str]:
    """What the recipe did to a composed run: the pieces it applied (Hydra's ``runtime.choices``), and each
    setting of its ``task`` that differs from the task's own file, configs/task/<name>.yaml (cameras,
    dataset, crop). A setting the command line gave is the user's, not the recipe's, and is left out."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    pieces = [f"recipe/{choices['recipe']}"] + sorted(  # the optional pieces that exist
        path for group, choice in choices.items() if group.startswith("recipe/") and choice
        for path in [f"{group.split('@')[0]}/{choice}"] if (CONFIG_DIR / f"{path}.yaml").exists())
    lines = [f"recipe pieces: {', '.join(pieces)}"]
    if not (CONFIG_DIR / "task" / f"{choices['task']}.yaml").is_file():  # a task from another config dir
        return lines
    given = [o.key_or_group + "." for o in OverridesParser.create().parse_overrides(overrides)
             if o.key_or_group.startswith("task.")]  # settings, not the group's option (task=lift)
    for key, (new, old) in sorted(_diff(to_dict(task), to_dict(load_task(choices["task"]))).items()):
        if not any(f"task.{key}.".startswith(g) for g in given):
            lines.append(f"recipe changed task.{key}: {old!r} -> {new!r}")
    return lines


def _diff(new: dict, old: dict, prefix: str = "") -> dict:
    out = {}
    for key in sorted(set(new) | set(old)):
        a, b = new.get(key), old.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out.update(_diff(a, b, f"{prefix}{key}."))
        elif a != b:
            out[prefix + key] = (a, b)
    return out


def to_dict(obj) -> dict:
    """A config dataclass -> plain dict (what checkpoints and summaries store)."""
    return OmegaConf.to_container(OmegaConf.structured(obj), resolve=True)


# "${" with the backslashes before it: OmegaConf reads "\${" as a literal "${" and "\\" before one as "\"
_INTERPOLATION_START = re.compile(r"(\\*)\$\{")


def _literal(data):
    """``data`` with every string escaped so that OmegaConf resolves it to itself: "${oc.env:HOME}" stays
    those characters. A file from elsewhere (a checkpoint's JSON) is data: it must not read the user's
    environment variables (oc.env) or other settings into the run."""
    if isinstance(data, DictConfig):
        data = OmegaConf.to_container(data, resolve=False)
    if isinstance(data, dict):
        return {k: _literal(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_literal(v) for v in data]
    if isinstance(data, str):
        return _INTERPOLATION_START.sub(lambda m: "\\" * (2 * len(m.group(1)) + 1) + "${", data)
    return data


def from_dict(cls, data: dict):
    """The inverse of ``to_dict``, validated (a checkpoint's ``cfg["task"]`` -> TaskConfig). Every string is
    a literal: no interpolation (``${...}``) is resolved. A value of the wrong type is one line."""
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), _literal(data)))
    except OmegaConfBaseException as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        where = f" at {exc.full_key}" if getattr(exc, "full_key", None) else ""
        raise ValueError(f"{cls.__name__}{where}: {detail}") from None


def load_task(name: str) -> TaskConfig:
    """configs/task/<name>.yaml alone as a TaskConfig (what export_dataset.py hands the data layer)."""
    path = CONFIG_DIR / "task" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (CONFIG_DIR / "task").glob("*.yaml"))
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(known)}")
    return from_dict(TaskConfig, OmegaConf.load(path))
