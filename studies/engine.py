"""A study's jobs run as one Hydra multirun: Hydra's launcher plugins are the engine.

The studies build a list of jobs (cells to train, evaluations to run); ``launch`` writes it to a
manifest and runs ``python -m studies.job --multirun manifest=<it> job=range(0,N)`` with the chosen
launcher, so every job is one Hydra job of one sweep:

    joblib           this machine (the default): hydra-joblib-launcher's pool of worker processes,
                     n_jobs = cores // threads per job (train.num_threads of the cells)
    slurm            a SLURM cluster: hydra-submitit-launcher (configs/hydra/launcher/study_slurm.yaml),
                     one SLURM job per study job, as an array
    submitit_local   submitit's local mode, each job its own process as on SLURM (what the tests use)
    basic            Hydra's default launcher: the jobs one after another, in this process

Each job writes ``<sweep>/status/<index>.json`` (done, skipped or failed, with the error) and its
output to a log in the cell's run directory. A failed job does not stop the others (the launchers
run every job of a sweep and report failures per job); ``launch`` returns every job's outcome, and
a job that left no status (killed, out of memory, a node lost) is reported as such.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from studies import common

REPO = Path(__file__).resolve().parents[1]

# --launcher NAME -> the hydra/launcher config that runs it
LAUNCHERS = {
    "joblib": "joblib",
    "slurm": "study_slurm",
    "submitit_local": "study_submitit_local",
    "basic": "basic",
}
SUBMITIT = ("slurm", "submitit_local")


def available_cores() -> int:
    """The cores this process may run on (a SLURM allocation or a CPU affinity mask counts)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def parallel_jobs(threads_per_job: int | None, num_jobs: int, cores: int | None = None) -> int:
    """How many jobs run at once on this machine: cores // threads per job (at least 1, at most the jobs).

    ``threads_per_job`` None: each job uses torch's default, every core, so one at a time.
    """
    cores = cores or available_cores()
    fit = cores // threads_per_job if threads_per_job else 1
    return max(1, min(num_jobs, fit))


@dataclass
class Outcome:
    """What became of one job: ``done``, ``skipped`` (already done), ``failed`` or ``lost`` (no status)."""

    label: str
    status: str
    message: str = ""
    log: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status in ("done", "skipped")


def job_label(job: dict) -> str:
    cell = common.Cell(**job["cell"])
    return f"train {cell.key}" if job["kind"] == "train" else f"eval {cell.key} {job['name']}"


def _quote(value) -> str:
    """A value as one Hydra override value (quoted, so paths with odd characters stay one string)."""
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def launch(jobs: list[dict], *, stage: str, study: str, launcher: str = "joblib", threads: int | None = None,
           n_jobs: int | None = None, gpus_per_job: int = 0, procs_per_job: int = 1, cpus_per_job: int | None = None,
           overrides: tuple = (), log=print) -> list[Outcome]:
    """Run ``jobs`` (``{"kind": "train"|"eval", ...}``, see ``studies.job``) as one multirun sweep.

    ``threads``: torch threads of each job (train.num_threads; None: torch's default). ``n_jobs``:
    jobs at once on joblib (default: cores // threads). ``cpus_per_job`` (default ``threads``),
    ``gpus_per_job`` and ``procs_per_job``: what each job asks of a submitit launcher.
    """
    if not jobs:
        return []
    if launcher not in LAUNCHERS:
        raise ValueError(f"--launcher {launcher!r} is unknown; choose one of {', '.join(LAUNCHERS)}")
    name = f"{time.strftime('%Y%m%d-%H%M%S')}_{study}_{stage}_{os.getpid()}"
    for k in range(1000):  # two sweeps of one process within the same second get directories of their own
        sweep = (common.CELLS / ".sweeps" / (name if k == 0 else f"{name}_{k}")).resolve()
        try:
            (sweep / "status").mkdir(parents=True, exist_ok=False)
            break
        except FileExistsError:
            continue
    manifest = sweep / "jobs.json"
    manifest.write_text(json.dumps({"study": study, "stage": stage, "results": str(common.RESULTS.resolve()),
                                    "threads": threads, "jobs": jobs}, indent=1))
    cmd = [sys.executable, "-m", "studies.job", "--multirun", f"manifest={_quote(manifest)}", f"job=range(0,{len(jobs)})",
           f"hydra/launcher={LAUNCHERS[launcher]}", f"hydra.sweep.dir={_quote(sweep)}"]
    how = launcher
    if launcher == "joblib":
        n = n_jobs or parallel_jobs(threads, len(jobs))
        cmd.append(f"hydra.launcher.n_jobs={n}")
        how = f"joblib, {n} at once"
    if launcher in SUBMITIT:  # only what is known, so --hydra can set the rest without a clash
        cpus = cpus_per_job or threads
        if cpus:
            cmd.append(f"hydra.launcher.cpus_per_task={cpus}")
        if gpus_per_job:
            cmd.append(f"hydra.launcher.gpus_per_node={gpus_per_job}")
            how += f", {gpus_per_job} GPU(s) each"
        if procs_per_job > 1:  # torch.distributed: one task (process) per GPU; the job joins them (studies.job)
            cmd.append(f"hydra.launcher.tasks_per_node={procs_per_job}")
    cmd += list(overrides)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    if threads:
        env.setdefault("OMP_NUM_THREADS", str(threads))
    log(f"{stage}: {len(jobs)} job(s) on {how}; sweep {sweep}")
    t0 = time.perf_counter()
    if launcher == "basic":  # Hydra's basic launcher runs the jobs in the driver: let this process be it
        returncode = _multirun_here(cmd[3:])
    else:
        returncode = subprocess.run(cmd, env=env).returncode
    outcomes = collect(sweep, jobs)
    if returncode != 0:  # the engine itself failed: a bad launcher override, no SLURM here, a crashed job's driver
        log(f"{stage}: the sweep exited with status {returncode} (its error is above); jobs that left no status are "
            f"reported as lost. Command: {' '.join(cmd)}")
    counts = {s: sum(o.status == s for o in outcomes) for s in ("done", "skipped", "failed", "lost")}
    log(f"{stage}: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v) + f" in {time.perf_counter() - t0:.0f} s")
    return outcomes


def _multirun_here(argv: list[str]) -> int:
    """``python -m studies.job <argv>`` in this process (Hydra parses sys.argv); its exit status."""
    from studies import job

    saved = sys.argv, common.RESULTS
    sys.argv = [job.__file__, *argv]
    try:
        job.main()
    except SystemExit as exc:  # Hydra exits on a bad override or a launcher error
        return exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = saved[0]
        common.set_results(saved[1])  # the jobs pointed it at the manifest's (absolute) root
    return 0


def collect(sweep: Path, jobs: list[dict]) -> list[Outcome]:
    """Every job's outcome from the sweep's status files."""
    out = []
    for i, job in enumerate(jobs):
        path = sweep / "status" / f"{i}.json"
        if path.exists():
            s = json.loads(path.read_text())
            out.append(Outcome(job_label(job), s["status"], s.get("message", ""), s.get("log", ""), s.get("seconds", 0.0)))
        else:
            out.append(Outcome(job_label(job), "lost", f"job {i} left no status: it was killed or crashed before reporting "
                                                       f"(see its log, and {sweep} for the launcher's)"))
    return out
