"""Where an evaluation is written: <run>/eval/<checkpoint>_seed<seed>[_<option><value>...], one folder per
evaluation, so two evaluations that differ in any option never share (or overwrite) a folder."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from envs.shifts import shift_tag
from policies.checkpoint import checkpoint_step

from .config import RolloutConfig
from .preflight import check_output_dir
from .rundir import is_run, run_path

NAME_MAX = 255  # the longest folder name most filesystems take, where the filesystem does not say


def run_of(checkpoint) -> Path:
    """The folder an evaluation of ``checkpoint`` writes its eval/ in: the run of a checkpoint inside one
    (<run>/checkpoints/<tag>), else the folder beside a standalone checkpoint; never the checkpoint itself,
    which a resume replaces."""
    ckpt = Path(checkpoint)
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent


def check_eval_dir(out_dir, checkpoint) -> None:
    """Before any episode: ``out_dir`` can be written, is not inside a checkpoint folder (a resume replaces
    ``last`` and would take the evaluation with it), has no folder name the filesystem refuses, and, inside a
    run, reaches no symbolic link. One line each."""
    out = Path(out_dir)
    _check_name_length(out)
    check_output_dir(out, "out_dir")
    for folder in (out, *out.parents):
        if (folder / "model.safetensors").exists() or folder.name == "checkpoints" and is_run(folder.parent):
            raise ValueError(f"out_dir={out} is inside the checkpoint folder {folder}: a resumed training replaces "
                             f"it and the evaluation would go with it; write under {run_of(checkpoint) / 'eval'}")
    run = next((p for p in out.parents if is_run(p)), None)
    if run is not None:
        run_path(run, str(out.relative_to(run)))


def _check_name_length(out: Path) -> None:
    """A folder name longer than the filesystem takes is refused by name, before anything is asked of the disk."""
    longest = max(out.parts, key=lambda part: len(part.encode()))
    limit = NAME_MAX
    for folder in out.parents:
        try:
            if folder.is_dir():
                limit = os.pathconf(folder, "PC_NAME_MAX")
                break
        except (OSError, ValueError):
            continue
    if len(longest.encode()) > limit:
        raise ValueError(f"out_dir= has a folder name of {len(longest.encode())} bytes ({longest[:24]}...); the "
                         f"filesystem takes at most {limit}: give a shorter out_dir=")


def default_out_dir(checkpoint: Path, seed: int, options: dict) -> Path:
    """<run>/eval/<checkpoint>_seed<seed>[_<option><value>...], the options sorted by name, unset ones left out.

    A checkpoint inside a run (<run>/checkpoints/<tag>) evaluates into <run>/eval/; a standalone
    checkpoint directory into eval/ beside it.
    """
    ckpt = Path(checkpoint)
    root = run_of(ckpt)
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
