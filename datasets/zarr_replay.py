"""Diffusion Policy replay-buffer layout (``pusht_cchi_v7_replay.zarr``), read and write.

Layout: group ``data`` with ``img`` (T, 96, 96, 3) uint8 (the public file stores float32
holding 0-255), ``state`` (T, 5) float32 = [agent_x, agent_y, block_x, block_y, block_angle],
``action`` (T, 2) float32, ``keypoint`` (T, 9, 2) float32, ``n_contacts`` (T, 1) float32; group
``meta`` with ``episode_ends`` (E,) int64, the exclusive end index of each episode.
Written in zarr format 2, as the public file is, so both ecosystems read it.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import zarr

from .episodes import EpisodeData, atomic_output

PUSHT_KEYS = {"img": 4, "state": 2, "action": 2, "keypoint": 3, "n_contacts": 2}  # key -> ndim
REQUIRED_KEYS = ("img", "state", "action")


def write_pusht_zarr(path, episodes: list[dict[str, np.ndarray]], overwrite: bool = False, attrs: dict | None = None) -> Path:
    """Write episodes (dicts with the keys above) atomically; returns the final path."""
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
            arr = arr.astype(np.uint8 if key == "img" else np.float32)
            # chunk along time like the public file: a training window touches one chunk
            chunks = (min(len(arr), 161),) + arr.shape[1:]
            data.create_array(key, shape=arr.shape, dtype=arr.dtype, chunks=chunks)[...] = arr
        meta = root.create_group("meta")
        meta.create_array("episode_ends", shape=ends.shape, dtype=np.int64)[...] = ends
        root.attrs.update(attrs or {})
    return Path(path)


def _open(path) -> zarr.Group:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(
            f"dataset {p} does not exist; generate it with: "
            f"python -m datasets.generate task=pusht num_episodes=200 out={p}"
        )
    try:
        return zarr.open_group(str(p), mode="r")
    except Exception as exc:  # zarr raises several types for a non-zarr path
        raise ValueError(f"{p} is not a zarr group ({exc}); expected a Diffusion Policy replay buffer") from exc


def read_pusht_zarr(path, *, load_keys: tuple[str, ...] = ("img", "state", "action")) -> EpisodeData:
    """Read a replay buffer into memory with the policy's names: ``image`` (uint8 HWC),
    ``agent_pos`` (state[:, :2]), ``state``, ``action``, plus any extra requested key."""
    root = _open(path)
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
    raw = {k: root["data"][k][:] for k in load_keys}
    img = raw.pop("img")
    if img.dtype != np.uint8:  # the public file stores float32 0..255
        img = np.clip(np.rint(img), 0, 255).astype(np.uint8)
    data = {"image": img, "agent_pos": raw["state"][:, :2].astype(np.float32), "action": raw["action"].astype(np.float32)}
    data.update({k: v.astype(np.float32) for k, v in raw.items() if k not in ("action",)})
    ends = np.asarray(root["meta"]["episode_ends"][:], dtype=np.int64)
    return EpisodeData(data, ends, {"format": "pusht_zarr", "path": str(path), "task": "pusht", **dict(root.attrs)})


def describe_pusht_zarr(path) -> dict:
    root = _open(path)
    ends = np.asarray(root["meta"]["episode_ends"][:])
    keys = {f"data/{k}": {"shape": list(root["data"][k].shape), "dtype": str(root["data"][k].dtype)} for k in root["data"].array_keys()}
    keys["meta/episode_ends"] = {"shape": list(ends.shape), "dtype": str(ends.dtype)}
    action = root["data"]["action"][:]
    lengths = np.diff(np.concatenate([[0], ends]))
    return {
        "format": "pusht_zarr",
        "path": str(path),
        "episodes": int(len(ends)),
        "frames": int(ends[-1]) if len(ends) else 0,
        "episode_length": {"min": int(lengths.min()), "mean": float(lengths.mean()), "max": int(lengths.max())},
        "keys": keys,
        "action_min": action.min(0).tolist(),
        "action_max": action.max(0).tolist(),
        "attrs": dict(root.attrs),
    }
