"""Roll a trained policy out in simulation and report its success rate.

    python rollout.py checkpoint=outputs/pusht/diffusion_fibottention_s0 num_episodes=50 seed=100000 workers=2

Prints and writes a JSON summary (success rate with a 95% Wilson interval, mean max reward,
mean episode length, seconds per episode) and videos of the first episodes. Evaluation seeds
start at 100000; demonstrations are generated from seeds below that, so they never overlap.
"""
from __future__ import annotations

import json
import math
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np
import torch

from common.cli import parse_key_values
from envs.factory import EVAL_SEED_START, EnvError, EnvPool, env_kwargs_from_task
from policies.checkpoint import load_policy, read_checkpoint_meta, resolve_checkpoint


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion (sane at 0/n and n/n, unlike Wald)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


class _Slot:
    """One environment's episode in progress: observation history, action queue, statistics."""

    def __init__(self, seed: int, first_obs: dict, n_obs_steps: int, record: bool):
        self.seed = seed
        self.obs = deque([first_obs] * n_obs_steps, maxlen=n_obs_steps)  # repeat the first frame, as training pads
        self.actions: deque = deque()
        self.steps = 0
        self.max_reward = 0.0
        self.max_coverage = None
        self.success = False
        self.error = None
        self.frames = [] if record else None
        self.t0 = time.perf_counter()


def evaluate(
    policy,
    task_cfg: dict,
    *,
    num_episodes: int,
    seed: int = EVAL_SEED_START,
    workers: int = 0,
    image_size: int | None = None,
    obs_transform=None,
    video_dir: Path | None = None,
    num_videos: int = 3,
    max_steps: int | None = None,
    progress: bool = True,
) -> dict:
    """Run ``num_episodes`` episodes on seeds ``seed, seed+1, ...``, batching the policy over the
    parallel environments. ``obs_transform(obs) -> obs`` alters observations (corruption studies)."""
    from tqdm import tqdm

    device = policy.device
    cfg = policy.config
    kwargs = env_kwargs_from_task(task_cfg, image_size)
    if max_steps is not None:
        kwargs["max_episode_steps"] = max_steps
    seeds = deque(range(seed, seed + num_episodes))
    results: list[dict] = []
    policy.eval()
    t_start = time.perf_counter()
    bar = tqdm(total=num_episodes, desc=f"rollout {task_cfg['name']}", disable=not progress, dynamic_ncols=True)
    with EnvPool(task_cfg["name"], kwargs, workers) as pool:
        slots: list[_Slot | None] = [None] * len(pool)

        def start(i: int) -> None:
            while seeds:
                s = seeds.popleft()
                pool.envs[i].send("reset", s)
                try:
                    obs = pool.envs[i].recv()
                except EnvError as exc:
                    results.append(dict(seed=s, success=False, steps=0, max_reward=0.0, seconds=0.0, error=str(exc)))
                    bar.update(1)
                    continue
                obs = obs_transform(obs) if obs_transform else obs
                slots[i] = _Slot(s, obs, cfg.n_obs_steps, video_dir is not None and s - seed < num_videos)
                if slots[i].frames is not None:
                    slots[i].frames.append(_render(pool.envs[i]))
                return
            slots[i] = None

        def finish(i: int) -> None:
            sl = slots[i]
            res = dict(seed=sl.seed, success=bool(sl.success), steps=sl.steps, max_reward=float(sl.max_reward),
                       seconds=time.perf_counter() - sl.t0)
            if sl.max_coverage is not None:
                res["max_coverage"] = float(sl.max_coverage)
            if sl.error:
                res["error"] = sl.error
            results.append(res)
            if sl.frames:
                _write_video(Path(video_dir) / f"episode_{sl.seed}.mp4", sl.frames, task_cfg.get("fps", 10))
            bar.update(1)
            start(i)

        for i in range(len(pool)):
            start(i)
        while any(slots):
            active = [i for i, sl in enumerate(slots) if sl is not None]
            need = [i for i in active if not slots[i].actions]
            if need:  # one batched forward pass for every environment that must replan
                batch = {
                    k: torch.from_numpy(np.stack([np.stack([o[k] for o in slots[i].obs]) for i in need])).to(device)
                    for k in cfg.input_shapes
                }  # key -> (B, To, ...)
                with torch.no_grad():
                    chunk = policy.predict_action_chunk(batch).cpu().numpy()  # (B, Ta, Da)
                for j, i in enumerate(need):
                    slots[i].actions.extend(chunk[j])
            for i in active:
                pool.envs[i].send("step", slots[i].actions.popleft().astype(np.float32))
            for i in active:
                sl = slots[i]
                try:
                    obs, reward, terminated, truncated, info = pool.envs[i].recv()
                except EnvError as exc:  # a simulation error fails this episode, not the evaluation
                    sl.error = str(exc)
                    finish(i)
                    continue
                sl.steps += 1
                sl.max_reward = max(sl.max_reward, float(reward))
                if "coverage" in info:
                    sl.max_coverage = max(sl.max_coverage or 0.0, float(info["coverage"]))
                sl.success = sl.success or bool(info.get("success", False))
                if sl.frames is not None:
                    sl.frames.append(_render(pool.envs[i]))
                sl.obs.append(obs_transform(obs) if obs_transform else obs)
                if terminated or truncated or sl.success:
                    finish(i)
    bar.close()
    wall = time.perf_counter() - t_start
    return summarize(results, wall, workers)


def summarize(results: list[dict], wall_seconds: float, workers: int) -> dict:
    results = sorted(results, key=lambda r: r["seed"])
    n = len(results)
    k = sum(r["success"] for r in results)
    lo, hi = wilson_interval(k, n)
    summary = {
        "num_episodes": n,
        "successes": k,
        "success_rate": k / n if n else 0.0,
        "success_rate_ci95": [lo, hi],
        "mean_max_reward": float(np.mean([r["max_reward"] for r in results])) if n else 0.0,
        "mean_episode_length": float(np.mean([r["steps"] for r in results])) if n else 0.0,
        "seconds_per_episode": wall_seconds / max(n, 1),
        "wall_seconds": wall_seconds,
        "workers": workers,
        "errors": sum("error" in r for r in results),
        "episodes": results,
    }
    if n and all("max_coverage" in r for r in results):
        summary["mean_max_coverage"] = float(np.mean([r["max_coverage"] for r in results]))
    return summary


def _render(env) -> np.ndarray:
    env.send("render")
    try:
        return env.recv()
    except EnvError:
        return None


def _write_video(path: Path, frames: list, fps: int) -> None:
    import imageio.v2 as imageio

    frames = [f for f in frames if f is not None]
    if not frames:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    imageio.mimsave(str(path), frames, fps=fps, macro_block_size=1)


class OverrideError(ValueError):
    """A rollout override that does not fit the checkpoint: the CLI prints it as one line."""


def evaluate_checkpoint(checkpoint, *, num_episodes: int, seed: int = EVAL_SEED_START, workers: int = 0,
                        out_dir=None, device="cpu", num_videos: int = 3, image_size=None, obs_transform=None,
                        max_steps=None, global_slope=None, w_max=None, offset_grid=None, num_inference_steps=None,
                        n_action_steps=None, progress=True) -> dict:
    ckpt = resolve_checkpoint(checkpoint)
    meta = read_checkpoint_meta(ckpt)
    overrides = {}
    if num_inference_steps is not None:
        overrides["num_inference_steps"] = num_inference_steps
    if n_action_steps is not None:  # Ta only acts at inference: replan more or less often without retraining
        overrides["n_action_steps"] = n_action_steps
    # Attention settings that only act on the masks, so they can change at inference on larger images:
    # LookHere's global slope (the paper lowers it), Fibottention's window (N // 3 grows with N) and
    # offset grid ("train": keep the 2-D displacements its 1-D offsets had on the training grid).
    vit = meta["policy_config"]["vit"]
    attn = vit["attention"]
    if isinstance(offset_grid, str):
        if offset_grid != "train":
            raise OverrideError(f"offset_grid={offset_grid!r}: give 'train' or [rows, cols]")
        offset_grid = list(vit["base_grid"])
    attn_over = {k: v for k, v in (("global_slope", global_slope), ("w_max", w_max), ("offset_grid", offset_grid)) if v is not None}
    for key, kind in (("global_slope", "lookhere"), ("w_max", "fibottention"), ("offset_grid", "fibottention")):
        if key in attn_over and attn["kind"] != kind:
            raise OverrideError(f"{key}= applies to {kind} attention, but this checkpoint uses {attn['kind']!r}; drop {key}=")
    if attn_over:
        overrides["vit"] = {**vit, "attention": {**attn, **attn_over}}
    policy = load_policy(ckpt, device=device, **overrides)
    task_cfg = meta["cfg"]["task"]
    summary = evaluate(policy, task_cfg, num_episodes=num_episodes, seed=seed, workers=workers, image_size=image_size,
                       obs_transform=obs_transform, video_dir=Path(out_dir) / "videos" if out_dir and num_videos else None,
                       num_videos=num_videos, max_steps=max_steps, progress=progress)
    summary.update(checkpoint=str(ckpt), task=task_cfg["name"], policy=meta["policy"],
                   attention=attn["kind"], attention_overrides=attn_over, seed_start=seed, image_size=image_size,
                   n_action_steps=policy.config.n_action_steps)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / ".summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2))
        tmp.replace(out / "summary.json")
    return summary


def format_summary(s: dict) -> str:
    lo, hi = s["success_rate_ci95"]
    line = (f"{s['task']} {s['policy']}/{s['attention']}: success {s['successes']}/{s['num_episodes']} = "
            f"{100 * s['success_rate']:.1f}% (95% CI {100 * lo:.1f}-{100 * hi:.1f}%), "
            f"mean max reward {s['mean_max_reward']:.3f}")
    if "mean_max_coverage" in s:
        line += f", mean max coverage {s['mean_max_coverage']:.3f}"
    line += f", mean length {s['mean_episode_length']:.1f} steps, {s['seconds_per_episode']:.2f} s/episode"
    if s["errors"]:
        line += f", {s['errors']} episodes ended by simulation errors"
    return line


USAGE = "usage: python rollout.py checkpoint=PATH [num_episodes=50] [seed=100000] [workers=0] [out_dir=DIR] [device=auto] [num_videos=3] [image_size=N] [max_steps=N] [global_slope=X] [w_max=N] [offset_grid=train|[R,C]] [num_inference_steps=N] [n_action_steps=N]"


DEFAULTS = {"checkpoint": None, "num_episodes": 50, "seed": EVAL_SEED_START, "workers": 0, "out_dir": None,
            "device": "auto", "num_videos": 3, "image_size": None, "max_steps": None, "global_slope": None,
            "w_max": None, "offset_grid": None, "num_inference_steps": None, "n_action_steps": None}


def parse_overrides(argv: list[str]) -> dict:
    args = parse_key_values(argv, DEFAULTS, USAGE)
    if args["checkpoint"] is None:
        raise SystemExit(f"checkpoint= is required\n{USAGE}")
    if args["seed"] < EVAL_SEED_START:
        print(f"warning: seed={args['seed']} is below {EVAL_SEED_START}: these initial states may overlap the demonstrations", file=sys.stderr)
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_overrides(sys.argv[1:] if argv is None else argv)
    from train_policy import pick_device

    ckpt = resolve_checkpoint(args["checkpoint"])
    out_dir = Path(args["out_dir"]) if args["out_dir"] else ckpt.parent.parent / "eval" / f"rollout_seed{args['seed']}"
    summary = evaluate_checkpoint(ckpt, num_episodes=args["num_episodes"], seed=args["seed"], workers=args["workers"],
                                  out_dir=out_dir, device=pick_device(args["device"]), num_videos=args["num_videos"],
                                  image_size=args["image_size"], max_steps=args["max_steps"],
                                  global_slope=args["global_slope"], w_max=args["w_max"], offset_grid=args["offset_grid"],
                                  num_inference_steps=args["num_inference_steps"],
                                  n_action_steps=args["n_action_steps"])
    print(format_summary(summary))
    print(f"summary: {out_dir / 'summary.json'}" + (f"  videos: {out_dir / 'videos'}" if args["num_videos"] else ""))
    return summary


if __name__ == "__main__":
    try:
        main()
    except (OverrideError, FileNotFoundError) as e:  # user input errors: the message names the fix
        raise SystemExit(f"rollout.py: {e}") from None
