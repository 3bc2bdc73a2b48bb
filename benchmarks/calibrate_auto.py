"""The ``impl="auto"`` thresholds a device's attention benchmark supports.

    python -m benchmarks.calibrate_auto results/gpu/attention_fp32.json [more.json ...]

For each sparse pattern kind, the smallest token count N from which the sparse path's
forward+backward is faster than the dense-bias path at N and at every larger N measured (the rule
``policies/vision/sparse/dispatch.py`` applies: sparse from ``AUTO_MIN_TOKENS[kind][device]``
tokens). Prints the entry for ``AUTO_MIN_TOKENS`` and, with ``--json``, writes it with the
measurements behind it. A kind whose sparse path never wins gets no threshold (None): keep dense.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

# benchmark implementation names: (pattern kind, dense impl, sparse impl)
PAIRS = [("fibottention", "fibottention-dense", "fibottention-sparse"),
         ("lookhere", "lookhere-dense", "lookhere-efficient")]


def threshold(rows: list[dict], dense: str, sparse: str) -> tuple[int | None, list[dict]]:
    """(smallest N from which ``sparse`` beats ``dense`` at every larger N, the per-N ratios)."""
    time_of = {(r["impl"], r["N"]): r["fwdbwd_ms"] for r in rows if "fwdbwd_ms" in r}
    sizes = sorted({n for impl, n in time_of if impl in (dense, sparse)})
    ratios = [{"N": n, "dense_over_sparse": time_of[dense, n] / time_of[sparse, n]}
              for n in sizes if (dense, n) in time_of and (sparse, n) in time_of]
    start = None
    for r in reversed(ratios):  # from the largest N down, while sparse keeps winning
        if r["dense_over_sparse"] <= 1.0:
            break
        start = r["N"]
    return start, ratios


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.calibrate_auto", description=__doc__.splitlines()[0])
    parser.add_argument("benchmarks", nargs="+", type=Path, help="JSON files of python -m benchmarks.attention --json")
    parser.add_argument("--json", type=Path, help="write the thresholds and ratios here")
    args = parser.parse_args(argv)
    out = {}
    for path in args.benchmarks:
        try:
            data = json.loads(path.read_text())
            device, dtype, rows = data["metadata"]["device"], data["metadata"]["dtype"], data["results"]
        except (OSError, ValueError, KeyError) as err:
            parser.error(f"{path} is not an attention benchmark's JSON ({type(err).__name__}: {err}); "
                         f"write one with python -m benchmarks.attention --json FILE")
        for kind, dense, sparse in PAIRS:
            start, ratios = threshold(rows, dense, sparse)
            out.setdefault(str(path), {})[kind] = {"device": device, "dtype": dtype, "min_tokens": start, "ratios": ratios}
            shown = ", ".join(f"N={r['N']}: {r['dense_over_sparse']:.2f}x" for r in ratios)
            print(f"{path.name} ({device}, {dtype}) {kind}: sparse from {start} tokens  [dense/sparse fwd+bwd: {shown}]")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.json.with_suffix(".tmp")
        tmp.write_text(json.dumps(out, indent=1))
        tmp.replace(args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
