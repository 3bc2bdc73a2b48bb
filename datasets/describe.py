"""Summarize a dataset file of any format the package reads, and say whether training can use it.

    python -m datasets.describe data/pusht/demos.zarr [--json]    (also a .hdf5 file or a LeRobotDataset root)

Exit status 0 for a valid file, 1 for a file the readers would refuse (each reason is printed,
with the message training would give), 2 for a path that cannot be read at all.
"""
from __future__ import annotations

import argparse
import json
import sys

from .factory import guess_format


def describe(path) -> dict:
    fmt = guess_format(path)
    if fmt == "pusht_zarr":
        from .zarr_replay import describe_pusht_zarr

        return describe_pusht_zarr(path)
    if fmt == "lerobot":
        from .lerobot import describe_lerobot

        return describe_lerobot(path)
    from .robomimic_hdf5 import describe_robomimic_hdf5

    return describe_robomimic_hdf5(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m datasets.describe", description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    try:
        info = describe(args.path)
    except (FileNotFoundError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    status = 1 if info.get("problems") else 0
    if args.json:
        print(json.dumps(info, default=str))
        return status
    print(f"{info['path']}  ({info['format']})")
    print(f"  episodes: {info['episodes']}   frames: {info['frames']}")
    if "episode_length" in info:
        el = info["episode_length"]
        print(f"  episode length: min {el['min']}  mean {el['mean']:.1f}  max {el['max']}")
    for key, spec in info["keys"].items():
        image = f"   image: {spec['image']}" if "image" in spec else ""
        print(f"  {key:<40} {str(tuple(spec['shape'])):<22} {spec['dtype']}{image}")
    if info["action_min"]:
        lo = ", ".join(f"{v:.3g}" for v in info["action_min"])
        hi = ", ".join(f"{v:.3g}" for v in info["action_max"])
        print(f"  action range: [{lo}] .. [{hi}]")
    for problem in info.get("problems", []):
        print(f"  INVALID: {problem}")
    if status:
        print(f"  the readers (and training) refuse this file: {len(info['problems'])} problem(s) above")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
