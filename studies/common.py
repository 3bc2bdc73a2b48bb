"""Shared machinery of the studies: cells, their training and evaluation jobs, result writing.

A cell is one training run identified by its config overrides; its directory name is a hash of
them, so every study reuses the checkpoints another study already trained (the robustness and
resolution studies evaluate the main comparison's checkpoints). A study is a list of jobs (a
``Cell`` to train, an ``Evaluation`` of a trained cell) that ``studies.engine`` hands to Hydra's
multirun launchers; each job skips what is already done: a cell whose newest checkpoint reached
``train.steps`` is not trained again, an interrupted one resumes from that checkpoint, and an
evaluation whose JSON exists (``<run_dir>/evals/<name>.json``) is not run again. The tables are
built from the run directories alone, so they can be written at any time from partial results.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from studies.stats import bootstrap_difference, bootstrap_rate, verdict

RESULTS = Path("results")
CELLS = RESULTS / "cells"  # checkpoints live here and stay out of git
BUDGET_NAME = "full"  # set by the CLI; tables merge rows only within one budget
COMMAND = ""  # the study's command line, set by the CLI

# Budgets: "small" fits a 2-core CPU machine; "full" is the protocol for a GPU. What a cell trains
# comes from the budget's recipe (configs/recipe/): the studies add only what they vary.
BUDGETS = {
    "small": {
        "recipe": "cpu",
        "seeds": [0],
        "episodes": 50,
        "corrupted_episodes": 30,  # per seed: each corruption (robustness) and each larger size (resolution)
        "workers": 2,
        "demos": [10, 25, 50],
        "policies": ["bc"],
        "attentions": ["full", "fibottention", "lookhere"],
    },
    "full": {
        "recipe": "paper",
        "seeds": [0, 1, 2],
        "episodes": 50,
        "workers": 8,
        "demos": [25, 50, 100, 200],
        "policies": ["bc", "diffusion"],
        "attentions": ["full", "fibottention", "lookhere"],
    },
}


def set_results(root) -> None:
    """Point the studies at another results root (its cells/ hold the run directories)."""
    global RESULTS, CELLS
    RESULTS = Path(root)
    CELLS = RESULTS / "cells"


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


@dataclass
class Cell:
    """One training run: the recipe's config for (task, policy, attention, seed), plus ``extra`` overrides."""

    task: str
    policy: str
    # "kind[:variant][:field=value...]": "lookhere:45" is a LookHere variant, "fibottention:windows=robot"
    # sets attention.windows; the label names the row in every table
    attention: str
    seed: int
    recipe: str = "cpu"
    extra: list[str] = field(default_factory=list)

    def overrides(self) -> list[str]:
        kind, *parts = self.attention.split(":")
        ovr = [f"task={self.task}", f"policy={self.policy}", f"attention={kind}", f"recipe={self.recipe}",
               f"seed={self.seed}", "eval.num_episodes=0"]
        return ovr + [f"attention.{p}" if "=" in p else f"attention.variant={p}" for p in parts] + list(self.extra)

    def config(self):
        """The composed training config, exactly as ``train_policy.py <overrides>`` builds it."""
        from hydra.core.global_hydra import GlobalHydra

        overrides = self.overrides() + [f"run_dir={self.run_dir}"]
        if GlobalHydra.instance().is_initialized():
            # inside a study job, itself a Hydra app on configs/: compose with the app's search path
            from hydra import compose as hydra_compose

            from core.config import register_configs, to_object

            register_configs()
            return to_object(hydra_compose(config_name="config", overrides=overrides))
        from core.config import compose

        return compose("config", overrides)

    @property
    def key(self) -> str:
        digest = hashlib.sha1(json.dumps(self.overrides()).encode()).hexdigest()[:10]
        label = "".join(c if c.isalnum() else "-" for c in self.attention.replace(":", "", 1)) if ":" in self.attention else self.attention
        return f"{self.task}_{self.policy}_{label}_s{self.seed}_{digest}"

    @property
    def run_dir(self) -> Path:
        return CELLS / self.key

    def to_json(self) -> dict:
        return asdict(self)

    def trained_step(self) -> int | None:
        """The step of the newest complete checkpoint, or None."""
        from policies.checkpoint import newest_checkpoint

        last = newest_checkpoint(self.run_dir / "checkpoints")
        return None if last is None else int(_saved_state(last)["step"])

    def finished(self, steps: int | None = None) -> bool:
        """Trained to ``train.steps`` (``steps``: that value, when the caller composed it already)."""
        step = self.trained_step()
        return step is not None and step >= (steps if steps is not None else self.config().train.steps)


def _saved_state(checkpoint: Path) -> dict:
    """The scalar entries of a checkpoint's training state (step, train_seconds), without its tensors."""
    return json.loads((Path(checkpoint) / "training_state.json").read_text())["__dict__"]


def train_cell(cell: Cell, log=print) -> Path | None:
    """Train (or resume, or skip) one cell; returns its newest checkpoint (None on torchrun ranks > 0)."""
    from dataclasses import replace

    from core.training import train
    from policies.checkpoint import newest_checkpoint

    cfg = cell.config()
    last = newest_checkpoint(cell.run_dir / "checkpoints")
    resume, timed = False, True
    if last is None and (cell.run_dir / "config.json").exists():
        # started and stopped before its first checkpoint: nothing to keep but its logs (the job's own
        # log file among them), so only the config that marks it as a run goes, and it starts again
        (cell.run_dir / "config.json").unlink()
        log(f"restarting {cell.key}: it stopped before its first checkpoint")
    if last is not None:
        state = _saved_state(last)
        if int(state["step"]) >= cfg.train.steps:
            return last
        resume = True
        timed = "train_seconds" in state  # checkpoints older than the running total give a partial time
        log(f"resuming {cell.key} at step {state['step']}")
    result = train(replace(cfg, resume=resume))
    if timed and result.checkpoint is not None:  # wall time summed over the interrupted run and its resumptions
        info = {"train_seconds": result.train_seconds, "overrides": cell.overrides(), "resumed": resume}
        (cell.run_dir / "train_info.json").write_text(json.dumps(info, indent=2))
    return result.checkpoint


@dataclass
class Evaluation:
    """One evaluation of a trained cell, cached as ``<run_dir>/evals/<name>.json``.

    Everything is plain data, so a job can be written down before the cell is trained: the
    settings ``options`` of ``core.evaluation.evaluate_checkpoint``, a ``corruption`` (kind,
    severity) of every camera the policy sees, and ``train_window``: Fibottention's widest window
    held at the one the cell trained with (``w_max`` = N // 3 of the training grid).
    """

    cell: Cell
    name: str
    options: dict = field(default_factory=dict)
    corruption: tuple | None = None
    train_window: bool = False

    @property
    def path(self) -> Path:
        return self.cell.run_dir / "evals" / f"{self.name}.json"

    def result(self) -> dict | None:
        return json.loads(self.path.read_text()) if self.path.exists() else None

    def to_json(self) -> dict:
        return {"cell": self.cell.to_json(), "name": self.name, "options": self.options,
                "corruption": list(self.corruption) if self.corruption else None, "train_window": self.train_window}

    @classmethod
    def from_json(cls, d: dict) -> "Evaluation":
        return cls(Cell(**d["cell"]), d["name"], dict(d["options"]), tuple(d["corruption"]) if d["corruption"] else None,
                   bool(d["train_window"]))

    def run(self, device="cpu") -> dict:
        """Evaluate (or return the cached summary); refuses a cell that has not finished training."""
        from core.evaluation import evaluate_checkpoint
        from policies.checkpoint import read_checkpoint_meta

        cached = self.result()
        if cached is not None:
            return cached
        step, steps = self.cell.trained_step(), self.cell.config().train.steps
        if step is None or step < steps:
            raise FileNotFoundError(f"cell {self.cell.key} is not trained (newest checkpoint: step {step}, train.steps={steps}): "
                                    f"train it first (python -m studies <study> ... trains before it evaluates)")
        kwargs = dict(self.options)
        if self.corruption:
            from envs.corruptions import obs_corruptor

            shapes = read_checkpoint_meta(self.cell.run_dir)["policy_config"]["input_shapes"]
            kind, severity = self.corruption
            kwargs["obs_transform"] = obs_corruptor([(kind, int(severity))], [k for k, s in shapes.items() if len(s) == 3])
        if self.train_window:
            kwargs["w_max"] = fib_train_window(self.cell)
        summary = evaluate_checkpoint(self.cell.run_dir, out_dir=None, num_videos=0, device=device, **kwargs)
        summary.pop("episodes", None)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(summary, indent=2))
        tmp.replace(self.path)
        return summary


def fib_train_window(cell: Cell) -> int:
    """Fibottention's default window of a trained cell: N // 3 of its training patch grid."""
    from policies.checkpoint import read_checkpoint_meta
    from policies.vision.masks import default_w_max

    vit = read_checkpoint_meta(cell.run_dir)["policy_config"]["vit"]
    if vit["attention"].get("w_max") is not None:
        return int(vit["attention"]["w_max"])
    return default_w_max(vit["base_grid"][0] * vit["base_grid"][1])


def load_eval(cell: Cell, name: str) -> dict | None:
    """A cell's cached evaluation ``name``, or None if it has not run (yet)."""
    return Evaluation(cell, name).result()


def train_seconds(cell: Cell) -> float | None:
    p = cell.run_dir / "train_info.json"
    return json.loads(p.read_text())["train_seconds"] if p.exists() else None


def outcomes_from_counts(counts: list[tuple[int, int]]) -> list[np.ndarray]:
    """(successes, episodes) per seed -> each seed's 0/1 episode outcomes (the bootstrap needs no order)."""
    return [np.r_[np.ones(int(k)), np.zeros(int(n) - int(k))] for k, n in counts]


def seed_outcomes(summaries: list[dict]) -> list[np.ndarray]:
    """Each evaluated seed's 0/1 episode outcomes, rebuilt from its summary's counts."""
    return outcomes_from_counts([(s["successes"], s["num_episodes"]) for s in summaries])


def pooled(summaries: list[dict | None]) -> dict | None:
    """Success over training seeds: the mean of the per-seed rates with a 95% interval from a bootstrap
    over seeds, then over each seed's episodes (``studies.stats``), so it widens when seeds disagree.

    Evaluations that have not run (None) are left out (``per_seed`` has one rate per seed that
    has one); with none at all, None.
    """
    summaries = [s for s in summaries if s is not None]
    if not summaries:
        return None
    est = bootstrap_rate(seed_outcomes(summaries))
    n = sum(s["num_episodes"] for s in summaries)
    out = {"successes": sum(s["successes"] for s in summaries), "episodes": n, "success_rate": est.mean,
           "ci95": [est.lo, est.hi], "seeds": est.seeds, "per_seed": [s["success_rate"] for s in summaries],
           "counts": [[s["successes"], s["num_episodes"]] for s in summaries]}  # (k, n) per seed: what studies.claims resamples
    if all("mean_max_coverage" in s for s in summaries):
        out["mean_max_coverage"] = sum(s["mean_max_coverage"] * s["num_episodes"] for s in summaries) / n
    return out


def difference(summaries: list[dict | None], baseline: list[dict | None]) -> dict | None:
    """Mean success of one method minus the baseline's (other trainings, so resampled independently),
    in points, with its 95% interval; None until both have an evaluated seed."""
    a, b = [s for s in summaries if s is not None], [s for s in baseline if s is not None]
    if not a or not b:
        return None
    d = bootstrap_difference(seed_outcomes(a), seed_outcomes(b))
    return {"diff": d.mean, "diff_ci95": [d.lo, d.hi], "verdict": verdict(d),
            "diff_text": f"{100 * d.mean:+.0f} [{100 * d.lo:+.0f}, {100 * d.hi:+.0f}]"}


def fmt_rate(p: dict) -> str:
    """``mean [95% CI] (per-seed rates)``."""
    lo, hi = p["ci95"]
    per_seed = "/".join(f"{100 * r:.0f}" for r in p["per_seed"])
    return f"{100 * p['success_rate']:.0f}% [{100 * lo:.0f}, {100 * hi:.0f}] ({per_seed})"


def merge_rows(old: list[dict], new: list[dict], keys: tuple[str, ...]) -> list[dict]:
    """Rows of earlier runs that this run did not redo, then this run's, sorted by ``keys``.

    A key missing from a row reads as "" (rows written before that key existed had no extra overrides).
    """
    redone = {tuple(r.get(k, "") for k in keys): r for r in new}
    kept = [r for r in old if tuple(r.get(k, "") for k in keys) not in redone]
    for r in old:  # a part of a study (--seeds 1) reports its own seeds only: say so where it replaces more
        again = redone.get(tuple(r.get(k, "") for k in keys))
        if again is not None and seed_count(again) < seed_count(r):
            print(f"note: the row {' '.join(str(again.get(k, '')) for k in keys if again.get(k, ''))} had {seed_count(r)} seeds "
                  f"and now has this run's {seed_count(again)}; `python -m studies report ...` with every --seeds pools them again")
    return sorted(kept + new, key=lambda r: tuple(str(r.get(k, "")) for k in keys))


def seed_count(row: dict) -> int:
    """Seeds behind a row: its per-seed rates (main, data efficiency) or its first condition's counts (robustness, resolution)."""
    return len(row.get("per_seed", [])) or len(next(iter(row.get("counts", {}).values()), []))


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
    if plot is not None and rows:  # partial results may have no row yet
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig = plot(plt, rows)
        # below the axes (bbox_inches="tight" grows the figure to fit), so it never overlaps the x labels
        fig.text(0.01, -0.02, f"{command}  @{meta['commit']}", fontsize=6, color="grey", va="top")
        fig.savefig(out / "plot.png", dpi=110, bbox_inches="tight")
        plt.close(fig)
    return out
