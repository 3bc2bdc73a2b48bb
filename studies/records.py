"""Results as records: one line per evaluation of one training run, in ``results/<study>/records.jsonl``.

    python -m studies add STUDY RUN_DIR [RUN_DIR ...] [--recipe cpu]

A record is long-format data: which training (task, policy, attention, steps, the overrides that
make it differ from its recipe, seed), which evaluation condition, and what it scored (successes,
episodes, PushT's coverage). ``add`` reads a run's ``config.json`` and every ``eval/*/summary.json``
``rollout.py`` wrote into it, so any plain ``train_policy.py`` + ``rollout.py`` run becomes records;
the study runner adds its own the same way. A record replaces an earlier one of the same key (the
same training evaluated again under the same condition); nothing else is ever removed.
"""
from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from envs.factory import EVAL_SEED_START

# settings that do not change what a run learns (core.rundir.RESUMABLE's kind), and copies of others
NOT_EXTRA = ("seed", "run_dir", "resume", "overwrite", "device", "eval.", "train.steps", "train.log_every", "train.val_every",
             "train.checkpoint_every", "train.num_workers", "train.num_threads", "train.compile", "task.env", "task.fps",
             "policy.vit.attention.", "policy.input_shapes.", "policy.action_dim", "policy.crop_size", "policy.name")


@dataclass(frozen=True)
class Record:
    task: str
    policy: str
    attention: str  # the attention kind; its settings, like every other change to the recipe, are in ``extra``
    steps: int
    extra: str  # training overrides on top of the recipe, space-separated
    seed: int
    condition: str  # "clean", or the corruption ("brightness1"), size ("112px"), attention settings, seed, in that order
    successes: int
    episodes: int
    coverage: float | None = None  # PushT: mean over episodes of the best coverage reached
    train_seconds: float | None = None
    commit: str = ""

    @property
    def row(self) -> tuple:
        """What a table row pools over seeds: the training recipe and the condition."""
        return self.task, self.policy, self.attention, self.steps, self.extra, self.condition

    @property
    def key(self) -> tuple:
        return *self.row, self.seed


def path_of(results: Path, study: str) -> Path:
    return Path(results) / study / "records.jsonl"


def load(results: Path, study: str) -> list[Record]:
    path = path_of(results, study)
    lines = path.read_text().splitlines() if path.exists() else []
    return [Record(**json.loads(line)) for line in lines if line.strip()]


def save(results: Path, study: str, new: list[Record]) -> int:
    """Merge ``new`` into the study's records (by key) and write them sorted, by a rename; how many were new or changed."""
    old = {r.key: r for r in load(results, study)}
    changed = sum(old.get(r.key) != r for r in new)
    merged = {**old, **{r.key: r for r in new}}
    path = path_of(results, study)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(asdict(merged[k])) + "\n" for k in sorted(merged, key=lambda k: tuple(map(str, k)))))
    tmp.replace(path)
    return changed


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _value(v) -> str:
    return {True: "true", False: "false", None: "null"}.get(v, v) if isinstance(v, (bool, type(None))) else \
        json.dumps(v, separators=(",", ":")) if isinstance(v, list) else str(v)


def extra_overrides(cfg: dict, recipe: str) -> str:
    """The overrides that turn ``train_policy.py task=T policy=P attention=A recipe=R`` into this run's config."""
    from core.config import compose, to_dict

    base = _flat(to_dict(compose("config", [f"task={cfg['task']['name']}", f"policy={cfg['policy']['name']}",
                                            f"attention={cfg['attention']['kind']}", f"recipe={recipe}"])))
    run = _flat(cfg)
    keep = [k for k in [*run, *(k for k in base if k not in run)] if not k.startswith(NOT_EXTRA)]
    out = [f"~{k}" if k not in run else f"+{k}={_value(run[k])}" if k not in base else f"{k}={_value(run[k])}"
           for k in keep if run.get(k, ...) != base.get(k, ...)]
    return " ".join(out)


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def condition_of(summary: dict) -> str:
    """``clean``, or what the evaluation changed: corruption tag, image size, attention settings."""
    parts = [summary["corruption"]] if summary.get("corruption") else []
    parts += [f"{summary['image_size']}px"] if summary.get("image_size") else []
    parts += [f"{k}={_value(v)}" for k, v in sorted((summary.get("attention_overrides") or {}).items())]
    parts += [f"seed{summary['seed_start']}"] if summary.get("seed_start", EVAL_SEED_START) != EVAL_SEED_START else []
    return " ".join(parts) or "clean"


def records_of_run(run_dir: Path, recipe: str = "cpu", settings: list[str] | None = None) -> list[Record]:
    """One record per ``eval/*/summary.json`` of a training run directory (``settings``: only these eval folders)."""
    from policies.checkpoint import newest_checkpoint

    run_dir = Path(run_dir)
    if not (run_dir / "config.json").exists():
        raise FileNotFoundError(f"{run_dir} holds no config.json: give the run_dir= of a train_policy.py run")
    cfg = json.loads((run_dir / "config.json").read_text())
    last = newest_checkpoint(run_dir / "checkpoints")
    state = json.loads((last / "training_state.json").read_text())["__dict__"] if last else {}
    common = dict(task=cfg["task"]["name"], policy=cfg["policy"]["name"], attention=cfg["attention"]["kind"],
                  steps=int(cfg["train"]["steps"]), extra=extra_overrides(cfg, recipe), seed=int(cfg["seed"]),
                  train_seconds=state.get("train_seconds"), commit=git_commit())
    out = []
    paths = [run_dir / "eval" / n / "summary.json" for n in settings] if settings is not None else run_dir.glob("eval/*/summary.json")
    for summary_path in sorted(p for p in paths if p.exists()):
        s = json.loads(summary_path.read_text())
        out.append(Record(**common, condition=condition_of(s), successes=int(s["successes"]), episodes=int(s["num_episodes"]),
                          coverage=s.get("mean_max_coverage")))
    return out

