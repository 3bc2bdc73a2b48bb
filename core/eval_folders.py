"""Where an evaluation is written: <run>/eval/<checkpoint>_seed<seed>[_<option><value>...], one folder per
evaluation, so two evaluations that differ in any option never share (or overwrite) a folder."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from envs.corruptions import shift_tag
from policies.checkpoint import checkpoint_step

from .config import RolloutConfig


def default_out_dir(checkpoint: Path, seed: int, options: dict) -> Path:
    """<run>/eval/<checkpoint>_seed<seed>[_<option><value>...], the options sorted by name, unset ones left out.

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


def rollout_out_dir(cfg: RolloutConfig, checkpoint: Path) -> Path:
    """``rollout.py``'s folder when out_dir= is not given: named by every inference option set, the
    episode cap and count (corruptions by their tag, e.g. brightness1+blur2)."""
    inference = dataclasses.asdict(cfg.overrides())
    inference["corruption"] = shift_tag(cfg.corruption)
    return default_out_dir(checkpoint, cfg.seed, {**inference, "max_steps": cfg.max_steps, "n": cfg.num_episodes})
