"""Write any dataset the package reads as a LeRobotDataset v3.0.

    python export_dataset.py src=data/pusht/demos.zarr out=data/pusht/demos_lerobot
    python export_dataset.py src=data/lift/ph_image.hdf5 out=data/lift/lerobot codec=h264 overwrite=true

Options: ExportConfig below (export_dataset.py is the command line, this module the library it
calls). Feature names come from the task's ``dataset.features``
(configs/task/<task>.yaml, lerobot/pusht's names for PushT), so ``task.dataset.path=OUT`` trains
on the export as it is. Images become one mp4 per camera (AV1 by default, as lerobot writes, or
H.264) whose frame i lies at exactly i/fps s; low-dim keys and actions go to data/ parquet.
Output goes to a temporary folder renamed at the end; an existing ``out`` is replaced only with
``overwrite=true`` and only if this exporter wrote it (its ``.export`` marker lists every file it wrote)
and it holds nothing else. Every refusal (options, ``out``, ``out`` inside a dataset) comes before the
source is read; a disk that fills up ends in one line and leaves nothing behind.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from common.ownership import Owner
from common.paths import inside, plain_name
from common.resources import is_no_room, no_room

from .episodes import EpisodeData, atomic_output, check_writable, is_image, recover_output
from .lerobot import (
    CODEBASE_VERSION, DATA_PATH, EPISODES_DIR, INFO_PATH, STATS_PATH, TASKS_PATH, VIDEO_PATH, feature_name,
    is_lerobot_root,
)

CODECS = {"av1": "libsvtav1", "h264": "libx264"}  # PyAV's wheels carry both encoders
CRF_RANGE = {"av1": (0, 63), "h264": (0, 51)}  # what each encoder accepts (FFmpeg's option ranges)
# its .export marker, written into every export, lists the files it wrote: overwrite=true replaces only such a folder
EXPORTER = Owner("export_dataset.py", ".export", "an export")
SVT_LOG_ERRORS = "1"
SVTAV1_PRESET = "12"  # lerobot's default: the fastest preset
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)  # lerobot's stats.json carries q01 ... q99
EPISODE_FILE = f"{EPISODES_DIR}/chunk-000/file-000.parquet"  # one file: our datasets are small
STATS_BLOCK = 256  # frames per block of the image statistics: no full float copy of the video
# info.json's chunking and file-size settings: lerobot's defaults, which its own writer records
FILE_LIMITS = {"chunks_size": 1000, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200}


@dataclass
class ExportConfig:
    src: str  # a file the package reads (.zarr, .hdf5, LeRobot root)
    out: str  # the LeRobot dataset root to write
    overwrite: bool = False  # replace an existing LeRobot dataset at out
    task: Optional[str] = None  # names the features and fps; default: the source's own task
    fps: Optional[int] = None  # default: the task's fps (configs/task/<task>.yaml)
    codec: str = "av1"  # av1 | h264
    crf: int = 30  # lerobot's default quality; lower is closer to the source, larger
    gop: int = 2  # keyframe interval: lerobot's default, cheap random access by timestamp

    def __post_init__(self):
        if self.codec not in CODECS:
            raise ValueError(f"codec={self.codec!r} is not known; choose one of {', '.join(CODECS)}")
        if self.fps is not None and self.fps < 1:
            raise ValueError(f"fps must be >= 1, got {self.fps}")
        low, high = CRF_RANGE[self.codec]
        if not low <= self.crf <= high:
            raise ValueError(f"crf={self.crf} is out of range for codec={self.codec}: choose {low}-{high} "
                             f"(lower is closer to the source and larger; lerobot's default is 30)")
        if self.gop < 1:
            raise ValueError(f"gop must be >= 1 (frames between keyframes), got {self.gop}")


def source_task(data: EpisodeData) -> str | None:
    """The package's task name of a dataset read by any reader, when its metadata says so."""
    if data.meta.get("task"):
        return str(data.meta["task"])
    env_name = data.meta.get("env_name")
    if env_name:
        from envs.robosuite_tasks import TASK_TO_ENV_NAME

        return {v: k for k, v in TASK_TO_ENV_NAME.items()}.get(env_name)
    return None


def _feature_spec(arr: np.ndarray, fps: int, codec: str) -> dict:
    if is_image(arr.shape):
        h, w, c = arr.shape[1:]
        return {"dtype": "video", "shape": [h, w, c], "names": ["height", "width", "channel"],
                "info": {"video.height": h, "video.width": w, "video.codec": codec, "video.pix_fmt": "yuv420p",
                         "video.is_depth_map": False, "video.fps": fps, "video.channels": c, "has_audio": False}}
    return {"dtype": "float32", "shape": [int(np.prod(arr.shape[1:]))], "names": None}


def _stats(arr: np.ndarray) -> dict:
    """lerobot's stats.json entry: images per channel (C, 1, 1) in [0, 1]; low-dim per dimension."""
    if is_image(arr.shape):
        c = arr.shape[-1]
        mean, sq = np.zeros(c), np.zeros(c)
        lo, hi = arr.reshape(-1, c).min(0) / 255.0, arr.reshape(-1, c).max(0) / 255.0
        for s in range(0, len(arr), STATS_BLOCK):  # (B, H, W, C) blocks
            block = arr[s : s + STATS_BLOCK].reshape(-1, c).astype(np.float64) / 255.0
            mean += block.sum(0)
            sq += (block**2).sum(0)
        n = arr.size // c
        mean, std = mean / n, np.sqrt(np.maximum(sq / n - (mean / n) ** 2, 0.0))
        def to_chw(v):
            return np.asarray(v).reshape(c, 1, 1).tolist()  # (C,) -> (C, 1, 1), lerobot's image stats shape

        return {"min": to_chw(lo), "max": to_chw(hi), "mean": to_chw(mean), "std": to_chw(std), "count": [len(arr)]}
    flat = arr.reshape(len(arr), -1).astype(np.float64)  # (T, D)
    out = {"min": flat.min(0), "max": flat.max(0), "mean": flat.mean(0), "std": flat.std(0)}
    out.update({f"q{round(q * 100):02d}": np.quantile(flat, q, axis=0) for q in QUANTILES})
    return {**{k: v.tolist() for k, v in out.items()}, "count": [len(arr)]}


def write_video(path: Path, frames: np.ndarray, fps: int, codec: str, crf: int, gop: int) -> None:
    """(T, H, W, 3) uint8 -> mp4 whose frame i has pts i in time base 1/fps (exactly i/fps s)."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    options = {"crf": str(crf), "g": str(gop)}
    if codec == "av1":
        options["preset"] = SVTAV1_PRESET
    with av.open(str(path), "w") as container:
        stream = container.add_stream(CODECS[codec], rate=fps, options=options)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        stream.time_base = Fraction(1, fps)
        for i, image in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, fps)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))


def _fixed_list(arr: np.ndarray):
    import pyarrow as pa

    flat = arr.reshape(len(arr), -1)  # (T, D): lerobot stores low-dim features as fixed-size lists
    return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1])


def _frame_table(data: EpisodeData, names: dict[str, str], fps: int):
    import pyarrow as pa

    ends = data.episode_ends
    starts = np.concatenate([[0], ends[:-1]])
    episode = np.repeat(np.arange(len(ends)), ends - starts)
    frame = np.arange(data.num_frames) - starts[episode]
    columns = {names[k]: _fixed_list(v.astype(np.float32)) for k, v in data.data.items() if not is_image(v.shape)}
    columns.update({
        "timestamp": pa.array((frame / fps).astype(np.float32)), "frame_index": pa.array(frame.astype(np.int64)),
        "episode_index": pa.array(episode.astype(np.int64)), "index": pa.array(np.arange(data.num_frames, dtype=np.int64)),
        "task_index": pa.array(np.zeros(data.num_frames, np.int64)),
    })
    return pa.table(columns)


def _episode_table(data: EpisodeData, video_names: list[str], fps: int, task_text: str):
    import pyarrow as pa

    ends = data.episode_ends
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    n = len(ends)
    zeros = np.zeros(n, np.int64)
    columns = {
        "episode_index": np.arange(n, dtype=np.int64), "tasks": pa.array([[task_text]] * n, pa.list_(pa.string())),
        "length": (ends - starts).astype(np.int64), "data/chunk_index": zeros, "data/file_index": zeros,
        "dataset_from_index": starts, "dataset_to_index": ends.astype(np.int64),
    }
    for name in video_names:  # every camera in one file, episodes one after another
        columns.update({f"videos/{name}/chunk_index": zeros, f"videos/{name}/file_index": zeros,
                        f"videos/{name}/from_timestamp": starts / fps, f"videos/{name}/to_timestamp": ends / fps})
    columns.update({"meta/episodes/chunk_index": zeros, "meta/episodes/file_index": zeros})
    return pa.table(columns)


def _tasks_table(task_text: str):
    """meta/tasks.parquet as lerobot writes it (from pandas): the task strings are the table's index."""
    import pyarrow as pa

    def column(name, field, kind):
        return {"name": name, "field_name": field, "pandas_type": kind,
                "numpy_type": "int64" if kind == "int64" else "object", "metadata": None}

    pandas_meta = {
        "index_columns": ["__index_level_0__"],
        "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
                            "metadata": {"encoding": "UTF-8"}}],
        "columns": [column("task_index", "task_index", "int64"), column(None, "__index_level_0__", "unicode")],
        "attributes": {}, "creator": {"library": "pyarrow", "version": pa.__version__},
    }
    table = pa.table({"task_index": pa.array([0], pa.int64()), "__index_level_0__": [task_text]})
    return table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})


def _dataset_around(path: Path) -> Path | None:
    """The dataset folder (LeRobot root or zarr) that ``path`` lies in, if any: its readers take every file under it."""
    for parent in path.parents:
        if is_lerobot_root(parent) or (parent / ".zgroup").exists() or (parent / "zarr.json").exists():
            return parent
    return None


def check_not_in_source(src: Path, out: Path) -> None:
    """``out`` may not be the source, lie inside it or hold it, nor lie inside any other dataset (a
    reader takes every file under a dataset root, so an export inside one makes it unreadable)."""
    s, o = src.resolve(), out.resolve()
    if o == s:
        raise ValueError(f"out={out} is the source itself; choose another out=")
    if s in o.parents:
        raise ValueError(f"out={out} lies inside src={src}; writing there would change the source: choose an out= "
                         f"outside it")
    if o in s.parents:
        raise ValueError(f"src={src} lies inside out={out}; replacing out would delete the source: choose another out=")
    around = _dataset_around(o)
    if around is not None:
        raise ValueError(f"out={out} lies inside the dataset {around}; writing there would make it unreadable: "
                         f"choose an out= outside it")


def check_out(out: Path, overwrite: bool) -> None:
    """Before the source is read: ``out`` can be written, and holds nothing or (overwrite=true) an
    export of this exporter with nothing added to it. Deletes nothing."""
    check_writable(out, "out")  # the new export is written beside it and renamed in
    if not (out.exists() or out.is_symlink()):
        return
    if not overwrite:
        raise FileExistsError(f"{out} already exists; pass overwrite=true to replace it, or choose another out=")
    EXPORTER.check_replaceable(out)


def _write_files(tmp: Path, data: EpisodeData, names: dict[str, str], fps: int, task_text: str, codec: str,
                 crf: int, gop: int) -> None:
    """The dataset's files under ``tmp``; every path derived from a name checked to stay inside it."""
    import pyarrow.parquet as pq

    features = {names[k]: _feature_spec(v, fps, codec) for k, v in data.data.items()}
    videos = [names[k] for k, v in data.data.items() if is_image(v.shape)]
    for key, arr in data.data.items():
        if is_image(arr.shape):
            rel = VIDEO_PATH.format(video_key=names[key], chunk_index=0, file_index=0)
            write_video(inside(tmp, rel, f"the video of feature {names[key]!r}"), arr, fps, codec, crf, gop)
    data_file = tmp / DATA_PATH.format(chunk_index=0, file_index=0)
    data_file.parent.mkdir(parents=True)
    frames = _frame_table(data, names, fps)
    pq.write_table(frames, data_file)
    (tmp / EPISODE_FILE).parent.mkdir(parents=True)
    pq.write_table(_episode_table(data, videos, fps, task_text), tmp / EPISODE_FILE)
    pq.write_table(_tasks_table(task_text), tmp / TASKS_PATH)
    stats = {names[k]: _stats(v) for k, v in data.data.items()}
    for col in ("timestamp", "frame_index", "episode_index", "index", "task_index"):
        stats[col] = _stats(frames.column(col).to_numpy())
    (tmp / STATS_PATH).write_text(json.dumps(stats, indent=2))
    for col in ("timestamp", "frame_index", "episode_index", "index", "task_index"):
        dtype = "float32" if col == "timestamp" else "int64"
        features[col] = {"dtype": dtype, "shape": [1], "names": None}
    info = {
        "codebase_version": CODEBASE_VERSION, "robot_type": data.meta.get("robot_type"),
        "total_episodes": data.num_episodes, "total_frames": data.num_frames, "total_tasks": 1,
        **FILE_LIMITS, "fps": fps,
        "splits": {"train": f"0:{data.num_episodes}"}, "data_path": DATA_PATH,
        "video_path": VIDEO_PATH if videos else None, "features": features,
    }
    (tmp / INFO_PATH).write_text(json.dumps(info, indent=4))  # a root with info.json is complete
    EXPORTER.sign(tmp)  # last: the marker lists every file written


def write_lerobot(out, data: EpisodeData, names: dict[str, str], *, fps: int, task_text: str, codec: str = "av1",
                  crf: int = 30, gop: int = 2, overwrite: bool = False) -> Path:
    """Write ``data`` (policy keys, renamed by ``names``) as a LeRobotDataset v3.0 root at ``out``."""
    out = Path(out)
    for name in names.values():  # a feature's name becomes a folder of its video
        plain_name(name, "feature name")
    clash = sorted({n for n in names.values() if list(names.values()).count(n) > 1})
    if clash:
        raise ValueError(f"several keys would be written as feature(s) {clash}: give them distinct names in task.dataset.features")
    recover_output(out)
    check_out(out, overwrite)
    with atomic_output(out, overwrite=overwrite) as tmp:
        try:
            _write_files(tmp, data, names, fps, task_text, codec, crf, gop)
        except OSError as exc:  # the temporary folder goes (atomic_output): nothing partial is left
            if not is_no_room(exc):
                raise
            name = Path(exc.filename) if getattr(exc, "filename", None) else None
            what = out / name.relative_to(tmp) if name is not None and tmp in name.parents else out
            raise no_room(exc, what, f"nothing was written at {out} (the partial export was removed): free space on "
                                     f"that disk or choose an out= on another, then run the command again") from None
    return out


def export(cfg: ExportConfig, load_task: Callable[[str], Any]) -> dict:
    """Export ``cfg.src`` to ``cfg.out``; ``load_task(name)`` gives the task's config (its ``fps`` and
    ``dataset.features``: ``core.config.load_task`` in the command, since the data layer reads no configs)."""
    from .factory import read_dataset

    src, out = Path(cfg.src), Path(cfg.out)
    if not src.exists():
        raise FileNotFoundError(f"src={src} does not exist")
    check_not_in_source(src, out)  # every refusal about out before the source is read (minutes of decoding)
    recover_output(out)  # a killed earlier export may have left the previous one aside: put it back first
    check_out(out, cfg.overwrite)
    task_cfg = load_task(cfg.task) if cfg.task else None
    data = read_dataset(src)
    task = cfg.task or source_task(data)
    if task is None:
        raise ValueError(f"{src} does not say which task it holds; pass task=pusht|lift|can (it names the features and fps)")
    task_cfg = task_cfg or load_task(task)
    fps = cfg.fps or task_cfg.fps
    names = {k: feature_name(k, task_cfg.dataset.features) for k in data.data}
    write_lerobot(out, data, names, fps=fps, task_text=task, codec=cfg.codec, crf=cfg.crf, gop=cfg.gop,
                  overwrite=cfg.overwrite)
    return {"src": str(src), "out": str(out), "task": task, "fps": fps, "episodes": data.num_episodes,
            "frames": data.num_frames, "features": names, "codec": cfg.codec}


def run(cfg: ExportConfig, load_task: Callable[[str], Any]) -> dict:
    """What export_dataset.py does with an ExportConfig: export, print the report."""
    report = export(cfg, load_task)
    print(json.dumps(report, indent=2))
    return report
