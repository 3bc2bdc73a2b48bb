"""Paired comparisons over training seeds: each method's runs against full attention's.

    python -m studies.claims --method full=RUN_A,RUN_B,... --method fibottention=RUN_C,... \\
        [--episodes 50] [--corrupted-episodes 30] [--workers 1] [--out results/claims]

Every run directory is one training seed of one method. Each is rolled out clean and under
brightness +0.1 and contrast 0.5 (the corruptions where the single-seed robustness study saw
Fibottention fail), per-episode outcomes kept in ``<run>/eval/<step>_seed100000_<options>/summary.json``
(an evaluation that exists is reused). The table gives each method's mean over seeds with a
seed-then-episode bootstrap interval, and its difference to the first method with an interval
(``studies.stats``). Writes ``<out>/table.md`` and ``<out>/results.json``.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from core.evaluation import default_out_dir, evaluate_checkpoint
from policies.checkpoint import read_checkpoint_meta, resolve_checkpoint
from studies.corruptions import LEVELS, obs_corruptor
from studies.stats import bootstrap_difference, bootstrap_rate

CONDITIONS = {"clean": None, "brightness+0.1": ("brightness", 1), "contrast0.5": ("contrast", 2)}


def outcomes(run: str, condition: str, episodes: int, workers: int) -> np.ndarray:
    """0/1 successes of ``run`` under ``condition`` (cached in the run's eval folder)."""
    ckpt = resolve_checkpoint(run)
    corruption = CONDITIONS[condition]
    options = {"n": episodes, **({"corruption": f"{corruption[0]}{corruption[1]}"} if corruption else {})}
    out_dir = default_out_dir(ckpt, 100000, options)
    summary_path = out_dir / "summary.json"
    if not summary_path.exists():
        transform = None
        if corruption:
            keys = [k for k, s in read_checkpoint_meta(ckpt)["policy_config"]["input_shapes"].items() if len(s) == 3]
            transform = obs_corruptor(corruption[0], corruption[1], keys)
        evaluate_checkpoint(ckpt, num_episodes=episodes, workers=workers, out_dir=out_dir, num_videos=0,
                            obs_transform=transform)
    summary = json.loads(summary_path.read_text())
    return np.array([float(e["success"]) for e in summary["episodes"]])


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m studies.claims", description=__doc__.splitlines()[0])
    parser.add_argument("--method", action="append", required=True, help="NAME=RUN[,RUN...]; the first is the baseline")
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--corrupted-episodes", type=int, default=30)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", default="results/claims")
    args = parser.parse_args(argv)
    methods = {}
    for spec in args.method:
        name, runs = spec.split("=", 1)
        methods[name] = runs.split(",")
    base = next(iter(methods))
    rows = []
    for condition in CONDITIONS:
        n = args.episodes if condition == "clean" else args.corrupted_episodes
        per = {m: [outcomes(r, condition, n, args.workers) for r in runs] for m, runs in methods.items()}
        for m in methods:
            est = bootstrap_rate(per[m])
            row = {"condition": condition, "method": m, "seeds": est.seeds, "episodes": est.episodes,
                   "per_seed": [float(o.mean()) for o in per[m]], "rate": est.fmt()}
            if m != base:
                diff = bootstrap_difference(per[m], per[base])
                row.update(diff=f"{100 * diff.mean:+.0f} [{100 * diff.lo:+.0f}, {100 * diff.hi:+.0f}]",
                           diff_lo=diff.lo, diff_hi=diff.hi)
            rows.append(row)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"methods": methods, "levels": LEVELS, "rows": rows}, indent=2))
    lines = ["| condition | method | seeds | per-seed success | mean [95% CI, seeds then episodes] | "
             f"difference to {base} (points) [95% CI] |", "|---|---|---|---|---|---|"]
    for r in rows:
        per_seed = " / ".join(f"{100 * p:.0f}%" for p in r["per_seed"])
        lines.append(f"| {r['condition']} | {r['method']} | {r['seeds']} | {per_seed} | {r['rate']} | {r.get('diff', '')} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return rows


if __name__ == "__main__":
    main()
