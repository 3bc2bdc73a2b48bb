"""The evaluation loop: a policy (or a checkpoint) rolled out in parallel environments -> a summary.

``evaluate`` batches the policy over the environments of an ``EnvPool``; ``evaluate_checkpoint``
loads a checkpoint, applies inference-time changes (``core.inference``) and writes ``summary.json``
+ videos into a folder of its own (``core.eval_folders`` names it). The videos show what the policy
saw: its camera images as it receives them. Evaluation seeds start at 100000; demonstrations use
seeds below that.
"""
from __future__ import annotations

import dataclasses
import json
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.provenance import environment
from envs.corruptions import obs_corruptor, parse_shifts, shift_tag, split_stages
from envs.factory import EVAL_SEED_START, EnvError, EnvPool, env_kwargs_from_task
from policies.checkpoint import load_policy, read_checkpoint_meta, resolve_checkpoint

from .config import InferenceOverrides, RolloutConfig, TaskConfig, from_dict
from .eval_folders import rollout_out_dir
# OverrideError: what evaluate_checkpoint raises for an option the checkpoint cannot take (one line in the CLI)
from .inference import OverrideError, policy_overrides
from .preflight import WrittenFiles, check_output_dir, replace_file
from .stats import paired_difference, wilson_interval

# what the videos show, as summary.json records it
VIDEO_SHOWS = ("what the policy saw: its camera images side by side as it receives them (rendered at image_size, "
               "after corruption), before its centre crop")


class _Episode:
    """The evaluator's record of one episode in progress: its statistics and video frames. What the
    policy acts on (observation history, action queue, state) the policy keeps (``select_action``)."""

    def __init__(self, seed: int, record: bool):
        self.seed = seed
        self.steps = 0
        self.max_reward = 0.0
        self.sum_reward = 0.0
        self.max_coverage = None
        self.success = False
        self.error = None
        self.frames = [] if record else None
        self.t0 = time.perf_counter()

    def record(self, reward: float, info: dict) -> None:
        self.steps += 1
        self.max_reward = max(self.max_reward, float(reward))
        self.sum_reward += float(reward)
        if "coverage" in info:
            self.max_coverage = max(self.max_coverage or 0.0, float(info["coverage"]))
        self.success = self.success or bool(info.get("success", False))

    def result(self) -> dict:
        res = dict(seed=self.seed, success=bool(self.success), steps=self.steps, max_reward=float(self.max_reward),
                   sum_reward=self.sum_reward, seconds=time.perf_counter() - self.t0)
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
        self.image_keys = policy.config.image_keys
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
            self._observe(i, obs)
            return

    def _observe(self, i: int, obs: dict) -> None:
        """What the policy of environment i sees next (corrupted, if asked), and the video's frame of it."""
        self.obs[i] = self.obs_transform(obs)
        frames = self.episodes[i].frames
        if frames is not None:
            frames.append(np.concatenate([self.obs[i][k] for k in self.image_keys], axis=1))  # (H, W * cameras, 3)

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
            self._observe(i, obs_i)
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
             max_steps: int | None = None, progress: bool = True, env_options: dict | None = None,
             scene_shifts=()) -> dict:
    """Run ``num_episodes`` episodes on seeds ``seed, seed+1, ...``, batching the policy over the
    parallel environments. What the policy observes can change on either side of the camera:
    ``env_options`` are constructor arguments of every environment (what it renders and how),
    ``scene_shifts`` [(kind, severity), ...] are rendered by every environment from each episode's seed,
    ``obs_transform(obs) -> obs`` alters each observation after it is rendered (camera corruptions).
    The first ``num_videos`` episodes are filmed as the policy saw them."""
    from tqdm import tqdm

    kwargs = env_kwargs_from_task(task, policy.config.image_keys, image_size, scene_shifts)  # only the policy's cameras
    if max_steps is not None:
        kwargs["max_episode_steps"] = max_steps
    kwargs.update(env_options or {})  # constructor arguments of the environment (benchmarks)
    policy.eval()
    policy.reset()
    t_start = time.perf_counter()
    videos = (video_dir, num_videos, task.fps) if video_dir is not None and policy.config.image_keys else None
    with tqdm(total=num_episodes, desc=f"rollout {task.name}", disable=not progress, dynamic_ncols=True) as bar:
        with EnvPool(task.name, kwargs, workers) as pool:
            results = _Rollouts(policy, pool, list(range(seed, seed + num_episodes)), obs_transform, videos, bar).run()
    summary = summarize(results, time.perf_counter() - t_start, workers)
    if videos is not None and num_videos:
        summary["videos"] = {"shows": VIDEO_SHOWS, "cameras": list(policy.config.image_keys)}
    return summary


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


def _write_video(path: Path, frames: list, fps: int) -> None:
    import imageio.v2 as imageio

    path.parent.mkdir(parents=True, exist_ok=True)
    imageio.mimsave(str(path), frames, fps=fps, macro_block_size=1)


def _write_summary(out_dir: Path, summary: dict) -> None:
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    replace_file(Path(out_dir) / "summary.json", json.dumps(summary, indent=2))


def _observation_changes(inference: InferenceOverrides, image_keys: list[str], obs_transform=None) -> tuple[list, Any]:
    """What ``inference`` changes in what the policy observes -> (the scene shifts every environment
    renders, the transform of each observation): a pixel corruption acts on the rendered frame; a scene
    shift (lighting, colour, camera) is rendered by the simulator, drawn from each episode's seed, so the
    initial states stay those of the clean run with the same seeds."""
    if not inference.corruption:  # parsed by InferenceOverrides
        return [], obs_transform
    if obs_transform is not None:
        raise ValueError("give corruption= or obs_transform, not both")
    pixel, scene = split_stages(inference.corruption)
    return scene, obs_corruptor(pixel, image_keys) if pixel else None


def paired_with_clean(summary: dict, clean_dir: Path) -> dict | None:
    """The shifted run against the clean run of the same checkpoint and seeds (one folder per evaluation,
    ``rollout_out_dir``): per-episode pairs (clean, shifted) on the same initial state -> the drop with a
    paired 95% interval; None when that clean run does not exist or misses some of the shifted run's seeds
    (a clean run of 50 episodes pairs with a shifted one of 30 on their 30 common seeds)."""
    path = Path(clean_dir) / "summary.json"
    if not path.exists():
        return None
    clean = {e["seed"]: e["success"] for e in json.loads(path.read_text()).get("episodes", [])}
    shifted = {e["seed"]: e["success"] for e in summary["episodes"]}
    if not set(shifted) <= set(clean):
        return None
    seeds = sorted(shifted)
    d = paired_difference([float(shifted[s]) for s in seeds], [float(clean[s]) for s in seeds])
    return {"clean": str(path), "episodes": len(seeds), "clean_success_rate": float(np.mean([clean[s] for s in seeds])),
            "difference": d.mean, "difference_ci95": [d.lo, d.hi]}


def evaluate_checkpoint(checkpoint, *, num_episodes: int, seed: int = EVAL_SEED_START, workers: int = 0,
                        out_dir=None, device="cpu", num_videos: int = 3, obs_transform=None, max_steps=None,
                        progress=True, overwrite: bool = False, inference: InferenceOverrides | None = None,
                        **overrides) -> dict:
    """Roll a checkpoint out, changed at inference by ``inference`` (or the same fields as keywords,
    e.g. ``global_slope=0.5``); with ``out_dir``, write summary.json (and videos) there, never over
    an earlier evaluation unless ``overwrite``. A ``corruption`` applies to every camera image
    (``envs.corruptions``) before the policy sees it, and before the video films it."""
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
    # a scene kind the checkpoint's task cannot render is refused before the policy loads
    parse_shifts(inference.corruption, task=meta["cfg"]["task"]["name"])
    changes, attn_over = policy_overrides(meta, inference)
    policy = load_policy(ckpt, device=device, **changes)
    task = from_dict(TaskConfig, meta["cfg"]["task"])
    scene_shifts, obs_transform = _observation_changes(inference, policy.config.image_keys, obs_transform)
    video_dir = Path(out_dir) / "videos" if out_dir and num_videos else None
    summary = evaluate(policy, task, num_episodes=num_episodes, seed=seed, workers=workers, image_size=inference.image_size,
                       obs_transform=obs_transform, scene_shifts=scene_shifts, max_steps=max_steps, progress=progress,
                       video_dir=video_dir, num_videos=num_videos)
    summary.update(checkpoint=str(ckpt), task=task.name, policy=meta["policy"],
                   attention=meta["policy_config"]["vit"]["attention"]["kind"], attention_overrides=attn_over,
                   seed_start=seed, image_size=inference.image_size, n_action_steps=policy.config.n_action_steps,
                   corruption=shift_tag(inference.corruption),
                   corruptions=[[c.kind, c.severity] for c in inference.corruption],
                   environment=environment())  # where it ran: the same checkpoint may act otherwise on another CPU
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
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    ckpt = resolve_checkpoint(cfg.checkpoint)
    out_dir = Path(cfg.out_dir) if cfg.out_dir else rollout_out_dir(cfg, ckpt)
    written = WrittenFiles(out_dir)
    try:
        summary = evaluate_checkpoint(ckpt, num_episodes=cfg.num_episodes, seed=cfg.seed, workers=cfg.workers, out_dir=out_dir,
                                      device=pick_device(cfg.device), num_videos=cfg.num_videos, max_steps=cfg.max_steps,
                                      overwrite=cfg.overwrite, inference=cfg.overrides())
    except KeyboardInterrupt:
        raise written.interrupted() from None
    if cfg.corruption:  # the matched clean run: same checkpoint, seeds and options, no corruption
        clean_dir = (out_dir.parent / "clean") if cfg.out_dir else rollout_out_dir(dataclasses.replace(cfg, corruption=None), ckpt)
        paired = paired_with_clean(summary, clean_dir)
        if paired is not None:
            summary["paired"] = paired
            _write_summary(out_dir, summary)
            d = paired["difference_ci95"]
            print(f"against the clean run on the same {paired['episodes']} initial states: "
                  f"{100 * paired['difference']:+.0f} points [{100 * d[0]:+.0f}, {100 * d[1]:+.0f}] (paired)")
    print(format_summary(summary))
    videos = f"  videos: {out_dir / 'videos'} (what the policy saw)" if "videos" in summary else ""
    print(f"summary: {out_dir / 'summary.json'}{videos}")
    return summary
