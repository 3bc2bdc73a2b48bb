"""Rollout seconds per episode on Lift with and without the rendering optimisations.

    python -m benchmarks.rollout_render CHECKPOINT [--episodes 4] [--workers 0]

Evaluates the same checkpoint on the same seeds twice, once with ``fast_render`` (shadows and
reflections off, no multisampling, render context recreated) and once with robosuite's defaults.
"""
from __future__ import annotations

import argparse
import json

from core.config import TaskConfig, from_dict
from core.evaluation import evaluate
from policies.checkpoint import load_policy, read_checkpoint_meta


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    policy = load_policy(args.checkpoint)
    task = from_dict(TaskConfig, read_checkpoint_meta(args.checkpoint)["cfg"]["task"])
    rows = []
    for fast in (True, False):
        s = evaluate(policy, task, num_episodes=args.episodes, workers=args.workers, progress=False,
                     env_options={"fast_render": fast})
        rows.append({"fast_render": fast, "seconds_per_episode": s["seconds_per_episode"],
                     "mean_episode_length": s["mean_episode_length"], "success_rate": s["success_rate"],
                     "ms_per_step": 1000 * s["wall_seconds"] / max(1, sum(e["steps"] for e in s["episodes"]))})
        print(json.dumps(rows[-1]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"checkpoint": args.checkpoint, "episodes": args.episodes, "workers": args.workers, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
