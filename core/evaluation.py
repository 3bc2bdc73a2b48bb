"""The evaluation loop: a policy (or a checkpoint) rolled out in parallel environments -> a summary.

``evaluate`` batches the policy over the environments of an ``EnvPool``; ``evaluate_checkpoint``
loads a checkpoint, applies inference-time changes and writes ``summary.json`` + videos into a
folder of its own. Evaluation seeds start at 100000; demonstrations use seeds below that.
"""
from __future__ import annotations

import dataclasses
import json
import time
from collections import deque
from pathlib import Path

import numpy as np
import torch

from envs.corruptions import corruption_tag, obs_corruptor
from envs.factory import EVAL_SEED_START, EnvError, EnvPool, env_kwargs_from_task
from policies.registry import get_policy_class
from policies.checkpoint import checkpoint_step, load_policy, read_checkpoint_meta, resolve_checkpoint
from policies.vision.vit import patch_grid

from .config import InferenceOverrides, RolloutConfig, TaskConfig, from_dict
from .preflight import WrittenFiles, check_output_dir, replace_file
from .stats import wilson_interval


class OverrideError(ValueError):
    """A rollout override that does not fit the checkpoint: the CLI prints it as one line."""


class _Episode:
    """The evaluator's record of one episode in progress: its statistics and video frames. What the
    policy acts on (observation history, action queue, state) the policy keeps (``select_action``)."""

    def __init__(self, seed: int, record: bool):
        self.seed = seed
        self.steps = 0
        self.max_reward = 0.0
        self.max_coverage = None
        self.success = False
        self.error = None
        self.frames = [] if record else None
        self.t0 = time.perf_counter()

    def record(self, reward: float, info: dict) -> None:
        self.steps += 1
        self.max_reward = max(self.max_reward, float(reward))
        if "coverage" in info:
            self.max_coverage = max(self.max_coverage or 0.0, float(info["coverage"]))
        self.success = self.success or bool(info.get("success", False))

    def result(self) -> dict:
        res = dict(seed=self.seed, success=bool(self.success), steps=self.steps, max_reward=float(self.max_reward),
                   seconds=time.perf_counter() - self.t0)
        if self.max_coverage is not None:
            res["max_coverage"] = float(self.max_coverage)
        if self.error:
            res["error"] = self.error
        return res


class _Rollouts:
    """Episodes on seeds ``seeds`` over an ``EnvPool``, one in flight per environment; every step
    the policy acts for all of them at once through ``select_action`` (environment i is its row id)."""

    def __init__(self, policy, pool, seeds: list[int], obs_transform, videos: tuple[Path, int, int] | None, bar):
        self.policy, self.pool, self.bar = policy, pool, bar
        self.seeds = deque(seeds)
        self.first_seed = seeds[0] if seeds else 0
        self.obs_transform = obs_transform or (lambda obs: obs)
        self.videos = videos  # (folder, number of episodes filmed, fps) or None
        self.episodes: list[_Episode | None] = [None] * len(pool)
        self.obs: list[dict | None] = [None] * len(pool)
        self.results: list[dict] = []

    def start(self, i: int) -> None:
        """Environment i starts the next seed's episode (a seed whose reset fails is recorded as failed)."""
        self.policy.reset([i])
        self.episodes[i] = None
        while self.seeds:
            seed = self.seeds.popleft()
            env = self.pool.envs[i]
            env.send("reset", seed)
            try:
                obs = env.recv()
            except EnvError as exc:
                self._record(dict(seed=seed, success=False, steps=0, max_reward=0.0, seconds=0.0, error=str(exc)))
                continue
            record = self.videos is not None and seed - self.first_seed < self.videos[1]
            self.episodes[i] = _Episode(seed, record)
            self.obs[i] = self.obs_transform(obs)
            if record:
                self.episodes[i].frames.append(_render(env))
            return

    def finish(self, i: int) -> None:
        episode = self.episodes[i]
        self._record(episode.result())
        if episode.frames:
            folder, _, fps = self.videos
            _write_video(Path(folder) / f"episode_{episode.seed}.mp4", episode.frames, fps)

    def _record(self, result: dict) -> None:
        self.results.append(result)
        self.bar.update(1)

    def step(self) -> None:
        """One action in every environment with an episode in flight; finished ones start the next seed."""
        active = [i for i, episode in enumerate(self.episodes) if episode is not None]
        obs = {k: torch.from_numpy(np.stack([self.obs[i][k] for i in active])).to(self.policy.device)
               for k in self.policy.config.input_shapes}  # key -> (B, ...)
        actions = self.policy.select_action(obs, envs=active).cpu().numpy()  # (B, Da); row j = environment active[j]
        for j, i in enumerate(active):
            self.pool.envs[i].send("step", actions[j].astype(np.float32))
        for i in active:
            episode = self.episodes[i]
            try:
                obs_i, reward, terminated, truncated, info = self.pool.envs[i].recv()
            except EnvError as exc:  # a simulation error fails this episode, not the evaluation
                episode.error = str(exc)
                self.finish(i)
                self.start(i)
                continue
            episode.record(reward, info)
            if episode.frames is not None:
                episode.frames.append(_render(self.pool.envs[i]))
            self.obs[i] = self.obs_transform(obs_i)
            if terminated or truncated or episode.success:
                self.finish(i)
                self.start(i)

    def run(self) -> list[dict]:
        for i in range(len(self.pool)):
            self.start(i)
        while any(episode is not None for episode in self.episodes):
            self.step()
        return self.results


def evaluate(policy, task: TaskConfig, *, num_episodes: int, seed: int = EVAL_SEED_START, workers: int = 0,
             image_size: int | None = None, obs_transform=None, video_dir: Path | None = None, num_videos: int = 3,
             max_steps: int | None = None, progress: bool = True, env_options: dict | None = None) -> dict:
    """Run ``num_episodes`` episodes on seeds ``seed, seed+1, ...``, batching the policy over the
    parallel environments. ``obs_transform(obs) -> obs`` alters observations (corruption studies)."""
    from tqdm import tqdm

    kwargs = env_kwargs_from_task(task, policy.config.image_keys, image_size)  # render only the cameras the policy reads
    if max_steps is not None:
        kwargs["max_episode_steps"] = max_steps
    kwargs.update(env_options or {})  # constructor arguments of the environment (benchmarks)
    policy.eval()
    policy.reset()
    t_start = time.perf_counter()
    videos = (video_dir, num_videos, task.fps) if video_dir is not None else None
    with tqdm(total=num_episodes, desc=f"rollout {task.name}", disable=not progress, dynamic_ncols=True) as bar:
        with EnvPool(task.name, kwargs, workers) as pool:
            results = _Rollouts(policy, pool, list(range(seed, seed + num_episodes)), obs_transform, videos, bar).run()
    return summarize(results, time.perf_counter() - t_start, workers)


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


def _policy_overrides(meta: dict, inference: InferenceOverrides) -> tuple[dict, dict]:
    """The checkpoint's policy config fields ``inference`` changes -> (load_policy's overrides, the
    attention settings changed); a change that does not fit the checkpoint is an OverrideError."""
    policy_config, name = meta["policy_config"], meta["policy"]
    overrides = {}
    if inference.num_inference_steps is not None:
        if "num_inference_steps" not in policy_config:
            raise OverrideError(f"num_inference_steps= applies to diffusion policies, but this checkpoint holds "
                                f"{name!r}; drop num_inference_steps=")
        overrides["num_inference_steps"] = inference.num_inference_steps
    ta = inference.n_action_steps
    if ta is not None:  # Ta only acts at inference: replan more or less often without retraining
        trained_ta = policy_config["n_action_steps"]
        if ta != trained_ta and not get_policy_class(name).config_class.inference_action_steps:
            raise OverrideError(f"n_action_steps= cannot change at rollout for a {name!r} checkpoint (its network "
                                f"outputs {trained_ta} actions per step); drop n_action_steps= or retrain with policy.n_action_steps=")
        overrides["n_action_steps"] = ta
    # Attention settings that only act on the masks, so they can change at inference on larger images:
    # LookHere's global slope (the paper lowers it), Fibottention's window (N // 3 grows with N) and
    # offset grid ("train": keep the 2-D displacements its 1-D offsets had on the training grid).
    vit = policy_config["vit"]
    attn = vit["attention"]
    train_grid = patch_grid(policy_config["crop_size"], vit["patch_size"])
    offset_grid = list(train_grid) if inference.offset_grid == "train" else inference.offset_grid
    attn_over = {k: v for k, v in (("global_slope", inference.global_slope), ("w_max", inference.w_max),
                                   ("offset_grid", offset_grid)) if v is not None}
    for key, kind in (("global_slope", "lookhere"), ("w_max", "fibottention"), ("offset_grid", "fibottention")):
        if key in attn_over and attn["kind"] != kind:
            raise OverrideError(f"{key}= applies to {kind} attention, but this checkpoint uses {attn['kind']!r}; drop {key}=")
    if attn_over:
        overrides["vit"] = {**vit, "attention": {**attn, **attn_over}}
    return overrides, attn_over


def _write_summary(out_dir: Path, summary: dict) -> None:
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    replace_file(Path(out_dir) / "summary.json", json.dumps(summary, indent=2))


def evaluate_checkpoint(checkpoint, *, num_episodes: int, seed: int = EVAL_SEED_START, workers: int = 0,
                        out_dir=None, device="cpu", num_videos: int = 3, obs_transform=None, max_steps=None,
                        progress=True, overwrite: bool = False, inference: InferenceOverrides | None = None,
                        **overrides) -> dict:
    """Roll a checkpoint out, changed at inference by ``inference`` (or the same fields as keywords,
    e.g. ``global_slope=0.5``); with ``out_dir``, write summary.json (and videos) there, never over
    an earlier evaluation unless ``overwrite``. A ``corruption`` applies to every camera image
    (``envs.corruptions``); the videos show what the policy saw."""
    if inference is not None and overrides:
        raise ValueError(f"give inference= or its fields {sorted(overrides)} as keywords, not both")
    inference = inference or InferenceOverrides(**overrides)
    ckpt = resolve_checkpoint(checkpoint)
    meta = read_checkpoint_meta(ckpt)
    if out_dir is not None and (Path(out_dir) / "summary.json").exists() and not overwrite:
        raise FileExistsError(f"{Path(out_dir) / 'summary.json'} holds an earlier evaluation; pass overwrite=true to "
                              f"replace it, or choose another out_dir=")
    if out_dir is not None:
        check_output_dir(out_dir, "out_dir")  # before the policy loads and an episode runs
    policy_overrides, attn_over = _policy_overrides(meta, inference)
    policy = load_policy(ckpt, device=device, **policy_overrides)
    task = from_dict(TaskConfig, meta["cfg"]["task"])
    corruptions = inference.corruption  # parsed by InferenceOverrides
    if corruptions:
        if obs_transform is not None:
            raise ValueError("give corruption= or obs_transform, not both")
        obs_transform = obs_corruptor(corruptions, policy.config.image_keys)
    summary = evaluate(policy, task, num_episodes=num_episodes, seed=seed, workers=workers, image_size=inference.image_size,
                       obs_transform=obs_transform, video_dir=Path(out_dir) / "videos" if out_dir and num_videos else None,
                       num_videos=num_videos, max_steps=max_steps, progress=progress)
    summary.update(checkpoint=str(ckpt), task=task.name, policy=meta["policy"],
                   attention=meta["policy_config"]["vit"]["attention"]["kind"], attention_overrides=attn_over,
                   seed_start=seed, image_size=inference.image_size, n_action_steps=policy.config.n_action_steps,
                   corruption=corruption_tag(corruptions))
    if out_dir is not None:
        _write_summary(out_dir, summary)
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




def run(cfg: RolloutConfig) -> dict:
    """What ``rollout.py`` does with a RolloutConfig: evaluate, print the summary line and paths."""
    import sys

    from .distributed import pick_device

    if cfg.seed < EVAL_SEED_START:
        print(f"warning: seed={cfg.seed} is below {EVAL_SEED_START}: these initial states may overlap the demonstrations",
              file=sys.stderr)
    ckpt = resolve_checkpoint(cfg.checkpoint)
    inference = cfg.overrides()
    options = {k: v for k, v in dataclasses.asdict(inference).items() if k != "corruption"}
    out_dir = Path(cfg.out_dir) if cfg.out_dir else default_out_dir(ckpt, cfg.seed, {**options, "max_steps": cfg.max_steps,
                                                                                      "n": cfg.num_episodes,
                                                                                      "corruption": corruption_tag(inference.corruption)})
    written = WrittenFiles(out_dir)
    try:
        summary = evaluate_checkpoint(ckpt, num_episodes=cfg.num_episodes, seed=cfg.seed, workers=cfg.workers, out_dir=out_dir,
                                      device=pick_device(cfg.device), num_videos=cfg.num_videos, max_steps=cfg.max_steps,
                                      overwrite=cfg.overwrite, inference=inference)
    except KeyboardInterrupt:
        raise written.interrupted() from None
    print(format_summary(summary))
    print(f"summary: {out_dir / 'summary.json'}" + (f"  videos: {out_dir / 'videos'}" if cfg.num_videos else ""))
    return summary
