"""Image corruptions (in the spirit of ImageNet-C) on uint8 HWC frames, for ``rollout.py corruption=``.

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


SEVERITIES = (1, 2, 3)


class CorruptionError(ValueError):
    """A malformed ``corruption=`` value: the CLI prints it as one line."""


def parse_corruptions(spec) -> list[tuple[str, int]]:
    """``"brightness:1"`` or a list of them -> [("brightness", 1), ...]; None or [] -> []."""
    items = [] if spec is None else [spec] if isinstance(spec, str) else list(spec)
    out = []
    for item in items:
        if isinstance(item, (tuple, list)) and len(item) == 2:  # already parsed
            item = f"{item[0]}:{item[1]}"
        kind, sep, severity = str(item).partition(":")
        if not sep or kind not in CORRUPTIONS or severity not in tuple(map(str, SEVERITIES)):
            raise CorruptionError(f"corruption={item!r}: give KIND:SEVERITY with KIND one of {', '.join(CORRUPTIONS)} "
                                  f"and SEVERITY 1, 2 or 3 (e.g. corruption=brightness:1)")
        out.append((kind, int(severity)))
    return out


def corruption_tag(corruptions: list[tuple[str, int]]) -> str | None:
    """[("brightness", 1), ("blur", 2)] -> "brightness1+blur2" (folder names, records); [] -> None."""
    return "+".join(f"{kind}{severity}" for kind, severity in corruptions) or None


def obs_corruptor(corruptions: list[tuple[str, int]], image_keys: list[str], seed: int = 0):
    """An ``obs -> obs`` function for ``evaluate`` corrupting every camera image, the corruptions in
    the order given. One generator for the whole evaluation, so noise differs from step to step."""
    rng = np.random.default_rng(seed)

    def transform(obs: dict) -> dict:
        out = dict(obs)
        for key in image_keys:
            for kind, severity in corruptions:
                out[key] = corrupt(out[key], kind, severity, rng)
        return out

    return transform
