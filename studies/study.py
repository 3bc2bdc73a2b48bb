"""A study is data over the two commands; ``run`` hands them to an engine and records what they measured.

A ``Study`` is a grid of cells, each ``python train_policy.py <overrides> run_dir=<cell>``, and named
settings, each ``python rollout.py checkpoint=<cell> <options> out_dir=<cell>/eval/<setting>``.
``run`` composes all of them first (a mistake ends the study before anything starts), trains what
has not reached ``train.steps`` (resuming from a checkpoint), evaluates what has no summary.json,
on joblib or submitit, and records every evaluation (``studies.records``). docs/studies.md.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import asdict, dataclass, field
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
    train_overrides: tuple[str, ...] = ()  # added to every cell (the tests' tiny budget)
    rollout_overrides: tuple[str, ...] = ()  # added to every evaluation


BUDGETS = {
    "cpu": Budget(),  # a 2-core CPU machine
    "paper": Budget(recipe="paper", workers=8),  # the papers' scale, for a GPU
    "tiny": Budget(recipe="none", seeds=(0,), episodes=1, shifted_episodes=1, workers=0,  # seconds, for the tests
                   train_overrides=("train.steps=2", "train.batch_size=4", "train.checkpoint_every=2"),
                   rollout_overrides=("max_steps=3",)),
}


@dataclass(frozen=True)
class Study:
    name: str
    tasks: tuple[str, ...]
    policies: tuple[str, ...]
    arms: tuple[str, ...]  # one encoder each: "attention=KIND [attention.FIELD=VALUE ...] [other overrides]"
    settings: dict[str, str]  # name -> rollout.py options; {episodes}, {shifted_episodes}, {workers} from the budget
    variants: tuple[str, ...] = ("",)  # more training overrides crossed with the grid (e.g. train.max_episodes=10)
    only: dict[str, str] = field(default_factory=dict)  # setting -> the one arm it applies to (an attention-specific option)

    def cells(self, budget: Budget, results: Path) -> list[Cell]:
        return [Cell(t, p, arm, s, budget.recipe, (*budget.train_overrides, *v.split()), Path(results).absolute())
                for t in self.tasks for p in self.policies for arm in self.arms for v in self.variants for s in budget.seeds]

    def rollout_options(self, budget: Budget, cell: Cell | None = None) -> dict[str, list[str]]:
        """Each setting's rollout.py options, the budget's last (for ``cell``: the settings that apply to its arm)."""
        return {name: [f"{k}={v}" for k, v in dict(o.split("=", 1) for o in [*opts.format(**asdict(budget)).split(),
                                                                             *budget.rollout_overrides]).items()]
                for name, opts in self.settings.items() if cell is None or self.only.get(name, cell.arm) == cell.arm}


@dataclass(frozen=True)
class Cell:
    task: str
    policy: str
    arm: str
    seed: int
    recipe: str
    extra: tuple[str, ...] = ()
    results: Path = field(default=Path("results"), compare=False)

    @property
    def overrides(self) -> list[str]:
        """``python train_policy.py`` arguments, run_dir= aside (in the order earlier studies hashed them),
        then the papers' setting where the cell does not set those keys itself."""
        kind, *rest = self.arm.split()
        attn = [o for o in rest if o.startswith("attention.")]
        out = [f"task={self.task}", f"policy={self.policy}", kind, f"recipe={self.recipe}", f"seed={self.seed}",
               "eval.num_episodes=0", *attn, *(o for o in rest if o not in attn), *self.extra]
        return out + [o for o in PAPERS_SETTING if not any(x.startswith(o.split("=")[0] + "=") for x in out)]

    @property
    def run_dir(self) -> Path:
        """The cell's directory: an existing one with the same overrides' hash, else a new one under results/cells/.
        The papers' setting is not hashed: the cells trained before recipe=cpu jittered images are these."""
        digest = hashlib.sha1(json.dumps([o for o in self.overrides if o not in PAPERS_SETTING]).encode()).hexdigest()[:10]
        found = [*sorted(self.results.glob(f"cells/*_s{self.seed}_{digest}")), *sorted(self.results.glob(f"*/cells/*_s{self.seed}_{digest}"))]
        kind = self.arm.split()[0].removeprefix("attention=")
        return found[0] if found else self.results / "cells" / f"{self.task}_{self.policy}_{kind}_s{self.seed}_{digest}"

    def trained_step(self) -> int:
        from policies.checkpoint import checkpoint_step, newest_checkpoint

        last = newest_checkpoint(self.run_dir / "checkpoints")
        return 0 if last is None else checkpoint_step(last)

    def train_command(self) -> list[str]:
        """Resume from the newest complete checkpoint (``run`` restarts one stopped before its first)."""
        resume = ["resume=true"] * (self.trained_step() > 0)
        return [sys.executable, "train_policy.py", *self.overrides, f"run_dir={self.run_dir}", *resume]


def check(study: Study, budget: Budget, cells: list[Cell]) -> dict[Cell, int]:
    """Compose every cell and setting as the two commands would (one line on a mistake); each cell's train.steps."""
    from core.config import compose

    def composed(what: str, config: str, overrides: list[str]):
        try:
            return compose(config, overrides)
        except Exception as exc:  # Hydra's and the schemas' errors, each a user's mistake here
            raise ValueError(f"study {study.name}: `{what} {' '.join(overrides)}` does not compose: "
                             f"{str(exc).strip().splitlines()[0]}") from None

    for options in study.rollout_options(budget).values():
        composed("python rollout.py", "rollout", ["checkpoint=CELL", *options])
    return {c: composed("python train_policy.py", "config", c.overrides).train.steps for c in cells}


def _command(cmd: list[str], log: Path) -> int:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        return subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT).returncode


def launch(jobs: list[tuple[str, list[str], Path]], engine: str, n_jobs: int, slurm: dict, folder: Path) -> list[str]:
    """Run (label, command, log) jobs; the labels of those that failed, with where to look."""
    if not jobs:
        return []
    if engine == "joblib":
        from joblib import Parallel, delayed

        codes = Parallel(n_jobs=n_jobs)(delayed(_command)(cmd, log) for _, cmd, log in jobs)
        return [f"{label}: exit status {rc}, log {log}" for (label, _, log), rc in zip(jobs, codes) if rc != 0]
    import submitit

    executor = submitit.AutoExecutor(folder=folder, cluster=engine)
    executor.update_parameters(**slurm)
    submitted = [executor.submit(submitit.helpers.CommandFunction(cmd, cwd=str(REPO))) for _, cmd, _ in jobs]
    failed = []
    for (label, _, _), job in zip(jobs, submitted):
        try:
            job.result()
        except Exception as exc:  # the command's failure, or the scheduler's: reported, the others go on
            failed.append(f"{label}: {' '.join(str(exc).split())[:300]} (submitit log {job.paths.stderr})")
    return failed


def run(study: Study, budget: Budget, results: Path, engine: str = "joblib", n_jobs: int = 1, slurm: dict | None = None,
        log=print) -> list[str]:
    """Train, evaluate, record; returns what failed (empty when everything finished)."""
    from studies.records import records_of_run, save

    cells = study.cells(budget, results)
    steps = check(study, budget, cells)
    todo = [c for c in cells if c.trained_step() < steps[c]]
    log(f"{study.name}: {len(cells)} cells, {len(cells) - len(todo)} trained already, {len(todo)} to train")
    for c in (c for c in todo if not c.trained_step() and (c.run_dir / "config.json").exists()):
        (c.run_dir / "config.json").unlink()  # stopped before its first checkpoint: written by the run itself; logs stay
    failed = launch([(f"train {c.run_dir.name}", c.train_command(), c.run_dir / "logs" / "train.log") for c in todo],
                    engine, n_jobs, slurm or {}, results / "cells" / ".submitit")
    trained = [c for c in cells if c.trained_step() >= steps[c]]
    failed += [f"evaluations of {c.run_dir.name}: not run, its training did not finish" for c in cells if c not in trained]
    evals = [(f"eval {c.run_dir.name} {name}", [sys.executable, "rollout.py", f"checkpoint={c.run_dir}", *opts, "num_videos=0",
                                               f"out_dir={c.run_dir / 'eval' / name}"], c.run_dir / "logs" / f"eval_{name}.log")
             for c in trained for name, opts in study.rollout_options(budget, c).items()]
    todo_evals = [e for e in evals if not (Path(e[1][-1].removeprefix("out_dir=")) / "summary.json").exists()]
    log(f"{study.name}: {len(evals)} evaluations, {len(evals) - len(todo_evals)} cached, {len(todo_evals)} to run")
    failed += launch(todo_evals, engine, n_jobs, slurm or {}, results / "cells" / ".submitit")
    new = [r for c in trained for r in records_of_run(c.run_dir, budget.recipe, settings=list(study.rollout_options(budget, c)))]
    log(f"{study.name}: {save(results, study.name, new)} new or changed records in {results / study.name / 'records.jsonl'}")
    return failed
