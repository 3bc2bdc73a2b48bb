"""robomimic HDF5 datasets: write scripted demonstrations, read public or generated files.

Layout (robomimic's own, so ``robomimic.utils.dataset.SequenceDataset`` reads what we write)::

    data/                      attrs: total (sum of num_samples), env_args (JSON of env_meta),
                               generated_by (generate_demos.py, in a file it wrote: what its overwrite may replace)
        demo_N/                attrs: num_samples, model_file (MuJoCo XML)
            actions  (T, 7)    states (T, S)    rewards (T,)    dones (T,)
            obs/<key>  (T, ...)                 next_obs/<key>  (T, ...)
    mask/train, mask/valid     arrays of demo names (dtype 'S')

Readers flatten demos into :class:`datasets.episodes.EpisodeData` (``action`` plus observation keys,
float observations and actions as float32, images as uint8 HWC). Images must be uint8 0-255 or
float 0-255 (rounded to uint8); float images all in [0, 1] are scaled x255 with a warning; anything
else, and NaN/inf in actions or low-dim observations, is refused with a one-line ValueError.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import h5py
import numpy as np

from common.paths import UntrustedPathError
from common.resources import MEMORY_FIX, check_memory
from datasets.episodes import (
    IMAGE_CASES,
    EpisodeData,
    atomic_output,
    check_finite,
    damaged,
    image_case,
    image_to_uint8,
    is_image,
    missing_output_hint,
    sample_frames,
    warn_float01,
)

FORMAT = "robomimic_hdf5"
GENERATED_BY = "generated_by"  # data.attrs: the command that wrote the file (what overwrite=true may replace)
GENERATE_HINT = "python generate_demos.py task=lift out={path}"  # num_episodes= defaults to GenerateConfig's
REQUIRED_DEMO_KEYS = ("actions", "obs")
IMAGE_COMPRESSION = dict(compression="gzip", compression_opts=4)
_DEMO_RE = re.compile(r"^demo_(\d+)$")


class RobomimicFormatError(ValueError):
    """The file exists but does not have the robomimic layout (or lacks what was asked for)."""


class MissingObsKeyError(KeyError):
    """Observation keys asked for that the file lacks (``keys``); ``make_dataset`` adds the fix."""

    def __init__(self, message: str, keys: list[str] = ()):
        super().__init__(message)
        self.keys = list(keys)

    def __str__(self):  # KeyError would repr-quote the message
        return str(self.args[0]) if self.args else ""


# the env each task's files record in data.attrs["env_args"]["env_name"] (envs.robosuite_tasks.TASK_TO_ENV_NAME)
TASK_ENV_NAMES = {"lift": "Lift", "can": "PickPlaceCan"}


# ---------------------------------------------------------------------------------------------- write
def _is_image(arr: np.ndarray) -> bool:
    return arr.dtype == np.uint8 and arr.ndim == 4 and arr.shape[-1] in (1, 3, 4)


def _write_array(group: h5py.Group, name: str, arr: np.ndarray) -> None:
    arr = np.asarray(arr)
    if _is_image(arr):
        chunks = (min(len(arr), 16),) + arr.shape[1:]
        group.create_dataset(name, data=arr, chunks=chunks, **IMAGE_COMPRESSION)
    else:
        group.create_dataset(name, data=arr)


def _episode_arrays(i: int, ep: dict) -> dict:
    """Validate one episode dict and fill derivable fields (rewards, dones, next_obs)."""
    for key in REQUIRED_DEMO_KEYS:
        if key not in ep:
            raise ValueError(f"episode {i} lacks {key!r}; it has keys {sorted(ep)}")
    actions = np.asarray(ep["actions"])
    if actions.ndim != 2 or len(actions) == 0:
        raise ValueError(f"episode {i}: actions must be a non-empty (T, action_dim) array, got shape {actions.shape}")
    T = len(actions)
    obs = {k: np.asarray(v) for k, v in ep["obs"].items()}
    if not obs:
        raise ValueError(f"episode {i} has no observation keys")
    if "next_obs" in ep and ep["next_obs"] is not None:
        next_obs = {k: np.asarray(v) for k, v in ep["next_obs"].items()}
    else:  # shift by one step, repeating the last frame (robomimic convention for the final transition)
        next_obs = {k: np.concatenate([v[1:], v[-1:]]) for k, v in obs.items()}
    if set(next_obs) != set(obs):
        raise ValueError(f"episode {i}: next_obs keys {sorted(next_obs)} differ from obs keys {sorted(obs)}")
    rewards = np.asarray(ep["rewards"]) if ep.get("rewards") is not None else np.zeros(T)
    if ep.get("dones") is not None:
        dones = np.asarray(ep["dones"])
    else:
        dones = np.zeros(T, dtype=np.int64)
        dones[-1] = 1
    states = np.asarray(ep["states"]) if ep.get("states") is not None else None
    arrays = {"actions": actions, "rewards": rewards, "dones": dones}
    if states is not None:
        arrays["states"] = states
    for name, arr in list(arrays.items()) + [(f"obs/{k}", v) for k, v in obs.items()] + [
        (f"next_obs/{k}", v) for k, v in next_obs.items()
    ]:
        if len(arr) != T:
            raise ValueError(f"episode {i}: {name} has {len(arr)} steps but actions has {T}")
    return {"T": T, "arrays": arrays, "obs": obs, "next_obs": next_obs}


def _split(n: int, valid_fraction: float, seed: int = 0) -> tuple[list[int], list[int]]:
    if not 0.0 <= valid_fraction < 1.0:
        raise ValueError(f"valid_fraction must be in [0, 1), got {valid_fraction}")
    n_valid = int(round(valid_fraction * n))
    if valid_fraction > 0 and n >= 2:
        n_valid = max(n_valid, 1)
    n_valid = min(n_valid, n - 1) if n >= 1 else 0
    order = np.random.default_rng(seed).permutation(n)
    valid = sorted(int(i) for i in order[:n_valid])
    train = sorted(int(i) for i in order[n_valid:])
    return train, valid


def write_robomimic_hdf5(
    path: str | os.PathLike,
    episodes: list[dict],
    env_meta: dict,
    overwrite: bool = False,
    valid_fraction: float = 0.1,
    attrs: dict[str, str] | None = None,
) -> Path:
    """Write episodes (as returned by ``envs.experts.*.collect_episode``) in robomimic's layout.

    Each episode needs ``actions`` (T, A) and ``obs`` {key: (T, ...)}; ``states``, ``rewards``,
    ``dones``, ``next_obs`` and ``model_file`` are written when given (rewards default to 0, dones to
    1 at the last step, next_obs to obs shifted by one). Images (uint8, (T, H, W, C)) are gzip
    compressed. ``mask/train`` / ``mask/valid`` hold a seeded random split with ``valid_fraction``
    of the demos in ``valid`` (at least one when there are two or more demos). ``attrs`` go into the
    ``data`` group's attributes (generate: ``generated_by``). The file appears atomically; an existing
    file is refused unless ``overwrite``.
    """
    if not episodes:
        raise ValueError("no episodes to write")
    checked = [_episode_arrays(i, ep) for i, ep in enumerate(episodes)]
    keys0 = set(checked[0]["obs"])
    for i, ep in enumerate(checked[1:], start=1):
        if set(ep["obs"]) != keys0:
            raise ValueError(f"episode {i} has obs keys {sorted(ep['obs'])}, episode 0 has {sorted(keys0)}")
    train, valid = _split(len(episodes), valid_fraction)
    env_args = json.dumps(env_meta)
    final = Path(path)
    with atomic_output(final, overwrite=overwrite) as tmp:
        # built in memory, then written in one plain write: HDF5 meeting a full disk (or ulimit -f)
        # mid-file floods stderr and can crash the interpreter; a plain write raises one OSError
        with h5py.File(tmp.name, "w", driver="core", backing_store=False) as f:
            data = f.create_group("data")
            total = 0
            for i, (ep, chk) in enumerate(zip(episodes, checked)):
                g = data.create_group(f"demo_{i}")
                g.attrs["num_samples"] = int(chk["T"])
                if ep.get("model_file") is not None:
                    g.attrs["model_file"] = ep["model_file"]
                info = ep.get("info") or {}
                if "seed" in info:
                    g.attrs["seed"] = int(info["seed"])
                for name, arr in chk["arrays"].items():
                    _write_array(g, name, arr)
                obs_g, next_g = g.create_group("obs"), g.create_group("next_obs")
                for k, v in chk["obs"].items():
                    _write_array(obs_g, k, v)
                for k, v in chk["next_obs"].items():
                    _write_array(next_g, k, v)
                total += int(chk["T"])
            data.attrs["total"] = total
            data.attrs["env_args"] = env_args
            data.attrs.update(attrs or {})
            mask = f.create_group("mask")
            mask.create_dataset("train", data=np.array([f"demo_{i}" for i in train], dtype="S"))
            mask.create_dataset("valid", data=np.array([f"demo_{i}" for i in valid], dtype="S"))
            f.flush()
            image = f.id.get_file_image()
        tmp.write_bytes(image)
    return final


# ----------------------------------------------------------------------------------------------- read
def _open(path: str | os.PathLike) -> h5py.File:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(
            f"robomimic dataset {p} not found{missing_output_hint(p)}; generate it with `{GENERATE_HINT.format(path=p)}` "
            "(task=can for PickPlaceCan) or download a robomimic image.hdf5 there"
        )
    try:
        f = h5py.File(p, "r")
    except OSError as e:
        raise RobomimicFormatError(f"{p} is not a readable HDF5 file ({e}); expected a robomimic dataset") from e
    try:
        _check_self_contained(f, p)
    except BaseException:
        f.close()
        raise
    return f


def _check_self_contained(f: h5py.File, p: Path) -> None:
    """HDF5 can point at other files: external links, datasets stored in external files, virtual
    datasets. A file from elsewhere may use none of them, or reading a key would read another file."""
    outside = []

    def link(name, lnk):
        if isinstance(lnk, h5py.ExternalLink):
            outside.append(f"{name} is an external link to {lnk.filename}")

    def dataset(name, obj):
        if isinstance(obj, h5py.Dataset) and (obj.external or obj.is_virtual):
            where = obj.external[0][0] if obj.external else "other files (a virtual dataset)"
            outside.append(f"{name} is stored in {where}")

    f.visititems_links(link)
    f.visititems(dataset)
    if outside:
        raise UntrustedPathError(f"{p}: {outside[0]}{f' (and {len(outside) - 1} more)' if len(outside) > 1 else ''}; "
                                 f"a dataset may only hold its own data: copy that data into the file")


def _data_group(f: h5py.File) -> h5py.Group | None:
    """The file's own ``data`` group, never one an external link would open in another file."""
    if not isinstance(f.get("data", getlink=True), h5py.HardLink) or not isinstance(f["data"], h5py.Group):
        return None
    return f["data"]


def is_robomimic_hdf5(path) -> bool:
    """Whether ``path`` is a robomimic file (what ``generate_demos.py overwrite=true`` may replace, if it wrote it)."""
    p = Path(path)
    if not p.is_file() or not h5py.is_hdf5(p):
        return False
    with h5py.File(p, "r") as f:
        return _data_group(f) is not None


def generated_by(path) -> str | None:
    """The command recorded in ``data.attrs["generated_by"]`` (None: a file from elsewhere, or generated
    before the attribute existed)."""
    try:
        with h5py.File(Path(path), "r") as f:
            data = _data_group(f)
            value = data.attrs.get(GENERATED_BY) if data is not None else None
    except OSError:  # not an HDF5 file
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else (value if isinstance(value, str) else None)


def _demo_index(name: str) -> int:
    m = _DEMO_RE.match(name)
    return int(m.group(1)) if m else -1


def _sorted_demos(names) -> list[str]:
    return sorted(names, key=lambda n: (_demo_index(n), n))


def _layout_error(path, expected: str, found) -> RobomimicFormatError:
    return RobomimicFormatError(
        f"{path} does not have the robomimic layout: expected {expected}, found {sorted(found)}"
    )


def _demos(f: h5py.File, path, filter_key: str | None) -> list[str]:
    if "data" not in f or not isinstance(f["data"], h5py.Group):
        raise _layout_error(path, "top-level group 'data' (and optional 'mask')", f.keys())
    data = f["data"]
    if filter_key is not None:
        masks = sorted(f["mask"].keys()) if "mask" in f else []
        if filter_key not in masks:
            raise RobomimicFormatError(f"{path} has no filter key mask/{filter_key}; available filter keys: {masks}")
        names = [n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in np.asarray(f["mask"][filter_key][:])]
        missing = [n for n in names if n not in data]
        if missing:
            raise RobomimicFormatError(f"{path}: mask/{filter_key} names demos missing from data/: {missing[:5]}")
    else:
        names = [n for n in data.keys() if isinstance(data[n], h5py.Group)]
    demos = _sorted_demos(names)
    if not demos and filter_key is None:
        raise _layout_error(path, "groups data/demo_0, data/demo_1, ...", data.keys())
    for name in demos[:1] + demos[-1:]:
        found = set(data[name].keys())
        if not set(REQUIRED_DEMO_KEYS) <= found:
            raise _layout_error(
                path, f"data/{name} with {list(REQUIRED_DEMO_KEYS)} (+ states, rewards, dones, next_obs)", found
            )
    return demos


def _env_args(f: h5py.File) -> dict:
    raw = f["data"].attrs.get("env_args")
    if raw is None:
        return {}
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8")
    try:
        return json.loads(raw)
    except (TypeError, ValueError):
        return {"raw": str(raw)}


def check_recorded_task(path, task: str) -> None:
    """Refuse a file whose recorded environment (``env_args.env_name``) is another task's."""
    want = TASK_ENV_NAMES.get(task)
    with _open(path) as f:
        got = _env_args(f).get("env_name") if "data" in f else None
    if want is not None and got is not None and got != want:
        other = {v: k for k, v in TASK_ENV_NAMES.items()}.get(got)
        fix = f"task={other}, or " if other else ""
        raise ValueError(f"{path} was recorded in {got} (data.attrs env_args.env_name), but task={task} runs {want}; "
                         f"pass {fix}the {want} dataset with task.dataset.path=")


def _read(ds: h5py.Dataset, path, n: int | None = None, episode: int | None = None) -> np.ndarray:
    """``ds[:n]``; a chunk that cannot be read (its filter fails) ends in one line naming the file,
    the dataset and the episode."""
    try:
        return ds[:n] if n is not None else ds[()]
    except OSError as exc:  # h5py: "Can't synchronously read data (filter returned failure ...)"
        where = f" (episode {episode})" if episode is not None else ""
        raise damaged(path, ds.name.lstrip("/"), exc, where) from None


def _num_samples(g: h5py.Group) -> int:
    n = g.attrs.get("num_samples")
    return int(n) if n is not None else int(g["actions"].shape[0])


def _as_float32(arr_dtype) -> np.dtype:
    return np.dtype(np.float32) if np.issubdtype(arr_dtype, np.floating) else np.dtype(arr_dtype)


def _image_case(data: h5py.Group, used: list[tuple[str, int]], src: str, path, warn: bool = True) -> str:
    """Image encoding of ``src`` judged on frames of the first and last demos (warns for float 0-1)."""
    picked = used[:1] + used[-1:] if len(used) > 1 else used
    shape = data[picked[0][0]][src].shape[1:]
    samples = []
    for (d, n), episode in zip(picked, (0, len(used) - 1)):
        if src in data[d] and data[d][src].shape[1:] == shape:
            try:
                samples.append(sample_frames(data[d][src], n))
            except OSError as exc:
                raise damaged(path, f"data/{d}/{src}", exc, f" (episode {episode})") from None
    case = image_case(np.concatenate(samples), path, src, f" (sampled from data/{picked[0][0]}, data/{picked[-1][0]})")
    if case == "float01" and warn:
        warn_float01(path, src)
    return case


def _empty_demos(demos: list[str], lengths, path) -> str:
    """The refusal of demos without a sample ("" if none): an empty episode is not a demonstration, and left
    out silently it would shift the train/validation split (a validation set of nothing)."""
    empty = [d for d, n in zip(demos, lengths) if n <= 0]
    if not empty:
        return ""
    more = f" (and {len(empty) - 1} more)" if len(empty) > 1 else ""
    return (f"{path}: data/{empty[0]}{more} has no samples (0 steps): an empty episode is not a demonstration; "
            f"delete it (and its name in mask/*) from the file, or regenerate the dataset")


def read_robomimic_hdf5(
    path: str | os.PathLike, obs_keys: list[str] | None = None, filter_key: str | None = None,
    max_episodes: int | None = None,
) -> EpisodeData:
    """Flatten a robomimic HDF5 file (ours or a public ``image.hdf5`` / ``image_v15.hdf5``).

    Args:
        obs_keys: observation keys to load (default: all keys of the first demo's ``obs``).
        filter_key: a ``mask/<filter_key>`` subset such as "train" or "valid" (default: all demos).
        max_episodes: read only the first N demos.

    Returns EpisodeData with ``data = {obs_key: (N, ...), "action": (N, A)}`` over demos sorted by
    their number, and meta ``{"env_args", "format", "path", "filter_key", "demos", "env_name"}``.
    """
    with _open(path) as f:
        demos = _demos(f, path, filter_key)
        if not demos:
            raise RobomimicFormatError(f"{path}: mask/{filter_key} selects no demos")
        data = f["data"]
        keys = _obs_keys(data[demos[0]], obs_keys, path)
        lengths = [_num_samples(data[d]) for d in demos]
        if empty := _empty_demos(demos, lengths, path):
            raise RobomimicFormatError(empty)
        used = list(zip(demos, lengths))[:max_episodes]  # the first N only: the rest is neither allocated nor read
        sources = {"action": "actions", **{k: f"obs/{k}" for k in keys}}
        out, image_cases = _allocate(data, used, sources, path)
        start = 0
        for i, (d, n) in enumerate(used):  # one demo at a time into the flat arrays: no per-demo copies kept
            for name, src in sources.items():
                out[name][start : start + n] = _demo_block(data[d], d, i, n, src, out[name].shape[1:],
                                                           image_cases.get(name), path)
            start += n
        env_args = _env_args(f)
    meta = {
        "env_args": env_args,
        "env_name": env_args.get("env_name"),
        "format": FORMAT,
        "path": str(path),
        "filter_key": filter_key,
        "demos": [d for d, _ in used],
    }
    return EpisodeData(out, np.cumsum([n for _, n in used]), meta)


def _obs_keys(first: h5py.Group, obs_keys: list[str] | None, path) -> list[str]:
    """The keys to read: ``obs_keys``, each refused in one message if the first demo lacks it."""
    available = sorted(first["obs"].keys())
    keys = list(available) if obs_keys is None else list(obs_keys)
    missing = [k for k in keys if k not in available]
    if missing:
        raise MissingObsKeyError(f"{path}: observation key(s) {missing} not present; available obs keys: {available}",
                                 missing)
    return keys


def _allocate(data: h5py.Group, used: list[tuple[str, int]], sources: dict[str, str], path):
    """The flat output arrays (all demos' frames, shaped and typed as the first demo's key), and the
    image encoding of each image key, so every demo's frames are converted the same way. Refused
    before anything is read or allocated when they do not fit in the memory available."""
    total = sum(n for _, n in used)
    first = data[used[0][0]]
    frames = {name: first[src].shape[1:] for name, src in sources.items()}
    dtypes = {name: np.dtype(np.uint8) if is_image(first[src].shape) else _as_float32(first[src].dtype)
              for name, src in sources.items()}
    elements = {k: int(np.prod(frames[k], dtype=np.float64)) for k in sources}  # per frame
    kept = sum(total * elements[k] * dtypes[k].itemsize for k in sources)
    # one demo's block of one key is read at a time, in the file's dtype, before it is copied in
    block = max(n for _, n in used) * max(elements[k] * first[src].dtype.itemsize for k, src in sources.items())
    shapes = ", ".join(f"{k} {'x'.join(map(str, frames[k])) or 'scalar'}" for k in sources)
    check_memory(kept + block, f"reading {path} ({total} frames: {shapes})", MEMORY_FIX)
    out, image_cases = {}, {}
    for name, src in sources.items():
        if is_image(first[src].shape):  # decided on a sample; every demo is checked as it is read
            image_cases[name] = _image_case(data, used, src, path)
        out[name] = np.empty((total,) + frames[name], dtype=dtypes[name])
    return out, image_cases


def _demo_block(g: h5py.Group, d: str, i: int, n: int, src: str, shape: tuple, case: str | None, path) -> np.ndarray:
    """Demo ``d``'s (episode ``i``) first ``n`` frames of ``src``, checked: present, of the first
    demo's frame shape, finite (low-dim) or converted to uint8 (images)."""
    if src not in g:
        found = list(g.keys()) + ([f"obs/{k}" for k in g["obs"].keys()] if "obs" in g else [])
        raise _layout_error(path, f"data/{d}/{src}", found)
    ds = g[src]
    if ds.shape[0] < n or ds.shape[1:] != shape:
        raise RobomimicFormatError(f"{path}: data/{d}/{src} has shape {ds.shape}, expected ({n}, *{shape})")
    block = _read(ds, path, n, episode=i)
    if case is not None:
        return image_to_uint8(block, case, path, src, f" in episode {i} (data/{d})")
    check_finite(block, path, src, episode=i, label=f"data/{d}")
    return block


def describe_robomimic_hdf5(path: str | os.PathLike) -> dict:
    """Summary for ``python -m datasets.describe``: episodes, frames, key shapes/dtypes (and each image
    key's encoding), action range, env name, masks; what the reader would refuse is listed under
    ``problems`` (the reader's own messages) instead of raised."""
    with _open(path) as f:
        demos = _demos(f, path, None)
        data = f["data"]
        env_args = _env_args(f)
        lengths = np.array([_num_samples(data[d]) for d in demos])
        g0 = data[demos[0]]
        keys = _key_summary(g0)
        used = [(d, n) for d, n in zip(demos, lengths) if n > 0]
        obs_keys = sorted(g0["obs"].keys()) if "obs" in g0 else []
        image_srcs = [f"obs/{k}" for k in obs_keys if is_image(g0["obs"][k].shape)]
        problems = [empty] if (empty := _empty_demos(demos, lengths, path)) else []
        problems += _image_problems(data, used, image_srcs, keys, path)
        lowdim = ["actions"] + [f"obs/{k}" for k in obs_keys if f"obs/{k}" not in image_srcs]
        problems += _lowdim_problems(data, used, lowdim, path)
        chunk_problems, a_min, a_max = _full_read(data, demos, lengths, image_srcs, path)
        problems += chunk_problems
        masks = {m: int(f["mask"][m].shape[0]) for m in f["mask"].keys()} if "mask" in f else {}
        return {
            "path": str(path),
            "format": FORMAT,
            "valid": not problems,
            "problems": list(dict.fromkeys(problems)),  # a damaged sample is met again by the full read
            "env_name": env_args.get("env_name"),
            "env_version": env_args.get("env_version"),
            "episodes": int(len(demos)),
            "frames": int(lengths.sum()),
            "total_attr": int(data.attrs["total"]) if "total" in data.attrs else None,
            "episode_length": {
                "min": int(lengths.min()),
                "max": int(lengths.max()),
                "mean": float(lengths.mean()),
            },
            "keys": dict(sorted(keys.items())),
            "obs_keys": sorted(g0["obs"].keys()),
            "action_min": None if a_min is None else [float(x) for x in a_min],
            "action_max": None if a_max is None else [float(x) for x in a_max],
            "masks": masks,
            "size_mb": round(os.path.getsize(path) / 2**20, 2),
        }


def _key_summary(g0: h5py.Group) -> dict:
    """Every dataset of the first demo (``obs/agentview_image``, ``actions`` ...): frame shape, dtype, compression."""
    keys = {}

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            keys[name] = {"shape": list(obj.shape[1:]), "dtype": str(obj.dtype), "compression": obj.compression}

    g0.visititems(visit)
    return keys


def _image_problems(data: h5py.Group, used: list[tuple[str, int]], image_srcs: list[str], keys: dict, path) -> list[str]:
    """Each image key's encoding (into ``keys``), by the reader's rules on the same sample it uses;
    the refusals the reader would raise, as messages."""
    problems = []
    for src in image_srcs:
        keys[src]["image"] = "refused"
        try:
            keys[src]["image"] = IMAGE_CASES[_image_case(data, used, src, path, warn=False)] if used else IMAGE_CASES["uint8"]
        except ValueError as exc:
            problems.append(str(exc))
    return problems


def _lowdim_problems(data: h5py.Group, used: list[tuple[str, int]], lowdim: list[str], path) -> list[str]:
    """The first demo with NaN/inf per low-dim key, as the reader would refuse it."""
    problems = []
    for src in lowdim:
        for i, (d, n) in enumerate(used):
            if src not in data[d]:
                continue
            try:
                check_finite(np.asarray(_read(data[d][src], path, n, episode=i)), path, src, episode=i, label=f"data/{d}")
            except ValueError as exc:
                problems.append(str(exc))
                break
    return problems


def _full_read(data: h5py.Group, demos: list[str], lengths: np.ndarray, image_srcs: list[str], path):
    """(problems, action min, action max): every image chunk decompressed, as training would (a damaged
    chunk anywhere is found), and the action range over all demos."""
    problems, a_min, a_max = [], None, None
    for i, (d, n) in enumerate(zip(demos, lengths)):
        for src in (s for s in image_srcs if s in data[d]):
            try:
                _read(data[d][src], path, n, episode=i)
            except ValueError as exc:
                problems.append(str(exc))
        try:
            a = np.asarray(_read(data[d]["actions"], path, episode=i))
        except ValueError:  # listed by _lowdim_problems
            continue
        if a.size == 0:
            continue
        lo, hi = a.min(axis=0), a.max(axis=0)
        a_min = lo if a_min is None else np.minimum(a_min, lo)
        a_max = hi if a_max is None else np.maximum(a_max, hi)
    return problems, a_min, a_max


if __name__ == "__main__":
    import sys

    for p in sys.argv[1:]:
        print(json.dumps(describe_robomimic_hdf5(p), indent=2))
