"""LeRobotDataset v3.0 (lerobot >= 0.4, ``lerobot/pusht`` ...), read into memory.

Layout of a dataset root::

    meta/info.json                  codebase_version, fps, features (name -> dtype, shape), path templates
    meta/episodes/chunk-*/file-*.parquet   one row per episode: length, dataset_from/to_index, and per
                                    video key its file (chunk_index, file_index) and from_timestamp
    meta/tasks.parquet, meta/stats.json
    data/chunk-*/file-*.parquet     one row per frame: low-dim features, timestamp, index, episode_index ...
    videos/<key>/chunk-*/file-*.mp4 several episodes per file; an episode's frame at ``timestamp`` (from
                                    0 in each episode) is the video frame at from_timestamp + timestamp

Each task names the features that feed its inputs (``task.dataset.features``: policy key -> feature
name; a key it does not name is read under its own name). Videos (AV1, H.264 ...) are decoded once,
at start, with PyAV into uint8 arrays, so training samples from memory as it does for zarr and hdf5.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .episodes import EpisodeData, check_episode_ends, check_finite

INFO_PATH = "meta/info.json"
EPISODES_DIR = "meta/episodes"
TASKS_PATH = "meta/tasks.parquet"
STATS_PATH = "meta/stats.json"
CODEBASE_VERSION = "v3.0"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
TIMESTAMP_TOLERANCE_S = 1e-4  # lerobot's own tolerance between a frame's timestamp and the video's
IMAGE_DTYPES = ("video", "image")
BOOKKEEPING = ("timestamp", "frame_index", "episode_index", "index", "task_index")


def is_lerobot_root(path) -> bool:
    return (Path(path) / INFO_PATH).is_file()


def feature_name(key: str, features: dict[str, str] | None) -> str:
    """The LeRobot feature that feeds policy key ``key``: the task's mapping, else the key itself."""
    return (features or {}).get(key, key)


def read_info(path) -> dict:
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"dataset {root} does not exist")
    if not is_lerobot_root(root):
        raise ValueError(f"{root} is not a LeRobotDataset root: no {INFO_PATH} (pass the folder that holds meta/)")
    try:
        info = json.loads((root / INFO_PATH).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{root / INFO_PATH} is not valid JSON ({exc}); the dataset is damaged: download or export it again") from exc
    version = str(info.get("codebase_version", "?"))
    if not version.startswith("v3"):
        raise ValueError(
            f"{root} is LeRobotDataset {version}; only v3.x is read: convert it with lerobot's "
            f"convert_dataset_v21_to_v30, or download the v3.0 revision"
        )
    missing = [k for k in ("fps", "features") if k not in info]
    if missing:
        raise ValueError(f"{root / INFO_PATH} lacks {missing}; the dataset is damaged: download or export it again")
    return info


def _read_parquets(root: Path, folder: str, columns: list[str] | None = None):
    """All parquet files under ``root/folder`` as one pyarrow Table (files in name order)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted((root / folder).rglob("*.parquet"))
    if not files:
        raise ValueError(f"{root}: no parquet files under {folder}/; the dataset is incomplete: download or export it again")
    tables = []
    for f in files:
        try:
            tables.append(pq.read_table(f, columns=columns))
        except (pa.ArrowInvalid, OSError) as exc:
            reason = " ".join(str(exc).split())
            raise ValueError(f"{f} cannot be read ({reason}); the file is truncated or damaged: download or export it again") from exc
        except KeyError as exc:
            raise ValueError(f"{f} lacks column {exc}; it does not match meta/info.json") from exc
    return pa.concat_tables(tables, promote_options="default")


def read_episodes(root: Path) -> dict[str, np.ndarray]:
    """meta/episodes/ as column -> array, sorted by episode_index; bounds checked against each other."""
    table = _read_parquets(root, EPISODES_DIR)
    cols = {name: table.column(name).to_numpy() for name in table.column_names
            if not name.startswith("stats/") and name != "tasks"}
    need = ("episode_index", "length", "dataset_from_index", "dataset_to_index")
    missing = [c for c in need if c not in cols]
    if missing:
        raise ValueError(f"{root / EPISODES_DIR}: episode table lacks columns {missing}; the dataset is damaged")
    order = np.argsort(cols["episode_index"], kind="stable")
    cols = {k: v[order] for k, v in cols.items()}
    lengths = cols["dataset_to_index"] - cols["dataset_from_index"]
    bad = np.flatnonzero(lengths != cols["length"])
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{root / EPISODES_DIR}: episode {cols['episode_index'][i]} has length {cols['length'][i]} but spans "
            f"dataset index {cols['dataset_from_index'][i]}..{cols['dataset_to_index'][i]}; the dataset is damaged"
        )
    return cols


def _frame_rows(root: Path, info: dict, names: list[str], episodes: dict) -> dict[str, np.ndarray]:
    """The data/ columns ``names`` (+ timestamp), rows in episode order: episode e's frames are the rows
    whose ``index`` lies in [dataset_from_index, dataset_to_index)."""
    table = _read_parquets(root, "data", list(dict.fromkeys(["index", "timestamp", *names])))
    index = table.column("index").to_numpy()
    order = np.argsort(index, kind="stable")
    total = int(info.get("total_frames", len(index)))
    if len(index) != total or not np.array_equal(index[order], np.arange(len(index))):
        raise ValueError(
            f"{root}/data: {len(index)} frames with index not 0..{total - 1} as meta/info.json says ({total} frames); "
            f"a data file is missing or truncated: download or export it again"
        )
    rows = np.concatenate([np.arange(a, b) for a, b in zip(episodes["dataset_from_index"], episodes["dataset_to_index"])])
    out = {}
    for name in ["timestamp", *names]:
        col = table.column(name).combine_chunks()
        out[name] = _column_array(col, info["features"].get(name, {}), root, name)[order][rows]
    return out


def _column_array(col, spec: dict, root: Path, name: str) -> np.ndarray:
    """A fixed-size-list (or scalar) parquet column -> (N, *shape) numpy array, shape checked against info."""
    import pyarrow as pa

    values = col
    while pa.types.is_fixed_size_list(values.type) or pa.types.is_list(values.type):
        values = values.flatten()
    arr = values.to_numpy(zero_copy_only=False)
    if arr.dtype.kind not in "fiub":
        raise ValueError(f"{root}: feature {name!r} has dtype {arr.dtype}; low-dim features must be numeric")
    shape = tuple(spec.get("shape", ())) or (1,)
    per_row = int(np.prod(shape))
    if arr.size != len(col) * per_row:
        raise ValueError(
            f"{root}: feature {name!r} holds {arr.size / max(len(col), 1):g} values per frame but meta/info.json "
            f"says shape {list(shape)}; the dataset is damaged"
        )
    return arr.reshape((len(col), *shape))  # (N, *shape); (N, 1) for scalar columns


def _decode_video(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Every frame of an mp4 as (times (F,) seconds, frames (F, H, W, 3) uint8)."""
    import av

    if not path.is_file():
        raise FileNotFoundError(f"video {path} is missing; the dataset is incomplete: download or export it again")
    times, frames = [], []
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            for frame in container.decode(stream):
                times.append(float(frame.time))
                frames.append(frame.to_ndarray(format="rgb24"))
    except (av.error.FFmpegError, IndexError) as exc:  # a cut file: keep the frames before the cut, so the
        if not frames:  # caller names the first missing timestamp and episode
            raise ValueError(f"video {path} cannot be decoded ({exc}); the file is damaged: download or export it again") from exc
    if not frames:
        raise ValueError(f"video {path} holds no frames; the file is damaged: download or export it again")
    return np.asarray(times), np.stack(frames)


def _read_video_key(root: Path, info: dict, key: str, episodes: dict, timestamps: np.ndarray,
                    ends: np.ndarray) -> np.ndarray:
    """Frames of video feature ``key`` for every dataset frame (episode order), matched by timestamp."""
    template = info.get("video_path") or VIDEO_PATH
    cols = [f"videos/{key}/{c}" for c in ("chunk_index", "file_index", "from_timestamp")]
    if any(c not in episodes for c in cols):
        raise ValueError(f"{root / EPISODES_DIR}: episode table lacks {cols}; the dataset is damaged")
    shape = tuple(info["features"][key]["shape"])
    out = np.empty((len(timestamps), *shape), np.uint8)  # (N, H, W, C) as info.json's feature shape
    files = list(zip(episodes[cols[0]], episodes[cols[1]]))
    decoded: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
    for e, ref in enumerate(files):
        path = root / template.format(video_key=key, chunk_index=int(ref[0]), file_index=int(ref[1]))
        if ref not in decoded:
            decoded = {ref: _decode_video(path)}  # episodes of one file are contiguous: keep one file decoded
        times, frames = decoded[ref]
        if frames.shape[1:] != shape:
            raise ValueError(f"video {path} has frames of shape {frames.shape[1:]} but meta/info.json says {list(shape)} for {key!r}")
        start = int(ends[e - 1]) if e else 0
        want = episodes[cols[2]][e] + timestamps[start : ends[e]].astype(np.float64)
        idx = np.clip(np.searchsorted(times, want), 1, len(times) - 1)
        idx -= (want - times[idx - 1]) < (times[idx] - want)  # nearest decoded frame
        miss = np.flatnonzero(np.abs(times[idx] - want) > TIMESTAMP_TOLERANCE_S)
        if miss.size:
            raise ValueError(
                f"video {path} has no frame at {want[miss[0]]:.4f} s (episode {episodes['episode_index'][e]}, "
                f"frame {miss[0]}; the video ends at {times[-1]:.4f} s): the file is truncated or does not match "
                f"the episode table: download or export it again"
            )
        out[start : ends[e]] = frames[idx]
    return out


def read_lerobot(path, keys: list[str] | None = None, features: dict[str, str] | None = None) -> EpisodeData:
    """Read ``keys`` (policy names; default: every non-bookkeeping feature under its own name) plus
    ``action`` from a LeRobotDataset v3 root into memory. ``features`` maps policy key -> feature name.

    Refuses with one line: other codebase versions, missing or truncated parquet/mp4 files, episode
    bounds that disagree, shapes that differ from meta/info.json, NaN/inf in low-dim features.
    """
    root = Path(path)
    info = read_info(root)
    specs = info["features"]
    if keys is None:
        keys = [k for k in specs if k not in BOOKKEEPING and k != feature_name("action", features)]
    wanted = {k: feature_name(k, features) for k in [*keys, "action"]}
    missing = {k: n for k, n in wanted.items() if n not in specs}
    if missing:
        raise ValueError(
            f"{root}: feature(s) {sorted(missing.values())} (for {sorted(missing)}) not in meta/info.json; it has "
            f"{sorted(k for k in specs if k not in BOOKKEEPING)}: name the right ones with task.dataset.features.KEY=NAME"
        )
    episodes = read_episodes(root)
    ends = check_episode_ends(np.cumsum(episodes["length"]), None, root)
    low_dim = [n for n in wanted.values() if specs[n].get("dtype") not in IMAGE_DTYPES]
    rows = _frame_rows(root, info, low_dim, episodes)
    data = {}
    for key, name in wanted.items():
        dtype = specs[name].get("dtype")
        if dtype == "video":
            data[key] = _read_video_key(root, info, name, episodes, rows["timestamp"][:, 0], ends)
        elif dtype == "image":  # PNG bytes in parquet: lerobot writes these only with use_videos=False
            raise ValueError(f"{root}: feature {name!r} stores images in parquet; only video features are read: "
                             f"write the dataset with use_videos=True (or export it with python export_dataset.py)")
        else:
            check_finite(rows[name], root, name, episode_ends=ends)
            data[key] = rows[name].astype(np.float32)
    meta = {"format": "lerobot", "path": str(root), "fps": info["fps"], "features": wanted,
            "codebase_version": info.get("codebase_version"), "robot_type": info.get("robot_type")}
    return EpisodeData(data, ends, meta)


def _video_end(path: Path) -> float:
    """How many seconds of frames an mp4 holds, from its header (no decoding)."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        if stream.frames and stream.average_rate:
            return float(stream.frames / stream.average_rate)
        return float(container.duration or 0) / av.time_base


def _describe_videos(root: Path, info: dict, episodes: dict, key: str) -> list[str]:
    """Problems of video ``key``: missing files, files shorter than their episodes (no decoding)."""
    template = info.get("video_path") or VIDEO_PATH
    col = f"videos/{key}"
    if f"{col}/chunk_index" not in episodes:
        return [f"{root / EPISODES_DIR}: episode table lacks {col}/chunk_index; the dataset is damaged"]
    problems, ends = [], {}
    for e in range(len(episodes["length"])):
        ref = (int(episodes[f"{col}/chunk_index"][e]), int(episodes[f"{col}/file_index"][e]))
        stop = float(episodes[f"{col}/from_timestamp"][e]) + episodes["length"][e] / info["fps"]
        ends[ref] = max(ends.get(ref, 0.0), stop)
    for (chunk, file), stop in ends.items():
        path = root / template.format(video_key=key, chunk_index=chunk, file_index=file)
        try:
            have = _video_end(path) if path.is_file() else None
        except Exception as exc:  # PyAV raises several types for a damaged file
            problems.append(f"video {path} cannot be opened ({type(exc).__name__}); the file is damaged")
            continue
        if have is None:
            problems.append(f"video {path} is missing; the dataset is incomplete: download or export it again")
        elif have + TIMESTAMP_TOLERANCE_S < stop:
            problems.append(f"video {path} holds {have:.3f} s but its episodes need {stop:.3f} s: the file is truncated")
    return problems


def describe_lerobot(path) -> dict:
    """Summary for ``python -m datasets.describe``; what the reader would refuse is listed under
    ``problems`` (the reader's own messages). Videos are checked from their headers, not decoded."""
    root = Path(path)
    info = read_info(root)
    specs = info["features"]
    episodes = read_episodes(root)
    problems = []
    try:
        ends = check_episode_ends(np.cumsum(episodes["length"]), None, root)
    except ValueError as exc:
        ends = None
        problems.append(str(exc))
    low_dim = [k for k, s in specs.items() if s.get("dtype") not in IMAGE_DTYPES and k not in BOOKKEEPING]
    rows = {}
    try:
        rows = _frame_rows(root, info, low_dim, episodes)
    except ValueError as exc:
        problems.append(str(exc))
    keys = {}
    for name, spec in specs.items():
        keys[name] = {"shape": list(spec.get("shape", [])), "dtype": spec.get("dtype")}
        if spec.get("dtype") == "video":
            codec = spec.get("info", {}).get("video.codec", "?")
            keys[name]["image"] = f"video ({codec})"
            problems += _describe_videos(root, info, episodes, name)
        elif name in rows:
            try:
                check_finite(rows[name], root, name, episode_ends=ends)
            except ValueError as exc:
                problems.append(str(exc))
    action = rows.get("action", np.zeros((0, 0)))
    lengths = episodes["length"]
    return {
        "format": "lerobot", "path": str(root), "valid": not problems, "problems": problems,
        "episodes": int(len(lengths)), "frames": int(lengths.sum()),
        **({"episode_length": {"min": int(lengths.min()), "mean": float(lengths.mean()), "max": int(lengths.max())}}
           if len(lengths) else {}),
        "keys": keys,
        "action_min": action.min(0).tolist() if len(action) else [],
        "action_max": action.max(0).tolist() if len(action) else [],
        "attrs": {k: info.get(k) for k in ("codebase_version", "fps", "robot_type", "total_tasks")},
    }
