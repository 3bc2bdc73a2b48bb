"""One robustness report per checkpoint: the clean run and every shift of a named suite, matched pairs.

    python -m core.suite RUN [--suite standard] [--workers 2] [--episodes 30] [--clean-episodes 50] [--max-steps N]

Each setting is one ``rollout.py`` evaluation into ``RUN/eval/suite_<suite>/<tag>/`` (``clean`` first): one
already evaluated (its summary.json exists) is skipped, so an interrupted suite continues where it stopped.
Every shifted run plays the clean run's seeds, so its drop is paired episode by episode (``paired``).
Writes ``report.md`` (success with its Wilson interval, the paired drop), ``report.png`` (success against
severity per kind) and ``eval_info.json`` (lerobot's ``eval_info.json`` field names) beside the runs.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from common.figures import save_png
from envs.corruptions import Shift, parse_shifts
from envs.scene_shifts import SCENE_KINDS, SCENE_SEVERITIES, scene_kinds_of

# the suites, as data: KIND:SEVERITY settings; scene kinds a task cannot render are left out for that task
SCENE = tuple(SCENE_KINDS)
SUITES = {
    "standard": [f"{k}:{s}" for k in SCENE for s in SCENE_SEVERITIES]
    + ["brightness:1", "contrast:2", "gaussian_noise:2", "blur:2",  # the studies' pixel corruptions
       "jpeg_compression:3", "motion_blur:3", "shot_noise:3", "pixelate:3"],  # ImageNet-C's, middle severity
    "scene": [f"{k}:2" for k in SCENE],  # the scene kinds at severity 2: what a lab changes between afternoons
    "tiny": ["colour:1", "brightness:1"],  # for the tests: seconds
}
CLEAN = "clean"


def settings(suite: str, task: str) -> list[Shift]:
    """The suite's settings that ``task`` can render, checked (one line on an unknown name or kind)."""
    if suite not in SUITES:
        raise ValueError(f"suite={suite!r} does not exist; choose one of {', '.join(SUITES)}")
    renders = set(scene_kinds_of(task))
    shifts = [parse_shifts(s)[0] for s in SUITES[suite]]  # each setting alone: one kind at one severity
    return [s for s in shifts if s.stage == "pixel" or s.kind in renders]


def evaluate_suite(run: Path, suite: str = "standard", *, workers: int = 2, episodes: int = 30,
                   clean_episodes: int = 50, max_steps: int | None = None, log=print) -> Path:
    """Evaluate what is missing, then write the report; returns the suite's folder."""
    from core.evaluation import evaluate_checkpoint, paired_with_clean
    from policies.checkpoint import read_checkpoint_meta, resolve_checkpoint

    ckpt = resolve_checkpoint(run)
    task = read_checkpoint_meta(ckpt)["cfg"]["task"]["name"]
    todo = settings(suite, task)  # before any evaluation: a bad suite costs nothing
    folder = Path(run) / "eval" / f"suite_{suite}"
    summaries = {}
    for name, corruption, n in [(CLEAN, None, clean_episodes), *((s.tag, [s], episodes) for s in todo)]:
        out = folder / name
        if (out / "summary.json").exists():
            log(f"{name}: evaluated already, kept")
        else:
            log(f"{name}: {n} episodes")
            t0 = time.perf_counter()
            s = evaluate_checkpoint(ckpt, num_episodes=n, workers=workers,
                                    out_dir=out, num_videos=0, max_steps=max_steps, corruption=corruption, progress=False)
            if corruption is not None:
                s["paired"] = paired_with_clean(s, folder / CLEAN)
            s["eval_s"] = time.perf_counter() - t0
            _write(out / "summary.json", json.dumps(s, indent=2))
        summaries[name] = json.loads((out / "summary.json").read_text())
    _report(folder, suite, summaries)
    return folder


def _write(path: Path, text: str) -> None:
    from core.preflight import replace_file

    replace_file(path, text)  # whole or absent: a Ctrl-C leaves no half-written file


def _pct(x: float) -> str:
    return f"{100 * x:.0f}"


def _report(folder: Path, suite: str, summaries: dict[str, dict]) -> None:
    rows = ["| setting | success [95% CI] | − clean, paired (points) [95% CI] | episodes |", "|---|---|---|---|"]
    for name, s in summaries.items():
        lo, hi = s["success_rate_ci95"]
        p = s.get("paired")
        drop = f"{100 * p['difference']:+.0f} [{100 * p['difference_ci95'][0]:+.0f}, {100 * p['difference_ci95'][1]:+.0f}]" if p else ""
        rows.append(f"| {name} | {_pct(s['success_rate'])}% [{_pct(lo)}, {_pct(hi)}] | {drop} | {s['num_episodes']} |")
    clean = summaries[CLEAN]
    _write(folder / "report.md", f"# Suite `{suite}`: {clean['checkpoint']}\n\n{clean['task']} {clean['policy']}, "
           f"attention {clean['attention']}. Success with its Wilson interval; the drop against the clean run "
           f"over the same initial states (per-episode pairs, bootstrap).\n\n" + "\n".join(rows) + "\n")
    _write(folder / "eval_info.json", json.dumps(_eval_info(summaries), indent=2))
    _plot(folder / "report.png", summaries)


def _eval_info(summaries: dict[str, dict]) -> dict:
    """lerobot's eval_info.json fields, per setting (``per_episode`` and ``aggregated``)."""
    out = {}
    for name, s in summaries.items():
        eps = s["episodes"]
        out[name] = {"per_episode": [{"episode_ix": i, "sum_reward": e.get("sum_reward"), "max_reward": e["max_reward"],
                                      "success": e["success"], "seed": e["seed"]} for i, e in enumerate(eps)],
                     "aggregated": {"pc_success": 100 * s["success_rate"], "avg_max_reward": s["mean_max_reward"],
                                    "eval_s": s.get("eval_s", s["wall_seconds"])}}
    return out


def _plot(path: Path, summaries: dict[str, dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clean = summaries[CLEAN]
    kinds: dict[str, list] = {}
    for s in summaries.values():
        for kind, severity in s.get("corruptions") or []:
            kinds.setdefault(kind, []).append((severity, s))
    fig, ax = plt.subplots(figsize=(7, 4))
    for kind, points in sorted(kinds.items()):
        points = [(0, clean)] + sorted(points, key=lambda p: p[0])
        x = [p[0] for p in points]
        y = [100 * p[1]["success_rate"] for p in points]
        err = [[y_ - 100 * p[1]["success_rate_ci95"][0] for y_, p in zip(y, points)],
               [100 * p[1]["success_rate_ci95"][1] - y_ for y_, p in zip(y, points)]]
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=kind)
    ax.set(xlabel="severity (0: clean)", ylabel="success (%)", ylim=(-2, 102), title=f"{clean['task']} {clean['policy']}")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    save_png(fig, path, dpi=100)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m core.suite", description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a train_policy.py run_dir or a checkpoint folder")
    ap.add_argument("--suite", default="standard", help=f"one of {', '.join(SUITES)}")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--episodes", type=int, default=30, help="per shifted setting")
    ap.add_argument("--clean-episodes", type=int, default=50)
    ap.add_argument("--max-steps", type=int, default=None, help="the task's horizon unless given")
    args = ap.parse_args(argv)
    try:
        folder = evaluate_suite(args.run, args.suite, workers=args.workers, episodes=args.episodes,
                                clean_episodes=args.clean_episodes, max_steps=args.max_steps)
    except KeyboardInterrupt:
        sys.exit("python -m core.suite: interrupted; every finished evaluation is kept: rerun the same command to continue")
    except (ValueError, FileNotFoundError, OSError) as exc:
        sys.exit(f"python -m core.suite: error: {exc}")
    print(f"report: {folder / 'report.md'}, {folder / 'report.png'}, {folder / 'eval_info.json'}")


if __name__ == "__main__":
    main()
