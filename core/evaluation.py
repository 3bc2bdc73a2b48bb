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
import os
import shutil
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.provenance import environment
from envs.corruptions import obs_corruptor
from envs.factory import EVAL_SEED_START, EnvError, EnvPool, env_kwargs_from_task
from envs.shifts import parse_shifts, shift_tag, split_stages
from policies.checkpoint import load_policy, read_checkpoint_meta, resolve_checkpoint

from .config import InferenceOverrides, RolloutConfig, TaskConfig, from_dict
from .eval_folders import check_eval_dir, rollout_out_dir
from .eval_identity import NotComparable, check_done, check_pair, identity, read_summary, weights_sha256
# OverrideError: what evaluate_checkpoint raises for an option the checkpoint cannot take (one line in the CLI)
from .inference import OverrideError, policy_overrides
from .preflight import WrittenFiles, check_output_dir, replace_file
from .stats import paired_difference, wilson_interval

class NonFiniteActions(FloatingPointError):
    """The policy acted with NaN or Inf: the evaluation ends, unscored (one line in the CLI)."""


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
        if not np.isfinite(actions).all():  # a degenerate policy is named, never scored as a failure
            seeds = [self.episodes[i].seed for j, i in enumerate(active) if not np.isfinite(actions[j]).all()]
            raise NonFiniteActions(f"the policy's action is NaN or Inf (episode seed {seeds[0]}, step "
                                   f"{self.episodes[active[0]].steps})")
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
             scene_shifts=(), bar=None) -> dict:
    """Run ``num_episodes`` episodes on seeds ``seed, seed+1, ...``, batching the policy over the
    parallel environments. What the policy observes can change on either side of the camera:
    ``env_options`` are constructor arguments of every environment (what it renders and how),
    ``scene_shifts`` [(kind, severity), ...] are rendered by every environment from each episode's seed,
    ``obs_transform(obs) -> obs`` alters each observation after it is rendered (camera corruptions).
    The first ``num_videos`` episodes are filmed as the policy saw them. ``bar``: a progress bar of the
    caller's to advance once per episode (a suite's one bar over all its settings) instead of one of its own."""
    import contextlib

    from tqdm import tqdm

    # only the policy's cameras, with their poses where the policy reads them
    kwargs = env_kwargs_from_task(task, policy.config.image_keys, image_size, scene_shifts, policy.config.lowdim_keys)
    if max_steps is not None:
        kwargs["max_episode_steps"] = max_steps
    kwargs.update(env_options or {})  # constructor arguments of the environment (benchmarks)
    policy.eval()
    policy.reset()
    t_start = time.perf_counter()
    videos = (video_dir, num_videos, task.fps) if video_dir is not None and policy.config.image_keys else None
    own_bar = tqdm(total=num_episodes, desc=f"rollout {task.name}", disable=not progress, dynamic_ncols=True) if bar is None \
        else contextlib.nullcontext(bar)
    with own_bar as bar:
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
    """One episode's MP4; a write that fails (a full disk) leaves no truncated file and names the file."""
    import imageio.v2 as imageio

    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        imageio.mimsave(str(path), frames, fps=fps, macro_block_size=1)
    except OSError as exc:
        path.unlink(missing_ok=True)
        raise OSError(exc.errno, f"cannot write the video {path}: {exc.strerror or exc}", str(path)) from None


def _write_summary(out_dir: Path, summary: dict) -> None:
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    path = Path(out_dir) / "summary.json"
    try:
        replace_file(path, json.dumps(summary, indent=2))
    except OSError as exc:  # replace_file leaves no temporary file; the old summary, if any, is untouched
        raise OSError(exc.errno, f"cannot write {path}: {exc.strerror or exc}", str(path)) from None


VIDEOS = "videos"


def _videos_in_progress(out_dir: Path) -> Path:
    """Where this evaluation films its episodes until it has finished: an evaluation that fails or is replaced
    never leaves its videos beside another evaluation's summary."""
    return Path(out_dir) / f".{VIDEOS}.{os.getpid()}.tmp"


def _publish(out_dir: Path, summary: dict, filmed: Path | None) -> None:
    """The finished evaluation takes the folder: its summary first (whole or not at all: a full disk leaves the
    earlier evaluation as it was), then the earlier evaluation's videos (episode_*.mp4, which the package
    wrote) go and this one's take their place (renames, which need no space)."""
    _write_summary(out_dir, summary)
    videos = Path(out_dir) / VIDEOS
    if videos.is_dir() and not videos.is_symlink():
        for old in videos.glob("episode_*.mp4"):
            old.unlink()
        if not any(videos.iterdir()):
            videos.rmdir()
    if filmed is not None and filmed.is_dir():
        if videos.exists():  # something the user put there stays; ours go beside it
            for new in filmed.iterdir():
                new.replace(videos / new.name)
            filmed.rmdir()
        else:
            filmed.replace(videos)


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


def paired_with_clean(summary: dict, clean_dir: Path) -> tuple[dict | None, str]:
    """The shifted run against the clean run of the same checkpoint and seeds -> (per-episode pairs on the same
    initial states as the drop with a paired 95% interval, ""), or (None, why not) when ``clean_dir`` holds no
    clean run that answers the same question (``core.eval_identity.check_pair``: the same weights and step,
    task, options and cap, on every seed of the shifted run; a clean run of 50 episodes pairs with a shifted
    one of 30 on their 30 common seeds)."""
    path = Path(clean_dir) / "summary.json"
    if not path.is_file():
        return None, f"no clean run at {path}"
    try:
        clean_summary = read_summary(path)
        check_pair(clean_summary, path, summary["identity"])
    except NotComparable as exc:
        return None, str(exc)
    clean = {e["seed"]: e["success"] for e in clean_summary["episodes"]}
    shifted = {e["seed"]: e["success"] for e in summary["episodes"]}
    seeds = sorted(shifted)
    d = paired_difference([float(shifted[s]) for s in seeds], [float(clean[s]) for s in seeds])
    return ({"clean": str(path), "episodes": len(seeds), "clean_success_rate": float(np.mean([clean[s] for s in seeds])),
             "difference": d.mean, "difference_ci95": [d.lo, d.hi]}, "")


def check_finite_weights(ckpt: Path) -> None:
    """A checkpoint whose weights hold NaN or Inf (a diverged training) is named before it loads: its
    rollouts would be noise, and its normalizer would fail with a message about something else."""
    from safetensors.torch import load_file

    from policies.checkpoint import own_file

    for name, tensor in load_file(own_file(ckpt, "model.safetensors")).items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise FloatingPointError(f"checkpoint {ckpt} holds NaN or Inf weights ({name}): it cannot be evaluated; "
                                     f"evaluate an earlier checkpoint of the run (its checkpoints/step_*)")


def encoder_of(policy_config: dict) -> str:
    """The visual encoder: ``vit`` or another one (``resnet18``), which has no attention."""
    return policy_config.get("encoder", "vit")


def camera_pose_options(meta: dict, inference: InferenceOverrides) -> dict:
    """The environment options ``camera_pose=`` asks for; refused in one line for a policy that reads no pose."""
    if inference.camera_pose is None:
        return {}
    if not meta["policy_config"].get("ray_maps"):
        raise OverrideError(f"camera_pose={inference.camera_pose} applies to camera-aware policies (policy.ray_maps=true), "
                            "and this checkpoint reads no camera pose; drop camera_pose=")
    return {"nominal_camera_pose": True}


def wanted_identity(ckpt: Path, meta: dict, inference: InferenceOverrides, *, seed: int, num_episodes: int,
                    max_steps: int | None) -> dict:
    """What evaluating ``ckpt`` so would answer (``core.eval_identity``), known before any episode runs."""
    from policies.checkpoint import checkpoint_step

    options = {k: v for k, v in dataclasses.asdict(inference).items() if k != "corruption"}
    return identity(step=checkpoint_step(ckpt), weights=weights_sha256(ckpt), task=meta["cfg"]["task"]["name"],
                    policy=meta["policy"], encoder=encoder_of(meta["policy_config"]), shifts=inference.corruption,
                    inference=options, max_steps=max_steps or meta["cfg"]["task"]["env"]["max_episode_steps"],
                    seeds=list(range(seed, seed + num_episodes)))


def _check_earlier(out_dir: Path, wanted: dict) -> None:
    """An out_dir holding an evaluation is never replaced without overwrite=true; the line says what it holds."""
    path = Path(out_dir) / "summary.json"
    try:
        check_done(path, wanted)
        held = "this evaluation already (the same weights, step, task, shifts, max_steps and seeds)"
    except NotComparable as exc:
        held = f"an earlier evaluation ({exc})"
    raise FileExistsError(f"{out_dir} holds {held}; pass overwrite=true to replace it, or choose another out_dir=")


def evaluate_checkpoint(checkpoint, *, num_episodes: int, seed: int = EVAL_SEED_START, workers: int = 0,
                        out_dir=None, device="cpu", num_videos: int = 3, obs_transform=None, max_steps=None,
                        progress=True, overwrite: bool = False, inference: InferenceOverrides | None = None,
                        bar=None, clean_dir=None, **overrides) -> dict:
    """Roll a checkpoint out, changed at inference by ``inference`` (or the same fields as keywords,
    e.g. ``global_slope=0.5``); with ``out_dir``, write summary.json (and videos) there, never over
    an earlier evaluation unless ``overwrite``. A ``corruption`` (``envs.shifts``: a scene shift the environment
    renders, or a pixel corruption of every camera image) acts before the policy sees a frame, and before the video
    films it. The summary's
    ``identity`` records what it answers (``core.eval_identity``); a shifted run is paired with the clean run in
    ``clean_dir`` where that answers the same question (``paired``), else ``unpaired`` says why."""
    if inference is not None and overrides:
        raise ValueError(f"give inference= or its fields {sorted(overrides)} as keywords, not both")
    if num_episodes < 1 or (max_steps is not None and max_steps < 1):
        raise ValueError(f"num_episodes={num_episodes} and max_steps={max_steps}: give at least 1 of each")
    inference = inference or InferenceOverrides(**overrides)
    ckpt = resolve_checkpoint(checkpoint)
    meta = read_checkpoint_meta(ckpt)
    if out_dir is not None:
        check_eval_dir(out_dir, ckpt)  # before the policy loads and an episode runs
    # a scene kind the checkpoint's task cannot render is refused before the policy loads
    parse_shifts(inference.corruption, task=meta["cfg"]["task"]["name"])
    check_finite_weights(ckpt)
    wanted = wanted_identity(ckpt, meta, inference, seed=seed, num_episodes=num_episodes, max_steps=max_steps)
    if out_dir is not None and (Path(out_dir) / "summary.json").exists() and not overwrite:
        _check_earlier(out_dir, wanted)
    changes, attn_over = policy_overrides(meta, inference)
    env_options = camera_pose_options(meta, inference)
    policy = load_policy(ckpt, device=device, **changes)
    task = from_dict(TaskConfig, meta["cfg"]["task"])
    scene_shifts, obs_transform = _observation_changes(inference, policy.config.image_keys, obs_transform)
    filmed = _videos_in_progress(out_dir) if out_dir is not None and num_videos else None
    try:
        summary = evaluate(policy, task, num_episodes=num_episodes, seed=seed, workers=workers, image_size=inference.image_size,
                           obs_transform=obs_transform, scene_shifts=scene_shifts, max_steps=max_steps, progress=progress,
                           video_dir=filmed, num_videos=num_videos, bar=bar, env_options=env_options)
    except BaseException as exc:
        if filmed is not None:
            shutil.rmtree(filmed, ignore_errors=True)  # an evaluation that did not finish leaves no videos
        if isinstance(exc, NonFiniteActions):
            raise NonFiniteActions(f"checkpoint {ckpt}: {exc}; the evaluation is not scored: evaluate an earlier "
                                   f"checkpoint of the run") from None
        raise
    encoder = encoder_of(meta["policy_config"])
    summary.update(checkpoint=str(ckpt), task=task.name, policy=meta["policy"], encoder=encoder,
                   attention=meta["policy_config"]["vit"]["attention"]["kind"] if encoder == "vit" else None,
                   attention_overrides=attn_over,
                   seed_start=seed, image_size=inference.image_size, n_action_steps=policy.config.n_action_steps,
                   corruption=shift_tag(inference.corruption),
                   corruptions=[[c.kind, c.severity] for c in inference.corruption], max_steps=wanted["max_steps"],
                   identity=wanted,
                   environment=environment())  # where it ran: the same checkpoint may act otherwise on another CPU
    if inference.corruption and clean_dir is not None:
        paired, why = paired_with_clean(summary, clean_dir)
        summary.update({"paired": paired} if paired else {"unpaired": why})
    if out_dir is not None:
        try:
            _publish(out_dir, summary, filmed)
        finally:
            if filmed is not None:
                shutil.rmtree(filmed, ignore_errors=True)
    return summary


def format_summary(s: dict) -> str:
    lo, hi = s["success_rate_ci95"]
    line = (f"{s['task']} {s['policy']}/{s.get('attention') or s.get('encoder')}: success {s['successes']}/{s['num_episodes']} = "
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
    check_eval_dir(out_dir, ckpt)  # before anything looks inside it: a name too long, a checkpoint folder
    written = WrittenFiles(out_dir)
    # the matched clean run: same checkpoint, seeds and options, no corruption
    clean_dir = (out_dir.parent / "clean") if cfg.out_dir else rollout_out_dir(dataclasses.replace(cfg, corruption=None), ckpt)
    try:
        summary = evaluate_checkpoint(ckpt, num_episodes=cfg.num_episodes, seed=cfg.seed, workers=cfg.workers, out_dir=out_dir,
                                      device=pick_device(cfg.device), num_videos=cfg.num_videos, max_steps=cfg.max_steps,
                                      overwrite=cfg.overwrite, inference=cfg.overrides(), clean_dir=clean_dir)
    except KeyboardInterrupt:
        raise written.interrupted() from None
    if paired := summary.get("paired"):
        d = paired["difference_ci95"]
        print(f"against the clean run on the same {paired['episodes']} initial states: "
              f"{100 * paired['difference']:+.0f} points [{100 * d[0]:+.0f}, {100 * d[1]:+.0f}] (paired)")
    elif cfg.corruption and (clean_dir / "summary.json").exists():  # a clean run that is not this one's is named
        print(f"not paired: {summary['unpaired']}; this run's own numbers stand", file=sys.stderr)
    print(format_summary(summary))
    videos = f"  videos: {out_dir / 'videos'} (what the policy saw)" if "videos" in summary else ""
    print(f"summary: {out_dir / 'summary.json'}{videos}")
    return summary
