"""One job of a study's sweep, as a Hydra app: ``python -m studies.job --multirun manifest=M job=range(0,N)``.

``python -m studies <study>`` writes the manifest (the list of jobs) and runs this sweep with the
chosen launcher (``studies.engine``); it is not meant to be typed by hand, but can be, e.g. to rerun
one job: ``python -m studies.job manifest=results/cells/.sweeps/<sweep>/jobs.json job=3``.

A job is ``{"kind": "train", "cell": {...}}`` (train, resume or skip one cell) or
``{"kind": "eval", "cell": {...}, "name": ..., "options": {...}, ...}`` (one cached evaluation,
``studies.common.Evaluation``). It writes its output to ``<run_dir>/logs/`` and its outcome to
``<sweep>/status/<job>.json``; an exception is recorded there, so the other jobs go on.

Under a submitit launcher with ``tasks_per_node`` > 1 (``--procs-per-cell``), every task runs the
job and the tasks join one torch.distributed process group (submitit's environment), one process
per GPU, as ``torchrun`` would start them.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import hydra
from omegaconf import MISSING

# Only Hydra here: the sweep's driver process imports this module and never trains; the jobs import
# torch and the training configs (core.config.register_configs) when they start.


@dataclass
class StudyJobConfig:
    manifest: str = MISSING  # the sweep's jobs.json
    job: int = MISSING  # index into its jobs


def _register() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="study_job_schema", node=StudyJobConfig)


_register()


@contextlib.contextmanager
def _output_to(path: Path):
    """stdout and stderr (file descriptors too: child processes, C libraries) appended to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "a", buffering=1) as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            with contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
                yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _distributed_rank() -> int:
    """Join a multi-task submitit job's processes into torch.distributed's environment; this task's rank."""
    try:
        import submitit

        env = submitit.JobEnvironment()
    except (ImportError, RuntimeError):  # not under submitit
        return 0
    if env.num_tasks > 1:
        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    return env.global_rank


def run_job(job: dict, threads: int | None = None) -> str:
    """Do one job; returns "done" or "skipped"."""
    import torch

    from core.distributed import pick_device
    from studies.common import Cell, Evaluation, train_cell

    cell = Cell(**job["cell"])
    if job["kind"] == "train":
        steps = cell.config().train.steps
        if cell.finished(steps):
            return "skipped"
        try:
            train_cell(cell)
        finally:
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
        return "done"
    if job["kind"] == "eval":
        ev = Evaluation.from_json(job)
        if ev.result() is not None:
            return "skipped"
        if threads:
            torch.set_num_threads(threads)
        ev.run(device=pick_device("auto"))
        return "done"
    raise ValueError(f"unknown job kind {job['kind']!r}")


CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "configs")  # core.config.CONFIG_DIR, without its imports


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="study_job")
def main(cfg) -> dict:
    from studies import common
    from studies.engine import job_label

    manifest_path = Path(cfg.manifest)
    manifest = json.loads(manifest_path.read_text())
    common.set_results(manifest["results"])
    job = manifest["jobs"][cfg.job]
    cell = common.Cell(**job["cell"])
    rank = _distributed_rank()
    if rank > 0 and job["kind"] != "train":  # an evaluation is one process: the job's other tasks have nothing to do
        return {"job": cfg.job, "status": "skipped", "rank": rank}
    name = "train" if job["kind"] == "train" else f"eval_{job['name']}"
    log = cell.run_dir / "logs" / (f"{name}.log" if rank == 0 else f"{name}.rank{rank}.log")
    status = {"job": cfg.job, "label": job_label(job), "log": str(log), "pid": os.getpid()}
    t0 = time.perf_counter()
    with _output_to(log):
        print(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {status['label']} (pid {os.getpid()}, sweep {manifest_path.parent})",
              flush=True)
        try:
            status["status"] = run_job(job, manifest.get("threads"))
        except Exception as exc:  # recorded, so the sweep's other jobs go on and the study reports it
            traceback.print_exc()
            status["status"] = "failed"
            status["message"] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        print(f"=== {status['status']} in {time.perf_counter() - t0:.1f} s", flush=True)
    status["seconds"] = time.perf_counter() - t0
    if rank == 0:
        out = manifest_path.parent / "status" / f"{cfg.job}.json"
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(json.dumps(status, indent=1))
        tmp.replace(out)
    return status


if __name__ == "__main__":
    main()
