"""Scripted PushT expert: sample-and-simulate pushing with privileged simulator state.

Cost: mean distance between the T's 8 outline corners and the goal's (``envs.pusht.corner_cost``; coverage >
0.95 needs it under ~2 px). Each *plan* is one push:

1. Candidates are fixed contact points along the T's outline (jittered a little), each pushed along the edge's
   inward normal. For every candidate a second physics world (a fresh pymunk space built with gym-pusht's own
   body constructors; ``space.copy()`` does not work on gym-pusht's space) is loaded with the block pose and
   the agent resting just off the contact point, and the push is simulated; every step of it is a possible
   stopping point and is scored by the corner cost.
2. The best few candidates are re-simulated exactly as they would be executed, from the true state (agent
   position *and* velocity): the approach around the block (a visibility-graph path over the T inflated by
   the agent radius plus a margin, followed by a moving set-point), the push, and for every stopping point a
   short retreat. The best improving (candidate, stop) is executed open loop, then the expert re-plans.
3. Push speed shrinks with the cost, so close to the goal pushes become slow and short (the fine phase; fast
   pushes stall at 0.91-0.95 coverage).

Physics facts this relies on: contacts are frictionless (gym-pusht sets friction on bodies, which pymunk
ignores), space damping is 0 so the block only moves while pushed, and the agent is kinematic, so its motion
under the PD set-point controller does not depend on the block. Pace (approach/push speed, retreat length,
contact jitter) and the choice among near-best pushes are drawn from a seeded ``numpy.random.Generator`` so
demonstrations are not all alike.

Public API: ``collect_episode(seed, max_steps=300, image_size=96)`` and ``PushTExpert(env, rng)`` with
``reset()`` / ``act(obs)``. ``python -m envs.experts.pusht --episodes 50 --start-seed 0`` evaluates it.
"""
from __future__ import annotations

import argparse
import heapq
import math
import time

import numpy as np

from envs.pusht import (
    AGENT_RADIUS,
    T_OUTLINE_LOCAL,
    WORKSPACE,
    PushTEnv,
    corner_cost,
    local_to_world,
    point_to_block_distance,
    rot,
)

KP, KV, DT, SUBSTEPS = 100.0, 20.0, 0.01, 10  # gym-pusht's PD gains, physics step, sub-steps per env step
SUCCESS_COST = 1.0  # corner cost (px) at which we consider the block placed (coverage ~0.97+)
# a push that places the block scores this (less its stop index): above any rate of progress, which is at
# most the starting corner cost (a few hundred px) per step
GOAL_SCORE = 1e3
# second word of the expert's seed [episode seed, PLAN_STREAM]: its pace and choices draw from a stream of
# their own, independent of the environment's initial-state stream for the same seed
PLAN_STREAM = 0x9E37
# the rest of a plan is dropped once the block is this far from where the plan predicted it (px, rad)
DRIFT_PX, DRIFT_RAD = 4.0, 0.05
# with no push that can be simulated, the agent moves to a random point this spread (px) around the middle
WANDER_CENTRE, WANDER_SPREAD = np.array([WORKSPACE / 2, WORKSPACE / 2]), 40.0

# (contact point, outward normal) in the block frame. Points near concave corners are kept far enough out
# that the agent (radius 15) can reach them along the normal without touching the other part of the T.
_EDGES = [
    # (fixed coordinate axis, value, range along the edge, outward normal)
    ("y", 0.0, np.linspace(-54, 54, 9), (0.0, -1.0)),  # bar, outer edge
    ("x", 60.0, np.array([5.0, 15.0, 25.0]), (1.0, 0.0)),  # bar, right end
    ("x", -60.0, np.array([5.0, 15.0, 25.0]), (-1.0, 0.0)),  # bar, left end
    ("y", 30.0, np.array([37.0, 46.0, 55.0]), (0.0, 1.0)),  # bar underside, right
    ("y", 30.0, np.array([-37.0, -46.0, -55.0]), (0.0, 1.0)),  # bar underside, left
    ("x", 15.0, np.array([54.0, 69.0, 84.0, 99.0, 113.0]), (1.0, 0.0)),  # stem, right side
    ("x", -15.0, np.array([54.0, 69.0, 84.0, 99.0, 113.0]), (-1.0, 0.0)),  # stem, left side
    ("y", 120.0, np.array([-9.0, 0.0, 9.0]), (0.0, 1.0)),  # stem end
]


def _candidate_table():
    pts, normals, lo, hi = [], [], [], []
    for axis, val, along, n in _EDGES:
        for a in along:
            pts.append((a, val) if axis == "y" else (val, a))
            normals.append(n)
            lo.append(along.min() - 2.0)
            hi.append(along.max() + 2.0)
    return np.array(pts), np.array(normals), np.array(lo), np.array(hi)


CAND_POINTS, CAND_NORMALS, _CAND_LO, _CAND_HI = _candidate_table()
_CAND_ALONG_X = CAND_NORMALS[:, 1] != 0  # the edge runs along x (normal along y)


class _Sim:
    """A second physics world mirroring gym-pusht's (same bodies, walls, PD control and time step)."""

    def __init__(self):
        from gym_pusht.envs.pusht import PushTEnv as _G  # only for its static body constructors

        self._G = _G

    def load(self, agent_pos, agent_vel, block_pose):
        """Fresh space (no cached contact impulses) holding the given state."""
        import pymunk

        G = self._G
        space = pymunk.Space()
        space.gravity = 0, 0
        space.damping = 0.0
        space.add(
            G.add_segment(space, (5, 506), (5, 5), 2),
            G.add_segment(space, (5, 5), (506, 5), 2),
            G.add_segment(space, (506, 5), (506, 506), 2),
            G.add_segment(space, (5, 506), (506, 506), 2),
        )
        self.agent = G.add_circle(space, (256, 400), 15)
        self.block, _ = G.add_tee(space, (256, 300), 0)
        self.space = space
        self.set_state((agent_pos[0], agent_pos[1], agent_vel[0], agent_vel[1]) + tuple(block_pose))

    def set_state(self, s):
        ax, ay, vx, vy, bx, by, ba = s
        self.agent.position = (ax, ay)
        self.agent.velocity = (vx, vy)
        self.block.angle = ba  # angle first: setting it rotates about the centre of gravity
        self.block.position = (bx, by)
        self.block.velocity = (0.0, 0.0)
        self.block.angular_velocity = 0.0

    def get_state(self):
        a, v, b = self.agent.position, self.agent.velocity, self.block.position
        return (a[0], a[1], v[0], v[1], b[0], b[1], self.block.angle)

    def block_pose(self):
        b = self.block.position
        return (b[0], b[1], self.block.angle)

    def step(self, tx, ty):
        """One env step towards set-point (tx, ty), exactly as gym-pusht integrates it (after our clipping)."""
        agent, space = self.agent, self.space
        tx, ty = min(max(tx, 0.0), WORKSPACE), min(max(ty, 0.0), WORKSPACE)
        for _ in range(SUBSTEPS):
            px, py = agent.position
            vx, vy = agent.velocity
            vx += (KP * (tx - px) - KV * vx) * DT
            vy += (KP * (ty - py) - KV * vy) * DT
            agent.velocity = (vx, vy)
            space.step(DT)


def _agent_rollout(pos, vel, targets):
    """Agent positions (substep resolution) under the PD controller; the agent is kinematic, so this is exact."""
    px, py = float(pos[0]), float(pos[1])
    vx, vy = float(vel[0]), float(vel[1])
    out = []
    for tx, ty in np.clip(np.asarray(targets, float).reshape(-1, 2), 0.0, WORKSPACE):
        for _ in range(SUBSTEPS):
            vx += (KP * (tx - px) - KV * vx) * DT
            vy += (KP * (ty - py) - KV * vy) * DT
            px += vx * DT
            py += vy * DT
            out.append((px, py))
    return np.array(out).reshape(-1, 2), (px, py), (vx, vy)


def _segment_clearance(pose, a, b, n=12):
    """Approximate distance from segment a-b to the T (sampled every ~n px along it)."""
    length = float(np.hypot(*(b - a)))
    k = max(2, int(length / n) + 2)
    t = np.linspace(0.0, 1.0, k)[:, None]
    return float(point_to_block_distance(pose, a + t * (b - a)).min())


def _plan_path(pose, start, goal, node_r=27.0, clear_r=21.0):
    """Shortest path start -> goal keeping the agent clear of the T (visibility graph over the T's outline
    inflated by node_r; edges must keep clear_r from the T, or as much as their end points have)."""
    start, goal = np.asarray(start, float), np.asarray(goal, float)
    d_start = float(point_to_block_distance(pose, start[None])[0])
    d_goal = float(point_to_block_distance(pose, goal[None])[0])
    if _segment_clearance(pose, start, goal, 6) >= min(clear_r, d_start - 0.5, d_goal - 0.5):
        return [start, goal]
    # inflated outline: offset every corner along its (mitred) bisector
    P = T_OUTLINE_LOCAL
    nodes_local = []
    for i in range(len(P)):
        e1 = P[i] - P[i - 1]
        e2 = P[(i + 1) % len(P)] - P[i]
        n1 = np.array([e1[1], -e1[0]]) / np.linalg.norm(e1)
        n2 = np.array([e2[1], -e2[0]]) / np.linalg.norm(e2)
        bis = n1 + n2
        nodes_local.append(P[i] + bis * node_r / (1.0 + n1 @ n2))
    nodes_local = np.array(nodes_local)
    # orientation check: outward offsets must increase the distance to the T
    nodes = local_to_world(pose, nodes_local)
    if point_to_block_distance(pose, nodes).min() < node_r - 1.0:
        nodes = local_to_world(pose, P - (nodes_local - P))
    nodes = np.clip(nodes, 1.0, WORKSPACE - 1.0)
    pts = np.vstack([start[None], goal[None], nodes])
    m = len(pts)
    limit = np.full(m, clear_r)
    limit[0] = min(clear_r, d_start - 0.5)
    limit[1] = min(clear_r, d_goal - 0.5)
    dist = {0: 0.0}
    prev = {}
    heap = [(0.0, 0)]
    done = set()
    while heap:
        d, i = heapq.heappop(heap)
        if i in done:
            continue
        done.add(i)
        if i == 1:
            break
        for j in range(1, m):
            if j in done:
                continue
            seg = float(np.hypot(*(pts[j] - pts[i])))
            nd = d + seg
            if nd >= dist.get(j, math.inf):
                continue
            if _segment_clearance(pose, pts[i], pts[j]) < min(limit[i], limit[j]):
                continue
            dist[j] = nd
            prev[j] = i
            heapq.heappush(heap, (nd, j))
    if 1 not in prev:
        return [start, goal]
    path, j = [pts[1]], 1
    while j != 0:
        j = prev[j]
        path.append(pts[j])
    return path[::-1]


def _carrot(path, speed, decel=5.0, v_min=1.5):
    """Set-points moving along a polyline at up to ``speed`` px/step, braking at ``decel`` px/step^2 at its end."""
    path = [np.asarray(p, float) for p in path]
    seg = [float(np.hypot(*(b - a))) for a, b in zip(path[:-1], path[1:])]
    total = float(sum(seg))
    out, s = [], 0.0
    while s < total - 1e-6:
        s = min(total, s + max(v_min, min(speed, math.sqrt(2.0 * decel * (total - s)))))
        r, i = s, 0
        while i < len(seg) - 1 and r > seg[i]:
            r -= seg[i]
            i += 1
        f = 0.0 if seg[i] == 0 else min(1.0, r / seg[i])
        out.append(path[i] + f * (path[i + 1] - path[i]))
    return out


class PushTExpert:
    """Closed-loop-by-replanning scripted expert. ``env`` is an ``envs.pusht.PushTEnv`` (read for privileged
    state), ``rng`` a ``numpy.random.Generator`` driving the variation between demonstrations."""

    def __init__(self, env: PushTEnv, rng: np.random.Generator | None = None, n_verify: int = 4):
        self.env = env
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self.n_verify = n_verify
        self.sim = _Sim()
        self.reset()

    def reset(self):
        self._queue: list[np.ndarray] = []
        self._pred: list[tuple] = []
        self._expect = None
        self.n_plans = 0
        self.n_failed_plans = 0

    # ------------------------------------------------------------------ acting
    def act(self, obs=None) -> np.ndarray:
        g = self.env.unwrapped_pusht
        if self._queue and self._expect is not None:
            # drop the rest of the plan if the world has drifted from the prediction
            px, py, pa = self._expect
            b = g.block
            if math.hypot(b.position[0] - px, b.position[1] - py) > DRIFT_PX or abs(b.angle - pa) > DRIFT_RAD:
                self._queue, self._pred = [], []
        if not self._queue:
            self._plan()
        self._expect = self._pred.pop(0) if self._pred else None
        return np.asarray(self._queue.pop(0), dtype=np.float32)

    # ------------------------------------------------------------------ planning
    def _true_state(self):
        g = self.env.unwrapped_pusht
        a, v, b = g.agent.position, g.agent.velocity, g.block.position
        return np.array([a[0], a[1]]), np.array([v[0], v[1]]), np.array([b[0], b[1], g.block.angle])

    def _candidates(self, pose, gap, lead):
        """World contact points, inward push directions and start points (agent at rest `gap+lead` px off)."""
        pts = CAND_POINTS.copy()
        jit = self.rng.uniform(-3.0, 3.0, size=len(pts))
        ax = np.where(_CAND_ALONG_X, 0, 1)
        pts[np.arange(len(pts)), ax] = np.clip(pts[np.arange(len(pts)), ax] + jit, _CAND_LO, _CAND_HI)
        R = rot(pose[2])
        n_w = CAND_NORMALS @ R.T
        c_w = local_to_world(pose, pts)
        touch = c_w + AGENT_RADIUS * n_w
        start = touch + (gap + lead) * n_w
        d = point_to_block_distance(pose, start)
        ok = (d >= min(AGENT_RADIUS + gap + lead, AGENT_RADIUS + 4.0) - 1e-6)
        ok &= np.all((start > 2.0) & (start < WORKSPACE - 2.0), axis=1)
        return touch, -n_w, start, ok

    def _push_targets(self, touch, push_dir, speed, n):
        return [touch + push_dir * speed * (k + 1) for k in range(n)]

    def _plan(self):
        self.n_plans += 1
        rng = self.rng
        agent_pos, agent_vel, pose = self._true_state()
        cost0 = float(corner_cost(pose))
        # pace: slow and short near the goal (fine phase), faster far away; jittered per plan
        speed = float(np.clip(0.45 * cost0, 1.2, 14.0) * rng.uniform(0.75, 1.25))
        n_push = 18 if cost0 > 30.0 else (12 if cost0 > 6.0 else 8)
        fine = cost0 < 12.0
        gap = 2.0 if fine else rng.uniform(3.0, 6.0)
        lead = 3.0 if fine else rng.uniform(6.0, 14.0)
        app_speed = rng.uniform(22.0, 34.0)
        touch, push_dir, start, ok = self._candidates(pose, gap, lead)

        # --- stage 1: rank candidates by progress per step of a push from rest at their start point
        sim = self.sim
        ranked = []
        for i in np.flatnonzero(ok):
            sim.load(start[i], (0.0, 0.0), pose)
            poses = []
            for t in self._push_targets(touch[i], push_dir[i], speed, n_push):
                sim.step(t[0], t[1])
                poses.append(sim.block_pose())
            gain = cost0 - corner_cost(np.array(poses))
            est_app = 3.0 + float(np.hypot(*(start[i] - agent_pos))) / app_speed
            rate = gain / (est_app + 3.0 + np.arange(len(gain)))
            k = int(np.argmax(rate))
            ranked.append((-float(rate[k]), int(i)))
        ranked.sort()

        # --- stage 2: simulate the best few exactly as executed (approach + push + retreat per stop)
        results = []
        for tried, (_, i) in enumerate(ranked):
            if tried >= self.n_verify and (any(r[0] > 0 for r in results) or tried >= 3 * self.n_verify):
                break
            results.append(
                self._verify(agent_pos, agent_vel, pose, touch[i], push_dir[i], start[i], speed, n_push, fine,
                             app_speed)
            )
        improving = [r for r in results if r[0] > 0]
        if improving:
            best = max(r[0] for r in improving)
            near = [r for r in improving if r[0] >= 0.8 * best]
            choice = near[int(rng.integers(len(near)))]
        else:
            self.n_failed_plans += 1
            if not results:  # nothing could be simulated: wander towards the middle and try again
                self._queue = [WANDER_CENTRE + rng.normal(0, WANDER_SPREAD, 2)]
                self._pred = []
                return
            # no improving push: take a random one of the least bad to shake things up
            results.sort(key=lambda r: -r[0])
            choice = results[int(rng.integers(min(3, len(results))))]
        _, targets, preds, self.last_plan_info = choice
        self._queue = [np.clip(t, 0.0, WORKSPACE) for t in targets]
        self._pred = preds

    def _verify(self, agent_pos, agent_vel, pose, touch, push_dir, start, speed, n_push, fine, app_speed):
        """Simulate approach + push + retreat from the true state. Returns (score, targets, predicted poses)
        where score is the corner-cost reduction per env step (> 0: improving) for the best stopping point."""
        approach, preds, hold = self._approach(agent_pos, agent_vel, pose, start, fine, app_speed)
        pushes = self._push_targets(touch, push_dir, speed, n_push)
        # the push continues the approach's simulation as one uninterrupted run (keeps the solver's
        # contact cache as in the real env) ...
        states, push_preds = self._simulate_push(pushes)
        # ... then, for every stopping point, a two-step retreat branch
        outcomes = self._retreats(states, push_dir, self.rng.uniform(12.0, 24.0))
        n_app = len(approach)
        k, score = _best_stop([o[0] for o in outcomes], n_app, float(corner_cost(pose)))
        c, back, p1, p2 = outcomes[k]
        targets = list(approach) + pushes[: k + 1] + [back, back]
        preds = preds + push_preds[: k + 1] + [p1, p2]
        info = {"approach": n_app - hold, "hold": hold, "push": k + 1, "cost": c}
        return score, targets, preds, info

    def _approach(self, agent_pos, agent_vel, pose, start, fine, app_speed):
        """(set-points, predicted block poses, settling steps) bringing the agent from its true state to
        ``start`` around the T; the simulation is left at the approach's end. An approach that would move
        the block is retried once at half the speed."""
        sim = self.sim
        path = _plan_path(pose, agent_pos, start)
        for _ in range(2):
            approach = _carrot(path, app_speed, decel=3.0 if fine else 8.0)
            # let the agent settle at the start point (tighter in the fine phase)
            _, p_end, v_end = _agent_rollout(agent_pos, agent_vel, approach)
            tol = 1.5 if fine else 1e9
            hold = 0
            while hold < 6 and (
                math.hypot(p_end[0] - start[0], p_end[1] - start[1]) > tol
                or math.hypot(*v_end) * 0.1 > tol
            ):
                approach.append(start.copy())
                _, p_end, v_end = _agent_rollout(p_end, v_end, [start])
                hold += 1
            sim.load(agent_pos, agent_vel, pose)
            preds = []
            for t in approach:
                sim.step(t[0], t[1])
                preds.append(sim.block_pose())
            moved = preds and (
                math.hypot(preds[-1][0] - pose[0], preds[-1][1] - pose[1]) > 0.5 or abs(preds[-1][2] - pose[2]) > 0.01
            )
            if not moved:
                break
            app_speed *= 0.5
        return approach, preds, hold

    def _simulate_push(self, pushes):
        """(simulator state, block pose) after each push step, stopping early once the block is placed."""
        states, push_preds = [], []
        for t in pushes:
            self.sim.step(t[0], t[1])
            states.append(self.sim.get_state())
            push_preds.append(self.sim.block_pose())
            if corner_cost(np.array(push_preds[-1])) < SUCCESS_COST:
                break
        return states, push_preds

    def _retreats(self, states, push_dir, retreat_len):
        """For each stopping point: (corner cost after a two-step retreat, retreat set-point, the two poses)."""
        sim = self.sim
        outcomes = []
        for state in states:
            sim.set_state(state)
            back = np.array(state[:2]) - push_dir * retreat_len
            sim.step(back[0], back[1])
            p1 = sim.block_pose()
            sim.step(back[0], back[1])
            p2 = sim.block_pose()
            outcomes.append((float(corner_cost(np.array(p2))), back, p1, p2))
        return outcomes


def _best_stop(costs, n_app: int, cost0: float) -> tuple[int, float]:
    """(stopping point, score): the best corner-cost reduction per env step (approach, pushes up to the
    stop, two retreat steps and one to spare), except that the first stop reaching the goal wins."""
    costs = np.array(costs)
    n_steps = n_app + np.arange(len(costs)) + 3
    score = (cost0 - costs) / n_steps
    done = np.flatnonzero(costs < SUCCESS_COST)
    if len(done):  # reaching the goal beats any rate
        k = int(done[0])
        score[k] = GOAL_SCORE - k
    k = int(np.argmax(score))
    return k, float(score[k])


def collect_episode(seed: int, *, max_steps: int = 300, image_size: int = 96, scene_randomization=None) -> dict | None:
    """Run the expert from env.reset(seed=seed). Return None if it failed, else a dict of numpy arrays:
    img (T,S,S,3) uint8 (S = image_size), state (T,5) float32, action (T,2) float32, keypoint (T,9,2) float32,
    n_contacts (T,1) float32, and scalars under 'info': {'seed', 'steps', 'max_coverage', 'seconds'}.
    Frame t holds the observation seen before action t (Diffusion Policy's layout). ``scene_randomization``
    (``envs.scene_shifts.SceneRandomization``): the frames are drawn in a scene drawn from ``seed``; the expert
    plans on the simulator's state, never on a frame."""
    out = run_episode(seed, max_steps=max_steps, image_size=image_size, scene_randomization=scene_randomization)
    if not out["info"]["success"]:
        return None
    out["info"] = {k: out["info"][k] for k in ("seed", "steps", "max_coverage", "seconds")}
    return out


def run_episode(seed: int, *, max_steps: int = 300, image_size: int = 96, record: bool = True,
                scene_randomization=None) -> dict:
    """Like ``collect_episode`` but always returns the dict; its info also holds ``success``, ``n_plans`` and
    ``cpu_seconds`` (process time, robust to a busy machine)."""
    t0, c0 = time.perf_counter(), time.process_time()
    env = PushTEnv(image_size=image_size, max_episode_steps=max_steps, scene_randomization=scene_randomization)
    expert = PushTExpert(env, np.random.default_rng([int(seed), PLAN_STREAM]))
    obs, info = env.reset(seed=int(seed))
    imgs, states, actions, kps, contacts = [], [], [], [], []
    max_cov = float(info["coverage"])
    success = bool(info["success"])
    n_contacts = 0
    steps = 0
    while not success and steps < max_steps:
        action = expert.act(obs)
        if record:
            imgs.append(obs["image"])
            states.append(env.get_state())
            kps.append(env.get_keypoints())
            contacts.append(n_contacts)
        actions.append(action)
        obs, _, terminated, truncated, info = env.step(action)
        n_contacts = env.n_contacts()
        steps += 1
        max_cov = max(max_cov, float(info["coverage"]))
        success = bool(info["success"])
        if terminated or truncated:
            break
    env.close()
    out = {
        "action": np.asarray(actions, dtype=np.float32).reshape(-1, 2),
        "info": {
            "seed": int(seed),
            "steps": int(steps),
            "max_coverage": float(max_cov),
            "seconds": float(time.perf_counter() - t0),
            "cpu_seconds": float(time.process_time() - c0),
            "success": success,
            "n_plans": expert.n_plans,
        },
    }
    if record:
        out["img"] = np.asarray(imgs, dtype=np.uint8).reshape(-1, image_size, image_size, 3)
        out["state"] = np.asarray(states, dtype=np.float32).reshape(-1, 5)
        out["keypoint"] = np.asarray(kps, dtype=np.float32).reshape(-1, 9, 2)
        out["n_contacts"] = np.asarray(contacts, dtype=np.float32).reshape(-1, 1)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description="Evaluate the scripted PushT expert on random initial states.")
    ap.add_argument("--episodes", type=int, default=50)
    ap.add_argument("--start-seed", type=int, default=0)
    ap.add_argument("--max-steps", type=int, default=300)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    succ, covs, steps, secs, cpus = [], [], [], [], []
    for seed in range(args.start_seed, args.start_seed + args.episodes):
        r = run_episode(seed, max_steps=args.max_steps)["info"]
        succ.append(r["success"])
        covs.append(r["max_coverage"])
        steps.append(r["steps"])
        secs.append(r["seconds"])
        cpus.append(r["cpu_seconds"])
        if args.verbose or not r["success"]:
            print(f"seed {seed}: success={r['success']} max_cov={r['max_coverage']:.3f} steps={r['steps']} "
                  f"plans={r['n_plans']} {r['seconds']:.2f}s", flush=True)
    n = len(succ)
    print(f"episodes={n} success_rate={np.mean(succ):.3f} mean_max_coverage={np.mean(covs):.4f} "
          f"mean_steps={np.mean(steps):.1f} (successful: {np.mean([s for s, ok in zip(steps, succ) if ok] or [0]):.1f}) "
          f"seconds_per_episode={np.mean(secs):.2f} (max {np.max(secs):.2f}) "
          f"cpu_seconds_per_episode={np.mean(cpus):.2f} (max {np.max(cpus):.2f})")


if __name__ == "__main__":
    main()
