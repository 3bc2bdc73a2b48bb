"""Scripted PickPlaceCan expert using privileged object poses.

above -> descend -> grasp -> lift -> move over the can's target bin -> lower -> release -> retreat
upward (robosuite's success check also needs the gripper away from the can).

    python -m envs.experts.can --episodes 20 [--no-render] [--image-size 84]
"""
from __future__ import annotations

import numpy as np

from envs.experts.lift import CLOSE, OPEN, PoseController, ScriptFn, evaluate_cli, get_env, gripper_settled, record_episode
from envs.robosuite_tasks import DEFAULT_CAMERAS, RobosuiteEnv


def _can_script(env: RobosuiteEnv, rng: np.random.Generator) -> ScriptFn:
    rs = env.unwrapped_robosuite
    ctrl = PoseController(env, rng, pos_noise=0.08, rot_noise=0.02)
    can_id = rs.obj_body_id[rs.objects[rs.object_id].name]
    goal = np.array(rs.target_bin_placements[rs.object_id], dtype=np.float64)
    # per-episode variations so demonstrations differ in more than jitter (all keep the can clear of walls)
    above = rng.uniform(0.07, 0.10)
    grasp_dz = rng.uniform(-0.01, 0.01)
    carry_z = rng.uniform(1.03, 1.08)  # can centre height while carrying (bin walls top out at 0.90)
    goal_xy = goal[:2] + rng.uniform(-0.02, 0.02, 2)
    release_z = rng.uniform(0.885, 0.905)  # can centre height at release (resting height 0.86)
    speed = rng.uniform(0.75, 1.0)
    state = {"phase": "above", "t": 0, "hold": None}

    def can():
        return np.array(rs.sim.data.body_xpos[can_id])

    def step():
        phase = state["phase"]
        state["t"] += 1
        c = can()
        eef = ctrl.eef_pos()
        if phase == "above":
            target = c + [0, 0, above]
            # descend once over the can, whatever the height (see gripper_settled on observable phases)
            if np.linalg.norm((target - eef)[:2]) < 0.01 or state["t"] > 60:
                state.update(phase="descend", t=0)
            return ctrl.action(target, OPEN, speed)
        if phase == "descend":
            target = c + [0, 0, grasp_dz]
            err = target - eef
            if (np.linalg.norm(err[:2]) < 0.01 and abs(err[2]) < 0.012) or state["t"] > 30:
                state.update(phase="grasp", t=0)
            return ctrl.action(target - [0, 0, 0.01], OPEN, speed * 0.6)
        if phase == "grasp":
            if gripper_settled(ctrl, state["t"]):
                state.update(phase="lift", t=0, hold=eef.copy())
            return ctrl.action(eef, CLOSE, speed)
        if phase == "lift":
            target = state["hold"].copy()
            target[2] = eef[2] + (carry_z - c[2])  # raise until the can (not the hand) reaches carry height
            if c[2] > carry_z - 0.02 or state["t"] > 60:
                state.update(phase="move", t=0)
            return ctrl.action(target, CLOSE, speed * 0.8)
        if phase == "move":
            offset = np.array([goal_xy[0] - c[0], goal_xy[1] - c[1], carry_z - c[2]])
            if np.linalg.norm(offset[:2]) < 0.03 or state["t"] > 80:
                state.update(phase="lower", t=0)
            return ctrl.action(eef + offset, CLOSE, speed)
        if phase == "lower":
            offset = np.array([goal_xy[0] - c[0], goal_xy[1] - c[1], release_z - c[2]])
            if c[2] < release_z + 0.01 or state["t"] > 40:
                state.update(phase="release", t=0)
            return ctrl.action(eef + offset, CLOSE, speed * 0.6)
        if phase == "release":
            if gripper_settled(ctrl, state["t"]):
                state.update(phase="retreat", t=0, hold=eef.copy())
            return ctrl.action(eef, OPEN, speed)
        # retreat upward; the env terminates once the can is in the bin and the gripper away from it
        if state["t"] > 40:
            return None
        return ctrl.action(state["hold"] + [0, 0, 0.12], OPEN, speed)

    return step


def collect_episode(
    seed: int, *, max_steps: int = 400, image_size: int = 84, cameras=DEFAULT_CAMERAS
) -> dict | None:
    """One scripted PickPlaceCan demonstration from the initial state seeded by ``seed``.

    Returns None if the episode failed, else a dict: actions (T,7) float32, states (T,S) float64,
    rewards (T,), dones (T,), obs / next_obs: {key: (T, ...)}, model_file: str (xml),
    info: {'seed', 'steps', 'seconds'}.
    """
    env = get_env("can", image_size, cameras)
    return record_episode(env, seed, _can_script, max_steps)


if __name__ == "__main__":
    evaluate_cli("can", collect_episode)
