"""Gymnasium wrapper around robosuite 1.5 Lift / PickPlaceCan with robomimic observation names.

robomimic 0.3's own ``EnvRobosuite`` imports mujoco_py, so this module talks to robosuite directly and
reproduces robomimic's conventions: camera frames flipped upright (robosuite renders OpenGL-style,
upside down), ``object`` = robosuite's concatenated ``object-state``, ``states`` = the flattened MuJoCo
state, and robomimic-style ``env_meta`` (``env_name`` / ``env_version`` / ``type`` / ``env_kwargs``).

Observations are computed after every step from the final simulator state (robosuite's own
observables are sampled at the first physics sub-step of a control step; we force-update instead, as
robomimic does when it replays states), and cameras are rendered by this wrapper only for the
cameras the policy uses.
"""
from __future__ import annotations

import copy
import os

os.environ.setdefault("MUJOCO_GL", "egl")

# Load triton's LLVM before Mesa's: importing triton (torch.compile, diffusers do) after an EGL
# context exists in the same process segfaults inside libtriton (two LLVM copies clash).
try:
    import triton  # noqa: F401, E402
except ImportError:
    pass

import logging  # noqa: E402

import gymnasium as gym  # noqa: E402

# robosuite warns at import (no private macro file, optional robot packages) and at every environment build
# (controller parts the Panda lacks): noise in every process, the pool's workers included. A filter on its
# logger, set before the import, outlives the level that robosuite's own logger set-up writes.
logging.getLogger("robosuite_logs").addFilter(lambda record: record.levelno >= logging.ERROR)
import mujoco  # noqa: E402
import numpy as np  # noqa: E402
import robosuite  # noqa: E402
import robosuite.utils.errors as _rs_errors  # noqa: E402
from robosuite.controllers import load_composite_controller_config  # noqa: E402
from robosuite.controllers.composite.composite_controller_factory import (  # noqa: E402
    is_part_controller_config,
    refactor_composite_controller_config,
)

from common.camera_pose import CAMERA_POSE_SUFFIX, POSE_DIM, pose_vector  # noqa: E402

from .robosuite_scene import RobosuiteScene  # noqa: E402
from .scene_shifts import check_one_scene_source, scene_draws, scene_randomization_for  # noqa: E402
from .shifts import parse_scene_shifts  # noqa: E402

TASK_TO_ENV_NAME = {"lift": "Lift", "can": "PickPlaceCan"}
ENV_NAME_TO_TASK = {v: k for k, v in TASK_TO_ENV_NAME.items()}
ROBOSUITE_ENV_TYPE = 1  # robomimic's EnvType.ROBOSUITE_TYPE
LOW_DIM_KEYS = ("robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos", "object")
DEFAULT_CAMERAS = ("agentview", "robot0_eye_in_hand")

_BAD_SIM_WARNINGS = (
    mujoco.mjtWarning.mjWARN_BADQPOS,
    mujoco.mjtWarning.mjWARN_BADQVEL,
    mujoco.mjtWarning.mjWARN_BADQACC,
)


class SimulationError(_rs_errors.SimulationError):
    """The MuJoCo simulation diverged or failed during ``step`` (the rollout should count a failure)."""


# robosuite draws some of the model itself when it builds it (Lift's cube is 2.0-2.2 cm a side) and keeps it
# (hard_reset=False): one seed for that draw, so every process and every pool worker builds the same model and
# an episode seed means the same initial state everywhere (a clean run and its shifted pair included)
MODEL_SEED = 0


def _robosuite_kwargs(robot: str, offscreen: bool, control_freq: int, horizon: int, controller_config: dict | None,
                      seed: int | None = MODEL_SEED) -> dict:
    """``robosuite.make``'s arguments (also what ``env_meta`` records, so robomimic can rebuild the env)."""
    if controller_config is None:
        controller_config = load_composite_controller_config(controller="BASIC", robot=robot)
    return dict(
        has_renderer=False,
        has_offscreen_renderer=offscreen,
        ignore_done=True,
        use_object_obs=True,
        use_camera_obs=False,  # this wrapper renders the cameras itself (once per step, upright)
        control_freq=control_freq,
        horizon=horizon,
        controller_configs=copy.deepcopy(controller_config),
        robots=[robot],
        reward_shaping=False,
        hard_reset=False,  # a hard reset reloads the model and would drop the render settings
        seed=seed,
    )


def _task_name(task: str) -> str:
    key = str(task).lower()
    if key in TASK_TO_ENV_NAME:
        return key
    if task in ENV_NAME_TO_TASK:
        return ENV_NAME_TO_TASK[task]
    raise ValueError(f"unknown robosuite task {task!r}; expected one of {sorted(TASK_TO_ENV_NAME)}")


class RobosuiteEnv(gym.Env):
    """robosuite Lift / PickPlaceCan (Panda, OSC pose deltas, 7-D action in [-1, 1], gripper last).

    Args:
        task: "lift" or "can" (robosuite names "Lift" / "PickPlaceCan" are accepted too).
        cameras: cameras rendered into ``<camera>_image`` observations; ``()`` renders none.
        image_size: square camera resolution (84 as in robomimic; larger for extrapolation studies).
        fast_render: shadows, reflections and multisampling off (~3-4x cheaper software rendering).
            Choose once and use the same setting for data generation and evaluation.
        max_episode_steps: truncation limit (robosuite itself never ends episodes: ``ignore_done``).
        controller_config: robosuite 1.5 composite controller config; default BASIC for Panda.
        seed: seeds the first ``reset`` (later resets without a seed continue the stream).
        scene_shifts: scene shifts ``[(kind, severity), ...]`` (``envs.scene_shifts``: lighting, colour,
            camera) rendered in every episode from ``reset(seed=...)`` on, drawn from that seed; the episode's
            state is the clean episode's. ``set_scene_shifts`` changes them for the next reset.
        scene_randomization: an ``envs.scene_shifts.SceneRandomization`` (demonstrations): every episode from
            ``reset(seed=...)`` on renders a scene drawn from its seed, each kind at a severity in [0, max];
        camera_poses: each camera's pose (``common.camera_pose``) beside its image, as ``<camera>_camera``:
            the pose that rendered the frame, read from the simulator (a calibrated camera).
        nominal_camera_pose: ``<camera>_camera`` holds the unshifted pose even under a camera shift (a
            bumped camera nobody recalibrated: the honest worst case of a camera-aware policy).
            the state is the clean episode's. ``set_scene_randomization`` changes it for the next reset.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}

    def __init__(
        self,
        task: str = "lift",
        *,
        cameras=DEFAULT_CAMERAS,
        image_size: int = 84,
        fast_render: bool = True,
        max_episode_steps: int = 400,
        horizon: int = 400,
        control_freq: int = 20,
        robot: str = "Panda",
        controller_config: dict | None = None,
        render_size: int | None = None,
        seed: int | None = None,
        scene_shifts=(),
        scene_randomization=None,
        camera_poses: bool = False,
        nominal_camera_pose: bool = False,
    ):
        super().__init__()
        self.task = _task_name(task)
        self._scene = None  # robosuite's modders (envs/robosuite_scene.py), made when a scene shift is first applied
        self.scene_randomization = None
        self.set_scene_shifts(scene_shifts)
        self.set_scene_randomization(scene_randomization)
        self.env_name = TASK_TO_ENV_NAME[self.task]
        if isinstance(cameras, str):
            cameras = (cameras,)
        self.cameras = tuple(cameras)
        self.image_size = int(image_size)
        self.render_size = int(render_size) if render_size else self.image_size
        self.fast_render = bool(fast_render)
        self.max_episode_steps = int(max_episode_steps)
        self.robot = robot
        self.render_mode = "rgb_array"
        self._env_kwargs = _robosuite_kwargs(robot, bool(self.cameras), int(control_freq), int(horizon),
                                             controller_config)  # ``seed`` seeds the first reset, not the model
        self._env = robosuite.make(self.env_name, **self._env_kwargs)
        self._render_ready = False
        if self.cameras:
            self._check_cameras()
            self._ensure_render_context()
        self._steps = 0
        self._last_obs: dict | None = None
        self._needs_reset = True
        # each camera's pose beside its image (<camera>_camera): the one that rendered the frame, as a calibrated
        # camera reports it, or (nominal_camera_pose) the unshifted one, as a bumped camera nobody recalibrated does
        self._asked_poses = bool(camera_poses) or bool(nominal_camera_pose)
        self.camera_poses = self._asked_poses or self.randomises_camera
        self._nominal_poses = None
        # the low-dim shapes are read off a first observation (clean: a shift is drawn from an episode's seed)
        first = self._reset_sim(seed, shifted=False)
        if nominal_camera_pose:  # the first scene is the clean one: its poses are the nominal ones
            self._nominal_poses = {cam: first[f"{cam}{CAMERA_POSE_SUFFIX}"] for cam in self.cameras}
        self._set_spaces(first)

    def set_scene_shifts(self, shifts) -> None:
        """Scene shifts ``[(kind, severity), ...]`` (or ``["lighting:2", ...]``) for the episodes from the next
        ``reset(seed=...)`` on; ``[]``: clean. Refused in one line: a pixel corruption (the caller applies
        those to observations) or a kind this task cannot render."""
        shifts = parse_scene_shifts(shifts, self.task)
        check_one_scene_source(shifts, self.scene_randomization)
        self.scene_shifts = shifts

    def set_scene_randomization(self, randomization) -> None:
        """Scenes drawn per episode (``envs.scene_shifts.SceneRandomization``) from the next ``reset(seed=...)``
        on; None: clean. Refused in one line: a kind this task cannot render, a max severity outside 1-3."""
        randomization = scene_randomization_for(randomization, self.task)
        check_one_scene_source(self.scene_shifts, randomization)
        self.scene_randomization = randomization
        if getattr(self, "_last_obs", None) is not None:  # after construction: the poses follow the randomisation
            poses = self._asked_poses or self.randomises_camera
            if poses != self.camera_poses:
                self.camera_poses = poses
                self._set_spaces(self._get_obs())

    @property
    def randomises_camera(self) -> bool:
        """Demonstrations under drawn camera poses record each frame's pose: the dataset keeps what varied."""
        return self.scene_randomization is not None and "camera" in self.scene_randomization.kinds

    def _check_cameras(self) -> None:
        names = set(self._env.sim.model.camera_names)
        missing = [c for c in self.cameras if c not in names]
        if missing:
            raise ValueError(f"unknown cameras {missing}; the model has {sorted(names)}")

    def _set_spaces(self, obs: dict) -> None:
        spaces = {}
        for cam in self.cameras:
            spaces[f"{cam}_image"] = gym.spaces.Box(0, 255, (self.image_size, self.image_size, 3), np.uint8)
            if self.camera_poses:
                spaces[f"{cam}{CAMERA_POSE_SUFFIX}"] = gym.spaces.Box(-np.inf, np.inf, (POSE_DIM,), np.float32)
        for key in LOW_DIM_KEYS:
            spaces[key] = gym.spaces.Box(-np.inf, np.inf, obs[key].shape, np.float32)
        self.observation_space = gym.spaces.Dict(spaces)
        low, high = self._env.action_spec
        self.action_space = gym.spaces.Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32)

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def from_env_meta(cls, env_meta: dict, **kw) -> "RobosuiteEnv":
        """Build from robomimic ``env_meta`` (``data.attrs['env_args']``); robosuite 1.4 metadata is converted.

        Keyword arguments override what the metadata implies (e.g. ``cameras=()`` for fast tests).
        """
        env_meta = convert_env_meta_v14(env_meta)
        ek = env_meta.get("env_kwargs", {})
        robots = ek.get("robots", ["Panda"])
        robot = robots[0] if isinstance(robots, (list, tuple)) else robots
        args = dict(
            task=_task_name(env_meta["env_name"]),
            robot=robot,
            control_freq=ek.get("control_freq", 20),
            controller_config=ek.get("controller_configs"),
        )
        if ek.get("use_camera_obs", False) and ek.get("camera_names"):
            names = ek["camera_names"]
            args["cameras"] = (names,) if isinstance(names, str) else tuple(names)
            heights = ek.get("camera_heights", 84)
            args["image_size"] = int(heights[0] if isinstance(heights, (list, tuple)) else heights)
        elif "use_camera_obs" in ek:
            args["cameras"] = ()
        render_opts = env_meta.get("render_options") or {}
        if "fast_render" in render_opts:
            args["fast_render"] = bool(render_opts["fast_render"])
        args.update(kw)
        return cls(**args)

    def env_meta(self) -> dict:
        """robomimic-style environment metadata (stored as ``data.attrs['env_args']``)."""
        ek = {k: v for k, v in self._env_kwargs.items() if k not in ("seed",)}
        ek = copy.deepcopy(ek)
        ek["use_camera_obs"] = bool(self.cameras)
        ek["has_offscreen_renderer"] = bool(self.cameras)
        ek["camera_names"] = list(self.cameras)
        ek["camera_heights"] = self.image_size
        ek["camera_widths"] = self.image_size
        ek["camera_depths"] = False
        return {
            "env_name": self.env_name,
            "env_version": robosuite.__version__,
            "type": ROBOSUITE_ENV_TYPE,
            "env_kwargs": ek,
            # not a robosuite kwarg: how this wrapper renders (shadows / reflections / MSAA off when fast)
            "render_options": {"fast_render": self.fast_render, "flip_images_upright": True},
        }

    # ------------------------------------------------------------------ rendering
    def _ensure_render_context(self):
        sim = self._env.sim
        if sim._render_context_offscreen is None:
            from robosuite.utils.binding_utils import MjRenderContextOffscreen

            MjRenderContextOffscreen(sim, device_id=-1)  # attaches itself to sim
        if self._render_ready:
            return
        ctx = sim._render_context_offscreen
        ctx.vopt.geomgroup[0] = 0  # collision meshes off, visual meshes on (robosuite defaults)
        ctx.vopt.geomgroup[1] = 1
        if self.fast_render:
            ctx.scn.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
            ctx.scn.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
            sim.model.vis.quality.offsamples = 0
            # multisampling is fixed when the MjrContext is created: recreate it
            ctx.gl_ctx.make_current()
            ctx.con.free()
            ctx._set_mujoco_context_and_buffers()
        self._render_ready = True

    def _render_camera(self, camera: str, size: int) -> np.ndarray:
        self._ensure_render_context()
        # robosuite renders in whichever GL context is current, which with several environments in one
        # process is another's (the newest one's, or none once one was closed): garbled or black frames
        self._env.sim._render_context_offscreen.gl_ctx.make_current()
        img = self._env.sim.render(camera_name=camera, width=size, height=size)
        return np.ascontiguousarray(img[::-1])  # upright, as robomimic stores images

    def render(self, camera: str = "agentview", size: int | None = None) -> np.ndarray:
        """An upright RGB frame (H, W, 3) uint8, by default agentview at ``render_size`` (for videos)."""
        size = int(size or self.render_size)
        key = f"{camera}_image"
        if self._last_obs is not None and key in self._last_obs and size == self.image_size:
            return self._last_obs[key].copy()
        return self._render_camera(camera, size)

    # ------------------------------------------------------------------ observations / state
    def _get_obs(self) -> dict:
        # Two passes: robosuite's relative sensors (e.g. Can_to_robot0_eef_pos) read other sensors' values
        # from the observation cache and some run before the sensors they depend on, so a single forced
        # update would mix in values from the previous sample.
        self._env._update_observables(force=True)
        di = self._env._get_observations(force_update=True)
        obs = {}
        for cam in self.cameras:
            obs[f"{cam}_image"] = self._render_camera(cam, self.image_size)
            if self.camera_poses:
                obs[f"{cam}{CAMERA_POSE_SUFFIX}"] = (self._nominal_poses[cam] if self._nominal_poses is not None
                                                     else self._camera_pose(cam))
        obs["robot0_eef_pos"] = np.asarray(di["robot0_eef_pos"], dtype=np.float32)
        obs["robot0_eef_quat"] = np.asarray(di["robot0_eef_quat"], dtype=np.float32)
        obs["robot0_gripper_qpos"] = np.asarray(di["robot0_gripper_qpos"], dtype=np.float32)
        obs["object"] = np.asarray(di["object-state"], dtype=np.float32)
        self._last_obs = obs
        return obs

    def _camera_pose(self, camera: str) -> np.ndarray:
        """(POSE_DIM,) float32: where ``camera`` is now (after any scene shift), read from the simulator's own state."""
        sim = self._env.sim
        cam = sim.model.camera_name2id(camera)
        return pose_vector(sim.data.cam_xpos[cam], sim.data.cam_xmat[cam], sim.model.cam_fovy[cam])

    def get_state(self) -> np.ndarray:
        """Flattened MuJoCo state [time, qpos, qvel], as robomimic stores ``states``."""
        return np.array(self._env.sim.get_state().flatten(), dtype=np.float64)

    def get_model_xml(self) -> str:
        return self._env.sim.model.get_xml()

    def is_success(self) -> bool:
        return bool(self._env._check_success())

    @property
    def unwrapped_robosuite(self):
        """The underlying robosuite environment (privileged access for scripted experts)."""
        return self._env

    @property
    def elapsed_steps(self) -> int:
        return self._steps

    # ------------------------------------------------------------------ gymnasium API
    def _reset_sim(self, seed: int | None, shifted: bool = True) -> dict:
        if seed is not None:
            # robosuite shares one Generator between the env, its placement samplers and robot init
            # noise: reseed it in place so every holder sees the new stream
            self._env.rng.bit_generator.state = np.random.default_rng(seed).bit_generator.state
        # from generators of their own (a missing seed is refused here, before anything changes)
        draws = scene_draws(self.scene_shifts, seed, self.scene_randomization) if shifted else []
        if self._scene is not None:  # no shift of an earlier episode outlives it
            self._scene.restore(keep=[kind for kind, _, _ in draws])
        self._env.reset()
        if draws:  # after the state is set: the state is the clean episode's
            if self._scene is None:
                self._scene = RobosuiteScene(self._env.sim, self.task)
            self._scene.apply(draws)
        self._steps = 0
        self._needs_reset = False
        return self._get_obs()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if options and options.get("state") is not None:
            return self.reset_to(options["state"]), self._info(0.0)
        obs = self._reset_sim(seed)
        return obs, self._info(0.0)

    def reset_to(self, state) -> dict:
        """Start an episode from a stored flattened simulator state (or robomimic ``{'states': ...}``)."""
        if isinstance(state, dict):
            state = state["states"]
        state = np.asarray(state, dtype=np.float64)
        expected = self.get_state().shape
        if state.shape != expected:
            raise ValueError(f"state has shape {state.shape}, this {self.env_name} model expects {expected}")
        if self._scene is not None:
            self._scene.restore()  # a stored state replays in the clean scene
        self._env.reset()
        self._env.sim.set_state_from_flattened(state)
        self._env.sim.forward()  # OSC deltas are taken from the achieved pose, so no goal reset needed
        self._steps = 0
        self._needs_reset = False
        return self._get_obs()

    def _info(self, reward: float) -> dict:
        return {"success": self.is_success(), "reward": float(reward)}

    def step(self, action):
        if self._needs_reset:
            raise RuntimeError("call reset() before step() (the episode ended or never started)")
        action = np.asarray(action, dtype=np.float64).reshape(-1)
        if action.shape != self.action_space.shape:
            raise ValueError(f"action must have shape {self.action_space.shape}, got {action.shape}")
        if not np.all(np.isfinite(action)):
            raise ValueError(f"non-finite action {action}")
        data = self._env.sim.data._data
        before = [int(data.warning[w].number) for w in _BAD_SIM_WARNINGS]
        try:
            action = np.clip(action, -1.0, 1.0)
            self._env.step(action)
        except (mujoco.FatalError, FloatingPointError, _rs_errors.robosuiteError) as e:
            self._needs_reset = True
            raise SimulationError(f"MuJoCo simulation failed in {self.env_name} at step {self._steps}: {e}") from e
        after = [int(data.warning[w].number) for w in _BAD_SIM_WARNINGS]
        if after != before or not (np.all(np.isfinite(data.qpos)) and np.all(np.isfinite(data.qvel))):
            self._needs_reset = True
            bad = [mujoco.mjtWarning(w).name for w, b, a in zip(_BAD_SIM_WARNINGS, before, after) if a != b]
            raise SimulationError(
                f"MuJoCo simulation became unstable in {self.env_name} at step {self._steps} "
                f"(warnings: {bad or 'non-finite state'})"
            )
        # robosuite's lite_physics stepping ends with mj_step2, leaving kinematics one sub-step behind qpos;
        # recompute them so observations, images, reward and success all describe the state get_state() returns
        self._env.sim.forward()
        reward = self._env.reward(action)
        self._steps += 1
        obs = self._get_obs()
        info = self._info(reward)
        terminated = info["success"]
        truncated = (not terminated) and self._steps >= self.max_episode_steps
        if terminated or truncated:
            self._needs_reset = True
        return obs, float(reward), terminated, truncated, info

    def close(self):
        env = getattr(self, "_env", None)
        if env is not None:
            ctx = getattr(env.sim, "_render_context_offscreen", None)
            if ctx is not None:  # robosuite frees the MjrContext in the current GL context, which may be
                ctx.gl_ctx.make_current()  # another environment's (its textures would go): make it this one's
            env.close()
            self._env = None


# ---------------------------------------------------------------------- robosuite 1.4 metadata
_OLD_TO_NEW_CONTROLLER_KEYS = {"damping": "damping_ratio", "damping_limits": "damping_ratio_limits"}


def _convert_part_config(cfg: dict) -> dict:
    cfg = copy.deepcopy(cfg)
    for old, new in _OLD_TO_NEW_CONTROLLER_KEYS.items():
        if old in cfg:
            value = cfg.pop(old)
            cfg.setdefault(new, value)
    if "control_delta" in cfg:
        delta = cfg.pop("control_delta")
        cfg.setdefault("input_type", "delta" if delta else "absolute")
    return cfg


def convert_env_meta_v14(env_meta: dict) -> dict:
    """Convert robosuite <= 1.4 robomimic metadata (arm-only ``OSC_POSE`` controller) to robosuite 1.5.

    The arm config becomes the ``right`` arm of the robot's default composite (BASIC) controller via
    robosuite's ``refactor_composite_controller_config``; 1.4 key names (``damping``,
    ``damping_limits``, ``control_delta``) are renamed to their 1.5 equivalents. Metadata that is
    already in 1.5 form is returned unchanged (as a copy).
    """
    meta = copy.deepcopy(env_meta)
    ek = meta.setdefault("env_kwargs", {})
    cfg = ek.get("controller_configs")
    if cfg is not None and is_part_controller_config(cfg):
        robots = ek.get("robots", ["Panda"])
        robot = robots[0] if isinstance(robots, (list, tuple)) else robots
        ek["controller_configs"] = refactor_composite_controller_config(_convert_part_config(cfg), robot, ["right"])
        meta["converted_from_env_version"] = meta.get("env_version")
        meta["env_version"] = robosuite.__version__
    return meta
