"""The pixel operations: corruptions of the rendered uint8 HWC frame before the policy sees it.

The four hand-written kinds (``gaussian_noise``, ``blur``, ``brightness``, ``contrast``) are kept exactly as
they were at severities 1-3 (committed records depend on them); ImageNet-C's kinds come from the
``imagecorruptions-imaug`` package (Hendrycks & Dietterich 2019). Which kinds and severities exist, and how a
shift is spelled and parsed, is the vocabulary's (``envs.shifts``); scene shifts are the simulator's
(``envs.scene_shifts``).
"""
from __future__ import annotations

import numpy as np

from .shifts import CORRUPTIONS, KINDS, PIXEL, PIXEL_SEVERITIES, Shift, ShiftError

# per hand-written corruption: strength at severities 1, 2, 3
LEVELS = {
    "gaussian_noise": (0.04, 0.08, 0.16),  # noise std, in units of the [0, 1] range
    "blur": (0.6, 1.0, 1.6),  # Gaussian sigma in pixels
    "brightness": (0.1, 0.2, 0.35),  # added to every pixel in [0, 1]
    "contrast": (0.75, 0.5, 0.3),  # factor towards the mean grey
}
LIBRARY_MIN_SIDE = 32  # the library refuses smaller frames


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
        raise ValueError(f"{kind} needs frames of at least {LIBRARY_MIN_SIDE} px a side, got {image.shape[:2]}: render at "
                         f"image_size={LIBRARY_MIN_SIDE} or more, or use a hand-written kind ({', '.join(CORRUPTIONS)})")
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
        raise ShiftError(f"unknown corruption {kind!r}; known: {', '.join(PIXEL_SEVERITIES)}")
    if severity != 0 and severity not in PIXEL_SEVERITIES[kind]:
        allowed = PIXEL_SEVERITIES[kind]
        raise ShiftError(f"{kind}: severity must be 0 or {allowed[0]}-{allowed[-1]}, got {severity}")
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
        raise ShiftError(f"{', '.join(scene)}: a scene shift is rendered by the environment (its scene_shifts=), "
                         "not applied to observations")
    rng = np.random.default_rng(seed)

    def transform(obs: dict) -> dict:
        out = dict(obs)
        for key in image_keys:
            for kind, severity in corruptions:
                out[key] = corrupt(out[key], kind, severity, rng)
        return out

    return transform
