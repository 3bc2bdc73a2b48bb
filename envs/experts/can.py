"""Scripted PickPlaceCan expert using privileged object poses.

above -> descend -> grasp -> lift -> move over the can's target bin -> lower -> release -> retreat
upward (robosuite's success check also needs the gripper away from the can).

    python -m envs.experts.can --episodes 20 [--no-render] [--image-size 84]
"""
from __future__ import annotations

import numpy as np

from envs.experts.lift import CLOSE, OPEN, PoseController, evaluate_cli, get_env, gripper_settled, record_episode
from envs.robosuite_tasks import DEFAULT_CAMERAS, RobosuiteEnv


class _CanScript:
    """The script as a state machine: one method per phase, each returning the phase's action and
    moving to the next phase when its goal is reached or its time is up (a stuck phase must not hang
    the episode). Calling it gives the next action, or None when the script ends."""

    def __init__(self, env: RobosuiteEnv, rng: np.random.Generator):
        rs = env.unwrapped_robosuite
        self.rs = rs
        self.ctrl = PoseController(env, rng, pos_noise=0.08, rot_noise=0.02)
        self.can_id = rs.obj_body_id[rs.objects[rs.object_id].name]
        goal = np.array(rs.target_bin_placements[rs.object_id], dtype=np.float64)
        # per-episode variations so demonstrations differ in more than jitter (all keep the can clear of walls)
        self.above = rng.uniform(0.07, 0.10)
        self.grasp_dz = rng.uniform(-0.01, 0.01)
        self.carry_z = rng.uniform(1.03, 1.08)  # can centre height while carrying (bin walls top out at 0.90)
        self.goal_xy = goal[:2] + rng.uniform(-0.02, 0.02, 2)
        self.release_z = rng.uniform(0.885, 0.905)  # can centre height at release (resting height 0.86)
        self.speed = rng.uniform(0.75, 1.0)
        self.phase, self.t, self.hold = "above", 0, None

    def _next(self, phase: str, hold=None) -> None:
        self.phase, self.t = phase, 0
        if hold is not None:
            self.hold = hold

    def __call__(self):
        self.t += 1
        can = np.array(self.rs.sim.data.body_xpos[self.can_id])
        return getattr(self, f"_{self.phase}")(can, self.ctrl.eef_pos())

    def _above(self, c, eef):
        target = c + [0, 0, self.above]
        # descend once over the can, whatever the height (see gripper_settled on observable phases)
        if np.linalg.norm((target - eef)[:2]) < 0.01 or self.t > 60:
            self._next("descend")
        return self.ctrl.action(target, OPEN, self.speed)

    def _descend(self, c, eef):
        target = c + [0, 0, self.grasp_dz]
        err = target - eef
        if (np.linalg.norm(err[:2]) < 0.01 and abs(err[2]) < 0.012) or self.t > 30:
            self._next("grasp")
        return self.ctrl.action(target - [0, 0, 0.01], OPEN, self.speed * 0.6)

    def _grasp(self, c, eef):
        if gripper_settled(self.ctrl, self.t):
            self._next("lift", hold=eef.copy())
        return self.ctrl.action(eef, CLOSE, self.speed)

    def _lift(self, c, eef):
        target = self.hold.copy()
        target[2] = eef[2] + (self.carry_z - c[2])  # raise until the can (not the hand) reaches carry height
        if c[2] > self.carry_z - 0.02 or self.t > 60:
            self._next("move")
        return self.ctrl.action(target, CLOSE, self.speed * 0.8)

    def _move(self, c, eef):
        offset = np.array([self.goal_xy[0] - c[0], self.goal_xy[1] - c[1], self.carry_z - c[2]])
        if np.linalg.norm(offset[:2]) < 0.03 or self.t > 80:
            self._next("lower")
        return self.ctrl.action(eef + offset, CLOSE, self.speed)

    def _lower(self, c, eef):
        offset = np.array([self.goal_xy[0] - c[0], self.goal_xy[1] - c[1], self.release_z - c[2]])
        if c[2] < self.release_z + 0.01 or self.t > 40:
            self._next("release")
        return self.ctrl.action(eef + offset, CLOSE, self.speed * 0.6)

    def _release(self, c, eef):
        if gripper_settled(self.ctrl, self.t):
            self._next("retreat", hold=eef.copy())
        return self.ctrl.action(eef, OPEN, self.speed)

    def _retreat(self, c, eef):
        # retreat upward; the env terminates once the can is in the bin and the gripper away from it
        if self.t > 40:
            return None
        return self.ctrl.action(self.hold + [0, 0, 0.12], OPEN, self.speed)


def collect_episode(
    seed: int, *, max_steps: int = 400, image_size: int = 84, cameras=DEFAULT_CAMERAS, scene_randomization=None
) -> dict | None:
    """One scripted PickPlaceCan demonstration from the initial state seeded by ``seed``.

    Returns None if the episode failed, else a dict: actions (T,7) float32, states (T,S) float64,
    rewards (T,), dones (T,), obs / next_obs: {key: (T, ...)}, model_file: str (xml),
    info: {'seed', 'steps', 'seconds'}. ``scene_randomization`` (``envs.scene_shifts.SceneRandomization``):
    the frames are rendered in a scene drawn from ``seed``; the script reads the simulator, never a frame.
    """
    env = get_env("can", image_size, cameras)
    env.set_scene_randomization(scene_randomization)  # the cached env keeps it: set it every episode
    return record_episode(env, seed, _CanScript, max_steps)  # a ScriptFn per episode


if __name__ == "__main__":
    evaluate_cli("can", collect_episode)
