"""The training loop: data -> policy -> AdamW/cosine/EMA -> checkpoints, resumable, DDP under torchrun.

``train(cfg)`` takes the composed ``TrainRunConfig``. One run owns its ``run_dir`` (a lock file);
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

from datasets.factory import make_dataset
from datasets.fingerprint import FINGERPRINT_KEY, check_resume_data
from datasets.sampler import SequenceDataset, StepBatchSampler, compute_stats, split_episodes
from policies.base import Policy, make_policy
from policies.checkpoint import (
    load_training_state,
    newest_checkpoint,
    read_checkpoint_meta,
    rng_state,
    save_checkpoint,
    set_rng_state,
)

from .config import TrainRunConfig, to_dict
from .distributed import Distributed, pick_device
from .cli import Interrupted
from .rundir import RunDirectory, check_resume_config, interrupted_message


@dataclass
class TrainResult:
    checkpoint: Path | None  # run_dir/checkpoints/last (None on ranks > 0)
    policy: Policy
    step: int
    train_seconds: float  # wall time of this run plus that of the runs it resumed


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


def train(cfg: TrainRunConfig) -> TrainResult:
    """Train from a composed config (``core.config.compose("config", overrides)``)."""
    t_start = time.perf_counter()
    from diffusers.optimization import get_scheduler
    from diffusers.training_utils import EMAModel
    from torch.utils.tensorboard import SummaryWriter

    tcfg = cfg.train
    ddp = Distributed.from_env(cfg.device)
    run = RunDirectory(Path(cfg.run_dir), is_main=ddp.is_main)
    resume_from = run.claim(resume=cfg.resume, overwrite=cfg.overwrite)  # lock, clean up, or refuse
    ddp.barrier()
    if cfg.resume and not ddp.is_main:
        resume_from = newest_checkpoint(run.checkpoints)
    if resume_from is not None:
        check_resume_config(read_checkpoint_meta(resume_from)["cfg"], to_dict(cfg), resume_from, schema=cfg)
    if tcfg.num_threads:
        torch.set_num_threads(tcfg.num_threads)
    device = pick_device(cfg.device, ddp.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # the same initial weights on every rank; different augmentation and noise draws per rank
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)

    # effective (global) batch and learning rate, explicit whatever the process count
    if tcfg.scale_lr_with_world_size:
        per_rank_batch, lr = tcfg.batch_size, tcfg.lr * ddp.world_size
    else:
        if tcfg.batch_size % ddp.world_size:
            raise ValueError(f"train.batch_size ({tcfg.batch_size}) must be divisible by the {ddp.world_size} processes")
        per_rank_batch, lr = tcfg.batch_size // ddp.world_size, tcfg.lr

    # data: split by episode, statistics from the training episodes only
    pconfig = cfg.policy
    data = make_dataset(cfg.task, list(pconfig.input_shapes), tcfg.max_episodes)
    fingerprint = check_resume_data(resume_from, data)  # a resume refuses changed data
    train_eps, val_eps = split_episodes(data.num_episodes, tcfg.val_fraction, cfg.seed)
    window = dict(n_obs_steps=pconfig.n_obs_steps, horizon=pconfig.horizon, n_action_steps=pconfig.n_action_steps,
                  obs_steps=pconfig.window_obs_steps)
    obs_keys = list(pconfig.input_shapes)
    train_set = SequenceDataset(data, obs_keys, train_eps, **window)
    val_set = SequenceDataset(data, obs_keys, val_eps, **window) if len(val_eps) else None
    stats = compute_stats(data, pconfig.lowdim_keys + ["action"], train_eps)

    policy = make_policy(pconfig, stats).to(device)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=tcfg.weight_decay, betas=(0.95, 0.999))
    scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=tcfg.warmup_steps, num_training_steps=tcfg.steps)
    ema = EMAModel(policy.parameters(), decay=tcfg.ema_max_decay, use_ema_warmup=True, power=tcfg.ema_power) if tcfg.ema else None

    step = 0
    seconds_before = 0.0  # wall time of the runs this one resumes; checkpoints carry the running total
    if resume_from is not None:
        state = load_training_state(resume_from)
        seconds_before = float(state.get("train_seconds", 0.0))
        policy.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        for group in optimizer.param_groups:  # a resumed run may have a different process count
            group["initial_lr"] = lr
        scheduler.load_state_dict(state["scheduler"])
        scheduler.base_lrs = [lr for _ in scheduler.base_lrs]
        if ema is not None:
            ema.load_state_dict(state["ema"])
        set_rng_state(state["rng"])
        step = int(state["step"])
        if step >= tcfg.steps:
            raise ValueError(f"{resume_from} is already at step {step} and train.steps={tcfg.steps}: "
                             f"pass a larger train.steps= to train longer")
        if ddp.is_main:
            print(f"resumed {resume_from} at step {step}")
            saved_steps = read_checkpoint_meta(resume_from)["cfg"]["train"]["steps"]
            if saved_steps != tcfg.steps:
                # LambdaLR keeps only the step count: the new length reshapes the rest of the cosine
                print(f"train.steps {saved_steps} -> {tcfg.steps}: the cosine schedule now ends at step "
                      f"{tcfg.steps}, so the learning rate continues from {lr * scheduler.lr_lambdas[0](step):.3g}")
    if resume_from is None:
        torch.manual_seed(cfg.seed * 1000 + ddp.rank)  # weights are built: now per-rank crops and noise
    elif ddp.rank > 0:  # the checkpoint holds rank 0's stream; other ranks derive theirs from it
        torch.manual_seed(torch.initial_seed() + 7919 * ddp.rank + step)

    # the data order is a function of the step (and seed, rank): a resumed run draws the batches
    # the uninterrupted run would have drawn; each process takes its own shard of every epoch
    batch_sampler = StepBatchSampler(len(train_set), per_rank_batch, seed=cfg.seed, rank=ddp.rank,
                                     world_size=ddp.world_size, start_step=step)
    # a private generator: creating the iterator draws a worker seed, which must not shift the global
    # RNG stream (crops, noise) that checkpoints save and restore
    loader = torch.utils.data.DataLoader(train_set, batch_sampler=batch_sampler, num_workers=tcfg.num_workers,
                                         persistent_workers=tcfg.num_workers > 0, pin_memory=device.type == "cuda",
                                         generator=torch.Generator().manual_seed(cfg.seed))
    model = _LossModule(policy)
    if ddp.world_size > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if tcfg.precision == "bf16" else contextlib.nullcontext
    step_fn = torch.compile(model) if tcfg.compile else model
    cfg_dict = to_dict(cfg)

    def eval_weights() -> dict:
        if ema is None:
            return policy.state_dict()
        # EMA covers parameters; buffers (normalizer) come from the live model
        ema.store(policy.parameters())
        ema.copy_to(policy.parameters())
        sd = {k: v.detach().clone() for k, v in policy.state_dict().items()}
        ema.restore(policy.parameters())
        return sd

    def checkpoint(tag: str) -> Path:
        weights = eval_weights()
        if not (_all_finite(policy.parameters()) and _all_finite(weights.values())):
            good = newest_checkpoint(run.checkpoints)
            raise FloatingPointError(
                f"the weights became non-finite by step {step} (training diverged); nothing was written, "
                f"the last good checkpoint is {good or 'none'}; lower train.lr or raise train.warmup_steps")
        training_state = {
            "model": policy.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "ema": ema.state_dict() if ema is not None else {}, "rng": rng_state(), "step": step,
            "world_size": ddp.world_size, "train_seconds": seconds_before + time.perf_counter() - t_start,
            FINGERPRINT_KEY: fingerprint,
        }
        save_checkpoint(run.checkpoints / tag, policy, cfg_dict, training_state, weights)
        return save_checkpoint(run.checkpoints / "last", policy, cfg_dict, training_state, weights)

    writer = None
    run.start()  # every check has passed: overwrite=true deletes the old run now, then the .run marker is written
    if ddp.is_main:
        (run.path / "config.json").write_text(json.dumps(cfg_dict, indent=2))
        writer = SummaryWriter(str(run.path / "tb"))
        print(
            f"policy={pconfig.name} attention={pconfig.vit.attention.kind} "
            f"params={sum(p.numel() for p in policy.parameters()) / 1e6:.2f}M "
            f"episodes train/val={len(train_eps)}/{len(val_eps)} windows={len(train_set)} device={device} "
            f"processes={ddp.world_size} batch={per_rank_batch}x{ddp.world_size} lr={lr:g} run_dir={run.path}"
        )
    from tqdm import tqdm

    batches = iter(loader)
    bar = tqdm(total=tcfg.steps, initial=step, desc="train", dynamic_ncols=True, mininterval=2.0, disable=not ddp.is_main)
    t_last, n_last = time.perf_counter(), 0
    last = run.checkpoints / "last"
    policy.train()
    try:
        while step < tcfg.steps:
            batch = _to_device(next(batches), device)
            with autocast():
                loss, info = step_fn(batch)
            if not math.isfinite(info["loss"]):  # before the update: the weights are still the last good ones
                raise FloatingPointError(f"loss became {info['loss']} at step {step + 1}; lower train.lr or check the dataset")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), tcfg.grad_clip)
            optimizer.step()
            scheduler.step()
            if ema is not None:
                ema.step(policy.parameters())
            step += 1
            n_last += len(batch["action"]) * ddp.world_size
            if ddp.is_main and (step % tcfg.log_every == 0 or step == tcfg.steps):
                now = time.perf_counter()
                sps = n_last / (now - t_last)
                t_last, n_last = now, 0
                for key, value in (("train/loss", info["loss"]), ("train/grad_norm", float(grad_norm)),
                                   ("train/lr", scheduler.get_last_lr()[0]), ("train/samples_per_s", sps)):
                    writer.add_scalar(key, value, step)
                bar.set_postfix(loss=f"{info['loss']:.4f}", samples_s=f"{sps:.0f}")
            bar.update(1)
            if ddp.is_main and val_set is not None and (step % tcfg.val_every == 0 or step == tcfg.steps):
                writer.add_scalar("val/loss", validate(policy, val_set, per_rank_batch, device), step)
            if step % tcfg.checkpoint_every == 0 or step == tcfg.steps:
                if ddp.is_main:
                    last = checkpoint(f"step_{step:07d}")
                    _maybe_evaluate(cfg, step, last, run.path, writer, device)
                    policy.train()
                ddp.barrier()
    finally:
        bar.close()
        if writer is not None:
            writer.close()
        run.release()
    if ddp.is_main:
        print(f"last checkpoint: {last}")
    return TrainResult(last if ddp.is_main else None, policy, step, seconds_before + time.perf_counter() - t_start)


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
def validate(policy, dataset, batch_size: int, device, max_batches: int = 10) -> float:
    # a fixed subset and fixed noise keep validation comparable across steps
    was_training = policy.training
    policy.eval()
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))
    state = torch.get_rng_state()
    torch.manual_seed(0)
    losses = []
    for i, batch in enumerate(loader):
        if i >= max_batches:
            break
        losses.append(policy.compute_loss(_to_device(batch, device))[0].item())
    torch.set_rng_state(state)
    policy.train(was_training)
    return float(np.mean(losses))


def run(cfg: TrainRunConfig) -> TrainResult:
    """What ``train_policy.py`` does: train, then leave torchrun's process group."""
    import torch.distributed as dist

    try:
        return train(cfg)
    except KeyboardInterrupt:
        raise Interrupted(interrupted_message(cfg.run_dir)) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
