"""A study is data over the two commands; ``run`` hands them to an engine and records what they measured.

A ``Study`` is a grid of cells, each ``python train_policy.py <overrides> run_dir=<cell>``, and named
settings, each ``python rollout.py checkpoint=<cell> <options> out_dir=<cell>/eval/<setting>``.
``run`` composes all of them first (a mistake ends the study before anything starts), trains what
has not reached ``train.steps`` (resuming from a checkpoint), evaluates what has no summary.json,
on joblib or submitit, and records every evaluation (``studies.records``). docs/studies.md.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import subprocess
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from studies.records import PAPERS_SETTING

REPO = Path(__file__).resolve().parents[1]


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


@dataclass(frozen=True)
class Study:
    name: str
    tasks: tuple[str, ...]
    policies: tuple[str, ...]
    arms: tuple[dict, ...]  # one encoder each: {"attention": KIND, "attention.FIELD": VALUE, ..., other overrides}
    settings: dict[str, dict]  # name -> rollout.py options; "{episodes}", "{shifted_episodes}", "{workers}" from the budget
    variants: tuple[dict, ...] = ({},)  # more training overrides crossed with the grid (e.g. train.max_episodes: 10)
    only: dict[str, dict] = field(default_factory=dict)  # setting -> the one arm it applies to (an attention-specific option)
    # studies whose cells this one's comparisons reuse (the same run directories, or the baseline a fix is set against):
    # their records count here too, this study's first (studies.measure.study_records)
    shares: tuple[str, ...] = ()

    def select(self, arms: list[str] | None = None, variants: list[int] | None = None,
               settings: list[str] | None = None) -> Study:
        """The same study on fewer arms (by ``arm_name``), variants (by index) or settings (by name): a part of
        it run now. Its cells are the whole study's (same directories); an unknown name is one line."""
        def chosen(what: str, given, known: list):
            unknown = [g for g in given if g not in known]
            if unknown:
                raise ValueError(f"study {self.name} has no {what} {', '.join(map(str, unknown))}: choose from "
                                 f"{', '.join(map(str, known))}")
            return given

        names = [arm_name(a) for a in self.arms]
        return replace(
            self,
            arms=tuple(a for a in self.arms if arms is None or arm_name(a) in chosen("arm", arms, names)),
            variants=tuple(v for i, v in enumerate(self.variants)
                           if variants is None or i in chosen("variant", variants, list(range(len(self.variants))))),
            settings={k: v for k, v in self.settings.items() if settings is None or k in chosen("setting", settings, list(self.settings))})

    def cells(self, budget: Budget, results: Path) -> list[Cell]:
        return [Cell(t, p, arm, s, budget.recipe, {**budget.train_overrides, **v}, Path(results).absolute())
                for t in self.tasks for p in self.policies for arm in self.arms for v in self.variants for s in budget.seeds]

    def rollout_options(self, budget: Budget, cell: Cell | None = None) -> dict[str, list[str]]:
        """Each setting's rollout.py options, the budget's last (for ``cell``: the settings that apply to its arm)."""
        return {name: [f"{k}={v}" for k, v in {**{k: str(v).format(**asdict(budget)) for k, v in opts.items()},
                                                **budget.rollout_overrides}.items()]
                for name, opts in self.settings.items() if cell is None or self.only.get(name, cell.arm) == cell.arm}


def arm_name(arm: dict) -> str:
    """How the command line names an arm: its encoder or attention kind, then its attention fields
    (``fibottention:windows=robot``)."""
    fields = [f"{k.removeprefix('attention.')}={v}" for k, v in arm.items() if k.startswith("attention.")]
    return ":".join([arm.get("policy.encoder", arm["attention"]), *fields])


@dataclass(frozen=True, eq=False)
class Cell:
    task: str
    policy: str
    arm: dict  # {"attention": KIND, ...}: the encoder's overrides
    seed: int
    recipe: str
    extra: dict = field(default_factory=dict)  # the budget's and the variant's overrides
    results: Path = Path("results")

    @property
    def overrides(self) -> dict:
        """``python train_policy.py``'s overrides, run_dir= aside (in the order earlier studies hashed them),
        then the papers' setting where the cell does not set those keys itself."""
        attn = {k: v for k, v in self.arm.items() if k.startswith("attention.")}
        out = {"task": self.task, "policy": self.policy, "attention": self.arm["attention"], "recipe": self.recipe,
               "seed": str(self.seed), "eval.num_episodes": "0", **attn, **{k: v for k, v in self.arm.items() if k != "attention"},
               **self.extra}
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
        encoder = self.arm.get("policy.encoder", self.arm["attention"])  # resnet18 rather than its nominal attention
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
        """Where the setting's rollouts write their summary.json (its evaluation is done once it exists)."""
        return self.run_dir / "eval" / setting / "summary.json"

    def train_command(self) -> list[str]:
        """Resume from the newest complete checkpoint (``run`` restarts one stopped before its first)."""
        resume = ["resume=true"] * (self.trained_step() > 0)
        return [sys.executable, "train_policy.py", *self.args, f"run_dir={self.run_dir}", *resume]


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


def check(study: Study, budget: Budget, cells: list[Cell]) -> list:
    """Compose every cell and setting as the two commands would (one line on a mistake); each cell's training config."""
    from core.config import compose

    def composed(what: str, config: str, overrides: list[str]):
        try:
            return compose(config, overrides)
        except Exception as exc:  # Hydra's and the schemas' errors, each a user's mistake here
            raise ValueError(f"study {study.name}: `{what} {' '.join(overrides)}` does not compose: "
                             f"{str(exc).strip().splitlines()[0]}") from None

    for options in study.rollout_options(budget).values():
        composed("python rollout.py", "rollout", ["checkpoint=CELL", *options])
    return [composed("python train_policy.py", "config", c.args) for c in cells]


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


def run(study: Study, budget: Budget, results: Path, engine: str = "joblib", n_jobs: int = 1, slurm: dict | None = None,
        log=print) -> list[str]:
    """Train, evaluate, record; returns what failed (empty when everything finished). A cell that another process
    trains now is left to it, and a command that failed because another process did its work is no failure."""
    from studies.records import records_of_run, save

    cells = study.cells(budget, results)
    steps = {c.run_dir: cfg.train.steps for c, cfg in zip(cells, check(study, budget, cells))}
    busy = {c.run_dir: pid for c in cells if (pid := training_pid(c.run_dir))}
    todo = [c for c in cells if c.trained_step() < steps[c.run_dir] and c.run_dir not in busy]
    log(f"{study.name}: {len(cells)} cells, {len(cells) - len(todo) - len(busy)} trained already, {len(todo)} to train" +
        "".join(f"\n{study.name}: {d.name} is being trained by PID {pid}; rerun when it finishes" for d, pid in busy.items()))
    for c in (c for c in todo if not c.trained_step() and (c.run_dir / "config.json").exists()):
        (c.run_dir / "config.json").unlink()  # stopped before its first checkpoint: written by the run itself; logs stay
    jobs = {f"train {c.run_dir.name}": (c.train_command(), c.run_dir / "logs" / "train.log", c) for c in todo}
    failed = {label: why for label, why in launch([(k, cmd, log) for k, (cmd, log, _) in jobs.items()], engine, n_jobs, slurm or {},
                                                  results / "cells" / ".submitit").items()
              if not (training_pid(jobs[label][2].run_dir) or jobs[label][2].trained_step() >= steps[jobs[label][2].run_dir])}
    trained = [c for c in cells if c.trained_step() >= steps[c.run_dir] and not training_pid(c.run_dir)]
    failed |= {f"evaluations of {c.run_dir.name}": "not run, its training did not finish" for c in todo if c not in trained}
    evals = {f"eval {c.run_dir.name} {name}": ([sys.executable, "rollout.py", f"checkpoint={c.run_dir}", *opts, "num_videos=0",
                                               f"out_dir={c.summary(name).parent}"], c.run_dir / "logs" / f"eval_{name}.log",
                                              c.summary(name))
             for c in trained for name, opts in study.rollout_options(budget, c).items()}
    todo_evals = [(label, cmd, log) for label, (cmd, log, summary) in evals.items() if not summary.exists()]
    log(f"{study.name}: {len(evals)} evaluations, {len(evals) - len(todo_evals)} cached, {len(todo_evals)} to run")
    failed |= {label: why for label, why in launch(todo_evals, engine, n_jobs, slurm or {}, results / "cells" / ".submitit").items()
               if not evals[label][2].exists()}  # else another runner evaluated it meanwhile
    new = [r for c in trained for r in records_of_run(c.run_dir, budget.recipe, settings=list(study.rollout_options(budget, c)))]
    log(f"{study.name}: {save(results, study.name, new)} new or changed records in {results / study.name / 'records.jsonl'}")
    return [f"{label}: {why}" for label, why in failed.items()]
