"""Generate demonstrations with a scripted expert and write them in the public layout.

    python generate_demos.py task=pusht num_episodes=200 out=data/pusht/demos.zarr workers=2
    python generate_demos.py task=lift num_episodes=200 workers=2    # out= defaults to the task's dataset path

Options: GenerateConfig below (`python generate_demos.py task=lift --cfg job`); generate_demos.py is
the command line, this module the library it calls.

Seeds ``seed, seed+1, ...`` are tried in order and the first ``num_episodes`` successful ones
are kept, so the result is the same for any number of workers. Failed attempts are dropped.
Output goes to a temporary path and is renamed at the end; an existing file is kept unless
``overwrite=true``, which replaces only a dataset of the task's format that this command generated
(common.ownership: a zarr folder's ``.generate`` marker lists every file it wrote; an hdf5 file
carries ``generated_by`` in its ``data`` group's attributes), never a dataset downloaded or brought,
a run or a folder of anything else. Every check runs before the first episode, and again just
before the old dataset is replaced. Seeds stay below 100000, which
evaluation uses.
"""
from __future__ import annotations

import importlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
from omegaconf import MISSING

from envs.factory import EVAL_SEED_START, ctrl_c_deferred, worker_context
from envs.scene_shifts import SceneRandomization, scene_randomization_for
from envs.shifts import TRAINING_RANGE, parse_randomised_kinds

from common.ownership import Owner, contents
from common.resources import is_no_room, no_room

from .episodes import check_writable, recover_output

TASKS = {"pusht": "envs.experts.pusht", "lift": "envs.experts.lift", "can": "envs.experts.can"}
GENERATOR = "datasets.generate"  # recorded in a PushT dataset's attributes: the module that wrote it
# what overwrite=true may replace: a dataset carrying this mark (datasets generated before it carry none)
GENERATE = Owner("generate_demos.py", ".generate", "a dataset it generated",
                 unmarked=": datasets it generated before the mark existed carry none")
EXTRA_ATTEMPTS = 20  # attempts beyond twice the episodes asked for, before max_attempts= is needed


@dataclass
class GenerateConfig:
    """``python generate_demos.py task=...``: scripted demonstrations in the public layout."""

    # the task's config (configs/task/<name>.yaml; core.config registers it as a TaskConfig): the
    # generator reads its name, and out= its dataset path
    task: Any = MISSING
    num_episodes: int = 200
    out: str = "${task.dataset.path}"  # where training reads the task's data by default
    workers: int = 1
    seed: int = 0  # first initial-state seed; seeds stay below EVAL_SEED_START
    overwrite: bool = False
    max_attempts: Optional[int] = None  # default 2 * num_episodes + EXTRA_ATTEMPTS
    image_size: Optional[int] = None  # camera size (default: the environment's)
    # Lift and Can: the cameras rendered (default: the task's two); [] renders none, proprioception-only
    # demonstrations for a policy without a camera (the blind floor), generated without a single frame
    cameras: Optional[Any] = None
    # frames rendered under a scene drawn per episode from its seed (envs/scene_shifts.py, the evaluation's
    # shifts): scene kinds, e.g. [lighting,colour,camera] or all (every kind the task renders); none: clean
    scene_randomization: Optional[Any] = None
    # each kind's severity is drawn uniformly in [0, this] (1-3; None: TRAINING_RANGE); an evaluation severity
    # above it is out of range. Only with scene_randomization= (alone it would change nothing, so it is refused)
    scene_randomization_max: Optional[int] = None

    def __post_init__(self):
        for name, low in (("num_episodes", 1), ("workers", 1), ("max_attempts", 1), ("image_size", 1), ("seed", 0)):
            value = getattr(self, name)
            if value is not None and value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        if self.scene_randomization is None and self.scene_randomization_max is not None:
            raise ValueError(f"scene_randomization_max={self.scene_randomization_max} without scene_randomization= changes "
                             f"nothing (the demonstrations would be clean): add scene_randomization=all or the kinds "
                             f"(e.g. scene_randomization=[lighting,colour]), or drop scene_randomization_max=")
        task = getattr(self.task, "name", self.task)
        check_cameras(task, self.cameras)
        if isinstance(task, str) and task in TASKS:  # at composition: refused before any environment starts
            self.randomization(task)

    def randomization(self, task: str | None = None) -> SceneRandomization | None:
        max_severity = TRAINING_RANGE if self.scene_randomization_max is None else self.scene_randomization_max
        parsed = parse_randomised_kinds(self.scene_randomization, max_severity, task or self.task.name)
        return None if parsed is None else SceneRandomization(*parsed)


def check_cameras(task: str, cameras) -> None:
    """``cameras=``: None (the environment's), or camera names ([] for none) of a robosuite task; one line otherwise."""
    if cameras is None:
        return
    if task == "pusht":
        raise ValueError("cameras= applies to lift and can; PushT draws its one view: drop cameras=")
    if not isinstance(cameras, (list, tuple)) or not all(isinstance(c, str) for c in cameras):
        raise ValueError(f"cameras={cameras!r}: give camera names, e.g. cameras=[agentview], or cameras=[] for none")


def _is_dataset(out: Path, task: str) -> bool:
    if task == "pusht":
        from .zarr_replay import is_pusht_zarr

        return is_pusht_zarr(out)
    from .robomimic_hdf5 import is_robomimic_hdf5

    return is_robomimic_hdf5(out)


def check_out(out: Path, task: str, overwrite: bool) -> None:
    """Before any episode: ``out`` can be written, and holds nothing or (overwrite=true) a dataset of the
    task's format that this command generated, with nothing added to it. Deletes nothing."""
    check_writable(out, "out")
    if not (out.exists() or out.is_symlink()):
        return
    if not overwrite:
        raise FileExistsError(f"{out} already exists; pass overwrite=true to replace it, or choose another out=")
    if not _is_dataset(out, task):
        kind = "PushT zarr replay buffer" if task == "pusht" else "robomimic hdf5 file"
        raise FileExistsError(f"out={out} is {contents(out)}, not a {kind}; overwrite=true replaces only a dataset: "
                              f"choose another out= or remove it yourself")
    from .robomimic_hdf5 import GENERATED_BY, generated_by

    GENERATE.check_replaceable(out, file_signed_by=generated_by, file_mark=f"{GENERATED_BY} attribute in its data group")


def _collect(job):
    task, seed, render, randomization = job
    module = importlib.import_module(TASKS[task])
    kwargs = dict(render)
    if randomization is not None:
        kwargs["scene_randomization"] = randomization
    try:
        return seed, module.collect_episode(seed, **kwargs), None
    except Exception as exc:  # one broken episode must not kill a long generation run
        return seed, None, f"{type(exc).__name__}: {exc}"


def generate(task: str, num_episodes: int, out, *, workers: int = 1, seed: int = 0, overwrite: bool = False,
             max_attempts: int | None = None, image_size: int | None = None, progress: bool = True,
             scene_randomization: SceneRandomization | None = None, cameras=None) -> dict:
    """Run the task's scripted expert on seeds ``seed, seed+1, ...`` until ``num_episodes`` succeed,
    write them to ``out`` and return the report (also stored in the dataset's attributes).
    ``scene_randomization``: every episode's frames are rendered in a scene drawn from its seed (the
    expert's actions and states are the clean scene's), recorded as ``scene_randomization`` in the
    dataset's attributes. ``cameras`` (Lift, Can): the cameras rendered; () none; None the environment's."""
    out = Path(out)
    check_cameras(task, cameras)
    render = {k: v for k, v in (("image_size", image_size), ("cameras", cameras)) if v is not None}
    if "cameras" in render:
        render["cameras"] = tuple(render["cameras"])
    randomization = scene_randomization_for(scene_randomization, task) if task in TASKS else None
    max_attempts = _check_request(task, num_episodes, out, overwrite, seed, max_attempts)
    t0 = time.perf_counter()
    kept, failed, errors = _collect_episodes(task, num_episodes, range(seed, seed + max_attempts), render,
                                             workers, progress, randomization)
    seconds = time.perf_counter() - t0
    if len(kept) < num_episodes:
        raise RuntimeError(
            f"only {len(kept)} of {num_episodes} episodes succeeded in {max_attempts} attempts "
            f"(errors: {errors[:3]}); raise max_attempts= or check the expert"
        )
    infos = [ep.pop("info", {}) for ep in kept]  # the per-episode info goes to the report, not the arrays
    report = _report(task, kept, infos, len(failed), seconds, seed)
    if randomization is not None:
        report["scene_randomization"] = randomization.attrs()
    try:
        _write(task, out, kept, infos, report, overwrite, render)
    except OSError as exc:  # the writers leave nothing partial (a temporary name, renamed at the end)
        if not is_no_room(exc):
            raise
        raise no_room(exc, out, f"nothing was written there (the partial file was removed; the next run "
                                f"generates the {len(kept)} episode(s) again): free space on that disk or choose an "
                                f"out= on another, then run the command again") from None
    report["out"] = str(out)
    return report


def _check_request(task: str, num_episodes: int, out: Path, overwrite: bool, seed: int, max_attempts: int | None) -> int:
    """Every check, before the first episode (a refusal after an hour of generation wastes the hour);
    returns the number of seeds to try."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; known tasks: {', '.join(TASKS)}")
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
    recover_output(out)  # a killed earlier run may have left the previous dataset aside: put it back first
    check_out(out, task, overwrite)
    max_attempts = max_attempts or 2 * num_episodes + EXTRA_ATTEMPTS
    if seed + max_attempts > EVAL_SEED_START:
        raise ValueError(f"seeds {seed}..{seed + max_attempts} would reach the evaluation seeds (>= {EVAL_SEED_START}); lower seed=")
    return max_attempts


def _collect_episodes(task: str, num_episodes: int, seeds, render: dict, workers: int, progress: bool,
                      randomization: SceneRandomization | None):
    """(kept episodes, failed seeds, error lines): the first ``num_episodes`` successes in seed order."""
    from tqdm import tqdm

    jobs = [(task, s, render, randomization) for s in seeds]
    kept, failed, errors = [], [], []
    pool, bar = None, None
    try:
        if workers > 1:
            with ctrl_c_deferred():  # a Ctrl-C during Pool() waits until `pool` exists, so `finally` can stop it;
                pool = worker_context().Pool(workers)  # the workers ignore Ctrl-C: the parent reports it once
        bar = tqdm(total=num_episodes, desc=f"generate {task}", unit="demo", disable=not progress, dynamic_ncols=True)
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
        if pool is not None:
            pool.terminate()  # the pool may still run attempts beyond the last one needed
        if bar is not None:
            bar.close()
    return kept, failed, errors


def _report(task: str, kept: list, infos: list, num_failed: int, seconds: float, seed: int) -> dict:
    attempts = len(kept) + num_failed
    report = {
        "task": task, "episodes": len(kept), "attempts": attempts, "expert_success_rate": len(kept) / attempts,
        "seconds": seconds, "seconds_per_attempt": seconds / attempts, "seed_start": seed,
        "mean_steps": float(np.mean([len(ep["action" if task == "pusht" else "actions"]) for ep in kept])),
    }
    if infos and "max_coverage" in infos[0]:  # PushT's expert reports how much of the goal it covered
        report["mean_max_coverage"] = float(np.mean([i["max_coverage"] for i in infos]))
    return report


def _write(task: str, out: Path, kept: list, infos: list, report: dict, overwrite: bool, render: dict) -> None:
    """The task's format: a PushT zarr replay buffer, or a robomimic hdf5 file with the environment's
    metadata (robomimic rebuilds the environment from it), marked as generated here. A randomised generation
    adds ``scene_randomization`` (the report's: kinds, max severity) to the attributes: readers of before
    read the rest as ever."""
    randomization = _randomization_record(report, infos)
    check_out(out, task, overwrite)  # again: out may have changed while the episodes ran
    if task == "pusht":
        from .zarr_replay import write_pusht_zarr

        attrs = {"task": task, "generator": GENERATOR, "seeds": [i.get("seed") for i in infos], "report": report}
        if randomization is not None:
            attrs["scene_randomization"] = randomization
        write_pusht_zarr(out, kept, overwrite=overwrite, attrs=attrs, owner=GENERATE)
        return
    from envs.robosuite_tasks import RobosuiteEnv

    from .robomimic_hdf5 import GENERATED_BY, write_robomimic_hdf5

    env = RobosuiteEnv(task, **render)  # the metadata names the cameras rendered and their size
    try:
        env_meta = env.env_meta()
    finally:
        env.close()
    attrs = {GENERATED_BY: GENERATE.command}
    if randomization is not None:  # a JSON string, as robomimic stores env_args: hdf5 attributes hold no dicts
        attrs["scene_randomization"] = json.dumps(randomization)
    write_robomimic_hdf5(out, kept, env_meta, overwrite=overwrite, attrs=attrs)


def _randomization_record(report: dict, infos: list) -> dict | None:
    """A randomised dataset's ``scene_randomization`` attribute: the report's (kinds, max severity) and each
    episode's seed and drawn severities, in the order of the episodes (an hdf5 demo records no seed)."""
    if "scene_randomization" not in report:
        return None
    meta = report["scene_randomization"]
    randomization = SceneRandomization(tuple(meta["kinds"]), meta["max_severity"])
    episodes = [{"seed": i["seed"], **{kind: round(float(level), 4) for kind, level, _ in randomization.draw(i["seed"])}}
                for i in infos]
    return {**meta, "episodes": episodes}


def run(cfg: GenerateConfig) -> dict:
    """What generate_demos.py does with a GenerateConfig: generate, print the report."""
    report = generate(cfg.task.name, cfg.num_episodes, cfg.out, workers=cfg.workers, seed=cfg.seed, overwrite=cfg.overwrite,
                      max_attempts=cfg.max_attempts, image_size=cfg.image_size, scene_randomization=cfg.randomization(),
                      cameras=cfg.cameras)
    print(json.dumps(report, indent=2))
    return report
