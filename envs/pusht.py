"""PushT environment with the package-wide task conventions.

Wraps ``gym_pusht`` 0.1.8 (``gym_pusht/PushT-v0``, ``obs_type="pixels_agent_pos"``), instantiating its env
class directly (no gymnasium wrappers) and adding the conventions every task in this package follows:

* observation: ``{"image": uint8 (S, S, 3) HWC, "agent_pos": float32 (2,)}`` with ``S = image_size``
  (96 by default; larger sizes, e.g. 128, render the same 512x512 scene at a higher resolution).
  ``observation_space`` is a ``gymnasium.spaces.Dict`` describing exactly this.
* action: absolute target position of the agent, float32 (2,) in ``[0, 512]^2`` (clipped to that box).
  A PD controller (10 physics sub-steps of 0.01 s per env step) drives the agent towards it.
* ``step`` returns ``(obs, reward, terminated, truncated, info)``; ``reward`` is gym-pusht's reward
  (``clip(coverage / success_threshold, 0, 1)``), ``info["coverage"]`` the fraction of the goal area covered
  by the block in [0, 1], ``info["success"] = coverage > success_threshold``. An episode terminates on success
  and is truncated after ``max_episode_steps`` (300) steps.
* ``reset(seed=...)`` is deterministic per seed. ``reset(options={"reset_to_state": s})`` with
  ``s = [agent_x, agent_y, block_x, block_y, block_angle]`` puts the block exactly there: gym-pusht sets the
  position before the angle and the angle rotates the body about its centre of gravity (which is not the body
  origin), so we pre-shift the position it is given to compensate.
* state: ``[agent_x, agent_y, block_x, block_y, block_angle]`` (block position = pymunk body origin, which is
  the middle of the T's top edge; angle wrapped to [0, 2*pi)), as in the Diffusion Policy dataset.

Geometry helpers (T outline, goal pose, corner cost) live here so the scripted expert and any analysis code
share one definition.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from .scene_shifts import (
    COLOUR_MIX,
    PUSHT_MOVE_PX,
    PUSHT_TURN_DEG,
    PUSHT_ZOOM,
    at_severity,
    check_one_scene_source,
    either_way,
    mixed_colour,
    scene_draws,
    scene_randomization_for,
)
from .shifts import parse_scene_shifts

WORKSPACE = 512.0
GOAL_POSE = np.array([256.0, 256.0, math.pi / 4])  # x, y, angle of the goal T (gym-pusht's fixed goal)
AGENT_RADIUS = 15.0
BLOCK_COG_LOCAL = np.array([0.0, 45.0])  # centre of gravity in the block frame (mean of the two boxes' centroids)
# The T's outline in the block frame (body origin = middle of the bar's outer edge): bar 120x30, stem 30x90.
T_OUTLINE_LOCAL = np.array(
    [[-60, 0], [60, 0], [60, 30], [15, 30], [15, 120], [-15, 120], [-15, 30], [-60, 30]], dtype=np.float64
)
# The two convex pieces of the T as axis-aligned boxes in the block frame: (xmin, ymin, xmax, ymax).
T_BOXES_LOCAL = np.array([[-60.0, 0.0, 60.0, 30.0], [-15.0, 30.0, 15.0, 120.0]])


def rot(angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, -s], [s, c]])


def local_to_world(pose, pts_local: np.ndarray) -> np.ndarray:
    """Block-frame points (N, 2) to world coordinates for block pose (x, y, angle)."""
    return np.asarray(pts_local) @ rot(pose[2]).T + np.asarray(pose[:2], dtype=np.float64)


def world_to_local(pose, pts_world: np.ndarray) -> np.ndarray:
    return (np.asarray(pts_world, dtype=np.float64) - np.asarray(pose[:2], dtype=np.float64)) @ rot(pose[2])


GOAL_CORNERS = local_to_world(GOAL_POSE, T_OUTLINE_LOCAL)


def corner_cost(poses: np.ndarray) -> np.ndarray:
    """Mean distance (px) between the T's 8 outline corners and the goal's, for poses (..., 3).

    Coverage > 0.95 needs this under about 2 px.
    """
    poses = np.asarray(poses, dtype=np.float64)
    c, s = np.cos(poses[..., 2])[..., None], np.sin(poses[..., 2])[..., None]
    lx, ly = T_OUTLINE_LOCAL[:, 0], T_OUTLINE_LOCAL[:, 1]
    wx = poses[..., 0:1] + c * lx - s * ly
    wy = poses[..., 1:2] + s * lx + c * ly
    return np.hypot(wx - GOAL_CORNERS[:, 0], wy - GOAL_CORNERS[:, 1]).mean(axis=-1)


def point_to_block_distance(pose, pts_world: np.ndarray) -> np.ndarray:
    """Euclidean distance (px) from world points (N, 2) to the T (0 inside)."""
    p = world_to_local(pose, np.atleast_2d(pts_world))
    out = np.full(len(p), np.inf)
    for xmin, ymin, xmax, ymax in T_BOXES_LOCAL:
        dx = np.maximum(np.maximum(xmin - p[:, 0], p[:, 0] - xmax), 0.0)
        dy = np.maximum(np.maximum(ymin - p[:, 1], p[:, 1] - ymax), 0.0)
        out = np.minimum(out, np.hypot(dx, dy))
    return out


def _block_keypoints_local(n: int = 9, seed: int = 0) -> np.ndarray:
    """Keypoints of the T in the block frame, defined the way the Diffusion Policy dataset defines its 9
    block keypoints: farthest-point sampling over the T's pixels (1 px grid, seeded random first point),
    then a seeded sub-pixel jitter. The constants therefore match DP's in spirit (spread over the T's area,
    fixed in the block frame), not necessarily to the decimal."""
    rng = np.random.default_rng(seed)
    pts = []
    for xmin, ymin, xmax, ymax in T_BOXES_LOCAL:
        xs, ys = np.meshgrid(np.arange(xmin, xmax) + 0.5, np.arange(ymin, ymax) + 0.5)
        pts.append(np.stack([xs.ravel(), ys.ravel()], axis=1))
    pts = np.concatenate(pts)
    chosen = [int(rng.integers(len(pts)))]
    dmin = np.linalg.norm(pts - pts[chosen[0]], axis=1)
    for _ in range(n - 1):
        i = int(np.argmax(dmin))
        chosen.append(i)
        dmin = np.minimum(dmin, np.linalg.norm(pts - pts[i], axis=1))
    return pts[chosen] + rng.uniform(0.0, 1.0, size=(n, 2))


BLOCK_KEYPOINTS_LOCAL = _block_keypoints_local()

# gym-pusht 0.1.8's colours (its ``_draw`` and ``add_tee``)
BACKGROUND_RGB = (255, 255, 255)
GOAL_RGB = (144, 238, 144)  # pygame's LightGreen
BLOCK_RGB = (119, 136, 153)  # pygame's LightSlateGray


@dataclass(frozen=True)
class PushTScene:
    """How one shifted PushT episode is drawn: colours, and the view (a camera over the 512 px table)."""

    background: tuple = BACKGROUND_RGB
    goal: tuple = GOAL_RGB
    block: tuple = BLOCK_RGB
    move: tuple = (0.0, 0.0)  # px of the 512 px drawing, right and down
    turn_deg: float = 0.0  # counter-clockwise
    zoom: float = 1.0


def pusht_scene(draws) -> PushTScene | None:
    """The drawing of an episode under ``envs.scene_shifts.scene_draws``'s ``[(kind, severity, generator),
    ...]`` (colour, camera; a severity between the whole ones interpolates the tables); None when there are none."""
    fields = {}
    for kind, severity, rs in draws:
        if kind == "colour":
            mix = at_severity(COLOUR_MIX, severity)
            fields.update(background=mixed_colour(BACKGROUND_RGB, mix, rs),
                          goal=mixed_colour(GOAL_RGB, mix, rs), block=mixed_colour(BLOCK_RGB, mix, rs))
        elif kind == "camera":
            angle, move = rs.uniform(0.0, 2.0 * math.pi), at_severity(PUSHT_MOVE_PX, severity)
            fields.update(move=(move * math.cos(angle), move * math.sin(angle)),
                          turn_deg=either_way(rs) * at_severity(PUSHT_TURN_DEG, severity),
                          zoom=at_severity(PUSHT_ZOOM, severity, clean=1.0) ** either_way(rs))
    return PushTScene(**fields) if fields else None


@functools.cache
def _gym_pusht_with_scene():
    """gym-pusht's environment class, drawing a ``PushTScene`` when one is set (``scene``): lazy, gym-pusht
    pulls in pygame, pymunk and shapely."""
    import pygame
    import pymunk.pygame_util
    from gym_pusht.envs.pusht import DrawOptions
    from gym_pusht.envs.pusht import PushTEnv as _GymPushT

    class GymPushTWithScene(_GymPushT):
        scene: PushTScene | None = None

        def _draw(self):
            if self.scene is None:  # clean: gym-pusht's own drawing, untouched
                return super()._draw()
            scene = self.scene
            # gym-pusht's _draw with the scene's colours (background, goal; the block's shapes draw in theirs)
            # with an alpha channel: what the turned drawing leaves uncovered is see-through, not black
            screen = pygame.Surface((512, 512), pygame.SRCALPHA)
            screen.fill(scene.background)
            draw_options = DrawOptions(screen)
            goal_body = self.get_goal_pose_body(self.goal_pose)
            for shape in self.block.shapes:
                shape.color = pygame.Color(*scene.block)
                goal_points = [goal_body.local_to_world(v) for v in shape.get_vertices()]
                goal_points = [pymunk.pygame_util.to_pygame(point, draw_options.surface) for point in goal_points]
                pygame.draw.polygon(screen, pygame.Color(*scene.goal), goal_points + [goal_points[0]])
            self.space.debug_draw(draw_options)
            if (scene.move, scene.turn_deg, scene.zoom) == ((0.0, 0.0), 0.0, 1.0):
                return screen
            # the camera: the drawing turned and zoomed about its centre, then moved; what comes into view is background
            view = pygame.transform.rotozoom(screen, scene.turn_deg, scene.zoom)
            out = pygame.Surface((512, 512))
            out.fill(scene.background)
            out.blit(view, view.get_rect(center=(256 + scene.move[0], 256 + scene.move[1])))
            return out

    return GymPushTWithScene


class PushTEnv(gym.Env):
    """gym-pusht PushT with dict observations ``image``/``agent_pos``, success/coverage info and a step limit.

    Args:
        image_size: side of the square observation image (96 by default).
        max_episode_steps: truncation limit (300).
        success_threshold: coverage above which the episode counts as solved and terminates (0.95).
        render_size: side of the frames ``render()`` returns (for videos; the agent's target is drawn on them).
        scene_shifts: scene shifts ``[(kind, severity), ...]`` (colour, camera; ``envs.scene_shifts``) drawn in
            every episode from ``reset(seed=...)`` on, from that seed; the episode's state is the clean one's.
        scene_randomization: an ``envs.scene_shifts.SceneRandomization`` (demonstrations): every episode from
            ``reset(seed=...)`` on is drawn in a scene drawn from its seed, each kind at a severity in [0, max].
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(
        self,
        image_size: int = 96,
        max_episode_steps: int = 300,
        success_threshold: float = 0.95,
        render_size: int = 256,
        render_mode: str = "rgb_array",
        scene_shifts=(),
        scene_randomization=None,
    ):
        super().__init__()
        self.scene_randomization = None
        self.set_scene_shifts(scene_shifts)
        self.set_scene_randomization(scene_randomization)
        self.image_size = int(image_size)
        self.max_episode_steps = int(max_episode_steps)
        self.success_threshold = float(success_threshold)
        self.render_mode = render_mode
        self._env = _gym_pusht_with_scene()(
            obs_type="pixels_agent_pos",
            render_mode="rgb_array",
            observation_width=self.image_size,
            observation_height=self.image_size,
            visualization_width=int(render_size),
            visualization_height=int(render_size),
        )
        self._env.success_threshold = self.success_threshold
        self.observation_space = spaces.Dict(
            {
                "image": spaces.Box(0, 255, shape=(self.image_size, self.image_size, 3), dtype=np.uint8),
                "agent_pos": spaces.Box(0.0, WORKSPACE, shape=(2,), dtype=np.float32),
            }
        )
        self.action_space = spaces.Box(0.0, WORKSPACE, shape=(2,), dtype=np.float32)
        self._elapsed = 0
        self._contacts = 0
        self._substeps = int(round(1.0 / (self._env.dt * self._env.control_hz)))  # 10 physics steps / env step
        self._last_n_contacts = 0

    # ------------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        opts = None
        if options is not None and options.get("reset_to_state") is not None:
            s = np.asarray(options["reset_to_state"], dtype=np.float64).reshape(5)
            # gym-pusht sets block.position (angle 0) and then block.angle; the angle change rotates the body
            # about its centre of gravity, moving the origin by (I - R) @ cog. Pre-shift so it lands at s[2:4].
            shifted = s.copy()
            shifted[2:4] = s[2:4] - BLOCK_COG_LOCAL + rot(s[4]) @ BLOCK_COG_LOCAL
            opts = {"reset_to_state": shifted}
        super().reset(seed=seed)
        # drawn from the seed by a generator of its own before gym-pusht draws the first frame; the state is
        # gym-pusht's from the same seed, as in the clean episode
        self._env.scene = pusht_scene(scene_draws(self.scene_shifts, seed, self.scene_randomization))
        raw, _ = self._env.reset(seed=seed, options=opts)
        self._install_contact_counter()
        self._elapsed = 0
        self._last_n_contacts = 0
        obs = self._convert_obs(raw)
        coverage = float(self._env._get_coverage())
        info = {"success": coverage > self.success_threshold, "coverage": coverage, "n_contacts": 0}
        return obs, info

    def step(self, action):
        action = np.clip(np.asarray(action, dtype=np.float64).reshape(2), 0.0, WORKSPACE)
        self._contacts = 0
        raw, reward, _, _, raw_info = self._env.step(action)
        self._elapsed += 1
        self._last_n_contacts = int(math.ceil(self._contacts / self._substeps))
        coverage = float(raw_info["coverage"])
        success = coverage > self.success_threshold
        terminated = bool(success)
        truncated = bool(self._elapsed >= self.max_episode_steps and not terminated)
        info = {
            "success": bool(success),
            "coverage": coverage,
            "n_contacts": self._last_n_contacts,
            "is_success": bool(success),
        }
        return self._convert_obs(raw), float(reward), terminated, truncated, info

    def render(self):
        return np.ascontiguousarray(self._env.render(), dtype=np.uint8)

    def close(self):
        self._env.close()

    def set_scene_shifts(self, shifts) -> None:
        """Scene shifts ``[(kind, severity), ...]`` (or ``["colour:2", ...]``) for the episodes from the next
        ``reset(seed=...)`` on; ``[]``: clean. Refused in one line: a pixel corruption (the caller applies those
        to observations) or a kind PushT cannot draw (lighting)."""
        shifts = parse_scene_shifts(shifts, "pusht")
        check_one_scene_source(shifts, self.scene_randomization)
        self.scene_shifts = shifts

    def set_scene_randomization(self, randomization) -> None:
        """Scenes drawn per episode (``envs.scene_shifts.SceneRandomization``) from the next ``reset(seed=...)``
        on; None: clean. Refused in one line: a kind PushT cannot draw (lighting), a max severity outside 1-3."""
        randomization = scene_randomization_for(randomization, "pusht")
        check_one_scene_source(self.scene_shifts, randomization)
        self.scene_randomization = randomization

    # ------------------------------------------------------------------ helpers
    @property
    def unwrapped_pusht(self):
        """The underlying gym_pusht env (privileged access for the scripted expert)."""
        return self._env

    @property
    def elapsed_steps(self) -> int:
        return self._elapsed

    def get_state(self) -> np.ndarray:
        """[agent_x, agent_y, block_x, block_y, block_angle] float32 (block angle wrapped to [0, 2*pi))."""
        a, b = self._env.agent.position, self._env.block.position
        return np.array([a[0], a[1], b[0], b[1], self._env.block.angle % (2 * math.pi)], dtype=np.float32)

    def get_block_pose(self) -> np.ndarray:
        """(x, y, angle) float64 of the block body origin, angle unwrapped."""
        b = self._env.block
        return np.array([b.position[0], b.position[1], b.angle], dtype=np.float64)

    def get_keypoints(self) -> np.ndarray:
        """(9, 2) float32: the block's 9 keypoints in world pixels (Diffusion Policy's ``keypoint`` field)."""
        return local_to_world(self.get_block_pose(), BLOCK_KEYPOINTS_LOCAL).astype(np.float32)

    def get_coverage(self) -> float:
        return float(self._env._get_coverage())

    def n_contacts(self) -> int:
        """Agent-block contact points during the last ``step``: contact points reported by the physics over its
        10 sub-steps, divided by 10 and rounded up (so usually 0, 1 or 2), as Diffusion Policy records it but
        counting only agent-block contacts (not block-wall ones)."""
        return self._last_n_contacts

    # ------------------------------------------------------------------ internals
    def _convert_obs(self, raw) -> dict:
        return {
            "image": np.ascontiguousarray(raw["pixels"], dtype=np.uint8),
            "agent_pos": np.asarray(raw["agent_pos"], dtype=np.float32),
        }

    def _install_contact_counter(self):
        env = self._env
        agent_shapes = set(env.agent.shapes)
        block_shapes = set(env.block.shapes)

        def post_solve(arbiter, space, data):
            n = len(arbiter.contact_point_set.points)
            env.n_contact_points += n  # keep gym-pusht's own counter working
            a, b = arbiter.shapes
            if (a in agent_shapes and b in block_shapes) or (b in agent_shapes and a in block_shapes):
                self._contacts += n

        env.collision_handeler.post_solve = post_solve
