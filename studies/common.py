"""Shared machinery of the studies: cached training/evaluation cells and result writing.

A cell is one training run identified by its config overrides; its directory name is a hash of
them, so every study reuses the checkpoints another study already trained (the robustness and
resolution studies evaluate the main comparison's checkpoints). A finished cell is skipped, an
interrupted one resumes from its last checkpoint, and each evaluation is cached as JSON.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

RESULTS = Path("results")
CELLS = RESULTS / "cells"  # checkpoints live here and stay out of git
BUDGET_NAME = "full"  # set by the CLI; tables merge rows only within one budget
COMMAND = ""  # the study's command line, set by the CLI

# Budgets: "small" fits a 2-core CPU machine; "full" is the protocol for a GPU.
BUDGETS = {
    "small": {
        "seeds": [0],
        "episodes": 50,
        "workers": 2,
        "steps": {"lift": {"bc": 4000, "diffusion": 4000}, "can": 15000, "pusht": 9000},
        "batch_size": 64,
        "demos": [10, 25, 50],
        "policies": ["bc"],
        "attentions": ["full", "fibottention", "lookhere"],
        # CPU recipe per task, one torch thread per process (two processes share the two cores).
        # Two observation steps for the low-dim state (velocities: is the gripper still closing, is
        # the arm rising?) but the camera only at the latest step, so the encoder costs one frame.
        # Lift sees only the agentview camera, as the calibration prototype did, and uncropped: with
        # a fixed camera a random 76/84 crop moves the cube by as much as the cube's own placement
        # range, and BC plateaued at 72-82% with it (100% without, same 4000 steps).
        "overrides": {
            "lift": ["~task.input_shapes.robot0_eye_in_hand_image", "policy.n_image_obs_steps=1", "train.num_threads=1",
                     "task.crop_size=84"],
            # Can with both cameras, uncropped: the agentview camera alone reached 16% after 6000 steps
            # (failures ran out the 400-step limit). 12-px patches give each camera 7x7 tokens, so two
            # cameras cost about what one did with 8-px patches (10x10).
            "can": ["policy.n_image_obs_steps=1", "train.num_threads=1", "task.crop_size=84", "policy.vit.patch_size=12"],
            # PushT: the whole 96x96 frame (the goal T is drawn at a fixed place) in 12-px patches, so
            # 64 tokens instead of 100 buy 9000 steps in the time 6000 would take.
            "pusht": ["policy.n_image_obs_steps=1", "train.num_threads=1", "task.crop_size=96", "policy.vit.patch_size=12"],
        },
    },
    "full": {
        "seeds": [0, 1, 2],
        "episodes": 50,
        "workers": 8,
        "steps": {"lift": 30000, "can": 60000, "pusht": 100000},
        "batch_size": 64,
        "demos": [25, 50, 100, 200],
        "policies": ["bc", "diffusion"],
        "attentions": ["full", "fibottention", "lookhere"],
    },
}


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


@dataclass
class Cell:
    task: str
    policy: str
    attention: str
    seed: int
    steps: int
    batch_size: int = 64
    extra: list[str] = field(default_factory=list)

    def overrides(self) -> list[str]:
        att = self.attention.split(":")  # "lookhere:45" selects a LookHere variant
        every = max(1, self.steps // 4)
        # a long cell checkpoints every 2000 steps, so an interruption loses little; the 2500 threshold
        # leaves the overrides (and so the cache keys) of the existing <= 10000-step cells unchanged
        if every > 2500:
            every = 2000
        ovr = [f"task={self.task}", f"policy={self.policy}", f"attention={att[0]}", f"seed={self.seed}",
               f"train.steps={self.steps}", f"train.batch_size={self.batch_size}",
               f"train.checkpoint_every={every}", f"train.val_every={max(1, self.steps // 10)}",
               "eval.num_episodes=0"]
        if len(att) > 1:
            ovr.append(f"attention.variant={att[1]}")
        return ovr + list(self.extra)

    @property
    def key(self) -> str:
        digest = hashlib.sha1(json.dumps(self.overrides()).encode()).hexdigest()[:10]
        return f"{self.task}_{self.policy}_{self.attention.replace(':', '')}_s{self.seed}_{digest}"

    @property
    def run_dir(self) -> Path:
        return CELLS / self.key


def train_cell(cell: Cell, log=print) -> Path:
    """Train (or resume, or skip) one cell; returns its last checkpoint."""
    from common.config import compose_config
    from policies.checkpoint import load_training_state
    from train_policy import train

    last = cell.run_dir / "checkpoints" / "last"
    resume, timed = False, True
    if (last / "training_state.json").exists():
        state = load_training_state(last)
        if int(state["step"]) >= cell.steps:
            return last
        resume = True
        timed = "train_seconds" in state  # checkpoints older than the running total give a partial time
        log(f"resuming {cell.key} at step {state['step']}")
    cfg = compose_config(cell.overrides() + [f"run_dir={cell.run_dir}", f"resume={str(resume).lower()}"])
    result = train(cfg)
    if timed:  # wall time summed over the interrupted run and its resumptions
        info = {"train_seconds": result.train_seconds, "overrides": cell.overrides(), "resumed": resume}
        (cell.run_dir / "train_info.json").write_text(json.dumps(info, indent=2))
    return result.checkpoint


def eval_cell(cell: Cell, name: str, **kwargs) -> dict:
    """Evaluate a trained cell once per (name, settings); cached in the cell's evals/ folder."""
    from rollout import evaluate_checkpoint

    path = cell.run_dir / "evals" / f"{name}.json"
    if path.exists():
        return json.loads(path.read_text())
    summary = evaluate_checkpoint(cell.run_dir / "checkpoints" / "last", out_dir=None, num_videos=0, **kwargs)
    summary.pop("episodes", None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2))
    return summary


def train_seconds(cell: Cell) -> float | None:
    p = cell.run_dir / "train_info.json"
    return json.loads(p.read_text())["train_seconds"] if p.exists() else None


def pooled(summaries: list[dict]) -> dict:
    """Pool episodes over training seeds: successes / episodes with a Wilson interval."""
    from rollout import wilson_interval

    n = sum(s["num_episodes"] for s in summaries)
    k = sum(s["successes"] for s in summaries)
    lo, hi = wilson_interval(k, n)
    out = {"successes": k, "episodes": n, "success_rate": k / n if n else 0.0, "ci95": [lo, hi],
           "per_seed": [s["success_rate"] for s in summaries]}
    if summaries and all("mean_max_coverage" in s for s in summaries):
        out["mean_max_coverage"] = sum(s["mean_max_coverage"] * s["num_episodes"] for s in summaries) / n
    return out


def fmt_rate(p: dict) -> str:
    lo, hi = p["ci95"]
    return f"{100 * p['success_rate']:.0f}% [{100 * lo:.0f}, {100 * hi:.0f}] ({p['successes']}/{p['episodes']})"


def merge_rows(old: list[dict], new: list[dict], keys: tuple[str, ...]) -> list[dict]:
    """Rows of earlier runs that this run did not redo, then this run's, sorted by ``keys``.

    A key missing from a row reads as "" (rows written before that key existed had no extra overrides).
    """
    redone = {tuple(r.get(k, "") for k in keys) for r in new}
    kept = [r for r in old if tuple(r.get(k, "") for k in keys) not in redone]
    return sorted(kept + new, key=lambda r: tuple(str(r.get(k, "")) for k in keys))


def write_results(study: str, rows: list[dict], columns: list[tuple[str, str]], *, title: str, notes: str = "",
                  plot=None, merge_on: tuple[str, ...] | None = None) -> Path:
    """results/<study>/{table.md, results.json, plot.png}, each naming the command and commit.

    With ``merge_on``, rows of earlier runs of the study on the same budget stay in the table unless
    this run redid them (same values of those keys); every row keeps the command that made it.
    """
    out = RESULTS / study
    out.mkdir(parents=True, exist_ok=True)
    command = COMMAND or " ".join(sys.argv)
    meta = {"study": study, "command": command, "commit": git_commit(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    rows = [{**r, "command": command, "commit": meta["commit"]} for r in rows]
    prev = out / "results.json"
    if merge_on:
        old = json.loads(prev.read_text()) if prev.exists() else {}
        rows = merge_rows(old.get("rows", []) if old.get("budget") == BUDGET_NAME else [], rows, merge_on)
    meta["budget"] = BUDGET_NAME
    tmp = out / ".results.json.tmp"
    tmp.write_text(json.dumps({**meta, "rows": rows}, indent=2, default=str))
    tmp.replace(out / "results.json")
    commands = sorted({r["command"] for r in rows})
    lines = [f"# {title}", "", *(f"Command: `{c}`  " for c in commands), f"Commit: `{meta['commit']}`, {meta['date']}", ""]
    if notes:
        lines += [notes, ""]
    lines.append("| " + " | ".join(h for _, h in columns) + " |")
    lines.append("|" + "---|" * len(columns))
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(k, "")) for k, _ in columns) + " |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    if plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig = plot(plt, rows)
        # below the axes (bbox_inches="tight" grows the figure to fit), so it never overlaps the x labels
        fig.text(0.01, -0.02, f"{command}  @{meta['commit']}", fontsize=6, color="grey", va="top")
        fig.savefig(out / "plot.png", dpi=110, bbox_inches="tight")
        plt.close(fig)
    return out
