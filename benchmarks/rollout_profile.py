"""Where the time of a Lift rollout goes: physics, rendering, corruptions and scene shifts, policy, worker messages.

    python -m benchmarks.rollout_profile [--steps 100] [--json OUT]

Each part is timed on its own, in this process unless said otherwise, as the evaluation loop
(``core/evaluation.py``) meets it, with Lift at 84 px and the policy ``recipe=cpu`` trains for it
(BC, Fibottention ViT, agentview only; random weights: the time does not depend on them):

* physics + low-dim observation: ``RobosuiteEnv.step`` with no camera (OSC control, 25 MuJoCo sub-steps,
  forward, reward, robosuite's observables);
* rendering: one agentview frame at 84 px (``fast_render``: no shadows, reflections or multisampling);
* a pixel corruption of one frame (``envs.corruptions.corrupt``), per kind at its middle severity;
* a scene shift: its cost falls on ``reset`` (apply after the state is set, restore before the next);
  the steps in between cost what clean steps cost (the modders only change model constants);
* policy: ``select_action`` for 2 environments, per step (a forward pass every Ta = 8 steps, the queue
  in between), and one forward pass alone;
* worker messages: a step command to a spawned process and its reply of one step's size
  (observation dict, reward, flags, info) through the pool's pipe, an echo without the step;
* a pool of 2 workers: one step of both, sent together and received together (the loop's wall per
  step without the policy).
Medians over ``--steps`` repetitions, in milliseconds. Timings vary with the machine's load: compare
parts within one run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from envs.corruptions import corrupt  # noqa: E402
from envs.factory import EVAL_SEED_START, EnvPool, worker_context  # noqa: E402
from envs.robosuite_tasks import RobosuiteEnv  # noqa: E402
from envs.shifts import Shift, scene_kinds_of, severities  # noqa: E402

IMAGE_SIZE = 84
CAMERA = "agentview"
POLICY_BATCH = 2  # two workers


def at_middle(kind: str) -> Shift:
    """``kind`` at its middle severity: 2 of 1-3 (the hand-written and scene kinds), 3 of ImageNet-C's 1-5."""
    return Shift(kind, severities(kind)[len(severities(kind)) // 2])


PIXEL_SHIFTS = tuple(map(at_middle, ("brightness", "gaussian_noise", "blur", "jpeg_compression", "motion_blur",
                                     "shot_noise", "pixelate")))
SCENE_SHIFTS = tuple(map(at_middle, scene_kinds_of("lift")))


def median_ms(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def physics_ms(n: int) -> float:
    env = RobosuiteEnv("lift", cameras=(), image_size=IMAGE_SIZE)
    env.reset(seed=EVAL_SEED_START)
    rng = np.random.default_rng(0)
    try:
        return median_ms(lambda: env.step(rng.uniform(-0.3, 0.3, 7)), n)
    finally:
        env.close()


def camera_env_parts(n: int) -> dict[str, float]:
    env = RobosuiteEnv("lift", cameras=(CAMERA,), image_size=IMAGE_SIZE)
    out = {}
    try:
        frame = env.reset(seed=EVAL_SEED_START)[0][f"{CAMERA}_image"]
        out["rendering: one 84 px agentview frame"] = median_ms(lambda: env._render_camera(CAMERA, IMAGE_SIZE), n)
        out["env step with the frame (physics + rendering)"] = median_ms(lambda: env.step(np.zeros(7)), n)
        for shift in PIXEL_SHIFTS:
            rng = np.random.default_rng(0)
            corrupt(frame, *shift, rng)  # the library's first call imports it
            out[f"pixel corruption {shift}, one frame"] = median_ms(lambda: corrupt(frame, *shift, rng), n)
        resets = max(5, n // 10)
        clean = median_ms(lambda: env.reset(seed=EVAL_SEED_START), resets)
        out["reset, clean"] = clean
        for shift in SCENE_SHIFTS:
            env.set_scene_shifts([shift])
            env.reset(seed=EVAL_SEED_START)  # the modders are made once per environment
            out[f"reset under scene shift {shift} (restore + apply), extra"] = median_ms(
                lambda: env.reset(seed=EVAL_SEED_START), resets) - clean
            env.set_scene_shifts([])
        return out
    finally:
        env.close()


def policy_parts(n: int) -> dict[str, float]:
    from benchmarks.policy_speed import build

    torch.set_num_threads(1)  # as a rollout on 2 cores with 2 workers leaves it
    policy, pc = build("lift", "bc", "fibottention", recipe="cpu")
    policy.eval()
    g = torch.Generator().manual_seed(0)
    obs = {}
    for k, shape in pc.input_shapes.items():
        obs[k] = (torch.randint(0, 256, (POLICY_BATCH, *shape[1:], shape[0]), generator=g, dtype=torch.uint8)
                  if k in pc.image_keys else torch.rand(POLICY_BATCH, *shape, generator=g))
    with torch.no_grad():
        policy.reset()
        per_step = median_ms(lambda: policy.select_action(obs), n)
        steps = []
        for _ in range(n):  # the mean: one forward every Ta steps, queue pops in between
            t = time.perf_counter()
            policy.select_action(obs)
            steps.append(time.perf_counter() - t)

        def forward():
            policy.reset()
            policy.select_action(obs)

        mean_name = f"policy select_action, {POLICY_BATCH} envs, mean per step (Ta={pc.n_action_steps})"
        return {mean_name: 1e3 * statistics.mean(steps),
                f"policy forward pass, {POLICY_BATCH} envs": median_ms(forward, max(5, n // 10)),
                "policy select_action, median step (queue pop)": per_step}


def _echo(conn, reply):
    while True:
        msg = conn.recv()
        if msg is None:
            return
        conn.send(("ok", reply))


def message_ms(n: int) -> float:
    """A step command out and a step's reply back through a spawned process's pipe (no step done)."""
    rng = np.random.default_rng(0)
    obs = {f"{CAMERA}_image": rng.integers(0, 256, (IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8),
           "robot0_eef_pos": np.zeros(3, np.float32), "robot0_eef_quat": np.zeros(4, np.float32),
           "robot0_gripper_qpos": np.zeros(2, np.float32), "object": np.zeros(10, np.float32)}
    reply = (obs, 0.0, False, False, {"success": False, "reward": 0.0})
    ctx = worker_context()
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_echo, args=(child, reply), daemon=True)
    proc.start()
    child.close()
    action = np.zeros(7, np.float32)

    def round_trip():
        parent.send(("step", action))
        parent.recv()

    try:
        round_trip()
        return median_ms(round_trip, n)
    finally:
        parent.send(None)
        proc.join(timeout=10)


def pool_step_ms(n: int, workers: int = POLICY_BATCH) -> float:
    """One step of every worker of a pool, sent together and received together (the loop's wall per step,
    without the policy): on 2 cores two workers step in parallel, as far as the machine's load lets them."""
    with EnvPool("lift", {"cameras": (CAMERA,), "image_size": IMAGE_SIZE}, workers=workers) as pool:
        for i, env in enumerate(pool.envs):
            env.send("reset", EVAL_SEED_START + i)
            env.recv()
        action = np.zeros(7, np.float32)

        def step():
            for env in pool.envs:
                env.send("step", action)
            for env in pool.envs:
                env.recv()

        return median_ms(step, n)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="repetitions of each timed part")
    parser.add_argument("--json", help="write the table here as JSON")
    args = parser.parse_args(argv)
    parts = {"physics + low-dim observation (env step, no camera)": physics_ms(args.steps)}
    parts.update(camera_env_parts(args.steps))
    parts.update(policy_parts(args.steps))
    parts["worker message: step command + one step's reply"] = message_ms(args.steps)
    parts[f"pool of {POLICY_BATCH} workers: one step of each, wall"] = pool_step_ms(args.steps)
    width = max(map(len, parts))
    print(f"{'part':<{width}}  ms")
    for name, ms in parts.items():
        print(f"{name:<{width}}  {ms:7.2f}")
    if args.json:
        tmp = f"{args.json}.tmp"
        with open(tmp, "w") as f:
            json.dump({"steps": args.steps, "ms": parts}, f, indent=1)
        os.replace(tmp, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
