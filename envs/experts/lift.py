"""Scripted Lift expert using privileged object poses: above -> descend -> close -> lift.

Also holds the machinery shared with ``envs.experts.can``: the per-process environment cache, the
Cartesian pose controller producing OSC delta actions, the episode recorder and the evaluation CLI.

    python -m envs.experts.lift --episodes 20 [--no-render] [--image-size 84]
"""
from __future__ import annotations

import argparse
import time
from typing import Callable

import numpy as np
from scipy.spatial.transform import Rotation

from envs.robosuite_tasks import DEFAULT_CAMERAS, RobosuiteEnv, SimulationError

# OSC output scaling of the BASIC Panda controller: an action of 1 moves 5 cm / rotates 0.5 rad per step
POS_SCALE = 0.05
ROT_SCALE = 0.5
OPEN, CLOSE = -1.0, 1.0
# second word of the scripts' seed [episode seed, NOISE_STREAM]: their action noise and per-episode
# variations draw from a stream of their own, independent of the env's initial-state stream for that seed
NOISE_STREAM = 7919

_ENV_CACHE: dict[tuple, RobosuiteEnv] = {}


def get_env(task: str, image_size: int = 84, cameras=DEFAULT_CAMERAS) -> RobosuiteEnv:
    """One environment per (task, image_size, cameras) per process, reused across episodes."""
    cameras = (cameras,) if isinstance(cameras, str) else tuple(cameras)
    key = (task, int(image_size), cameras)
    env = _ENV_CACHE.get(key)
    if env is None:
        env = RobosuiteEnv(task, cameras=cameras, image_size=image_size)
        _ENV_CACHE[key] = env
    return env


class PoseController:
    """Turns a world-frame end-effector target into a 7-D OSC delta action (holding initial orientation)."""

    def __init__(self, env: RobosuiteEnv, rng: np.random.Generator, pos_noise: float, rot_noise: float):
        rs = env.unwrapped_robosuite
        self.sim = rs.sim
        self.robot = rs.robots[0]
        self.site_id = self.robot.eef_site_id["right"]
        self.arm = self.robot.composite_controller.part_controllers["right"]
        self.rng = rng
        self.pos_noise = pos_noise
        self.rot_noise = rot_noise
        self.target_rot = Rotation.from_matrix(self.eef_mat())
        self.gain = 1.0 / POS_SCALE  # reach the target in ~1 step if far below the clip

    def eef_pos(self) -> np.ndarray:
        return np.array(self.sim.data.site_xpos[self.site_id])

    def finger_speed(self) -> float:
        """Largest finger joint speed: the gripper has closed on the object (or fully opened) once it is ~0."""
        idx = self.robot._ref_gripper_joint_vel_indexes["right"]
        return float(np.abs(self.sim.data.qvel[idx]).max())

    def eef_mat(self) -> np.ndarray:
        return np.array(self.sim.data.site_xmat[self.site_id]).reshape(3, 3)

    def action(self, target_pos, gripper: float, max_speed: float = 1.0) -> np.ndarray:
        err = np.asarray(target_pos, dtype=np.float64) - self.eef_pos()
        pos = err * self.gain * 0.7
        peak = np.abs(pos).max()
        if peak > max_speed:  # keep the direction, saturate the largest axis
            pos *= max_speed / peak
        rot_err = (self.target_rot * Rotation.from_matrix(self.eef_mat()).inv()).as_rotvec()
        rot = rot_err / ROT_SCALE * 0.7
        # the controller reads deltas in its origin (robot base) frame
        origin = self.arm.origin_ori if self.arm.origin_ori is not None else np.eye(3)
        pos, rot = origin.T @ pos, origin.T @ rot
        pos = pos + self.rng.normal(0.0, self.pos_noise, 3)
        rot = rot + self.rng.normal(0.0, self.rot_noise, 3)
        act = np.concatenate([pos, rot, [gripper]])
        return np.clip(act, -1.0, 1.0).astype(np.float32)


# A policy step: (controller, observation-free privileged state) -> action, or None when the script ends.
ScriptFn = Callable[[], "np.ndarray | None"]


def record_episode(
    env: RobosuiteEnv, seed: int, make_script: Callable[[RobosuiteEnv, np.random.Generator], ScriptFn], max_steps: int
) -> dict | None:
    """Run a scripted expert from ``env.reset(seed=seed)`` and return robomimic-style arrays, or None."""
    t0 = time.perf_counter()
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng([int(seed), NOISE_STREAM])
    script = make_script(env, rng)
    obs_list, next_list, actions, states, rewards, dones = [], [], [], [], [], []
    success = False
    for _ in range(max_steps):
        action = script()
        if action is None:
            break
        states.append(env.get_state())
        try:
            next_obs, reward, terminated, truncated, info = env.step(action)
        except SimulationError:
            return None
        obs_list.append(obs)
        next_list.append(next_obs)
        actions.append(np.asarray(action, dtype=np.float32))
        rewards.append(float(reward))
        dones.append(bool(terminated))
        obs = next_obs
        if terminated:
            success = bool(info["success"])
            break
        if truncated:
            break
    if not success:
        return None
    keys = obs_list[0].keys()
    model_file = getattr(env, "_expert_model_xml", None)
    if model_file is None:  # the XML the model was loaded from never changes for a cached env
        model_file = env.get_model_xml()
        env._expert_model_xml = model_file
    return {
        "actions": np.stack(actions).astype(np.float32),
        "states": np.stack(states).astype(np.float64),
        "rewards": np.asarray(rewards, dtype=np.float64),
        "dones": np.asarray(dones, dtype=np.int64),
        "obs": {k: np.stack([o[k] for o in obs_list]) for k in keys},
        "next_obs": {k: np.stack([o[k] for o in next_list]) for k in keys},
        "model_file": model_file,
        "info": {"seed": int(seed), "steps": len(actions), "seconds": time.perf_counter() - t0},
    }


def gripper_settled(ctrl: PoseController, t: int, min_steps: int = 3) -> bool:
    """The fingers stopped moving after a close/open command: the next phase may start.

    Phases end on what the policy can see (the finger joints in ``robot0_gripper_qpos``, the hand's
    height) rather than on hidden timers, so the expert stays a function of its observation and
    behaviour cloning without memory can reproduce when it closes, lifts or lets go.
    """
    return t >= min_steps and ctrl.finger_speed() < 0.02


def _lift_script(env: RobosuiteEnv, rng: np.random.Generator) -> ScriptFn:
    rs = env.unwrapped_robosuite
    ctrl = PoseController(env, rng, pos_noise=0.08, rot_noise=0.02)
    cube_id = rs.cube_body_id
    # per-episode variations so demonstrations differ in more than jitter
    above = rng.uniform(0.06, 0.10)
    grasp_dz = rng.uniform(-0.005, 0.0)
    lift_h = rng.uniform(0.12, 0.18)
    speed = rng.uniform(0.7, 1.0)
    state = {"phase": "above", "t": 0, "lift_from": None}

    def cube():
        return np.array(rs.sim.data.body_xpos[cube_id])

    def step():
        phase = state["phase"]
        state["t"] += 1
        c = cube()
        eef = ctrl.eef_pos()
        if phase == "above":
            target = c + [0, 0, above]
            # descend as soon as the hand is over the cube, whatever its height: no hovering state
            # that would be labelled "wait" in one demonstration and "go down" in the next
            if np.linalg.norm((target - eef)[:2]) < 0.01 or state["t"] > 60:
                state.update(phase="descend", t=0)
            return ctrl.action(target, OPEN, speed)
        if phase == "descend":
            target = c + [0, 0, grasp_dz]
            err = target - eef
            # a threshold the target lies beyond, so the hand crosses it instead of creeping up to it
            if (np.linalg.norm(err[:2]) < 0.012 and abs(err[2]) < 0.01) or state["t"] > 40:
                state.update(phase="close", t=0)
            return ctrl.action(target - [0, 0, 0.01], OPEN, speed * 0.6)
        if phase == "close":
            if gripper_settled(ctrl, state["t"]):
                state.update(phase="lift", t=0, lift_from=eef.copy())
            return ctrl.action(eef, CLOSE, speed)
        # lift: the env terminates on success; give up after a while
        if state["t"] > 80:
            return None
        return ctrl.action(state["lift_from"] + [0, 0, lift_h], CLOSE, speed * 0.6)

    return step


def collect_episode(
    seed: int, *, max_steps: int = 400, image_size: int = 84, cameras=DEFAULT_CAMERAS, scene_randomization=None
) -> dict | None:
    """One scripted Lift demonstration from the initial state seeded by ``seed``.

    Returns None if the episode failed, else a dict: actions (T,7) float32, states (T,S) float64,
    rewards (T,), dones (T,), obs / next_obs: {key: (T, ...)}, model_file: str (xml),
    info: {'seed', 'steps', 'seconds'}. ``scene_randomization`` (``envs.scene_shifts.SceneRandomization``):
    the frames are rendered in a scene drawn from ``seed``; the script reads the simulator, never a frame.
    """
    env = get_env("lift", image_size, cameras)
    env.set_scene_randomization(scene_randomization)  # the cached env keeps it: set it every episode
    return record_episode(env, seed, _lift_script, max_steps)


def evaluate_cli(task: str, collect: Callable, argv=None) -> dict:
    parser = argparse.ArgumentParser(description=f"Evaluate the scripted {task} expert")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--no-render", action="store_true", help="no cameras (fast)")
    parser.add_argument("--image-size", type=int, default=84)
    parser.add_argument("--max-steps", type=int, default=400)
    args = parser.parse_args(argv)
    cameras = () if args.no_render else DEFAULT_CAMERAS
    t_start = time.perf_counter()
    get_env(task, args.image_size, cameras)
    t_env = time.perf_counter() - t_start
    results = []
    for i in range(args.episodes):
        seed = args.seed + i
        t0 = time.perf_counter()
        ep = collect(seed, max_steps=args.max_steps, image_size=args.image_size, cameras=cameras)
        dt = time.perf_counter() - t0
        steps = ep["info"]["steps"] if ep else None
        results.append((seed, ep is not None, steps, dt))
        print(f"seed {seed}: {'success' if ep else 'FAIL'} steps={steps} {dt:.2f}s", flush=True)
    ok = [r for r in results if r[1]]
    summary = {
        "task": task,
        "episodes": len(results),
        "successes": len(ok),
        "success_rate": len(ok) / max(len(results), 1),
        "mean_steps": float(np.mean([r[2] for r in ok])) if ok else None,
        "seconds_per_episode": float(np.mean([r[3] for r in results])) if results else None,
        "ms_per_step": float(1000 * sum(r[3] for r in ok) / sum(r[2] for r in ok)) if ok else None,
        "env_construction_s": t_env,
        "cameras": list(cameras),
        "image_size": args.image_size,
    }
    print(summary)
    return summary


if __name__ == "__main__":
    evaluate_cli("lift", collect_episode)
