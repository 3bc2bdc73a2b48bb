"""Summarize a dataset file of any format the package reads.

    python -m datasets.inspect data/pusht/demos.zarr [--json]
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
    from .robomimic_hdf5 import describe_robomimic_hdf5

    return describe_robomimic_hdf5(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m datasets.inspect", description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    try:
        info = describe(args.path)
    except (FileNotFoundError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(info, default=str))
        return 0
    print(f"{info['path']}  ({info['format']})")
    print(f"  episodes: {info['episodes']}   frames: {info['frames']}")
    if "episode_length" in info:
        el = info["episode_length"]
        print(f"  episode length: min {el['min']}  mean {el['mean']:.1f}  max {el['max']}")
    for key, spec in info["keys"].items():
        print(f"  {key:<40} {str(tuple(spec['shape'])):<22} {spec['dtype']}")
    lo = ", ".join(f"{v:.3g}" for v in info["action_min"])
    hi = ", ".join(f"{v:.3g}" for v in info["action_max"])
    print(f"  action range: [{lo}] .. [{hi}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
