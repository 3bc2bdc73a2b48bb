"""Results as records: one line per measurement of one training run, in ``results/<study>/records.jsonl``.

    python -m studies add STUDY RUN_DIR [RUN_DIR ...] [--recipe cpu]

``add`` reads a run's ``config.json`` (what was trained) and every ``eval/*/summary.json`` that ``rollout.py``
wrote into it (what was evaluated: the checkpoint's step, the episode cap and the evaluation's identity come
from the summary, never from the config), so any plain ``train_policy.py`` + ``rollout.py`` run becomes
records, as the study runner's do. A record set holding one evaluation twice is refused, never counted twice. Overrides
and condition are mappings, never words to parse; numbers are numbers. ``reliance`` comes from the run's
``eval/vision_reliance.json`` (``python -m probes.vision_reliance RUN --into-run``) for evaluations of the same weights.
A record replaces one of the same key (the same training, measured again under the same condition).
"""
from __future__ import annotations

import fcntl
import json
import subprocess
from dataclasses import dataclass, fields, replace
from pathlib import Path

from core.preflight import replace_file
from core.rundir import run_path
from core.run_info import condition_of, evaluation_fields, machine_text, reliance_of, run_config, trained_on, value_text

# recipe=cpu jitters brightness and contrast in training since issue 31; the studies measure the papers'
# setting, which has none: its cells turn it off, and records name what differs from this setting
PAPERS_SETTING = {"policy.image_aug.brightness": "0.0", "policy.image_aug.contrast": "0.0"}
# besides core.rundir.RESUMABLE (settings that do not change what a run learns): the seed, and copies of other settings
# and how the file is read (told from the path since the LeRobot reader; older runs name it)
NOT_EXTRA = ("seed", "policy.vit.attention.", "policy.input_shapes.", "policy.action_dim", "policy.crop_size", "policy.name",
             "task.dataset.format")
LOCK_NAME = ".records.lock"  # beside records.jsonl, held while one process merges its records in (git ignores it)
OPTIONAL = ("measure", "value", "detail", "provenance", "machine", "max_steps", "evaluation", "reliance")  # written only where set


@dataclass(frozen=True)
class Record:
    task: str
    policy: str
    attention: str  # the attention kind; its settings, like every other change to the recipe, are in ``overrides``
    steps: int
    overrides: dict  # training overrides on top of the recipe's papers' setting: "key", "+key" -> value text, "~key" -> None
    seed: int
    condition: dict  # inference options changed: corruption [[kind, severity], ...], image_size, attention {...}, seed_start
    successes: int = 0
    episodes: int = 0
    coverage: float | None = None  # PushT: mean over episodes of the best coverage reached
    train_seconds: float | None = None
    commit: str = ""
    measure: str = "success"  # per episode (0/1); or per seed: "coverage", "head_diversity" (in ``value``)
    value: float | None = None
    detail: dict | None = None  # e.g. head diversity per layer
    provenance: str = ""  # how a record not written by today's commands was measured
    machine: str = ""  # where it was trained and evaluated (CPU, torch's kernels): the same seed differs across them
    max_steps: int | None = None  # the episode cap the evaluation ran under (older records: not recorded)
    evaluation: str = ""  # the evaluation's identity, hashed (core.eval_identity): one evaluation, one record
    reliance: float | None = None  # probes.vision_reliance on the evaluated weights: 0 = the policy ignores its images

    def __post_init__(self):  # frozen: the one place the overrides' order and the condition's form are set
        for name in ("successes", "episodes", "steps", "seed"):
            if not isinstance(getattr(self, name), int) or isinstance(getattr(self, name), bool) or getattr(self, name) < 0:
                raise ValueError(f"{name} {getattr(self, name)!r} is not a count")
        if self.successes > self.episodes:
            raise ValueError(f"{self.successes} successes of {self.episodes} episodes")
        object.__setattr__(self, "overrides", dict(sorted(self.overrides.items(), key=lambda kv: kv[0].lstrip("+~"))))
        object.__setattr__(self, "condition", json.loads(json.dumps(self.condition, sort_keys=True)))

    @property
    def row(self) -> tuple:
        """What a table row pools over seeds: the training recipe, the condition and the measure."""
        return (self.task, self.policy, self.attention, self.steps, json.dumps(self.overrides), json.dumps(self.condition),
                self.measure)

    key = property(lambda self: (*self.row, self.seed))  # one training, one condition

    def seed_value(self) -> float:
        """The seed's one value of a per-seed measure (coverage, head diversity)."""
        return self.coverage if self.measure == "coverage" else self.value


def canonical(overrides: dict) -> dict:
    """Overrides as a comparison sees them: "+key" is "key" (adding a key the recipe lacks), "~key" and "key=null"
    are both None (a key deleted), numbers as numbers, and ``train.steps`` aside (a record names its steps itself)."""
    return {k.lstrip("+~"): None if k.startswith("~") or v == "null" else _number(v) for k, v in overrides.items() if k != "train.steps"}


def _number(value):
    """A number typed as "3" on the command line is the "3.0" a run's config gives back: compared as a float."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def overrides_text(overrides: dict) -> str:
    """The overrides as they are typed on the command line (tables show them so)."""
    return " ".join(k if v is None else f"{k}={v}" for k, v in overrides.items())


CONDITION_ORDER = ("corruption", "image_size", "attention", "seed_start")  # as the tables name them; other options after


def condition_text(condition: dict, sep: str = "") -> str:
    """``clean``, or the condition as the tables name it: corruption kind and severity (``sep`` between them),
    image size, attention settings, first evaluation seed, in that order."""
    parts = ["+".join(f"{k}{sep}{s}" for k, s in condition.get("corruption", []))] if condition.get("corruption") else []
    parts += [f"{condition['image_size']}px"] if "image_size" in condition else []
    parts += [f"{k}={value_text(v)}" for k, v in sorted(condition.get("attention", {}).items())]
    parts += [f"{k}={value_text(v)}" for k, v in sorted(condition.items()) if k not in CONDITION_ORDER]
    parts += [f"seed{condition['seed_start']}"] if "seed_start" in condition else []
    return " ".join(parts) or "clean"


def load(results: Path, study: str) -> list[Record]:
    """The study's records; a line that is not one, or one that repeats another line's measurement (the same
    key, or the same evaluation), ends in one line naming the file and the lines."""
    path = Path(results) / study / "records.jsonl"
    out, seen = [], {}
    for n, line in enumerate(path.read_text().splitlines() if path.exists() else [], 1):
        try:
            record = Record(**json.loads(line)) if line.strip() else None
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"{path} line {n} is not a record ({' '.join(str(exc).split())[:120]}): "
                             f"restore it from version control or delete that line") from None
        for same in filter(None, (record and ("key", record.key), record and record.evaluation and ("evaluation", record.evaluation))):
            if same in seen:
                what = "the same evaluation" if same[0] == "evaluation" else "the same training under the same condition"
                raise ValueError(f"{path} lines {seen[same]} and {n} record {what} twice; it would be counted twice: "
                                 f"delete one of the two lines")
            seen[same] = n
        out += [record] if record else []
    return out


def save(results: Path, study: str, new: list[Record]) -> int:
    """Merge ``new`` in by key (one equal but for the commit keeps its commit); how many were new or changed.
    Two study runs of one study (two cells side by side) save in turn: the read and the write hold one lock."""
    folder = Path(results) / study
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK_NAME, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        old = {r.key: r for r in load(results, study)}
        changed = {r.key: r for r in new if r.key not in old or replace(old[r.key], commit=r.commit) != r}
        merged = {**old, **changed}
        replace_file(folder / "records.jsonl",
                     "".join(json.dumps(_line(merged[k])) + "\n" for k in sorted(merged, key=lambda k: tuple(map(str, k)))))
    return len(changed)


def _line(record: Record) -> dict:
    return {f.name: getattr(record, f.name) for f in fields(Record) if f.name not in OPTIONAL or getattr(record, f.name) != f.default}


def extra_overrides(cfg: dict, recipe: str) -> dict:
    """The overrides that turn ``train_policy.py task=T policy=P attention=A recipe=R`` in the papers'
    setting (``PAPERS_SETTING``) into this run's config, compared in today's layout. A setting the run predates (a dataclass field, or an entry of a dict the
    run has not got) is not one of its overrides: it trained with what the code then did."""
    from core.config import compose, to_dict
    from core.rundir import NO_DEFAULT, RESUMABLE, field_default, flatten
    from policies.registry import get_policy_class

    schema = compose("config", [f"task={cfg['task']['name']}", f"policy={cfg['policy']['name']}",
                                f"attention={cfg['attention']['kind']}", f"recipe={recipe}", *(f"{k}={v}" for k, v in PAPERS_SETTING.items())])
    base = flatten(to_dict(schema))
    run = flatten({**cfg, "policy": get_policy_class(cfg["policy"]["name"]).config_class.upgrade(cfg["policy"])})
    removed = [k for k in base if k not in run and field_default(schema, k) is NO_DEFAULT
               and any(r.startswith(k.rsplit(".", 1)[0] + ".") for r in run)]  # an entry the user dropped from a dict
    keep = [k for k in [*run, *removed] if not k.startswith((*RESUMABLE, *NOT_EXTRA))]
    return dict((f"~{k}", None) if k not in run else (f"+{k}" if k not in base else k, value_text(run[k]))
                for k in keep if run.get(k, ...) != base.get(k, ...))


def training_fields(cfg: dict, recipe: str) -> dict:
    """What names one training in a record, from its config: task, policy, attention, steps, overrides, seed."""
    return dict(task=cfg["task"]["name"], policy=cfg["policy"]["name"], attention=cfg["attention"]["kind"],
                steps=int(cfg["train"]["steps"]), overrides=extra_overrides(cfg, recipe), seed=int(cfg["seed"]))


def records_of_training(records: list[Record], cfg: dict, recipe: str) -> list[Record]:
    """The records of the training that ``cfg`` configures, found without its run directory."""
    named = training_fields(cfg, recipe)
    return [r for r in records if all(getattr(r, k) == v for k, v in named.items())]


def run_fields(run_dir: Path, recipe: str) -> dict:
    """What every record of a training run shares: ``training_fields`` (but ``steps``, which each evaluation
    names: ``evaluation_fields``), then its minutes and the commit."""
    from policies.checkpoint import newest_checkpoint

    last = newest_checkpoint(run_path(run_dir, "checkpoints"))
    state = json.loads((last / "training_state.json").read_text())["__dict__"] if last else {}
    return dict(**training_fields(run_config(run_dir), recipe),
                train_seconds=state.get("train_seconds"), commit=subprocess.run(  # the code that recorded it
                    ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent).stdout.strip())


def records_of_run(run_dir: Path, recipe: str = "cpu", settings: list[str] | None = None) -> list[Record]:
    """One record per ``eval/*/summary.json`` of a training run directory (``settings``: only these eval folders)."""
    from core.eval_identity import NotComparable, read_summary

    run_dir = Path(run_dir)
    cfg = run_config(run_dir)
    common = {k: v for k, v in run_fields(run_dir, recipe).items() if k != "steps"}
    trained = trained_on(run_dir)  # read once: every evaluation of the run shares it
    out = {}
    names = settings if settings is not None else [p.parent.name for p in run_path(run_dir, "eval").glob("*/summary.json")]
    for path in sorted(p for p in (run_path(run_dir, "eval", n, "summary.json") for n in names) if p.exists()):
        try:
            s = read_summary(path)
        except NotComparable as exc:
            raise ValueError(f"{exc}: evaluate it again before recording it") from None
        evaluated = evaluation_fields(s, path, cfg)
        evaluated["reliance"] = reliance_of(run_dir, s["identity"]["weights_sha256"])
        try:
            record = Record(**common, **evaluated, condition=condition_of(s), successes=s["successes"],
                            episodes=s["num_episodes"], coverage=s.get("mean_max_coverage"), machine=machine_text(trained, s))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path} is not a summary rollout.py wrote ({' '.join(str(exc).split())[:100]}): "
                             f"evaluate it again before recording it") from None
        if record.key in out:  # two evaluations of one condition: which one to record is the user's choice
            raise ValueError(f"{out[record.key][0]} and {path.parent} both evaluate {run_dir} under condition "
                             f"{condition_text(record.condition)!r}: move the one not to record out of {run_dir / 'eval'}")
        out[record.key] = (path.parent, record)
    return [record for _, record in out.values()]
