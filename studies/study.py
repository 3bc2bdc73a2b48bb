"""The experiment model (arms, variants, settings, studies: typed data) and the runner that hands a study to an engine.

A ``Study`` is a grid of cells, each ``python train_policy.py <overrides> run_dir=<cell>``, and settings, each
``python rollout.py checkpoint=<cell> <options> out_dir=<cell>/eval/<setting>``. ``run`` composes all of them first
(a mistake ends the study before anything starts), trains what has not reached ``train.steps`` (resuming from a
checkpoint), measures each trained cell's vision reliance, evaluates what no finished evaluation of these weights
answers (``core.eval_identity``), on joblib or submitit, and records every evaluation (``studies.records``).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from envs.shifts import Shift
from studies.records import PAPERS_SETTING

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Arm:
    """One encoder: ``id`` is how ``--arms`` and the claim rows name it, ``label`` how the tables do."""
    id: str
    label: str
    overrides: dict  # train_policy.py's: "attention" first, then its fields and any other override
    authors: bool = False  # †: a setting of the authors' code; a task's verdict leaves it out

    attention = property(lambda self: self.overrides["attention"])


@dataclass(frozen=True)
class Variant:
    """Training overrides crossed with a study's arms (a training fix, fewer demonstrations); ``+``-joined ids combine."""
    id: str
    label: str  # how the fix tables name it
    overrides: dict
    note: str = ""  # how a claim row names it when both sides carry it (default: the label)


@dataclass(frozen=True)
class Setting:
    """One evaluation of every cell: ``id`` names its folder (RUN/eval/ID) and ``--settings``; ``condition`` is what it
    changes at inference in the records' form ({"corruption": [[kind, severity]], "image_size": N, "attention": {...}})."""
    id: str
    label: str
    condition: dict = field(default_factory=dict)
    only: str | None = None  # the one arm id it applies to (an attention-specific option)

    def options(self, budget: Budget, cap: int | None) -> dict[str, str]:
        """rollout.py's options: clean episodes or shifted ones (capped at ``cap`` steps), then what it changes."""
        c, shifts = self.condition, [str(Shift(*s)) for s in self.condition.get("corruption", [])]
        out = {"num_episodes": budget.shifted_episodes if c else budget.episodes, "workers": budget.workers,
               **({"max_steps": cap} if c and cap else {}), **({"corruption": shifts[0] if len(shifts) == 1 else f"[{','.join(shifts)}]"} if shifts else {}),
               **{k: v for k, v in c.items() if k not in ("corruption", "attention")}, **c.get("attention", {})}
        return {k: str(v) for k, v in {**out, **budget.rollout_overrides}.items()}


@dataclass(frozen=True)
class Budget:
    recipe: str = "cpu"  # configs/recipe/<recipe>: every cell's settings beyond what the study varies
    seeds: tuple[int, ...] = (0, 1, 2)
    episodes: int = 50  # clean evaluation episodes per seed
    shifted_episodes: int = 30  # per seed under a corruption or at another image size
    workers: int = 2  # environment processes of one evaluation
    train_overrides: dict = field(default_factory=dict)  # added to every cell (the tests' tiny budget)
    rollout_overrides: dict = field(default_factory=dict)  # added to every evaluation


BUDGETS = {
    # 2 CPU cores, two jobs at a time: one torch thread per evaluation, as per training (recipe=cpu); torch's default
    # of one per core made a PushT episode beside a training 13x slower (10.6 s against 0.8 s per 96 steps)
    "cpu": Budget(rollout_overrides={"num_threads": "1"}),
    "paper": Budget(recipe="paper", workers=8),  # the papers' scale, for a GPU
    "tiny": Budget(recipe="none", seeds=(0,), episodes=1, shifted_episodes=1, workers=0,  # seconds, for the tests
                   train_overrides={"train.steps": "2", "train.batch_size": "4", "train.checkpoint_every": "2"},
                   rollout_overrides={"max_steps": "3"}),
}
PAPERS = Variant("papers", "papers' setting", {})  # the recipe's input in the papers' setting: nothing added


@dataclass(frozen=True)
class Study:
    name: str
    tasks: tuple[str, ...]
    policies: tuple[str, ...]
    arms: tuple[Arm, ...]
    settings: tuple[Setting, ...]
    variants: tuple[Variant, ...] = (PAPERS,)
    cap: int | None = None  # max_steps of a shifted setting's episodes (None: the task's horizon)
    shares: tuple[str, ...] = ()  # studies whose run directories are some of its cells: their records count here too

    def select(self, arms=None, variants=None, settings=None) -> Study:
        """The same study on fewer arms (by id), variants (by index) or settings (by id): a part of it run now.
        Its cells are the whole study's (same directories); an unknown name is one line."""
        def chosen(what: str, given, known: list):
            if unknown := [g for g in given or () if g not in known]:
                raise ValueError(f"study {self.name} has no {what} {', '.join(map(str, unknown))}: choose from "
                                 f"{', '.join(map(str, known))}")
            return given

        a, v, s = chosen("arm", arms, [a.id for a in self.arms]), chosen("variant", variants, list(range(len(self.variants)))), \
            chosen("setting", settings, [s.id for s in self.settings])
        return replace(self, arms=tuple(x for x in self.arms if a is None or x.id in a),
                       variants=tuple(x for i, x in enumerate(self.variants) if v is None or i in v),
                       settings=tuple(x for x in self.settings if s is None or x.id in s))

    def cells(self, budget: Budget, results: Path) -> list[Cell]:
        return [Cell(t, p, arm, s, budget.recipe, {**budget.train_overrides, **v.overrides}, Path(results).absolute())
                for t in self.tasks for p in self.policies for arm in self.arms for v in self.variants for s in budget.seeds]

    def rollout_options(self, budget: Budget, cell: Cell | None = None) -> dict[str, list[str]]:
        """Each setting's rollout.py options, the budget's last (for ``cell``: the settings that apply to its arm)."""
        return {s.id: [f"{k}={v}" for k, v in s.options(budget, self.cap).items()]
                for s in self.settings if cell is None or s.only in (None, cell.arm.id)}


@dataclass(frozen=True, eq=False)
class Cell:
    task: str
    policy: str
    arm: Arm
    seed: int
    recipe: str
    extra: dict = field(default_factory=dict)  # the budget's and the variant's overrides
    results: Path = Path("results")

    @property
    def overrides(self) -> dict:
        """``python train_policy.py``'s overrides, run_dir= aside (in the order earlier studies hashed them),
        then the papers' setting where the cell does not set those keys itself."""
        arm = self.arm.overrides
        out = {"task": self.task, "policy": self.policy, "attention": arm["attention"], "recipe": self.recipe,
               "seed": str(self.seed), "eval.num_episodes": "0", **{k: v for k, v in arm.items() if k.startswith("attention.")},
               **{k: v for k, v in arm.items() if k != "attention"}, **self.extra}
        return out | {k: v for k, v in PAPERS_SETTING.items() if k not in out}

    @property
    def args(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.overrides.items()]

    @property
    def run_dir(self) -> Path:
        """The cell's directory: an existing one with the same overrides' hash, else a new one under results/cells/.
        The papers' setting is not hashed: the cells trained before recipe=cpu jittered images are these."""
        hashed = [f"{k}={v}" for k, v in self.overrides.items() if PAPERS_SETTING.get(k) != v]
        digest = hashlib.sha1(json.dumps(hashed).encode()).hexdigest()[:10]
        found = [*sorted(self.results.glob(f"cells/*_s{self.seed}_{digest}")), *sorted(self.results.glob(f"*/cells/*_s{self.seed}_{digest}"))]
        encoder = self.arm.overrides.get("policy.encoder", self.arm.attention)  # resnet18 rather than its nominal attention
        return found[0] if found else self.results / "cells" / f"{self.task}_{self.policy}_{encoder}_s{self.seed}_{digest}"

    def trained_step(self) -> int:
        from policies.checkpoint import checkpoint_step, newest_checkpoint

        last = newest_checkpoint(self.run_dir / "checkpoints")
        return 0 if last is None else checkpoint_step(last)

    def progress(self, steps: int) -> str:
        """Where the cell stands against its ``steps`` (``show`` prints it): trained, resumable, running, not started."""
        if pid := training_pid(self.run_dir):
            return f"being trained by PID {pid}"
        if not self.run_dir.exists():
            return "no run directory"
        if not (step := self.trained_step()):
            return "no checkpoint: trains from the start"
        return f"trained, {step} steps" if step >= steps else f"resumes from step {step} of {steps}"

    def summary(self, setting: str) -> Path:
        return self.run_dir / "eval" / setting / "summary.json"

    def train_command(self) -> list[str]:
        """Resume from the newest complete checkpoint (``run`` restarts one stopped before its first)."""
        return [sys.executable, "train_policy.py", *self.args, f"run_dir={self.run_dir}", *["resume=true"] * (self.trained_step() > 0)]


def training_pid(run_dir: Path) -> str | None:
    """Who holds the run's lock (core.rundir: a training running now), or None: its PID as it wrote it."""
    if not (run_dir / ".lock").exists():
        return None
    with open(run_dir / ".lock") as lock:
        try:  # a shared lock for an instant: refused while a training holds its exclusive one
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return lock.read().strip() or "unknown"
        fcntl.flock(lock, fcntl.LOCK_UN)
    return None


def check(study: Study, budget: Budget, cells: list[Cell]) -> tuple[list, dict]:
    """Compose every cell and setting as the two commands would (one line on a mistake): each cell's training config,
    and each setting's rollout config."""
    from core.config import compose

    def composed(what: str, config: str, overrides: list[str]):
        try:
            return compose(config, overrides)
        except Exception as exc:  # Hydra's and the schemas' errors, each a user's mistake here
            raise ValueError(f"study {study.name}: `{what} {' '.join(overrides)}` does not compose: "
                             f"{str(exc).strip().splitlines()[0]}") from None

    rollouts = {name: composed("python rollout.py", "rollout", ["checkpoint=CELL", *opts]) for name, opts in study.rollout_options(budget).items()}
    return [composed("python train_policy.py", "config", c.args) for c in cells], rollouts


def _command(cmd: list[str], log: Path) -> int:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        return subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT).returncode


def launch(jobs: list[tuple[str, list[str], Path]], engine: str, n_jobs: int, slurm: dict, folder: Path) -> dict[str, str]:
    """Run (label, command, log) jobs; label -> what went wrong, with where to look, for those that failed."""
    if not jobs:
        return {}
    if engine == "joblib":
        from joblib import Parallel, delayed

        codes = Parallel(n_jobs=n_jobs)(delayed(_command)(cmd, log) for _, cmd, log in jobs)
        return {label: f"exit status {rc}, log {log}" for (label, _, log), rc in zip(jobs, codes) if rc != 0}
    import submitit

    executor = submitit.AutoExecutor(folder=folder, cluster=engine)
    executor.update_parameters(**slurm)
    submitted = [executor.submit(submitit.helpers.CommandFunction(cmd, cwd=str(REPO))) for _, cmd, _ in jobs]
    failed = {}
    for (label, _, _), job in zip(jobs, submitted):
        try:
            job.result()
        except Exception as exc:  # the command's failure, or the scheduler's: reported, the others go on
            failed[label] = f"{' '.join(str(exc).split())[:300]} (submitit log {job.paths.stderr})"
    return failed


def answered(summary: Path, wanted: dict) -> bool:
    """Whether ``summary`` is a finished evaluation answering ``wanted`` (the weights, step, shifts, cap and seeds)."""
    from core.eval_identity import NotComparable, check_done

    try:
        check_done(summary, wanted)
        return True
    except (NotComparable, OSError):
        return False


def reliance_measured(run_dir: Path) -> bool:
    """Whether RUN/eval/vision_reliance.json measured the newest checkpoint's weights (``core.run_info.reliance_of``)."""
    from core.eval_identity import weights_sha256
    from core.run_info import reliance_of
    from policies.checkpoint import resolve_checkpoint

    return reliance_of(run_dir, weights_sha256(resolve_checkpoint(run_dir))) is not None


def run(study: Study, budget: Budget, results: Path, engine: str = "joblib", n_jobs: int = 1, slurm: dict | None = None,
        log=print) -> list[str]:
    """Train, probe, evaluate, record; returns what failed (empty when everything finished). A cell that another process
    trains now is left to it, and a command that failed because another process did its work is no failure."""
    from core.evaluation import wanted_identity
    from policies.checkpoint import read_checkpoint_meta, resolve_checkpoint
    from studies.records import records_of_run, save

    cells, engine_args = study.cells(budget, results), (engine, n_jobs, slurm or {}, results / "cells" / ".submitit")
    configs, rollouts = check(study, budget, cells)
    steps = {c.run_dir: cfg.train.steps for c, cfg in zip(cells, configs)}
    busy = {c.run_dir: pid for c in cells if (pid := training_pid(c.run_dir))}
    todo = [c for c in cells if c.trained_step() < steps[c.run_dir] and c.run_dir not in busy]
    log(f"{study.name}: {len(cells)} cells, {len(cells) - len(todo) - len(busy)} trained already, {len(todo)} to train" +
        "".join(f"\n{study.name}: {d.name} is being trained by PID {pid}; rerun when it finishes" for d, pid in busy.items()))
    for c in (c for c in todo if not c.trained_step() and (c.run_dir / "config.json").exists()):
        (c.run_dir / "config.json").unlink()  # stopped before its first checkpoint: written by the run itself; logs stay
    jobs = {f"train {c.run_dir.name}": (c.train_command(), c.run_dir / "logs" / "train.log", c) for c in todo}
    failed = {label: why for label, why in launch([(k, cmd, log) for k, (cmd, log, _) in jobs.items()], *engine_args).items()
              if not (training_pid(jobs[label][2].run_dir) or jobs[label][2].trained_step() >= steps[jobs[label][2].run_dir])}
    trained = [c for c in cells if c.trained_step() >= steps[c.run_dir] and not training_pid(c.run_dir)]
    failed |= {f"evaluations of {c.run_dir.name}": "not run, its training did not finish" for c in todo if c not in trained}
    # does each policy look at its images? measured once per checkpoint, into the run, before its records are written
    probes = [(f"probe {c.run_dir.name}", [sys.executable, "-m", "probes.vision_reliance", str(c.run_dir), "--into-run"],
               c.run_dir / "logs" / "vision_reliance.log") for c in trained if not reliance_measured(c.run_dir)]
    failed |= launch(probes, *engine_args)
    evals = {}
    for c in trained:
        ckpt = resolve_checkpoint(c.run_dir)
        meta = read_checkpoint_meta(ckpt)
        for name, opts in study.rollout_options(budget, c).items():
            r = rollouts[name]
            wanted = wanted_identity(ckpt, meta, r.overrides(), seed=r.seed, num_episodes=r.num_episodes, max_steps=r.max_steps)
            evals[f"eval {c.run_dir.name} {name}"] = ([sys.executable, "rollout.py", f"checkpoint={c.run_dir}", *opts, "num_videos=0",
                                                     f"out_dir={c.summary(name).parent}", *["overwrite=true"] * c.summary(name).exists()],
                                                    c.run_dir / "logs" / f"eval_{name}.log", c.summary(name), wanted)
    todo_evals = [(label, cmd, log) for label, (cmd, log, summary, wanted) in evals.items() if not answered(summary, wanted)]
    log(f"{study.name}: {len(evals)} evaluations, {len(evals) - len(todo_evals)} cached, {len(todo_evals)} to run")
    failed |= {label: why for label, why in launch(todo_evals, *engine_args).items()
               if not answered(*evals[label][2:])}  # else another runner evaluated it meanwhile
    new = [r for c in trained for r in records_of_run(c.run_dir, budget.recipe, settings=list(study.rollout_options(budget, c)))]
    log(f"{study.name}: {save(results, study.name, new)} new or changed records in {results / study.name / 'records.jsonl'}")
    return [f"{label}: {why}" for label, why in failed.items()]
