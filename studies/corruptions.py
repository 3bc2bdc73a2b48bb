"""Image corruptions for the robustness study (in the spirit of ImageNet-C), on uint8 HWC frames.

Severity 0 returns the image unchanged; 1-3 grow the strength. Deterministic for a given rng.
"""
from __future__ import annotations

import numpy as np

CORRUPTIONS = ("gaussian_noise", "blur", "brightness", "contrast")
# per corruption: strength at severities 1, 2, 3
LEVELS = {
    "gaussian_noise": (0.04, 0.08, 0.16),  # noise std, in units of the [0, 1] range
    "blur": (0.6, 1.0, 1.6),  # Gaussian sigma in pixels
    "brightness": (0.1, 0.2, 0.35),  # added to every pixel in [0, 1]
    "contrast": (0.75, 0.5, 0.3),  # factor towards the mean grey
}


def _gaussian_kernel(sigma: float) -> np.ndarray:
    radius = max(1, int(round(3 * sigma)))
    x = np.arange(-radius, radius + 1)
    k = np.exp(-(x**2) / (2 * sigma**2))
    return k / k.sum()


def corrupt(image: np.ndarray, kind: str, severity: int, rng: np.random.Generator | None = None) -> np.ndarray:
    if kind not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {kind!r}; known: {', '.join(CORRUPTIONS)}")
    if severity not in (0, 1, 2, 3):
        raise ValueError(f"severity must be 0, 1, 2 or 3, got {severity}")
    if severity == 0:
        return image
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


def _blur_axis(x: np.ndarray, k: np.ndarray, axis: int) -> np.ndarray:
    r = len(k) // 2
    widths = [(0, 0)] * x.ndim
    widths[axis] = (r, r)
    pad = np.pad(x, widths, mode="edge")
    n = x.shape[axis]
    return sum(w * np.take(pad, np.arange(i, i + n), axis=axis) for i, w in enumerate(k))


def obs_corruptor(kind: str, severity: int, image_keys: list[str], seed: int = 0):
    """An ``obs -> obs`` function for ``rollout.evaluate`` corrupting every camera image."""
    rng = np.random.default_rng(seed)

    def transform(obs: dict) -> dict:
        out = dict(obs)
        for key in image_keys:
            out[key] = corrupt(obs[key], kind, severity, rng)
        return out

    return transform
