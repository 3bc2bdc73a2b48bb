"""What changes between the camera and the policy: one vocabulary, ``KIND:SEVERITY``, for two stages.

* **pixel corruptions** act on the rendered uint8 HWC frame before the policy sees it (``corrupt``,
  ``obs_corruptor``): the four kinds of before, hand-written and kept exactly as they were at severities
  1-3 (committed records depend on them: ``gaussian_noise``, ``blur``, ``brightness``, ``contrast``), and
  ImageNet-C's definitions (Hendrycks & Dietterich 2019) at their five severities, from the
  ``imagecorruptions-imaug`` package (``LIBRARY_KINDS``);
* **scene shifts** are rendered by the simulator itself (``envs.scene_shifts``: light, colours, camera
  pose), drawn from the episode's seed and undone after the episode; the environment applies them.

``parse_shifts`` is the one parser: it checks kind, severity and what the task can render before
anything loads, and gives ``Shift(kind, severity)`` pairs that tell their ``stage`` and ``tag``.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from .scene_shifts import SCENE_KINDS, SCENE_SEVERITIES, scene_kinds_of

PIXEL, SCENE = "pixel", "scene"

# --- the four hand-written kinds (their meaning is frozen: records of before are named by them) ----------
CORRUPTIONS = ("gaussian_noise", "blur", "brightness", "contrast")
# per corruption: strength at severities 1, 2, 3
LEVELS = {
    "gaussian_noise": (0.04, 0.08, 0.16),  # noise std, in units of the [0, 1] range
    "blur": (0.6, 1.0, 1.6),  # Gaussian sigma in pixels
    "brightness": (0.1, 0.2, 0.35),  # added to every pixel in [0, 1]
    "contrast": (0.75, 0.5, 0.3),  # factor towards the mean grey
}
SEVERITIES = (1, 2, 3)  # of the four above

# --- ImageNet-C, as the imagecorruptions-imaug package defines it ------------------------------------------
# ImageNet-C's gaussian_noise, brightness and contrast are not offered: those names mean ours (above).
# glass_blur is left out: 0.6 s a frame at 84 px, and it draws from an unseeded generator of its own.
LIBRARY_KINDS = ("shot_noise", "impulse_noise", "speckle_noise", "defocus_blur", "motion_blur", "zoom_blur",
                 "gaussian_blur", "fog", "frost", "snow", "spatter", "elastic_transform", "pixelate",
                 "jpeg_compression", "saturate")
LIBRARY_SEVERITIES = (1, 2, 3, 4, 5)
LIBRARY_MIN_SIDE = 32  # the library refuses smaller frames

PIXEL_SEVERITIES = {**{k: SEVERITIES for k in CORRUPTIONS}, **{k: LIBRARY_SEVERITIES for k in LIBRARY_KINDS}}
KINDS = {**{k: PIXEL for k in PIXEL_SEVERITIES}, **{k: SCENE for k in SCENE_KINDS}}


class CorruptionError(ValueError):
    """A malformed or unsupported ``KIND:SEVERITY``: the CLI prints it as one line."""


class Shift(NamedTuple):
    """One ``KIND:SEVERITY``; a plain ``(kind, severity)`` pair (JSON writes it as a list)."""

    kind: str
    severity: int

    @property
    def stage(self) -> str:
        """``"pixel"``: a corruption of the observation (``obs_corruptor``); ``"scene"``: the env renders it."""
        return KINDS[self.kind]

    @property
    def tag(self) -> str:
        """The name in folder names and records: ``brightness1``, ``jpeg_compression3``, ``lighting2``."""
        return f"{self.kind}{self.severity}"

    def __str__(self) -> str:
        return f"{self.kind}:{self.severity}"


def severities(kind: str) -> tuple[int, ...]:
    return PIXEL_SEVERITIES[kind] if KINDS[kind] == PIXEL else SCENE_SEVERITIES


def _example(option: str) -> str:
    return f"{option}=camera:1" if option == "scene_shifts" else f"{option}=brightness:1"


def _items(spec, option: str) -> list:
    if spec is None:
        return []
    if isinstance(spec, str):
        return [spec]
    if isinstance(spec, Mapping) or not hasattr(spec, "__iter__"):  # 42, True, {...}: not KIND:SEVERITY
        raise CorruptionError(f"{option}={spec!r}: give KIND:SEVERITY or a list of them, e.g. {_example(option)}")
    return list(spec)


def _one(item, option: str) -> Shift:
    if isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[1], int) \
            and not isinstance(item[1], bool):  # already parsed
        kind, severity = str(item[0]), str(item[1])
    elif isinstance(item, str) and item.count(":") == 1:
        kind, severity = item.split(":")
    else:
        raise CorruptionError(f"{option}={item!r}: give KIND:SEVERITY, e.g. {_example(option)}")
    if kind not in KINDS:
        raise CorruptionError(f"{option}={kind}:{severity}: give KIND:SEVERITY with KIND a pixel corruption "
                              f"({', '.join(PIXEL_SEVERITIES)}) or a scene shift ({', '.join(SCENE_KINDS)})")
    allowed = severities(kind)
    if severity not in tuple(map(str, allowed)):
        raise CorruptionError(f"{option}={kind}:{severity}: give KIND:SEVERITY with SEVERITY {allowed[0]}-{allowed[-1]} "
                              f"for {kind}, e.g. {option}={kind}:{allowed[0]}")
    return Shift(kind, int(severity))


def parse_shifts(spec, task: str | None = None, option: str = "corruption") -> list[Shift]:
    """``"lighting:2"``, ``"brightness:1"``, ``[...]`` of them (or of pairs) -> ``[Shift, ...]`` in the order
    given; None or [] -> []. Refused in one line (``CorruptionError``, a ValueError): anything that is not
    KIND:SEVERITY, an unknown kind, a severity out of the kind's range, a scene kind twice, and with ``task``
    a scene kind that task cannot render. ``option`` names the setting in the messages."""
    out = [_one(item, option) for item in _items(spec, option)]
    scene = [s.kind for s in out if s.stage == SCENE]
    if len(set(scene)) < len(scene):
        raise CorruptionError(f"{option}: give each scene shift once, got {', '.join(map(str, out))}")
    if task is not None:
        can = scene_kinds_of(task)
        for s in out:
            if s.stage == SCENE and s.kind not in can:
                raise CorruptionError(f"{option}={s}: the {task} task cannot render a {s.kind} shift; "
                                      f"its scene shifts: {', '.join(can)}")
    return out


def shift_tag(shifts) -> str | None:
    """[("brightness", 1), ("lighting", 2)] -> "brightness1+lighting2" (folder names, records); [] -> None."""
    return "+".join(Shift(*s).tag for s in shifts) or None


def split_stages(shifts) -> tuple[list[Shift], list[Shift]]:
    """(pixel corruptions for ``obs_corruptor``, scene shifts for the env's ``scene_shifts=``), order kept."""
    shifts = [Shift(*s) for s in shifts]
    return [s for s in shifts if s.stage == PIXEL], [s for s in shifts if s.stage == SCENE]


def parse_scene_shifts(spec, task: str) -> tuple[Shift, ...]:
    """What an environment's ``scene_shifts=`` / ``set_scene_shifts`` takes: ``parse_shifts`` for ``task``,
    scene kinds only (a pixel corruption is refused in one line: the caller applies those to observations)."""
    shifts = parse_shifts(spec, task=task, option="scene_shifts")
    pixel = [str(s) for s in shifts if s.stage == PIXEL]
    if pixel:
        raise CorruptionError(f"scene_shifts={', '.join(pixel)}: a pixel corruption applies to observations "
                              "(envs.corruptions.obs_corruptor), not to the scene")
    return tuple(shifts)


# --- the pixel operations --------------------------------------------------------------------------------
def _gaussian_kernel(sigma: float) -> np.ndarray:
    radius = max(1, int(round(3 * sigma)))
    x = np.arange(-radius, radius + 1)
    k = np.exp(-(x**2) / (2 * sigma**2))
    return k / k.sum()


def _blur_axis(x: np.ndarray, k: np.ndarray, axis: int) -> np.ndarray:
    r = len(k) // 2
    widths = [(0, 0)] * x.ndim
    widths[axis] = (r, r)
    pad = np.pad(x, widths, mode="edge")
    n = x.shape[axis]
    return sum(w * np.take(pad, np.arange(i, i + n), axis=axis) for i, w in enumerate(k))


def _hand_written(image: np.ndarray, kind: str, severity: int, rng: np.random.Generator | None) -> np.ndarray:
    level = LEVELS[kind][severity - 1]
    x = image.astype(np.float32) / 255.0
    if kind == "gaussian_noise":
        rng = rng or np.random.default_rng(0)
        x = x + rng.normal(0.0, level, x.shape).astype(np.float32)
    elif kind == "blur":
        k = _gaussian_kernel(level)
        x = _blur_axis(_blur_axis(x, k, axis=0), k, axis=1)  # separable: rows, then columns
    elif kind == "brightness":
        x = x + level
    elif kind == "contrast":
        mean = x.mean(axis=(0, 1), keepdims=True)
        x = (x - mean) * level + mean
    return (np.clip(x, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def _library(image: np.ndarray, kind: str, severity: int, rng: np.random.Generator | None) -> np.ndarray:
    from imagecorruptions import corrupt as imagenet_c  # lazy: scikit-image, numba and OpenCV load in ~0.4 s

    if min(image.shape[:2]) < LIBRARY_MIN_SIDE:
        raise ValueError(f"{kind} needs frames of at least {LIBRARY_MIN_SIDE} px a side, got {image.shape[:2]}")
    # the library draws from numpy's global generator: seed it from ours for this call, then put it back,
    # so a corruption is repeatable and nothing else that uses the global generator sees a difference
    seed = int((rng or np.random.default_rng(0)).integers(2**32))
    saved = np.random.get_state()
    try:
        np.random.seed(seed)
        return np.ascontiguousarray(imagenet_c(image, severity=severity, corruption_name=kind), dtype=np.uint8)
    finally:
        np.random.set_state(saved)


def corrupt(image: np.ndarray, kind: str, severity: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """A uint8 HWC frame corrupted by pixel kind ``kind``; severity 0 returns it unchanged. Deterministic
    for a given ``rng`` (None: a generator seeded 0)."""
    if KINDS.get(kind) != PIXEL:
        raise ValueError(f"unknown corruption {kind!r}; known: {', '.join(PIXEL_SEVERITIES)}")
    if severity != 0 and severity not in PIXEL_SEVERITIES[kind]:
        allowed = PIXEL_SEVERITIES[kind]
        raise ValueError(f"{kind}: severity must be 0 or {allowed[0]}-{allowed[-1]}, got {severity}")
    if severity == 0:
        return image
    return (_hand_written if kind in CORRUPTIONS else _library)(image, kind, severity, rng)


def obs_corruptor(corruptions, image_keys: list[str], seed: int = 0):
    """An ``obs -> obs`` function for ``evaluate`` corrupting every camera image, the corruptions in
    the order given (pixel kinds only: scene shifts are the env's). One generator for the whole
    evaluation, so noise differs from step to step."""
    corruptions = [Shift(*c) for c in corruptions]
    scene = [str(c) for c in corruptions if c.stage != PIXEL]
    if scene:
        raise ValueError(f"{', '.join(scene)}: a scene shift is rendered by the environment (its scene_shifts=), "
                         "not applied to observations")
    rng = np.random.default_rng(seed)

    def transform(obs: dict) -> dict:
        out = dict(obs)
        for key in image_keys:
            for kind, severity in corruptions:
                out[key] = corrupt(out[key], kind, severity, rng)
        return out

    return transform
