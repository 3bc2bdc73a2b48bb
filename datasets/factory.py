"""make_dataset(task_cfg): the task's file -> EpisodeData, whatever its format."""
from __future__ import annotations

import re
from pathlib import Path

from .episodes import EpisodeData

FORMATS = ("pusht_zarr", "robomimic_hdf5", "lerobot")
# the recipes' file names say how many demonstrations they hold: data/pusht/demos1000.zarr
_COUNT_IN_NAME = re.compile(r"demos(\d+)$")
# and whether they are rendered under randomised scenes: data/lift/ph_image_scene.hdf5
_SCENE_IN_NAME = re.compile(r"_scene$")


def generate_command(task_name: str, path) -> str:
    """The command that writes the dataset a task reads at ``path``: as many demonstrations as its
    name says, under randomised scenes when its name ends in ``_scene``."""
    from .generate import GenerateConfig

    stem = Path(path).stem
    m = _COUNT_IN_NAME.search(stem)
    count = int(m[1]) if m else GenerateConfig.num_episodes
    scene = " scene_randomization=all" if _SCENE_IN_NAME.search(stem) else ""
    return f"python generate_demos.py task={task_name} num_episodes={count} out={path}{scene}"


def read_dataset(path, fmt: str | None = None, obs_keys: list[str] | None = None,
                 features: dict[str, str] | None = None, max_episodes: int | None = None) -> EpisodeData:
    """``features`` (policy key -> feature name) is used by the lerobot format only; ``max_episodes``:
    read only the first N episodes (every reader)."""
    fmt = fmt or guess_format(path)
    if fmt == "pusht_zarr":
        from .zarr_replay import read_pusht_zarr

        return read_pusht_zarr(path, max_episodes=max_episodes)
    if fmt == "robomimic_hdf5":
        from .robomimic_hdf5 import read_robomimic_hdf5

        return read_robomimic_hdf5(path, obs_keys=obs_keys, max_episodes=max_episodes)
    if fmt == "lerobot":
        from .lerobot import read_lerobot

        return read_lerobot(path, keys=obs_keys, features=features, max_episodes=max_episodes)
    raise ValueError(f"unknown dataset format {fmt!r}; known formats: {', '.join(FORMATS)}")


def guess_format(path) -> str:
    p = Path(path)
    if p.suffix == ".zarr" or (p / ".zgroup").exists() or (p / "zarr.json").exists():
        return "pusht_zarr"
    if p.suffix in (".hdf5", ".h5"):
        return "robomimic_hdf5"
    if (p / "meta" / "info.json").is_file():
        return "lerobot"
    raise ValueError(
        f"cannot tell the format of {p}: expected a .zarr directory, a .hdf5 file or a LeRobotDataset root (holding meta/info.json)"
    )


def make_dataset(task, keys: list[str] | None = None, max_episodes: int | None = None) -> EpisodeData:
    """Read the task's dataset (a TaskConfig) and check it carries ``keys`` (default: all of
    ``task.input_shapes``) in the task's shapes."""
    path = task.dataset.path
    if not Path(path).exists():
        raise FileNotFoundError(
            f"dataset {path} does not exist; generate it with: {generate_command(task.name, path)}"
        )
    keys = list(task.input_shapes) if keys is None else list(keys)
    fmt = task.dataset.format or guess_format(path)
    features = getattr(task.dataset, "features", None)
    if fmt == "robomimic_hdf5":
        from .robomimic_hdf5 import MissingObsKeyError, check_recorded_task

        check_recorded_task(path, task.name)  # before reading: a Can file must not train task=lift
        try:
            data = read_dataset(path, fmt, obs_keys=keys, max_episodes=max_episodes)
        except MissingObsKeyError as exc:  # a camera the task reads is in no demo: say how to drop it
            raise ValueError(f"{exc}; if the file was recorded without it, drop it from the task with "
                             f"{' '.join(f'task.input_shapes.{k}=null' for k in exc.keys)}") from None
    else:
        if fmt == "lerobot":
            from .lerobot import check_fps

            check_fps(path, task.fps, task.name)  # before decoding: a dataset at another rate is refused at once
        data = read_dataset(path, fmt, obs_keys=keys, features=features, max_episodes=max_episodes)
    missing = [k for k in keys + ["action"] if k not in data.data]
    if missing:
        raise ValueError(
            f"dataset {path} does not fit task {task.name!r}: it lacks {missing} "
            f"(it has {sorted(data.data)}); was it written for another task or camera set?"
        )
    for key in keys:
        shape = task.input_shapes[key]
        arr = data.data[key]
        got = tuple(arr.shape[1:])
        want = (shape[1], shape[2], shape[0]) if len(shape) == 3 else tuple(shape)
        if got != want:
            raise ValueError(f"dataset {path}: {key!r} frames have shape {got}, task {task.name!r} expects {want}")
    if data.data["action"].shape[1] != task.action_dim:
        raise ValueError(
            f"dataset {path}: actions are {data.data['action'].shape[1]}-D, task {task.name!r} expects {task.action_dim}-D"
        )
    if max_episodes is not None and max_episodes < data.num_episodes:
        end = data.episode_ends[max_episodes - 1]
        data = EpisodeData({k: v[:end] for k, v in data.data.items()}, data.episode_ends[:max_episodes], data.meta)
    return data
