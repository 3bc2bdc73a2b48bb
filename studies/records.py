"""Results as records: one line per evaluation of one training run, in ``results/<study>/records.jsonl``.

    python -m studies add STUDY RUN_DIR [RUN_DIR ...] [--recipe cpu]

``add`` reads a run's ``config.json`` and every ``eval/*/summary.json`` that ``rollout.py`` wrote into
it, so any plain ``train_policy.py`` + ``rollout.py`` run becomes records, as the study runner's do.
A record replaces one of the same key (the same training, re-evaluated under the same condition).
"""
from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from core.preflight import replace_file
from envs.factory import EVAL_SEED_START

# besides core.rundir.RESUMABLE (settings that do not change what a run learns): the seed, and copies of other settings
# and how the file is read (told from the path since the LeRobot reader; older runs name it)
# recipe=cpu jitters brightness and contrast in training since issue 31; the studies measure the papers'
# setting, which has none: its cells turn it off, and records name what differs from this setting
PAPERS_SETTING = ("policy.image_aug.brightness=0.0", "policy.image_aug.contrast=0.0")
NOT_EXTRA = ("seed", "policy.vit.attention.", "policy.input_shapes.", "policy.action_dim", "policy.crop_size", "policy.name",
             "task.dataset.format")


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

    key = property(lambda self: (*self.row, self.seed))  # one training, one condition

    def __post_init__(self):  # frozen: the one place the overrides' order is set
        object.__setattr__(self, "extra", canonical(self.extra))


def canonical(extra: str) -> str:
    """Overrides sorted by key: a run whose config lists its fields in another order (a dataclass
    reordered since) pools with the older runs of the same overrides."""
    return " ".join(sorted(extra.split(), key=lambda w: w.lstrip("+~")))


def load(results: Path, study: str) -> list[Record]:
    path = Path(results) / study / "records.jsonl"
    return [Record(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def save(results: Path, study: str, new: list[Record]) -> int:
    """Merge ``new`` in by key (one equal but for the commit keeps its commit); how many were new or changed."""
    old = {r.key: r for r in load(results, study)}
    changed = {r.key: r for r in new if r.key not in old or replace(old[r.key], commit=r.commit) != r}
    merged = {**old, **changed}
    (Path(results) / study).mkdir(parents=True, exist_ok=True)
    replace_file(Path(results) / study / "records.jsonl",
                 "".join(json.dumps(asdict(merged[k])) + "\n" for k in sorted(merged, key=lambda k: tuple(map(str, k)))))
    return len(changed)


def _value(v) -> str:
    return {True: "true", False: "false", None: "null"}.get(v, v) if isinstance(v, (bool, type(None))) else \
        json.dumps(v, separators=(",", ":")) if isinstance(v, list) else str(v)


def extra_overrides(cfg: dict, recipe: str) -> str:
    """The overrides that turn ``train_policy.py task=T policy=P attention=A recipe=R`` in the papers'
    setting (``PAPERS_SETTING``) into this run's config, compared in today's layout. A setting the run predates (a dataclass field, or an entry of a dict the
    run has not got) is not one of its overrides: it trained with what the code then did."""
    from core.config import compose, to_dict
    from core.rundir import NO_DEFAULT, RESUMABLE, field_default, flatten
    from policies.registry import get_policy_class

    schema = compose("config", [f"task={cfg['task']['name']}", f"policy={cfg['policy']['name']}",
                                f"attention={cfg['attention']['kind']}", f"recipe={recipe}", *PAPERS_SETTING])
    base = flatten(to_dict(schema))
    run = flatten({**cfg, "policy": get_policy_class(cfg["policy"]["name"]).config_class.upgrade(cfg["policy"])})
    removed = [k for k in base if k not in run and field_default(schema, k) is NO_DEFAULT
               and any(r.startswith(k.rsplit(".", 1)[0] + ".") for r in run)]  # an entry the user dropped from a dict
    keep = [k for k in [*run, *removed] if not k.startswith((*RESUMABLE, *NOT_EXTRA))]
    out = [f"~{k}" if k not in run else f"+{k}={_value(run[k])}" if k not in base else f"{k}={_value(run[k])}"
           for k in keep if run.get(k, ...) != base.get(k, ...)]
    return " ".join(out)


def condition_of(summary: dict) -> str:
    """``clean``, or what the evaluation changed: corruption tag, image size, attention settings, first seed."""
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
                  train_seconds=state.get("train_seconds"), commit=subprocess.run(  # the code that recorded it
                      ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent).stdout.strip())
    out = {}
    paths = [run_dir / "eval" / n / "summary.json" for n in settings] if settings is not None else run_dir.glob("eval/*/summary.json")
    for path in sorted(p for p in paths if p.exists()):
        s = json.loads(path.read_text())
        if condition_of(s) in out:  # two evaluations of one condition: which one to record is the user's choice
            raise ValueError(f"{out[condition_of(s)][0]} and {path.parent} both evaluate {run_dir} under condition {condition_of(s)!r}: "
                             f"move the one not to record out of {run_dir / 'eval'}")
        out[condition_of(s)] = (path.parent, Record(**common, condition=condition_of(s), successes=int(s["successes"]),
                                                    episodes=int(s["num_episodes"]), coverage=s.get("mean_max_coverage")))
    return [record for _, record in out.values()]

