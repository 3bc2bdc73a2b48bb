"""The evaluation loop: a policy (or a checkpoint) rolled out in parallel environments -> a summary.

``evaluate`` batches the policy over the environments of an ``EnvPool``; ``evaluate_checkpoint``
loads a checkpoint, applies inference-time changes and writes ``summary.json`` + videos into a
folder of its own. Evaluation seeds start at 100000; demonstrations use seeds below that.
"""
from __future__ import annotations

import json
import math
import time
from collections import deque
from pathlib import Path

import numpy as np
import torch

from envs.corruptions import corruption_tag, obs_corruptor, parse_corruptions
from envs.factory import EVAL_SEED_START, EnvError, EnvPool, env_kwargs_from_task
from policies.base import get_policy_class
from policies.checkpoint import checkpoint_step, load_policy, read_checkpoint_meta, resolve_checkpoint

from .config import TaskConfig, from_dict
from .preflight import WrittenFiles, check_output_dir


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


class OverrideError(ValueError):
    """A rollout override that does not fit the checkpoint: the CLI prints it as one line."""


def evaluate(
    policy,
    task: TaskConfig,
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
    env_options: dict | None = None,
) -> dict:
    """Run ``num_episodes`` episodes on seeds ``seed, seed+1, ...``, batching the policy over the
    parallel environments. ``obs_transform(obs) -> obs`` alters observations (corruption studies)."""
    from tqdm import tqdm

    device = policy.device
    cfg = policy.config
    kwargs = env_kwargs_from_task(task, cfg.image_keys, image_size)  # render only the cameras the policy reads
    if max_steps is not None:
        kwargs["max_episode_steps"] = max_steps
    kwargs.update(env_options or {})  # constructor arguments of the environment (benchmarks)
    seeds = deque(range(seed, seed + num_episodes))
    results: list[dict] = []
    policy.eval()
    policy.reset()  # a recurrent policy forgets every slot's state; each slot's episode start resets it again
    t_start = time.perf_counter()
    bar = tqdm(total=num_episodes, desc=f"rollout {task.name}", disable=not progress, dynamic_ncols=True)
    with EnvPool(task.name, kwargs, workers) as pool:
        slots: list[_Slot | None] = [None] * len(pool)

        def start(i: int) -> None:
            policy.reset_slots([i])  # slot i's next episode starts from a fresh state (stateless policies: no-op)
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
                _write_video(Path(video_dir) / f"episode_{sl.seed}.mp4", sl.frames, task.fps)
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
                    chunk = policy.predict_action_chunk_for(batch, need).cpu().numpy()  # (B, Ta, Da); row j = slot need[j]
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


def default_out_dir(checkpoint: Path, seed: int, options: dict) -> Path:
    """<run>/eval/<checkpoint>_seed<seed>[_<option><value>...]: one folder per evaluation.

    A checkpoint inside a run (<run>/checkpoints/<tag>) evaluates into <run>/eval/; a standalone
    checkpoint directory into eval/ beside it.
    """
    ckpt = Path(checkpoint)
    root = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
    tag = ckpt.name
    step = checkpoint_step(ckpt) if tag == "last" else None
    if step is not None:  # "last" moves on when a run resumes; its step does not
        tag = f"step_{step:07d}"
    parts = [f"{tag}_seed{seed}"]
    for key, value in sorted(options.items()):
        if value is not None:
            text = "x".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
            parts.append(f"{key}{text}")
    return root / "eval" / "_".join(parts)


def evaluate_checkpoint(checkpoint, *, num_episodes: int, seed: int = EVAL_SEED_START, workers: int = 0,
                        out_dir=None, device="cpu", num_videos: int = 3, image_size=None, obs_transform=None,
                        max_steps=None, global_slope=None, w_max=None, offset_grid=None, num_inference_steps=None,
                        n_action_steps=None, corruption=None, progress=True, overwrite: bool = False) -> dict:
    """Roll a checkpoint out; with ``out_dir``, write summary.json (and videos) there, never over
    an earlier evaluation unless ``overwrite``. ``corruption``: [(kind, severity), ...] applied to
    every camera image (``envs.corruptions``); the videos show what the policy saw."""
    ckpt = resolve_checkpoint(checkpoint)
    meta = read_checkpoint_meta(ckpt)
    if out_dir is not None and (Path(out_dir) / "summary.json").exists() and not overwrite:
        raise FileExistsError(f"{Path(out_dir) / 'summary.json'} holds an earlier evaluation; pass overwrite=true to "
                              f"replace it, or choose another out_dir=")
    if out_dir is not None:
        check_output_dir(out_dir, "out_dir")  # before the policy loads and an episode runs
    overrides = {}
    if num_inference_steps is not None:
        if "num_inference_steps" not in meta["policy_config"]:
            raise OverrideError(f"num_inference_steps= applies to diffusion policies, but this checkpoint holds "
                                f"{meta['policy']!r}; drop num_inference_steps=")
        overrides["num_inference_steps"] = num_inference_steps
    if n_action_steps is not None:  # Ta only acts at inference: replan more or less often without retraining
        trained_ta = meta["policy_config"]["n_action_steps"]
        if n_action_steps != trained_ta and not get_policy_class(meta["policy"]).config_class.inference_action_steps:
            raise OverrideError(f"n_action_steps= cannot change at rollout for a {meta['policy']!r} checkpoint (its network "
                                f"outputs {trained_ta} actions per step); drop n_action_steps= or retrain with policy.n_action_steps=")
        overrides["n_action_steps"] = n_action_steps
    # Attention settings that only act on the masks, so they can change at inference on larger images:
    # LookHere's global slope (the paper lowers it), Fibottention's window (N // 3 grows with N) and
    # offset grid ("train": keep the 2-D displacements its 1-D offsets had on the training grid).
    vit = meta["policy_config"]["vit"]
    attn = vit["attention"]
    if offset_grid == "train":
        offset_grid = list(vit["base_grid"])
    attn_over = {k: v for k, v in (("global_slope", global_slope), ("w_max", w_max), ("offset_grid", offset_grid)) if v is not None}
    for key, kind in (("global_slope", "lookhere"), ("w_max", "fibottention"), ("offset_grid", "fibottention")):
        if key in attn_over and attn["kind"] != kind:
            raise OverrideError(f"{key}= applies to {kind} attention, but this checkpoint uses {attn['kind']!r}; drop {key}=")
    if attn_over:
        overrides["vit"] = {**vit, "attention": {**attn, **attn_over}}
    policy = load_policy(ckpt, device=device, **overrides)
    task = from_dict(TaskConfig, meta["cfg"]["task"])
    corruptions = parse_corruptions(corruption)
    if corruptions:
        if obs_transform is not None:
            raise ValueError("give corruption= or obs_transform, not both")
        obs_transform = obs_corruptor(corruptions, policy.config.image_keys)
    summary = evaluate(policy, task, num_episodes=num_episodes, seed=seed, workers=workers, image_size=image_size,
                       obs_transform=obs_transform, video_dir=Path(out_dir) / "videos" if out_dir and num_videos else None,
                       num_videos=num_videos, max_steps=max_steps, progress=progress)
    summary.update(checkpoint=str(ckpt), task=task.name, policy=meta["policy"],
                   attention=attn["kind"], attention_overrides=attn_over, seed_start=seed, image_size=image_size,
                   n_action_steps=policy.config.n_action_steps, corruption=corruption_tag(corruptions))
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




def run(cfg) -> dict:
    """What ``rollout.py`` does with a RolloutConfig: evaluate, print the summary line and paths."""
    import sys

    from .distributed import pick_device

    if cfg.seed < EVAL_SEED_START:
        print(f"warning: seed={cfg.seed} is below {EVAL_SEED_START}: these initial states may overlap the demonstrations",
              file=sys.stderr)
    ckpt = resolve_checkpoint(cfg.checkpoint)
    options = dict(image_size=cfg.image_size, n_action_steps=cfg.n_action_steps, num_inference_steps=cfg.num_inference_steps,
                   global_slope=cfg.global_slope, w_max=cfg.w_max, offset_grid=cfg.offset_grid)
    corruptions = parse_corruptions(cfg.corruption)
    out_dir = Path(cfg.out_dir) if cfg.out_dir else default_out_dir(ckpt, cfg.seed, {**options, "max_steps": cfg.max_steps,
                                                                                      "n": cfg.num_episodes,
                                                                                      "corruption": corruption_tag(corruptions)})
    written = WrittenFiles(out_dir)
    try:
        summary = evaluate_checkpoint(ckpt, num_episodes=cfg.num_episodes, seed=cfg.seed, workers=cfg.workers, out_dir=out_dir,
                                      device=pick_device(cfg.device), num_videos=cfg.num_videos, max_steps=cfg.max_steps,
                                      overwrite=cfg.overwrite, corruption=corruptions, **options)
    except KeyboardInterrupt:
        raise written.interrupted() from None
    print(format_summary(summary))
    print(f"summary: {out_dir / 'summary.json'}" + (f"  videos: {out_dir / 'videos'}" if cfg.num_videos else ""))
    return summary
