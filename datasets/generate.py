"""Generate demonstrations with a scripted expert and write them in the public layout.

    python -m datasets.generate task=pusht num_episodes=200 out=data/pusht/demos.zarr workers=2
    python -m datasets.generate task=lift num_episodes=200 workers=2    # out= defaults to the task's dataset path

Options: GenerateConfig in core/config.py (`python -m datasets.generate task=lift --cfg job`).

Seeds ``seed, seed+1, ...`` are tried in order and the first ``num_episodes`` successful ones
are kept, so the result is the same for any number of workers. Failed attempts are dropped.
Output goes to a temporary path and is renamed at the end; an existing file is kept unless
``overwrite=true``, which replaces only a dataset of the task's format (never a run or a folder of
anything else). Every check runs before the first episode. Seeds stay below 100000, which
evaluation uses.
"""
from __future__ import annotations

import importlib
import json
import multiprocessing as mp
import signal
import sys
import time
from pathlib import Path

import numpy as np

from core.preflight import check_output_file, contents
from envs.factory import EVAL_SEED_START

from .episodes import recover_output

TASKS = {"pusht": "envs.experts.pusht", "lift": "envs.experts.lift", "can": "envs.experts.can"}


def _ignore_sigint() -> None:
    """Pool workers leave Ctrl-C to the parent, which stops them and reports in one line."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _is_dataset(out: Path, task: str) -> bool:
    if task == "pusht":
        from .zarr_replay import is_pusht_zarr

        return is_pusht_zarr(out)
    from .robomimic_hdf5 import is_robomimic_hdf5

    return is_robomimic_hdf5(out)


def check_out(out: Path, task: str, overwrite: bool) -> None:
    """Before any episode: ``out`` can be written, and holds nothing or (overwrite=true) a dataset."""
    check_output_file(out, "out")
    if not (out.exists() or out.is_symlink()):
        return
    if not overwrite:
        raise FileExistsError(f"{out} already exists; pass overwrite=true to replace it, or choose another out=")
    if not _is_dataset(out, task):
        kind = "PushT zarr replay buffer" if task == "pusht" else "robomimic hdf5 file"
        raise FileExistsError(f"out={out} is {contents(out)}, not a {kind}; overwrite=true replaces only a dataset: "
                              f"choose another out= or remove it yourself")


def _collect(job):
    task, seed, image_size = job
    module = importlib.import_module(TASKS[task])
    kwargs = {} if image_size is None else {"image_size": image_size}
    try:
        return seed, module.collect_episode(seed, **kwargs), None
    except Exception as exc:  # one broken episode must not kill a long generation run
        return seed, None, f"{type(exc).__name__}: {exc}"


def generate(task: str, num_episodes: int, out, *, workers: int = 1, seed: int = 0, overwrite: bool = False,
             max_attempts: int | None = None, image_size: int | None = None, progress: bool = True) -> dict:
    from tqdm import tqdm

    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; known tasks: {', '.join(TASKS)}")
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
    out = Path(out)
    recover_output(out)  # a killed earlier run may have left the previous dataset aside: put it back first
    check_out(out, task, overwrite)  # fail before the expensive part, not after it
    max_attempts = max_attempts or 2 * num_episodes + 20
    if seed + max_attempts > EVAL_SEED_START:
        raise ValueError(f"seeds {seed}..{seed + max_attempts} would reach the evaluation seeds (>= {EVAL_SEED_START}); lower seed=")
    jobs = [(task, s, image_size) for s in range(seed, seed + max_attempts)]
    kept, failed, errors = [], [], []
    t0 = time.perf_counter()
    bar = tqdm(total=num_episodes, desc=f"generate {task}", unit="demo", disable=not progress, dynamic_ncols=True)
    pool = mp.get_context("spawn").Pool(workers, initializer=_ignore_sigint) if workers > 1 else None
    try:
        results = pool.imap(_collect, jobs) if pool else map(_collect, jobs)
        for s, episode, error in results:  # imap keeps seed order: same result for any worker count
            if episode is None:
                failed.append(s)
                if error:
                    errors.append(f"seed {s}: {error}")
            else:
                kept.append(episode)
                bar.update(1)
            bar.set_postfix(failed=len(failed))
            if len(kept) == num_episodes:
                break
    finally:
        if pool:
            pool.terminate()
        bar.close()
    seconds = time.perf_counter() - t0
    if len(kept) < num_episodes:
        raise RuntimeError(
            f"only {len(kept)} of {num_episodes} episodes succeeded in {max_attempts} attempts "
            f"(errors: {errors[:3]}); raise max_attempts= or check the expert"
        )
    infos = [ep.pop("info", {}) for ep in kept]
    attempts = len(kept) + len(failed)
    report = {
        "task": task, "episodes": len(kept), "attempts": attempts, "expert_success_rate": len(kept) / attempts,
        "seconds": seconds, "seconds_per_attempt": seconds / attempts, "seed_start": seed,
        "mean_steps": float(np.mean([len(ep["action" if task == "pusht" else "actions"]) for ep in kept])),
    }
    if infos and "max_coverage" in infos[0]:
        report["mean_max_coverage"] = float(np.mean([i["max_coverage"] for i in infos]))
    attrs = {"task": task, "generator": "datasets.generate", "seeds": [i.get("seed") for i in infos], "report": report}
    if task == "pusht":
        from .zarr_replay import write_pusht_zarr

        write_pusht_zarr(out, kept, overwrite=overwrite, attrs=attrs)
    else:
        from envs.robosuite_tasks import RobosuiteEnv

        from .robomimic_hdf5 import write_robomimic_hdf5

        env_kwargs = {} if image_size is None else {"image_size": image_size}
        env = RobosuiteEnv(task, **env_kwargs)
        try:
            env_meta = env.env_meta()
        finally:
            env.close()
        write_robomimic_hdf5(out, kept, env_meta, overwrite=overwrite)
    report["out"] = str(out)
    return report


def run(cfg) -> dict:
    """What the command does with a GenerateConfig: generate, print the report."""
    report = generate(cfg.task.name, cfg.num_episodes, cfg.out, workers=cfg.workers, seed=cfg.seed, overwrite=cfg.overwrite,
                      max_attempts=cfg.max_attempts, image_size=cfg.image_size)
    print(json.dumps(report, indent=2))
    return report


def main() -> None:
    import hydra

    from core.cli import run_command
    from core.config import CONFIG_DIR, register_configs

    register_configs()
    hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="generate")(
        lambda cfg: run_command("python -m datasets.generate", run, cfg))()


if __name__ == "__main__":
    main()
