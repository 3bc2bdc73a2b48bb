"""The claims table: each claim of the two papers that the studies test, its measured effect with a
95% interval, and a verdict, built from the studies' ``results/<study>/results.json``.

    python -m studies.claims [--task lift] [--policy bc] [--results results]

Rewrites the table between the ``claims:begin`` / ``claims:end`` markers of ``results/claims.md``
(the prose around it is written by hand) and writes ``results/claims.json``. Every effect is a
difference of mean success over training seeds, resampled over seeds, then over each seed's
episodes (``studies.stats``), from the (successes, episodes) of each seed the study tables keep.
A claim whose cells have not run yet says so. Verdicts: ``supported`` (the interval excludes 0 on
the claimed side), ``contradicted`` (on the other), ``not resolved at this scale``.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from studies.common import outcomes_from_counts, seed_count
from studies.stats import Estimate, bootstrap_difference, bootstrap_rate, verdict

BEGIN, END = "<!-- claims:begin -->", "<!-- claims:end -->"
FIX_BEGIN, FIX_END = "<!-- per-image:begin -->", "<!-- per-image:end -->"
PER_IMAGE = "policy.vit.input_norm=per_image"  # the fix of claims.md's section 5
LABELS = {"full": "full", "fibottention": "Fibottention", "fibottention:windows=robot": "Fibottention (robot windows)",
          "fibottention:mask_mode=multiplicative": "Fibottention (multiplicative mask)", "lookhere": "LookHere-90",
          "lookhere:45": "LookHere-45", "bigbird": "BigBird"}
FIB = ["fibottention", "fibottention:windows=robot"]
LOOKHERE = ["lookhere"]


def _counts(row: dict) -> list[list[int]]:
    """(k, n) per seed of a main / data-efficiency row (rows written before ``counts`` existed: from the rates)."""
    if "counts" in row:
        return row["counts"]
    per = row["episodes"] // len(row["per_seed"])
    return [[round(r * per), per] for r in row["per_seed"]]


def _rows(results: Path, study: str, task: str, policy: str, extra: str = "") -> list[dict]:
    """Rows of ``study`` whose extra overrides are ``extra`` (default: the recipe's own cells), save the
    training length, which has a column of its own."""
    path = results / study / "results.json"
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    return [r for r in rows if r.get("task") == task and r.get("policy") == policy
            and [o for o in (r.get("extra") or "").split() if not o.startswith("train.steps=")] == extra.split()]


def _best(rows: list[dict], **match) -> dict | None:
    """The row of ``match`` with the most seeds (the current measurement; older single-seed rows stay in the tables)."""
    found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    return max(found, key=seed_count, default=None)


def _claim(claim: str, attention: str) -> str:
    """The claims column: which paper claims it; BigBird is the sparse baseline, which claims nothing."""
    if attention == "bigbird":
        return f"{claim}: sparse baseline (BigBird; no claim)"
    return f"{claim} ({'Fibottention' if attention.startswith('fib') else 'LookHere'})"


def _as_baseline(attention: str, result: dict | None) -> dict | None:
    """A row of the sparse baseline claims nothing: its verdict says only which side of full attention it is on."""
    if attention != "bigbird" or not result:
        return result
    side = {"supported": "better than full attention", "contradicted": "worse than full attention"}
    return {**result, "verdict": next((result["verdict"].replace(k, v) for k, v in side.items() if result["verdict"].startswith(k)),
                                      result["verdict"])}


def compare(a: list, b: list, claim_sign: int = 1) -> dict:
    """Mean of ``a`` minus mean of ``b`` ((k, n) per seed each), with interval, seeds and verdict."""
    oa, ob = outcomes_from_counts(a), outcomes_from_counts(b)
    d = bootstrap_difference(oa, ob)
    ra, rb = bootstrap_rate(oa), bootstrap_rate(ob)
    return {"effect": f"{100 * d.mean:+.0f} [{100 * d.lo:+.0f}, {100 * d.hi:+.0f}] points",
            "rates": f"{ra.fmt()} vs {rb.fmt()}", "seeds": f"{len(a)} vs {len(b)}",
            "diff": d.mean, "ci95": [d.lo, d.hi], "verdict": _verdict(d, claim_sign, min(len(a), len(b)))}


def _verdict(diff, claim_sign: int, seeds: int) -> str:
    v = verdict(diff, claim_sign)
    return v if seeds >= 3 or v == "not resolved at this scale" else f"{v} on {seeds} seed{'s' * (seeds > 1)} (fewer than 3)"


def claims(results: Path, task: str, policy: str) -> list[dict]:
    out = []

    def add(claim, measurement, result):
        out.append({"claim": claim, "measurement": measurement, **(result or {"effect": "not measured yet", "verdict": "—"})})

    main = _rows(results, "main", task, policy)
    full = _best(main, attention="full")
    main = [r for r in main if full and r.get("steps") == full.get("steps")]  # rows trained as long as the baseline
    for a in FIB + LOOKHERE + ["bigbird"]:
        row = _best(main, attention=a)
        add(_claim("Better task success", a), f"{task} {policy}, clean, {LABELS[a]} − full",
            _as_baseline(a, compare(_counts(row), _counts(full)) if row and full else None))
    eff = _rows(results, "data_efficiency", task, policy)
    for n in sorted({r["demos"] for r in eff}):
        base = _best(eff, attention="full", demos=n)
        for a in ["fibottention", "lookhere"]:
            row = _best(eff, attention=a, demos=n)
            add(f"Better with scarce data ({'Fibottention' if a in FIB else 'LookHere'})",
                f"{task} {policy}, {n} demonstrations, {LABELS[a]} − full",
                compare(_counts(row), _counts(base)) if row and base else None)
    rob = _rows(results, "robustness", task, policy)
    base = _best(rob, attention="full")
    for a in FIB + ["fibottention:mask_mode=multiplicative"] + LOOKHERE + ["bigbird"]:
        row = _best(rob, attention=a)
        for name in (row or {}).get("counts", {}):
            if name != "clean" and base and name in base.get("counts", {}):
                add(_claim("More robust to corruptions", a),
                    f"{task} {policy}, {name.replace('_', ' ')}, {LABELS[a]} − full",
                    _as_baseline(a, compare(row["counts"][name], base["counts"][name])))
    res = _rows(results, "resolution", task, policy)
    base = _best(res, attention="full")
    before = len(out)
    for a in ["lookhere", "lookhere (s_g scaled)"]:
        row = _best(res, attention=a)
        for size in (row or {}).get("counts", {}):
            if base and size in base.get("counts", {}) and int(size) != min(int(s) for s in row["counts"]):
                add("Extrapolates to larger images (LookHere)", f"{task} {policy}, rendered at {size} px, {a} − full",
                    compare(row["counts"][size], base["counts"][size]))
    if len(out) == before:  # resolution rows written before the tables kept per-seed counts hold rates only
        add("Extrapolates to larger images (LookHere)", f"{task} {policy}, rendered larger than in training, LookHere − full", None)
    path = results / "diversity" / "results.json"
    div = [r for r in (json.loads(path.read_text())["rows"] if path.exists() else [])
           if r.get("task") == task and r.get("policy") == policy]
    for r in div:
        if "diff" in r:
            seeds = len(r.get("values", [1]))
            d = Estimate(r["diff"], *r["diff_ci95"], seeds, 0)
            add(f"More diverse heads ({'Fibottention' if r['attention'].startswith('fib') else 'LookHere'})",
                f"{task} {policy}, 1 − mean pairwise CKA of the heads' outputs, {LABELS.get(r['attention'], r['attention'])} − full",
                {"effect": r["diff_text"], "rates": f"{r['diversity']} (per seed {r['per_seed']})", "seeds": str(seeds),
                 "verdict": _verdict(d, 1, seeds)})
    sparse, dense_mask = _best(main, attention="fibottention"), _best(main, attention="fibottention:mask_mode=multiplicative")
    add("The gain needs the sparsity (Fibottention)", f"{task} {policy}, clean, Fibottention − the same with the public "
        "code's multiplicative mask", compare(_counts(sparse), _counts(dense_mask)) if sparse and dense_mask else None)
    return out


def per_image(results: Path, task: str, policy: str) -> list[dict]:
    """Each encoder trained on per-image standardised input, per robustness condition, against full
    attention (the recipe), against itself on the recipe's input, and against full attention on the same input."""
    recipe, fixed = _rows(results, "robustness", task, policy), _rows(results, "robustness", task, policy, PER_IMAGE)
    out = []
    for a in ["full", "fibottention"]:
        row = _best(fixed, attention=a)
        # full attention's "itself" is the first column, and its own per-image row the row itself
        against = {"full attention": _best(recipe, attention="full"),
                   "itself without": _best(recipe, attention=a) if a != "full" else None,
                   "full attention, per-image": _best(fixed, attention="full") if a != "full" else None}
        for name, counts in (row or {}).get("counts", {}).items():
            out.append({"encoder": LABELS[a], "condition": name.replace("_", " "), "seeds": len(counts),
                        "success": bootstrap_rate(outcomes_from_counts(counts)).fmt(),
                        **{k: compare(counts, r["counts"][name])["effect"] if r and name in r["counts"] else "—"
                           for k, r in against.items()}})
    return out


def per_image_table(rows: list[dict]) -> str:
    lines = ["| encoder, per-image input | condition | seeds | success, mean [95% CI] | − full attention (recipe input) "
             "| − itself on the recipe input | − full attention, per-image input |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['encoder']} | {r['condition']} | {r['seeds']} | {r['success']} | {r['full attention']} "
                     f"| {r['itself without']} | {r['full attention, per-image']} |")
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    lines = ["| claim (paper) | measurement | value, mean [95% CI] (success, or head diversity) | effect [95% CI] | seeds | verdict |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['claim']} | {r['measurement']} | {r.get('rates', '')} | {r['effect']} | {r.get('seeds', '')} | {r['verdict']} |")
    return "\n".join(lines)


def write(md: Path, text: str, begin: str = BEGIN, end: str = END) -> None:
    """Put ``text`` between the markers of ``md`` (appended with them if absent), by a rename."""
    old = md.read_text() if md.exists() else ""
    block = f"{begin}\n{text}\n{end}"
    new = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, old, flags=re.S) if begin in old \
        else old + ("\n" if old else "") + block + "\n"
    tmp = md.with_name(f".{md.name}.tmp")
    tmp.write_text(new)
    tmp.replace(md)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m studies.claims", description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="lift")
    parser.add_argument("--policy", default="bc")
    parser.add_argument("--results", default="results")
    args = parser.parse_args(argv)
    results = Path(args.results)
    rows = claims(results, args.task, args.policy)
    text = table(rows)
    write(results / "claims.md", text)
    fixed = per_image(results, args.task, args.policy)
    if fixed:
        write(results / "claims.md", per_image_table(fixed), FIX_BEGIN, FIX_END)
    (results / "claims.json").write_text(json.dumps({"task": args.task, "policy": args.policy, "rows": rows,
                                                     "per_image": fixed}, indent=2))
    print(text)
    return rows


if __name__ == "__main__":
    main()
