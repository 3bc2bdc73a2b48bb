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

from common.paths import UntrustedPathError, fill_template, inside, plain_name
from common.resources import check_memory

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
# the fields lerobot's path templates use (example values: a template is checked before any file is named)
DATA_FIELDS = {"chunk_index": 0, "file_index": 0}
VIDEO_FIELDS = {"video_key": "key", **DATA_FIELDS}


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
    _check_info(root, info)
    return info


def check_fps(path, fps: float, task: str) -> None:
    """A dataset recorded at another rate than the task's environment steps would train a policy that
    acts at the wrong rate (each action held for the wrong time): refused, naming both rates."""
    recorded = read_info(path)["fps"]
    if abs(recorded - fps) > 1e-9:
        raise ValueError(
            f"{path} was recorded at {recorded:g} fps but task {task!r} runs at {fps:g} fps (task.fps): a policy "
            f"trained on it would act at the wrong rate; resample the data to {fps:g} fps, or pass "
            f"task.fps={recorded:g} if your environment steps at {recorded:g} Hz")


def _check_info(root: Path, info: dict) -> None:
    """meta/info.json comes from elsewhere: its names become folders and its templates paths, so
    feature names must be plain names, templates may use only the documented fields, fps and shapes
    must be numbers; each is refused in one line before any other file is opened."""
    where = root / INFO_PATH
    fps = info["fps"]
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not fps > 0:
        raise ValueError(f"{where}: fps is {fps!r}, not a positive number; the dataset is damaged")
    if not isinstance(info["features"], dict):
        raise ValueError(f"{where}: features is not a mapping of name -> spec; the dataset is damaged")
    for name, spec in info["features"].items():
        plain_name(name, f"{where}: feature")
        shape = spec.get("shape", []) if isinstance(spec, dict) else None
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise ValueError(f"{where}: feature {name!r} has shape {shape!r}, not a list of sizes; the dataset is damaged")
    for key, fields in (("data_path", DATA_FIELDS), ("video_path", VIDEO_FIELDS)):
        if info.get(key) is not None:
            rel = Path(fill_template(info[key], fields, f"{where}'s {key}"))
            # the reader takes every parquet under data/ and never follows data_path, but a dataset naming a file
            # elsewhere is refused all the same (video_path is checked per video, where it is used)
            if key == "data_path" and (rel.is_absolute() or ".." in rel.parts):
                raise UntrustedPathError(f"{where}'s data_path ({info[key]}) is absolute or contains '..'; a dataset "
                                         f"may only name files inside {root}, by paths that do not climb")


def _video_file(root: Path, info: dict, key: str, chunk: int, file: int) -> Path:
    """The mp4 of video feature ``key`` in (chunk, file), from info.json's template: inside ``root`` or refused."""
    rel = fill_template(info.get("video_path") or VIDEO_PATH,
                        {"video_key": key, "chunk_index": int(chunk), "file_index": int(file)},
                        f"{root / INFO_PATH}'s video_path")
    return inside(root, rel, f"{root / INFO_PATH}'s video_path for {key!r} (chunk {chunk}, file {file})")


def _read_parquets(root: Path, folder: str, columns: list[str] | None = None):
    """All parquet files under ``root/folder`` as one pyarrow Table (files in name order)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted((root / folder).rglob("*.parquet"))
    if not files:
        raise ValueError(f"{root}: no parquet files under {folder}/; the dataset is incomplete: download or export it again")
    # a symbolic link in the dataset may not lead out of it
    files = [inside(root, f.relative_to(root), f"{root}: {f.relative_to(root)}, through a symbolic link,") for f in files]
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
    check_bounds(root, episodes, len(index))
    rows = np.concatenate([np.arange(a, b) for a, b in zip(episodes["dataset_from_index"], episodes["dataset_to_index"])])
    out = {}
    for name in ["timestamp", *names]:
        col = table.column(name).combine_chunks()
        out[name] = _column_array(col, info["features"].get(name, {}), root, name)[order][rows]
    return out


def check_bounds(root: Path, episodes: dict, total: int) -> None:
    """Episodes tile the data: each starts where the one before ended, the first at 0, the last at the
    data's end. Overlaps would train on frames twice, gaps drop them, a bound past the end reads nothing."""
    starts, stops = episodes["dataset_from_index"], episodes["dataset_to_index"]
    expected = np.concatenate([[0], stops[:-1]])
    bad = np.flatnonzero(starts != expected)
    if bad.size:
        i = int(bad[0])
        after = f"episode {episodes['episode_index'][i - 1]} ends at {expected[i]}" if i else "the data starts at 0"
        kind = "overlaps the one before" if starts[i] < expected[i] else "leaves a gap"
        raise ValueError(f"{root / EPISODES_DIR}: episode {episodes['episode_index'][i]} starts at dataset index "
                         f"{starts[i]} but {after}: it {kind}; the dataset is damaged: download or export it again")
    if len(stops) and stops[-1] != total:
        raise ValueError(f"{root / EPISODES_DIR}: the last episode ({episodes['episode_index'][-1]}) ends at dataset "
                         f"index {stops[-1]} but data/ holds {total} frames; the dataset is damaged: download or "
                         f"export it again")


def check_timestamps(root: Path, timestamps: np.ndarray, ends: np.ndarray, fps: float, episode_index) -> None:
    """Consecutive frames of an episode lie 1/fps s apart (lerobot's own check, its tolerance): data/
    timestamps spaced otherwise contradict meta/info.json's fps."""
    steps = np.diff(timestamps.astype(np.float64))  # step i: frame i -> i + 1
    within = np.ones(len(steps), bool)
    within[ends[:-1] - 1] = False  # the step from an episode's last frame to the next one's first
    off = np.flatnonzero(within & (np.abs(steps - 1.0 / fps) > TIMESTAMP_TOLERANCE_S))
    if off.size:
        row = int(off[0]) + 1
        e = int(np.searchsorted(ends, row, side="right"))
        frame = row - (int(ends[e - 1]) if e else 0)
        raise ValueError(
            f"{root}/data: frame {frame} of episode {episode_index[e]} lies {steps[row - 1]:.4f} s after the one "
            f"before, but meta/info.json's fps ({fps:g}) says {1.0 / fps:.4f} s; the dataset's fps or its "
            f"timestamps are wrong: fix meta/info.json or export it again")


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


def _video_columns(root: Path, episodes: dict, key: str) -> list[str]:
    cols = [f"videos/{key}/{c}" for c in ("chunk_index", "file_index", "from_timestamp")]
    if any(c not in episodes for c in cols):
        raise ValueError(f"{root / EPISODES_DIR}: episode table lacks {cols}; the dataset is damaged")
    return cols


def _file_stops(root: Path, episodes: dict, key: str, fps: float) -> dict[tuple[int, int], float]:
    """(chunk, file) -> the second up to which video ``key``'s episodes in that file need frames."""
    chunk, file, start = _video_columns(root, episodes, key)
    stops: dict[tuple[int, int], float] = {}
    for e in range(len(episodes["length"])):
        ref = (int(episodes[chunk][e]), int(episodes[file][e]))
        stops[ref] = max(stops.get(ref, 0.0), float(episodes[start][e]) + episodes["length"][e] / fps)
    return stops


def _check_decode_memory(root: Path, info: dict, episodes: dict, names: list[str]) -> None:
    """Before decoding: the frames of every camera (kept) plus one video file's frames (decoded at a
    time) must fit in the memory available now; a dataset too large is refused, not killed by the kernel."""
    frames = int(np.sum(episodes["length"]))
    needed, largest_file = 0, 0
    for name in names:
        frame_bytes = int(np.prod(info["features"][name]["shape"], dtype=np.float64))
        needed += frames * frame_bytes
        stops = _file_stops(root, episodes, name, info["fps"]).values()
        largest_file = max(largest_file, (int(max(stops, default=0.0) * info["fps"]) + 1) * frame_bytes)
    shapes = ", ".join("x".join(map(str, info["features"][n]["shape"])) for n in names)
    check_memory(needed + largest_file, f"decoding {root}'s videos ({frames} frames of {shapes})",
                 "free memory, use a machine with more, or train on fewer episodes (train.max_episodes=N decodes "
                 "only the first N)")


def _decode_video(path: Path, shape: tuple, until: float) -> tuple[np.ndarray, list[np.ndarray]]:
    """The frames of an mp4 up to ``until`` s as (times (F,) seconds, F frames (H, W, 3) uint8); a frame
    of another shape than meta/info.json's ``shape`` is refused before more are decoded."""
    import av

    if not path.is_file():
        raise FileNotFoundError(f"video {path} is missing; the dataset is incomplete: download or export it again")
    times, frames = [], []
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            for frame in container.decode(stream):
                image = frame.to_ndarray(format="rgb24")
                if image.shape != shape:
                    raise ValueError(f"video {path} has frames of shape {image.shape} but meta/info.json says "
                                     f"{list(shape)}; the dataset is damaged: download or export it again")
                times.append(float(frame.time))
                frames.append(image)
                if times[-1] > until + TIMESTAMP_TOLERANCE_S:  # frames past the episodes' end are not needed
                    break
    except (av.error.FFmpegError, IndexError) as exc:  # a cut file: keep the frames before the cut, so the
        if not frames:  # caller names the first missing timestamp and episode
            raise ValueError(f"video {path} cannot be decoded ({exc}); the file is damaged: download or export it again") from exc
    if not frames:
        raise ValueError(f"video {path} holds no frames; the file is damaged: download or export it again")
    return np.asarray(times), frames


def _nearest(times: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Index of the decoded frame nearest each wanted time."""
    if len(times) == 1:
        return np.zeros(len(want), np.int64)
    idx = np.clip(np.searchsorted(times, want), 1, len(times) - 1)
    return idx - ((want - times[idx - 1]) < (times[idx] - want))


def _read_video_key(root: Path, info: dict, key: str, episodes: dict, timestamps: np.ndarray,
                    ends: np.ndarray) -> np.ndarray:
    """Frames of video feature ``key`` for every dataset frame (episode order), matched by timestamp."""
    chunk, file, start_col = _video_columns(root, episodes, key)
    stops = _file_stops(root, episodes, key, info["fps"])
    shape = tuple(info["features"][key]["shape"])
    out = np.empty((len(timestamps), *shape), np.uint8)  # (N, H, W, C) as info.json's feature shape
    decoded: dict[tuple, tuple[Path, np.ndarray, list]] = {}
    for e in range(len(ends)):
        ref = (int(episodes[chunk][e]), int(episodes[file][e]))
        if ref not in decoded:  # episodes of one file are contiguous: keep one file decoded
            decoded = {}  # the previous file's frames go before the next is decoded
            path = _video_file(root, info, key, *ref)
            decoded = {ref: (path, *_decode_video(path, shape, stops[ref]))}
        path, times, frames = decoded[ref]
        start = int(ends[e - 1]) if e else 0
        want = episodes[start_col][e] + timestamps[start : ends[e]].astype(np.float64)
        idx = _nearest(times, want)
        miss = np.flatnonzero(np.abs(times[idx] - want) > TIMESTAMP_TOLERANCE_S)
        if miss.size:
            raise ValueError(
                f"video {path} has no frame at {want[miss[0]]:.4f} s (episode {episodes['episode_index'][e]}, "
                f"frame {miss[0]}; the video ends at {times[-1]:.4f} s): the file is truncated or does not match "
                f"the episode table: download or export it again"
            )
        out[start : ends[e]] = np.stack([frames[i] for i in idx])  # (T_e, H, W, C), one episode at a time
    return out


def read_lerobot(path, keys: list[str] | None = None, features: dict[str, str] | None = None,
                 max_episodes: int | None = None) -> EpisodeData:
    """Read ``keys`` (policy names; default: every non-bookkeeping feature under its own name) plus
    ``action`` from a LeRobotDataset v3 root into memory. ``features`` maps policy key -> feature name;
    ``max_episodes``: decode only the first N episodes (every bound is still checked).

    Refuses with one line: other codebase versions, missing or truncated parquet/mp4 files, episode
    bounds that overlap, leave gaps or pass the data, timestamps that contradict the fps, shapes that
    differ from meta/info.json, NaN/inf in low-dim features, names and templates that would reach files
    outside the root, more frames than the memory available.
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
    check_timestamps(root, rows["timestamp"][:, 0], ends, info["fps"], episodes["episode_index"])
    if max_episodes is not None and max_episodes < len(ends):  # rows are in episode order
        episodes = {k: v[:max_episodes] for k, v in episodes.items()}
        ends = ends[:max_episodes]
        rows = {k: v[: ends[-1]] for k, v in rows.items()}
    videos = [n for n in wanted.values() if specs[n].get("dtype") == "video"]
    _check_decode_memory(root, info, episodes, videos)
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
    try:
        stops = _file_stops(root, episodes, key, info["fps"])
    except ValueError as exc:
        return [str(exc)]
    problems = []
    for (chunk, file), stop in stops.items():
        try:
            path = _video_file(root, info, key, chunk, file)
        except UntrustedPathError as exc:
            problems.append(str(exc))
            continue
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
        if ends is not None:
            check_timestamps(root, rows["timestamp"][:, 0], ends, info["fps"], episodes["episode_index"])
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
