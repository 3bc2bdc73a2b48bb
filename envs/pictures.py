"""Pictures of the shifts: one frame of the policy's camera per kind and severity, a grid per task.

    python -m envs.pictures --pictures docs/img [--seed 100000] [--tasks lift,can,pusht]

writes ``shifts_<task>.png`` (scene shifts, a row per kind, severities 0-3; ``envs/scene_shifts.py``) and
``corruptions_lift.png`` (the ImageNet-C kinds from the library at severities 0-5, on Lift's clean frame).
Every frame is the first of the episode of that seed: the same initial state in every cell.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402

from common.figures import save_png  # noqa: E402

from .corruptions import corrupt  # noqa: E402
from .factory import EVAL_SEED_START, TASKS, make_env  # noqa: E402
from .shifts import SCENE_SEVERITIES, scene_set  # noqa: E402

PICTURED_CORRUPTIONS = ("jpeg_compression", "motion_blur", "shot_noise", "pixelate")
IMAGE_KEY = {"lift": "agentview_image", "can": "agentview_image", "pusht": "image"}
ENV_KWARGS = {"lift": {"cameras": ("agentview",), "image_size": 84},
              "can": {"cameras": ("agentview",), "image_size": 84}, "pusht": {"image_size": 96}}
DPI = 100


def scene_frames(task: str, seed: int) -> dict[str, list[np.ndarray]]:
    """kind -> [first frame at severity 0, 1, 2, 3] of the episode ``seed``."""
    env = make_env(task, **ENV_KWARGS[task])
    try:
        clean = env.reset(seed=seed)[0][IMAGE_KEY[task]]
        rows = {}
        for shift in scene_set(task):  # kind by kind, severities 1-3
            env.set_scene_shifts([shift])
            rows.setdefault(shift.kind, [clean]).append(env.reset(seed=seed)[0][IMAGE_KEY[task]])
        env.set_scene_shifts([])
        return rows
    finally:
        env.close()


def grid(rows: dict[str, list[np.ndarray]], columns: list[str], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n, m = len(rows), len(columns)
    fig, axes = plt.subplots(n, m, figsize=(1.3 * m, 1.3 * n + 0.3), squeeze=False)
    for r, (kind, frames) in enumerate(rows.items()):
        for c, frame in enumerate(frames):
            ax = axes[r][c]
            ax.imshow(frame, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(columns[c], fontsize=7)
            if c == 0:
                ax.set_ylabel(kind, fontsize=7)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout(pad=0.3)
    save_png(fig, path, dpi=DPI)  # a half-written picture never takes the name
    print(f"wrote {path}")


def pictures(out: Path, seed: int, tasks: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        rows = scene_frames(task, seed)
        grid(rows, ["clean", *(f"severity {s}" for s in SCENE_SEVERITIES)], f"{task}: scene shifts, seed {seed}",
             out / f"shifts_{task}.png")
        if task == "lift":
            clean = rows[next(iter(rows))][0]
            severities = range(6)
            pixel = {k: [corrupt(clean, k, s, np.random.default_rng(seed)) for s in severities]
                     for k in PICTURED_CORRUPTIONS}
            grid(pixel, ["clean", *(f"severity {s}" for s in severities[1:])],
                 f"lift: ImageNet-C corruptions (imagecorruptions-imaug), seed {seed}", out / "corruptions_lift.png")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envs.pictures", description=__doc__.split("\n")[0])
    parser.add_argument("--pictures", type=Path, required=True, metavar="DIR", help="folder for the PNG grids")
    parser.add_argument("--seed", type=int, default=EVAL_SEED_START,
                        help="the episode shown (default: the first evaluation seed)")
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated, of " + ", ".join(TASKS))
    args = parser.parse_args(argv)
    tasks = [t for t in args.tasks.split(",") if t]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        parser.error(f"--tasks: unknown {', '.join(unknown)}; known: {', '.join(TASKS)}")
    pictures(args.pictures, args.seed, tasks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
