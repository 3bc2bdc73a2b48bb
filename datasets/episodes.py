"""The in-memory form every dataset reader returns, and safe writing helpers.

Readers (zarr replay buffers, robomimic hdf5) flatten episodes into one array per key, as the
Diffusion Policy replay buffer does, with ``episode_ends`` marking exclusive episode ends. Keys
use the policy's observation names (``image``, ``agent_pos``, ``agentview_image`` ...) plus
``action``; readers know nothing of policies, policies know nothing of file formats.
"""
from __future__ import annotations

import os
import re
import shutil
import uuid
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from common.ownership import SHOWN_ENTRIES, contents  # noqa: F401  (what a path holds, for refusals; re-exported)


@dataclass
class EpisodeData:
    data: dict[str, np.ndarray]  # key -> (T_total, ...) over all episodes, concatenated
    episode_ends: np.ndarray  # (E,) int64, exclusive end index of each episode
    meta: dict = field(default_factory=dict)  # task name, env_args, source path ...

    def __post_init__(self):
        self.episode_ends = check_episode_ends(
            self.episode_ends, {k: len(v) for k, v in self.data.items()}, self.meta.get("path")
        )

    @property
    def num_episodes(self) -> int:
        return len(self.episode_ends)

    @property
    def num_frames(self) -> int:
        return int(self.episode_ends[-1]) if len(self.episode_ends) else 0

    def episode_bounds(self, i: int) -> tuple[int, int]:
        start = int(self.episode_ends[i - 1]) if i > 0 else 0
        return start, int(self.episode_ends[i])

    def episode(self, i: int) -> dict[str, np.ndarray]:
        start, end = self.episode_bounds(i)
        return {k: v[start:end] for k, v in self.data.items()}

    @staticmethod
    def from_episodes(episodes: list[dict[str, np.ndarray]], meta: dict | None = None) -> "EpisodeData":
        if not episodes:
            raise ValueError("no episodes given")
        keys = episodes[0].keys()
        data = {k: np.concatenate([ep[k] for ep in episodes]) for k in keys}
        ends = np.cumsum([len(ep["action"]) for ep in episodes])
        return EpisodeData(data, ends, dict(meta or {}))


# ------------------------------------------------------------------------------------------ validation
def check_episode_ends(episode_ends, num_frames: dict[str, int] | None = None, source=None) -> np.ndarray:
    """The one check of ``episode_ends`` (readers, training and ``datasets.describe`` all use it).

    Returns the ends as int64; raises a one-line ValueError naming ``source`` when they are not
    strictly increasing from 0 (an empty or negative-length episode) or when a key in
    ``num_frames`` (key -> frame count) does not hold exactly ``episode_ends[-1]`` frames.
    """
    where = f"{source}: " if source else ""
    ends = np.asarray(episode_ends)
    if ends.ndim != 1:
        raise ValueError(f"{where}episode_ends must be a 1-D array of episode end indices, got shape {ends.shape}")
    ends = ends.astype(np.int64)
    bad = np.flatnonzero(np.diff(ends, prepend=0) <= 0)
    if bad.size:
        i = int(bad[0])
        after = f"episode {i - 1} ended at {ends[i - 1]}" if i else "the start (0)"
        raise ValueError(
            f"{where}episode_ends must be strictly increasing (no empty episodes), but episode {i} ends at "
            f"{ends[i]} after {after}; the file is invalid: regenerate it or repair meta/episode_ends"
        )
    total = int(ends[-1]) if len(ends) else 0
    for key, n in (num_frames or {}).items():
        if n != total:
            raise ValueError(f"{where}key {key!r} has {n} frames but episode_ends says {total}; the file is invalid")
    return ends


def check_finite(arr: np.ndarray, source, key: str, *, episode_ends=None, episode: int | None = None,
                 label: str = "") -> None:
    """Refuse NaN/inf in a low-dim key or the actions with one line naming file, key and episode.

    ``arr`` is either a whole key over all episodes (pass ``episode_ends`` to locate the episode)
    or one episode's frames (pass its index as ``episode``; ``label`` names it, e.g. "data/demo_3").
    """
    arr = np.asarray(arr)
    if arr.size == 0 or arr.dtype.kind not in "fc" or (np.isfinite(arr.min()) and np.isfinite(arr.max())):
        return
    rows = np.flatnonzero(~np.isfinite(arr.reshape(len(arr), -1)).all(axis=1))
    if episode is None and episode_ends is None:  # episode_ends unknown or invalid: frames only
        raise ValueError(
            f"{source}: {key!r} holds NaN or inf in {len(rows)} frame(s), first at frame {int(rows[0])}; fix or drop those frames"
        )
    if episode is not None:
        episodes, step = [int(episode)], int(rows[0])
    else:
        ends = np.asarray(episode_ends, dtype=np.int64)
        episodes = np.unique(np.searchsorted(ends, rows, side="right")).tolist()
        step = int(rows[0]) - (int(ends[episodes[0] - 1]) if episodes[0] > 0 else 0)
    many = len(episodes) > 1
    shown = ", ".join(map(str, episodes[:5])) + (f" and {len(episodes) - 5} more" if len(episodes) > 5 else "")
    detail = f"first at step {step}" + (f" of episode {episodes[0]}" if many else "")
    detail = f"{label + ', ' if label else ''}{detail}, {len(rows)} frame{'s' if len(rows) > 1 else ''} in all"
    raise ValueError(
        f"{source}: {key!r} holds NaN or inf in episode{'s' if many else ''} {shown} ({detail}); "
        f"fix or drop {'those episodes' if many else 'that episode'} (training cannot normalize it)"
    )


def damaged(source, key: str, reason, where: str = "") -> ValueError:
    """A read that failed inside the file (a truncated or overwritten chunk): one line naming the
    file, the key and (``where``) the chunk and episodes; ``reason``: the library's exception or a sentence."""
    if isinstance(reason, BaseException):
        detail = str(reason).strip().splitlines()[0] if str(reason).strip() else ""
        reason = type(reason).__name__ + (f": {detail}" if detail else "")
    return ValueError(f"{source}: {key}{where} cannot be read, the file is damaged ({reason}); "
                      f"regenerate it or restore it from a copy")


def episodes_of(episode_ends, first: int, last: int) -> str:
    """" in episode(s) A[-B]" for frames first..last, "" when the ends are unknown."""
    if episode_ends is None or not len(episode_ends):
        return ""
    a, b = (int(i) for i in np.searchsorted(np.asarray(episode_ends), [first, last], side="right"))
    return f", episode {a}" if a == b else f", episodes {a}-{b}"


class ImageScaleWarning(UserWarning):
    """Float images in [0, 1] were scaled x255 to uint8 (store uint8 0-255 to avoid the guess)."""


# how datasets.describe names each accepted image encoding
IMAGE_CASES = {"uint8": "uint8 0-255", "float255": "float 0-255 → uint8", "float01": "float 0-1 → ×255 (warning)"}
IMAGE_FIX = "store images as uint8 0-255 (float 0-255 is also read)"
IMAGE_SAMPLE_FRAMES = 64  # frames from each end of an array that decide float 0-1 vs 0-255


def is_image(shape) -> bool:
    """(T, H, W, C) arrays are images, as the policies' 3-D (C, H, W) input shapes are."""
    return len(shape) == 4


def image_case(frames: np.ndarray, source, key: str, where: str = "") -> str:
    """Which accepted encoding ``frames`` (some or all frames of image ``key``) use: "uint8",
    "float255" (float 0-255) or "float01" (float, every value in [0, 1]); anything else
    (other dtypes, NaN/inf, values below 0 or above 255) is refused with a one-line ValueError."""
    dtype = np.dtype(frames.dtype)
    if dtype == np.uint8:
        return "uint8"
    if dtype.kind != "f":
        raise ValueError(f"{source}: image key {key!r}{where} has dtype {dtype}; images must be uint8 0-255 or float 0-255: {IMAGE_FIX}")
    if frames.size == 0:
        return "float255"
    lo, hi = float(frames.min()), float(frames.max())
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise ValueError(f"{source}: image key {key!r}{where} holds NaN or inf; images must be finite uint8 0-255 or float 0-255: {IMAGE_FIX}")
    if lo < 0 or hi > 255:
        raise ValueError(
            f"{source}: image key {key!r}{where} has values in [{lo:g}, {hi:g}]; images must lie in 0-255 "
            f"(or all in 0-1, read as x255): rescale them and {IMAGE_FIX}"
        )
    return "float01" if hi <= 1.0 else "float255"


def warn_float01(source, key: str) -> None:
    warnings.warn(
        f"{source}: image key {key!r} is float with every value in [0, 1]; converting it to uint8 0-255 by x255 "
        f"(store uint8 0-255 to avoid this guess)", ImageScaleWarning, stacklevel=3,
    )


def image_to_uint8(frames: np.ndarray, case: str, source, key: str, where: str = "") -> np.ndarray:
    """Check ``frames`` against the key's ``case`` (from :func:`image_case` on a sample) and
    return them as uint8 0-255 (float 0-255 rounded, float 0-1 scaled x255 and rounded)."""
    got = image_case(frames, source, key, where)
    if got != case and not (case == "float255" and got == "float01"):  # dark frames of a 0-255 image are fine
        raise ValueError(
            f"{source}: image key {key!r} mixes encodings: {IMAGE_CASES[case]} elsewhere but {IMAGE_CASES[got]}{where}; {IMAGE_FIX}"
        )
    if case == "uint8":
        return frames
    scaled = frames * np.float32(255.0) if case == "float01" else frames
    return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)


def sample_frames(arr, length: int | None = None, n: int = IMAGE_SAMPLE_FRAMES) -> np.ndarray:
    """The first and last ``n`` of the first ``length`` frames of an array-like (numpy, zarr, h5py)."""
    length = arr.shape[0] if length is None else int(length)
    if length <= 2 * n:
        return np.asarray(arr[:length])
    return np.concatenate([np.asarray(arr[:n]), np.asarray(arr[length - n : length])])


# ------------------------------------------------------------------------------------- before writing
# A path the writer can create (what a path holds, for refusals: common.ownership.contents).
# core/preflight.py checks the commands' output folders with these too: the data layer imports no core.


def nearest_existing(path: Path) -> Path:
    p = Path(path).absolute()
    while not (p.exists() or p.is_symlink()):
        p = p.parent
    return p


def check_writable(path, option: str, folder=None) -> None:
    """Refuse ``path`` (given as ``option=``) when the folder it is written in (``folder``; default its
    parent) cannot be created or written: one of its parents is a file, or the nearest existing one is
    read-only. Creates nothing, so a writer calls it before the expensive part, not after it."""
    p = Path(path)
    base = nearest_existing(p.parent if folder is None else folder)
    if not base.is_dir():
        raise FileExistsError(f"{option}={p} cannot be created: {base} is a file; choose another {option}=")
    if not os.access(base, os.W_OK | os.X_OK):
        raise PermissionError(f"{option}={p} cannot be written: {base} is read-only for this user; "
                              f"make it writable or choose another {option}=")


# ------------------------------------------------------------------------------------- atomic writing
# Siblings of an output path PATH while it is written: ".PATH.tmp-<pid>-<token>" (the new data being
# written), ".PATH.old-<pid>-<token>" (the complete previous data, moved aside for a moment) and
# ".PATH.del-<pid>-<token>" (data being deleted). A writer killed at any moment leaves PATH holding a
# complete dataset, or (between two renames) PATH missing and a complete .old sibling, which the next
# write to PATH renames back before anything else.
_SIBLING = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old|del)-(?P<pid>\d+)-[0-9a-f]{8}$")


def _sibling(final: Path, kind: str) -> Path:
    return final.with_name(f".{final.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _exists(p: Path) -> bool:
    return p.exists() or p.is_symlink()


def _running(pid: int) -> bool:
    if pid == os.getpid() or os.name != "posix":
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def stale_siblings(path: str | os.PathLike) -> dict[str, list[Path]]:
    """Temporary siblings of ``path`` left by writers that are no longer running, by kind."""
    final = Path(path)
    found: dict[str, list[Path]] = {"tmp": [], "old": [], "del": []}
    if not final.parent.is_dir():
        return found
    for p in sorted(final.parent.iterdir()):
        m = _SIBLING.match(p.name)
        if m and m["name"] == final.name and not _running(int(m["pid"])):
            found[m["kind"]].append(p)
    return found


def _discard(p: Path, final: Path) -> None:
    """Delete ``p``; renamed to a .del name first, so a half-deleted tree is never taken for data."""
    doomed = p
    if _SIBLING.match(p.name) is None or _SIBLING.match(p.name)["kind"] != "del":
        doomed = _sibling(final, "del")
        os.rename(p, doomed)
    _remove(doomed)


def recover_output(path: str | os.PathLike) -> Path | None:
    """Clean up after writers of ``path`` that were killed: if ``path`` is missing but a complete
    previous dataset waits under a .old name, rename it back; delete stale .tmp/.old/.del siblings.
    Every write through :func:`atomic_output` (and :func:`datasets.generate.generate`) calls this first.
    Returns the restored .old path, if any."""
    final = Path(path)
    stale = stale_siblings(final)
    olds = sorted(stale["old"], key=lambda p: p.lstat().st_mtime, reverse=True)
    restored = None
    if olds and not _exists(final):
        restored = olds.pop(0)
        os.rename(restored, final)
        warnings.warn(f"restored {final} from {restored.name}, left by an overwrite that was interrupted", stacklevel=2)
    for p in stale["tmp"] + olds + stale["del"]:
        _discard(p, final)
    return restored


def missing_output_hint(path: str | os.PathLike) -> str:
    """For a "does not exist" message: say so when an interrupted overwrite left the old data aside."""
    olds = stale_siblings(path)["old"]
    if not olds:
        return ""
    return (f" (an interrupted overwrite left the previous dataset at {olds[-1]}; the next generate to this "
            f"path renames it back, or rename it yourself)")


def _commit(tmp: Path, final: Path) -> None:
    if not _exists(final):
        os.rename(tmp, final)
        return
    if tmp.is_file() and final.is_file() and not final.is_symlink():
        os.replace(tmp, final)  # a file replaces a file atomically: there is always one at the path
        return
    old = _sibling(final, "old")  # a directory cannot be renamed over a directory: move the old aside
    os.rename(final, old)
    try:
        os.rename(tmp, final)
    except BaseException:
        os.rename(old, final)
        raise
    try:
        _discard(old, final)
    except OSError as exc:  # the new data is in place; the next write retries the deletion
        warnings.warn(f"could not delete the previous {final} at {old} ({exc})", stacklevel=3)


@contextmanager
def atomic_output(path: str | os.PathLike, overwrite: bool = False):
    """Yield a temporary path beside ``path``; move it into place only if the block succeeds.

    An interrupted or failing writer never leaves a half-written file under the final name, and
    an existing file is never replaced unless ``overwrite`` is set. Replacing is done by renames
    (new data written aside, old moved aside, new renamed in, old deleted last), so a writer
    killed at any moment leaves one complete dataset: see :func:`recover_output`.
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    recover_output(final)
    if _exists(final) and not overwrite:
        raise FileExistsError(f"{final} already exists; pass overwrite=true to replace it, or choose another out=")
    tmp = _sibling(final, "tmp")
    try:
        yield tmp
        _commit(tmp, final)
    finally:
        if _exists(tmp):
            _remove(tmp)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif p.exists() or p.is_symlink():
        p.unlink()
