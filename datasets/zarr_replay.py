"""Diffusion Policy replay-buffer layout (``pusht_cchi_v7_replay.zarr``), read and write.

Layout: group ``data`` with ``img`` (T, 96, 96, 3) uint8 (the public file stores float32
holding 0-255), ``state`` (T, 5) float32 = [agent_x, agent_y, block_x, block_y, block_angle],
``action`` (T, 2) float32, ``keypoint`` (T, 9, 2) float32, ``n_contacts`` (T, 1) float32; group
``meta`` with ``episode_ends`` (E,) int64, the exclusive end index of each episode.
Written in zarr format 2, as the public file is, so both ecosystems read it. A store generate_demos.py
wrote also holds its ``.generate`` marker (common.ownership), which zarr ignores.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import zarr

from common.ownership import Owner
from common.paths import links_inside
from common.resources import MEMORY_FIX, check_memory

from .episodes import (
    IMAGE_CASES,
    EpisodeData,
    atomic_output,
    check_episode_ends,
    check_finite,
    damaged,
    episodes_of,
    image_case,
    image_to_uint8,
    is_image,
    missing_output_hint,
    sample_frames,
    warn_float01,
)


PUSHT_KEYS = {"img": 4, "state": 2, "action": 2, "keypoint": 3, "n_contacts": 2}  # key -> ndim
REQUIRED_KEYS = ("img", "state", "action")
TIME_CHUNK = 161  # frames per chunk along time (write_pusht_zarr chunks like the public file)
READ_BLOCK_ROWS = 512  # frames per block (rounded to whole chunks) when a key is read or checked piecewise


def write_pusht_zarr(path, episodes: list[dict[str, np.ndarray]], overwrite: bool = False, attrs: dict | None = None,
                     owner: Owner | None = None) -> Path:
    """Write episodes (dicts with the keys above) atomically; returns the final path. ``owner``: the
    command whose marker (listing every file) goes in last (generate: what its overwrite=true may replace)."""
    if not episodes:
        raise ValueError("no episodes to write")
    missing = [k for k in PUSHT_KEYS if k not in episodes[0]]
    if missing:
        raise ValueError(f"episodes lack keys {missing}; expected {list(PUSHT_KEYS)}")
    lengths = [len(ep["action"]) for ep in episodes]
    for i, ep in enumerate(episodes):
        bad = {k: len(ep[k]) for k in PUSHT_KEYS if len(ep[k]) != lengths[i]}
        if bad:
            raise ValueError(f"episode {i}: {bad} frames but {lengths[i]} actions; every key needs one row per step")
    ends = np.cumsum(lengths).astype(np.int64)
    with atomic_output(path, overwrite=overwrite) as tmp:
        root = zarr.open_group(str(tmp), mode="w", zarr_format=2)
        data = root.create_group("data")
        for key in PUSHT_KEYS:
            arr = np.concatenate([np.asarray(ep[key]) for ep in episodes])
            if key == "img":  # the readers' rules: float 0-255 rounded, float 0-1 x255 (warned), else refused
                case = image_case(arr, path, "img")
                if case == "float01":
                    warn_float01(path, "img")
                arr = image_to_uint8(arr, case, path, "img")
            else:
                arr = arr.astype(np.float32)
            # chunk along time like the public file: a training window touches one chunk
            chunks = (min(len(arr), TIME_CHUNK),) + arr.shape[1:]
            data.create_array(key, shape=arr.shape, dtype=arr.dtype, chunks=chunks)[...] = arr
        meta = root.create_group("meta")
        meta.create_array("episode_ends", shape=ends.shape, dtype=np.int64)[...] = ends
        root.attrs.update(attrs or {})
        if owner is not None:
            owner.sign(tmp)
    return Path(path)


def _open(path) -> zarr.Group:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(
            f"dataset {p} does not exist{missing_output_hint(p)}; generate it with: python generate_demos.py task=pusht out={p}"
        )
    if p.is_dir():
        links_inside(p, str(p))  # a chunk linked to a file elsewhere would be read as data
    try:
        return zarr.open_group(str(p), mode="r")
    except Exception as exc:  # zarr raises several types for a non-zarr path
        raise ValueError(f"{p} is not a zarr group ({exc}); expected a Diffusion Policy replay buffer") from exc


def is_pusht_zarr(path) -> bool:
    """Whether ``path`` holds a replay buffer (what ``generate_demos.py overwrite=true`` may replace)."""
    try:
        _check_layout(zarr.open_group(str(path), mode="r"), path)
    except Exception:  # not a zarr group, or another layout
        return False
    return True


def _check_layout(root: zarr.Group, path) -> None:
    found_data = sorted(root["data"].array_keys()) if "data" in root else []
    found_meta = sorted(root["meta"].array_keys()) if "meta" in root else []
    missing = [f"data/{k}" for k in REQUIRED_KEYS if k not in found_data]
    if "episode_ends" not in found_meta:
        missing.append("meta/episode_ends")
    if missing:
        raise ValueError(
            f"{path} is not a PushT replay buffer: missing {missing}. Expected data/{{{', '.join(PUSHT_KEYS)}}} "
            f"and meta/episode_ends; found data/{found_data} and meta/{found_meta}"
        )


BLOSC_HEADER = 16  # bytes; little-endian uint32s: uncompressed size at 4:8, compressed size at 12:16


def _chunk_where(arr: zarr.Array, path, key: str, ends, index: int) -> tuple[str, str]:
    """(chunk file name, " (chunk file ...: frames a-b, episodes c-d)") of chunk ``index`` along time."""
    rows = int(arr.chunks[0])
    first, last = index * rows, min((index + 1) * rows, arr.shape[0]) - 1
    chunk = ".".join([str(index)] + ["0"] * (arr.ndim - 1))
    name = f"{key}/{chunk}" if (Path(path) / key / ".zarray").exists() else f"{key} chunk {chunk}"
    return name, f" (chunk file {name}: frames {first}-{last}{episodes_of(ends, first, last)})"


def _check_chunk_sizes(arr: zarr.Array, path, key: str, ends, start: int, stop: int) -> None:
    """A blosc chunk file shorter or longer than its header says (truncated, overwritten) is refused
    before blosc decompresses it: blosc reads past the end of such a buffer, returning garbage or crashing."""
    folder = Path(path) / key
    spec = json.loads((folder / ".zarray").read_text()) if (folder / ".zarray").is_file() else {}
    compressor = spec.get("compressor") or {}
    if compressor.get("id") != "blosc" or spec.get("filters") or list(spec["chunks"][1:]) != list(arr.shape[1:]):
        return
    rows, sep = int(spec["chunks"][0]), spec.get("dimension_separator", ".")
    expected = int(np.prod(spec["chunks"])) * arr.dtype.itemsize
    for index in range(start // rows, -(-stop // rows)):
        file = folder / sep.join([str(index)] + ["0"] * (arr.ndim - 1))
        if not file.is_file():
            continue  # never written: the fill value
        with open(file, "rb") as fh:
            head = fh.read(BLOSC_HEADER)
        size = file.stat().st_size
        stored = int.from_bytes(head[12:16], "little") if len(head) == BLOSC_HEADER else None
        if stored != size or int.from_bytes(head[4:8], "little") != expected:
            reason = (f"the chunk file holds {size} bytes, its blosc header says {stored}" if stored != size
                      else f"its blosc header says {int.from_bytes(head[4:8], 'little')} bytes uncompressed, the chunk has {expected}")
            raise damaged(path, key, reason, _chunk_where(arr, path, key, ends, index)[1])


def _read_rows(arr: zarr.Array, path, key: str, ends=None, start: int = 0, stop: int | None = None) -> np.ndarray:
    """``arr[start:stop]``; a damaged chunk ends in one line naming the file, the key, the chunk and
    its episodes (after a failed read the chunks are read one by one to find it)."""
    stop = arr.shape[0] if stop is None else stop
    if arr.ndim:
        _check_chunk_sizes(arr, path, key, ends, start, stop)
    try:
        return arr[start:stop]
    except Exception as exc:  # blosc / zarr raise RuntimeError, ValueError, ... for a damaged chunk
        error = exc
    if not arr.ndim:
        raise damaged(path, key, error) from None
    rows = int(arr.chunks[0])
    index = start // rows
    for index in range(start // rows, -(-stop // rows)):
        try:
            arr[index * rows : (index + 1) * rows]
        except Exception as exc:
            error = exc
            break
    raise damaged(path, key, error, _chunk_where(arr, path, key, ends, index)[1]) from None


def _sample(arr: zarr.Array, path, key: str, ends=None) -> np.ndarray:
    _check_chunk_sizes(arr, path, key, ends, 0, arr.shape[0])
    try:
        return sample_frames(arr)
    except Exception as exc:
        if isinstance(exc, ValueError) and str(exc).startswith(f"{path}:"):
            raise
        _read_rows(arr, path, key, ends)  # names the damaged chunk
        raise


def _block_rows(arr: zarr.Array) -> int:
    """Frames per block when a key is read piecewise: whole chunks, so each is decompressed once."""
    chunk = int(arr.chunks[0])
    return chunk * max(1, READ_BLOCK_ROWS // chunk)


def verify_chunks(arr: zarr.Array, path, key: str, ends=None) -> None:
    """Decompress every chunk of ``arr`` (``datasets.describe``: what training would read)."""
    rows = _block_rows(arr) if arr.ndim else None
    for s in range(0, arr.shape[0], rows) if arr.ndim else (0,):
        _read_rows(arr, path, key, ends, s, None if rows is None else s + rows)


def _read_image(arr: zarr.Array, path, key: str, ends: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` frames: uint8 as stored; float 0-255 rounded, float 0-1 scaled x255 (with a
    warning); else refused. Converted block by block, so a float file never needs a full-size float copy."""
    if arr.dtype == np.uint8:
        return _read_rows(arr, path, key, ends, 0, n)
    case = image_case(_sample(arr, path, key, ends), path, key)
    if case == "float01":
        warn_float01(path, key)
    out = np.empty((n,) + arr.shape[1:], np.uint8)
    step = _block_rows(arr)
    for s in range(0, n, step):
        e = min(s + step, n)
        first, last = np.searchsorted(ends, [s, e - 1], side="right")
        where = f" in episode {first}" if first == last else f" in episodes {first}-{last}"
        out[s:e] = image_to_uint8(_read_rows(arr, path, key, ends, s, e), case, path, key, where)
    return out


def _is_image_key(group: zarr.Group, key: str) -> bool:
    return key == "img" or is_image(group[key].shape)


def _check_read_memory(group: zarr.Group, keys, n: int, path) -> None:
    """Before reading: the arrays kept (images as uint8, the rest as read and as float32) plus one
    block of a float image must fit in the memory available; a dataset too large is refused, not
    killed by the kernel."""
    needed, shapes = 0, []
    for k in keys:
        arr = group[k]
        frame = int(np.prod(arr.shape[1:], dtype=np.float64))
        if _is_image_key(group, k):
            needed += n * frame + (0 if arr.dtype == np.uint8 else _block_rows(arr) * frame * arr.dtype.itemsize)
        else:
            needed += n * frame * (arr.dtype.itemsize + np.dtype(np.float32).itemsize)
        shapes.append(f"{k} {'x'.join(map(str, arr.shape[1:]))}")
    check_memory(needed, f"reading {path} ({n} frames: {', '.join(shapes)})", MEMORY_FIX)


def read_pusht_zarr(path, *, load_keys: tuple[str, ...] = ("img", "state", "action"),
                    max_episodes: int | None = None) -> EpisodeData:
    """Read a replay buffer into memory with the policy's names: ``image`` (uint8 HWC),
    ``agent_pos`` (state[:, :2]), ``state``, ``action``, plus any extra requested key.
    ``max_episodes``: read only the first N (every episode bound is still checked).

    Refuses (one-line ValueError) invalid ``episode_ends``, NaN/inf in low-dim keys and actions,
    images that are neither uint8 nor float 0-255 / 0-1 (float 0-1 is scaled x255, with a warning),
    and more frames than the memory available (before reading them).
    """
    root = _open(path)
    _check_layout(root, path)
    group = root["data"]
    ends = check_episode_ends(_read_rows(root["meta"]["episode_ends"], path, "meta/episode_ends"),
                              {f"data/{k}": group[k].shape[0] for k in load_keys}, path)
    ends = ends[:max_episodes]  # the first N episodes are the first ends[N-1] frames
    n = int(ends[-1]) if len(ends) else 0
    _check_read_memory(group, load_keys, n, path)
    raw = {}
    for k in load_keys:
        if _is_image_key(group, k):
            raw[k] = _read_image(group[k], path, f"data/{k}", ends, n)
        else:
            raw[k] = _read_rows(group[k], path, f"data/{k}", ends, 0, n)
            check_finite(raw[k], path, f"data/{k}", episode_ends=ends)
    img = raw.pop("img")
    data = {"image": img, "agent_pos": raw["state"][:, :2].astype(np.float32), "action": raw["action"].astype(np.float32)}
    data.update({k: v.astype(np.float32) for k, v in raw.items() if k not in ("action",)})
    return EpisodeData(data, ends, {"format": "pusht_zarr", "path": str(path), "task": "pusht", **dict(root.attrs)})


def describe_pusht_zarr(path) -> dict:
    """Summary for ``python -m datasets.describe``; what the reader would refuse is listed under
    ``problems`` (the reader's own messages) instead of raised."""
    root = _open(path)
    _check_layout(root, path)
    group = root["data"]
    raw_ends = np.asarray(_read_rows(root["meta"]["episode_ends"], path, "meta/episode_ends"))
    keys = {f"data/{k}": {"shape": list(group[k].shape), "dtype": str(group[k].dtype)} for k in group.array_keys()}
    keys["meta/episode_ends"] = {"shape": list(raw_ends.shape), "dtype": str(raw_ends.dtype)}
    problems = []
    try:
        ends = check_episode_ends(raw_ends, {f"data/{k}": group[k].shape[0] for k in group.array_keys()}, path)
    except ValueError as exc:
        ends = None
        problems.append(str(exc))
    for k in group.array_keys():
        name, arr = f"data/{k}", group[k]
        try:
            if _is_image_key(group, k):
                keys[name]["image"] = "refused"
                keys[name]["image"] = IMAGE_CASES[image_case(_sample(arr, path, name, ends), path, name)]
                verify_chunks(arr, path, name, ends)  # a damaged chunk anywhere is what training would meet
            else:
                check_finite(_read_rows(arr, path, name, ends), path, name, episode_ends=ends)
        except ValueError as exc:
            problems.append(str(exc))
    try:
        action = _read_rows(group["action"], path, "data/action", ends)
    except ValueError:  # listed above
        action = np.zeros((0,) + group["action"].shape[1:], np.float32)
    info = {
        "format": "pusht_zarr",
        "path": str(path),
        "valid": not problems,
        "problems": problems,
        "episodes": int(len(raw_ends)),
        "frames": int(group["action"].shape[0]),
    }
    if ends is not None and len(ends):
        lengths = np.diff(ends, prepend=0)
        info["episode_length"] = {"min": int(lengths.min()), "mean": float(lengths.mean()), "max": int(lengths.max())}
    info.update({
        "keys": keys,
        "action_min": action.min(0).tolist() if len(action) else [],
        "action_max": action.max(0).tolist() if len(action) else [],
        "attrs": dict(root.attrs),
    })
    return info
