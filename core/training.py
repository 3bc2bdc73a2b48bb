"""The training loop: data -> policy -> AdamW/cosine/EMA -> checkpoints, resumable, DDP under torchrun.

``train(cfg)`` takes the composed ``TrainRunConfig`` and runs named steps: claim the run directory,
build the data, build the policy with its optimizer and EMA, restore a checkpoint, seed each rank,
then the loop, which checkpoints and evaluates. One run owns its ``run_dir`` (a lock file);
``resume=true`` continues from the newest complete checkpoint and refuses a config that changes
the model or the data (config and dataset fingerprint); ``overwrite=true`` deletes the old run
only after every check has passed (core/rundir.py). A checkpoint never
holds non-finite weights: a diverging run stops with the last good checkpoint as ``last``.
"""
from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from common.resources import NoRoomError
from datasets.factory import make_dataset
from datasets.fingerprint import FINGERPRINT_KEY, check_resume_data
from datasets.sampler import SequenceDataset, StepBatchSampler, compute_stats, split_episodes
from policies.base import Policy
from policies.registry import make_policy
from policies.checkpoint import (
    checkpoint_step,
    load_policy,
    load_training_state,
    load_weights,
    newest_checkpoint,
    read_checkpoint_meta,
    resolve_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
    training_state_entry,
)

from .config import TrainConfig, TrainRunConfig, to_dict
from .distributed import Distributed, pick_device
from .cli import Interrupted
from .rundir import RunDirectory, check_resume_config, interrupted_message, way_on

# Seeds. Every rank builds the same initial weights from ``seed``; once they are built each rank
# draws its own crops and noise from ``seed * RANK_SEED_STRIDE + rank``. A resumed run restores
# rank 0's stream from the checkpoint; rank r > 0 derives its own from it with a prime stride.
RANK_SEED_STRIDE = 1000
RESUMED_RANK_SEED_PRIME = 7919
VAL_SEED = 0  # validation draws a fixed subset and fixed noise, comparable across steps
VAL_MAX_BATCHES = 10
ADAMW_BETAS = (0.95, 0.999)  # Diffusion Policy's AdamW betas
LR_SCHEDULE = "cosine"


@dataclass
class TrainResult:
    checkpoint: Path | None  # run_dir/checkpoints/last (None on ranks > 0)
    policy: Policy
    step: int
    train_seconds: float  # wall time of this run plus that of the runs it resumed


@dataclass
class TrainData:
    train_set: SequenceDataset
    val_set: SequenceDataset | None
    stats: dict
    num_train_episodes: int
    num_val_episodes: int
    fingerprint: dict  # what a resume compares the data with (datasets.fingerprint)


@dataclass
class TrainState:
    """Everything a checkpoint restores, and the step the loop advances."""

    policy: Policy
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    ema: object | None  # diffusers EMAModel
    step: int = 0
    seconds_before: float = 0.0  # wall time of the runs this one resumes; checkpoints carry the running total
    fingerprint: dict | None = None  # the training data's, saved with every checkpoint

    def eval_weights(self) -> dict:
        """The weights rollouts use: the EMA's parameters with the live model's buffers (normalizer)."""
        if self.ema is None:
            return self.policy.state_dict()
        self.ema.store(self.policy.parameters())
        self.ema.copy_to(self.policy.parameters())
        weights = {k: v.detach().clone() for k, v in self.policy.state_dict().items()}
        self.ema.restore(self.policy.parameters())
        return weights

    def training_state(self, world_size: int, seconds: float) -> dict:
        return {
            "model": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "ema": self.ema.state_dict() if self.ema is not None else {},
            "rng": rng_state(), "step": self.step, "world_size": world_size,
            "train_seconds": self.seconds_before + seconds, FINGERPRINT_KEY: self.fingerprint,
        }


class _LossModule(torch.nn.Module):
    """DDP synchronises gradients through forward(); policies expose compute_loss instead."""

    def __init__(self, policy: Policy):
        super().__init__()
        self.policy = policy

    def forward(self, batch):
        return self.policy.compute_loss(batch)


def _to_device(batch: dict, device) -> dict:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def _all_finite(tensors) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())


# --- the steps of a run -------------------------------------------------------------------------
def claim_run(cfg: TrainRunConfig, ddp: Distributed) -> tuple[RunDirectory, Path | None]:
    """Lock the run directory (or refuse it) -> (run, the checkpoint to resume from or None)."""
    run = RunDirectory(Path(cfg.run_dir), is_main=ddp.is_main)
    resume_from = run.claim(resume=cfg.resume, overwrite=cfg.overwrite)  # lock, clean up, or refuse
    ddp.barrier()
    if cfg.resume and not ddp.is_main:
        resume_from = newest_checkpoint(run.checkpoints)
    if resume_from is not None:
        check_resume_config(read_checkpoint_meta(resume_from)["cfg"], to_dict(cfg), resume_from, schema=cfg)
    return run, resume_from


def setup_device(cfg: TrainRunConfig, ddp: Distributed) -> torch.device:
    if cfg.train.num_threads:
        torch.set_num_threads(cfg.train.num_threads)
    device = pick_device(cfg.device, ddp.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def batch_and_lr(tcfg: TrainConfig, world_size: int) -> tuple[int, float]:
    """(per-process batch, learning rate): the effective (global) batch and lr, explicit whatever the process count."""
    if tcfg.scale_lr_with_world_size:
        return tcfg.batch_size, tcfg.lr * world_size
    if tcfg.batch_size % world_size:
        raise ValueError(f"train.batch_size ({tcfg.batch_size}) must be divisible by the {world_size} processes")
    return tcfg.batch_size // world_size, tcfg.lr


def build_data(cfg: TrainRunConfig, resume_from: Path | None) -> TrainData:
    """Windows split by episode; normalization statistics from the training episodes only. A resume
    refuses data that changed since ``resume_from`` was written."""
    pconfig = cfg.policy
    data = make_dataset(cfg.task, list(pconfig.input_shapes), cfg.train.max_episodes)
    saved = resume_from and training_state_entry(resume_from, FINGERPRINT_KEY)
    fingerprint = check_resume_data(resume_from, saved, data)
    train_eps, val_eps = split_episodes(data.num_episodes, cfg.train.val_fraction, cfg.seed)
    window = dict(n_obs_steps=pconfig.n_obs_steps, horizon=pconfig.horizon, n_action_steps=pconfig.n_action_steps,
                  obs_steps=pconfig.window_obs_steps)
    obs_keys = list(pconfig.input_shapes)
    train_set = SequenceDataset(data, obs_keys, train_eps, **window)
    val_set = SequenceDataset(data, obs_keys, val_eps, **window) if len(val_eps) else None
    stats = compute_stats(data, pconfig.lowdim_keys + ["action"], train_eps)
    return TrainData(train_set, val_set, stats, len(train_eps), len(val_eps), fingerprint)


def build_state(cfg: TrainRunConfig, stats: dict, lr: float, device) -> TrainState:
    """The policy, AdamW with a warmed-up cosine schedule, and the EMA of its weights."""
    from diffusers.optimization import get_scheduler
    from diffusers.training_utils import EMAModel

    tcfg = cfg.train
    policy = make_policy(cfg.policy, stats).to(device)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=tcfg.weight_decay, betas=ADAMW_BETAS)
    scheduler = get_scheduler(LR_SCHEDULE, optimizer, num_warmup_steps=tcfg.warmup_steps, num_training_steps=tcfg.steps)
    ema = (EMAModel(policy.parameters(), decay=tcfg.ema_max_decay, use_ema_warmup=True, power=tcfg.ema_power)
           if tcfg.ema else None)
    return TrainState(policy, optimizer, scheduler, ema)


def restore(state: TrainState, checkpoint: Path, cfg: TrainRunConfig, lr: float, is_main: bool) -> None:
    """Continue from ``checkpoint``: weights, optimizer, schedule, EMA, RNG streams and the step."""
    saved = load_training_state(checkpoint)
    state.seconds_before = float(saved.get("train_seconds", 0.0))
    load_weights(state.policy, saved["model"], checkpoint / "training_state.safetensors")
    state.optimizer.load_state_dict(saved["optimizer"])
    for group in state.optimizer.param_groups:  # a resumed run may have a different process count
        group["initial_lr"] = lr
    state.scheduler.load_state_dict(saved["scheduler"])
    state.scheduler.base_lrs = [lr for _ in state.scheduler.base_lrs]
    if state.ema is not None:
        state.ema.load_state_dict(saved["ema"])
    set_rng_state(saved["rng"])
    state.step = int(saved["step"])
    steps = cfg.train.steps
    if state.step >= steps:
        raise ValueError(f"{checkpoint} is already at step {state.step} and train.steps={steps}: "
                         f"pass a larger train.steps= to train longer")
    if is_main:
        print(f"resumed {checkpoint} at step {state.step}")
        saved_steps = read_checkpoint_meta(checkpoint)["cfg"]["train"]["steps"]
        if saved_steps != steps:
            # LambdaLR keeps only the step count: the new length reshapes the rest of the cosine
            print(f"train.steps {saved_steps} -> {steps}: the cosine schedule now ends at step {steps}, so the "
                  f"learning rate continues from {lr * state.scheduler.lr_lambdas[0](state.step):.3g}")


def start_from(state: TrainState, source: str, is_main: bool) -> None:
    """Fine-tuning: the weights of another run's checkpoint (its evaluation weights, normalisation included) as
    the start, and the EMA restarted from them; the optimizer, the schedule and the step start fresh."""
    try:
        ckpt = resolve_checkpoint(source)
        donor = load_policy(ckpt, expected_policy=state.policy.config.name)  # the loader's checks: a checkpoint is data
    except (FileNotFoundError, ValueError) as exc:
        raise type(exc)(f"train.init_from={source}: {exc}") from None
    mine, theirs = state.policy.state_dict(), donor.state_dict()
    differ = sorted(k for k in mine.keys() | theirs.keys() if k not in mine or k not in theirs
                    or mine[k].shape != theirs[k].shape)
    if differ:
        raise ValueError(f"train.init_from={source}: its policy differs from this one in {len(differ)} tensor(s) "
                         f"({', '.join(differ[:3])}{', ...' if len(differ) > 3 else ''}): start from a run of the same "
                         "task, policy, encoder and cameras")
    state.policy.load_state_dict(theirs)
    if state.ema is not None:  # the average starts at the loaded weights, not at the random ones
        state.ema.shadow_params = [p.clone().detach() for p in state.policy.parameters()]
    if is_main:
        print(f"fine-tuning from {ckpt} (step {checkpoint_step(ckpt)})")


def seed_rank(seed: int, rank: int, resumed: bool, step: int) -> None:
    """The weights are built (or restored): from here each rank draws its own crops and noise."""
    if not resumed:
        torch.manual_seed(seed * RANK_SEED_STRIDE + rank)
    elif rank > 0:  # the checkpoint holds rank 0's stream; other ranks derive theirs from it
        torch.manual_seed(torch.initial_seed() + RESUMED_RANK_SEED_PRIME * rank + step)


def make_loader(train_set, per_rank_batch: int, cfg: TrainRunConfig, ddp: Distributed, step: int, device):
    """The data order is a function of the step (and seed, rank): a resumed run draws the batches
    the uninterrupted run would have drawn; each process takes its own shard of every epoch."""
    sampler = StepBatchSampler(len(train_set), per_rank_batch, seed=cfg.seed, rank=ddp.rank,
                               world_size=ddp.world_size, start_step=step)
    workers = cfg.train.num_workers
    # a private generator: creating the iterator draws a worker seed, which must not shift the global
    # RNG stream (crops, noise) that checkpoints save and restore
    return torch.utils.data.DataLoader(train_set, batch_sampler=sampler, num_workers=workers,
                                       persistent_workers=workers > 0, pin_memory=device.type == "cuda",
                                       generator=torch.Generator().manual_seed(cfg.seed))


def make_step_fn(policy: Policy, tcfg: TrainConfig, ddp: Distributed, device):
    """batch -> (loss, info): DDP-wrapped over several processes, compiled on request."""
    model = _LossModule(policy)
    if ddp.world_size > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return torch.compile(model) if tcfg.compile else model


def autocast_context(precision: str, device):
    if precision == "bf16":
        return lambda: torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext


def save(state: TrainState, run: RunDirectory, tag: str, cfg_dict: dict, world_size: int, seconds: float) -> Path:
    """Write checkpoints/<tag> and checkpoints/last, or refuse non-finite weights and write nothing. A disk
    without room ends the run in one line naming the file and the command that goes on (``way_on``)."""
    weights = state.eval_weights()
    if not (_all_finite(state.policy.parameters()) and _all_finite(weights.values())):
        good = newest_checkpoint(run.checkpoints)
        raise FloatingPointError(
            f"the weights became non-finite by step {state.step} (training diverged); nothing was written, "
            f"the last good checkpoint is {good or 'none'}; lower train.lr or raise train.warmup_steps")
    training_state = state.training_state(world_size, seconds)
    try:
        save_checkpoint(run.checkpoints / tag, state.policy, cfg_dict, training_state, weights)
        return save_checkpoint(run.checkpoints / "last", state.policy, cfg_dict, training_state, weights)
    except NoRoomError as exc:  # the run stops here: say how to go on once there is room
        raise NoRoomError(f"{exc}; {way_on(run.path)}") from None


def optimize(state: TrainState, batch: dict, step_fn, autocast, grad_clip: float) -> tuple[dict, float]:
    """One update on ``batch`` -> (the loss info, the gradient norm); refuses a non-finite loss
    before the update, so the weights are still the last good ones."""
    with autocast():
        loss, info = step_fn(batch)
    if not math.isfinite(info["loss"]):
        raise FloatingPointError(f"loss became {info['loss']} at step {state.step + 1}; lower train.lr or check the dataset")
    state.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(state.policy.parameters(), grad_clip)
    state.optimizer.step()
    state.scheduler.step()
    if state.ema is not None:
        state.ema.step(state.policy.parameters())
    state.step += 1
    return info, float(grad_norm)


class _Logger:
    """Rank 0's TensorBoard scalars and progress bar; samples/s over each logging interval."""

    def __init__(self, run_path: Path, tcfg: TrainConfig, step: int, is_main: bool):
        from torch.utils.tensorboard import SummaryWriter
        from tqdm import tqdm

        self.is_main, self.every, self.steps = is_main, tcfg.log_every, tcfg.steps
        self.writer = SummaryWriter(str(run_path / "tb")) if is_main else None
        self.bar = tqdm(total=tcfg.steps, initial=step, desc="train", dynamic_ncols=True, mininterval=2.0,
                        disable=not is_main)
        self.t_last, self.samples = time.perf_counter(), 0

    def step(self, step: int, samples: int, info: dict, grad_norm: float, lr: float) -> None:
        self.samples += samples
        if self.is_main and (step % self.every == 0 or step == self.steps):
            now = time.perf_counter()
            sps = self.samples / (now - self.t_last)
            self.t_last, self.samples = now, 0
            for key, value in (("train/loss", info["loss"]), ("train/grad_norm", grad_norm),
                               ("train/lr", lr), ("train/samples_per_s", sps)):
                self.writer.add_scalar(key, value, step)
            self.bar.set_postfix(loss=f"{info['loss']:.4f}", samples_s=f"{sps:.0f}")
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
        if self.writer is not None:
            self.writer.close()


def _due(step: int, every: int, steps: int) -> bool:
    return step % every == 0 or step == steps


def _encoder_text(pconfig) -> str:
    """What reads the cameras: the ViT's attention, another encoder (which has none), or nothing at all."""
    if not pconfig.image_keys:
        return "cameras=none"
    return f"attention={pconfig.vit.attention.kind}" if pconfig.encoder == "vit" else f"encoder={pconfig.encoder}"


def _describe(cfg: TrainRunConfig, state: TrainState, data: TrainData, device, ddp: Distributed,
              per_rank_batch: int, lr: float, run: RunDirectory) -> str:
    params = sum(p.numel() for p in state.policy.parameters()) / 1e6
    return (f"policy={cfg.policy.name} {_encoder_text(cfg.policy)} params={params:.2f}M "
            f"episodes train/val={data.num_train_episodes}/{data.num_val_episodes} windows={len(data.train_set)} "
            f"device={device} processes={ddp.world_size} batch={per_rank_batch}x{ddp.world_size} lr={lr:g} "
            f"run_dir={run.path}")


@dataclass
class _Run:
    """What the loop reads: the run's pieces, built once by ``train``."""

    cfg: TrainRunConfig
    ddp: Distributed
    run: RunDirectory
    device: torch.device
    state: TrainState
    data: TrainData
    per_rank_batch: int
    t_start: float

    def seconds(self) -> float:
        return time.perf_counter() - self.t_start


def loop(r: _Run, loader, logger: _Logger) -> Path:
    """Train until ``train.steps``: validate, checkpoint and evaluate on their schedules -> the last checkpoint."""
    cfg, tcfg, state, ddp = r.cfg, r.cfg.train, r.state, r.ddp
    step_fn = make_step_fn(state.policy, tcfg, ddp, r.device)
    autocast = autocast_context(tcfg.precision, r.device)
    cfg_dict = cfg.to_stored()
    if ddp.is_main:
        (r.run.path / "config.json").write_text(json.dumps(cfg_dict, indent=2))
        r.run.record_environment(state.step)
    batches = iter(loader)
    last = r.run.checkpoints / "last"
    state.policy.train()
    while state.step < tcfg.steps:
        batch = _to_device(next(batches), r.device)
        info, grad_norm = optimize(state, batch, step_fn, autocast, tcfg.grad_clip)
        step = state.step
        logger.step(step, len(batch["action"]) * ddp.world_size, info, grad_norm, state.scheduler.get_last_lr()[0])
        if ddp.is_main and r.data.val_set is not None and _due(step, tcfg.val_every, tcfg.steps):
            logger.writer.add_scalar("val/loss", validate(state.policy, r.data.val_set, r.per_rank_batch, r.device), step)
        if _due(step, tcfg.checkpoint_every, tcfg.steps):
            if ddp.is_main:
                last = save(state, r.run, f"step_{step:07d}", cfg_dict, ddp.world_size, r.seconds())
                _maybe_evaluate(cfg, step, last, r.run.path, logger.writer, r.device)
                state.policy.train()
            ddp.barrier()
    return last


def train(cfg: TrainRunConfig) -> TrainResult:
    """Train from a composed config (``core.config.compose("config", overrides)``)."""
    t_start = time.perf_counter()
    ddp = Distributed.from_env(cfg.device)
    run, resume_from = claim_run(cfg, ddp)
    device = setup_device(cfg, ddp)
    # the same initial weights on every rank; different augmentation and noise draws per rank
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    per_rank_batch, lr = batch_and_lr(cfg.train, ddp.world_size)
    data = build_data(cfg, resume_from)
    state = build_state(cfg, data.stats, lr, device)
    state.fingerprint = data.fingerprint
    if resume_from is not None:
        restore(state, resume_from, cfg, lr, ddp.is_main)
    elif cfg.train.init_from is not None:
        start_from(state, cfg.train.init_from, ddp.is_main)
    seed_rank(cfg.seed, ddp.rank, resume_from is not None, state.step)
    loader = make_loader(data.train_set, per_rank_batch, cfg, ddp, state.step, device)
    r = _Run(cfg, ddp, run, device, state, data, per_rank_batch, t_start)
    logger = None
    try:
        run.start()  # every check has passed: overwrite=true deletes the old run now, then the .run marker is written
        logger = _Logger(run.path, cfg.train, state.step, ddp.is_main)
        if ddp.is_main:
            print(_describe(cfg, state, data, device, ddp, per_rank_batch, lr, run))
        last = loop(r, loader, logger)
    finally:
        if logger is not None:
            logger.close()
        run.release()
    if ddp.is_main:
        print(f"last checkpoint: {last}")
    return TrainResult(last if ddp.is_main else None, state.policy, state.step, state.seconds_before + r.seconds())


def _maybe_evaluate(cfg: TrainRunConfig, step: int, checkpoint: Path, run_dir: Path, writer, device) -> None:
    ecfg = cfg.eval
    if ecfg.num_episodes <= 0 or not ((ecfg.every and step % ecfg.every == 0) or step == cfg.train.steps):
        return
    from .evaluation import evaluate_checkpoint

    summary = evaluate_checkpoint(checkpoint, num_episodes=ecfg.num_episodes, seed=ecfg.seed, workers=ecfg.workers,
                                  num_videos=ecfg.num_videos, out_dir=run_dir / "eval" / f"step_{step:07d}_seed{ecfg.seed}",
                                  device=device, overwrite=True)
    writer.add_scalar("eval/success_rate", summary["success_rate"], step)
    writer.add_scalar("eval/mean_max_reward", summary["mean_max_reward"], step)


@torch.no_grad()
def validate(policy, dataset, batch_size: int, device, max_batches: int = VAL_MAX_BATCHES) -> float:
    # a fixed subset and fixed noise keep validation comparable across steps
    was_training = policy.training
    policy.eval()
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True,
                                         generator=torch.Generator().manual_seed(VAL_SEED))
    state = torch.get_rng_state()
    torch.manual_seed(VAL_SEED)
    losses = []
    for i, batch in enumerate(loader):
        if i >= max_batches:
            break
        losses.append(policy.compute_loss(_to_device(batch, device))[0].item())
    torch.set_rng_state(state)
    policy.train(was_training)
    return float(np.mean(losses))


def _print_recipe(task) -> None:
    """Under ``train_policy.py`` (Hydra's command line): which recipe pieces applied, and what they
    changed in the run's ``task``."""
    import os

    from hydra.core.hydra_config import HydraConfig

    from .config import recipe_report

    if not HydraConfig.initialized() or int(os.environ.get("RANK", "0")) != 0:
        return
    hydra_cfg = HydraConfig.get()
    print("\n".join(recipe_report(dict(hydra_cfg.runtime.choices), list(hydra_cfg.overrides.task), task)))


def run(cfg: TrainRunConfig) -> TrainResult:
    """What ``train_policy.py`` does: say what the recipe did, train, then leave torchrun's process group."""
    import torch.distributed as dist

    _print_recipe(cfg.task)
    try:
        return train(cfg)
    except KeyboardInterrupt:
        raise Interrupted(interrupted_message(cfg.run_dir)) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
