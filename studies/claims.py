"""The one report: every study's table and the claims table, from the committed records.

    python -m studies.claims [--results results] [--task lift] [--policy bc]

Writes ``results/<study>/table.md`` for every ``records.jsonl`` (rows pooled over seeds, each compared
with full attention: ``baseline_row``), the claims table between the markers of ``results/claims.md``
(the prose around it is written by hand), ``results/claims.json`` and the README's tables (evidence, verdict per task) beside
``results/``. It reads records only: the same
files on every machine, and a second run changes nothing. Verdicts: ``supported`` (the interval
excludes 0 on the claimed side), ``contradicted`` (on the other), ``not resolved at this scale``.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

from core.preflight import replace_file
from studies.records import Record, canonical, load
from core.stats import Estimate, bootstrap_difference, bootstrap_rate, verdict

BEGIN, END = "<!-- claims:begin -->", "<!-- claims:end -->"
# the training-side fixes of claims.md, each a table of its own between markers
PER_IMAGE = "policy.vit.input_norm=per_image"
AUGMENT = "policy.image_aug.brightness=0.3 policy.image_aug.contrast=0.5"  # torchvision ColorJitter per training image
FIXES = {"per-image": (PER_IMAGE, "per-image input", ("full", "fibottention")),
         "augment": (AUGMENT, "photometric augmentation", ("full", "fibottention", "lookhere"))}
ROBOT, MULT = "attention.windows=robot", "attention.mask_mode=multiplicative"
LABELS = {("full", ""): "full", ("fibottention", ""): "Fibottention", ("fibottention", ROBOT): "Fibottention (robot windows)",
          ("fibottention", MULT): "Fibottention (multiplicative mask)", ("lookhere", ""): "LookHere-90",
          ("lookhere", "attention.variant=45"): "LookHere-45", ("bigbird", ""): "BigBird"}
ARMS = {"fib": [("fibottention", ""), ("fibottention", ROBOT)], "lookhere": [("lookhere", "")], "bigbird": [("bigbird", "")]}
# the papers' other two tasks: (study, task, policy) of their measured CPU recipes (studies/catalog.py)
OTHER_TASKS = (("can", "can", "bc"), ("pusht", "pusht", "diffusion"))
TASKS = ("lift", "can", "pusht")
FEW = "fewer than 3 seeds"  # a task whose rows all rest on fewer seeds than a verdict needs
COLLAPSE = 0.5  # a seed "collapses" under a corruption below this success rate (full attention keeps about 0.9)
# the README's evidence table (between its <!-- evidence:begin/end --> markers): (attention, extra overrides, label)
PLAIN_LOOKHERE = "policy.vit.patch_size=8 policy.vit.pool=cls attention.rotate_directions=false attention.global_slope=1.0 " \
    "~task.input_shapes.robot0_eye_in_hand_image"
README_ROWS = (
    ("full", "", "full attention"), ("fibottention", "", "Fibottention"),
    ("fibottention", ROBOT, "Fibottention, the authors' robot windows (`attention.windows=robot`)"),
    ("fibottention", MULT, "Fibottention, the public code's multiplicative mask (`attention.mask_mode=multiplicative`)"),
    ("lookhere", "", "LookHere-90 (the recipe: + wrist camera, 12-px patches, keypoint read-out, rotated directions)"),
    ("lookhere", PLAIN_LOOKHERE, "plain LookHere-90 (agentview, CLS read-out, 8-px patches)"),
    ("bigbird", "", "BigBird (band ±3, CLS, 3 random keys per row; the Fibottention paper's sparse baseline)"),
    ("fibottention", PER_IMAGE, "Fibottention, per-image input normalisation (`policy.vit.input_norm=per_image`)"),
    ("full", PER_IMAGE, "full attention, per-image input normalisation"),
    ("fibottention", AUGMENT, "Fibottention, photometric augmentation (`recipe=cpu`'s jitter)"),
    ("full", AUGMENT, "full attention, photometric augmentation"),
    ("lookhere", AUGMENT, "LookHere-90 (the recipe's), photometric augmentation"))


def outcomes(recs: list[Record]) -> list[np.ndarray]:
    """Each seed's 0/1 episode outcomes, in seed order (the bootstrap draws seed by seed)."""
    return [np.r_[np.ones(r.successes), np.zeros(r.episodes - r.successes)] for r in sorted(recs, key=lambda r: r.seed)]


def rows_of(records: list[Record]) -> dict[tuple, list[Record]]:
    return {row: [r for r in records if r.row == row] for row in dict.fromkeys(r.row for r in records)}


def baseline_row(row: tuple) -> tuple:
    """Full attention's row: same task, policy, steps, overrides less ``attention.*``, condition less ``key=value``s."""
    task, policy, _, steps, extra, condition = row
    return (task, policy, "full", steps, " ".join(w for w in extra.split() if not w.startswith("attention.")),
            " ".join(w for w in condition.split() if "=" not in w))


def pct(d: Estimate, sign=True) -> str:
    f = "{:+.0f}" if sign else "{:.0f}"
    return f"{f.format(100 * d.mean)} [{f.format(100 * d.lo)}, {f.format(100 * d.hi)}]"


def table_row(row: tuple, recs: list[Record], rows: dict) -> list[str]:
    est = bootstrap_rate(outcomes(recs))
    per_seed = "/".join(f"{100 * o.mean():.0f}" for o in outcomes(recs)) if len(recs) > 1 else f"{recs[0].successes}/{recs[0].episodes}"
    base = rows.get(baseline_row(row))
    diff = pct(bootstrap_difference(outcomes(recs), outcomes(base))) if base and baseline_row(row) != row else ""
    cov = f"{sum(r.coverage * r.episodes for r in recs) / sum(r.episodes for r in recs):.3f}" if None not in [r.coverage for r in recs] else ""
    secs = [r.train_seconds for r in recs if r.train_seconds]
    return [*row, len(recs), f"{pct(est, False).replace(' [', '% [', 1)} ({per_seed})", diff, cov, f"{np.mean(secs) / 60:.1f}" if secs else ""]


def study_table(study: str, records: list[Record]) -> str:
    rows = rows_of(records)
    order = sorted(rows, key=lambda r: (*map(str, r[:5]), r[5] != "clean", r[5]))
    return (f"# {study}\n\nWritten by `python -m studies.claims` from [records.jsonl](records.jsonl) ({len(records)} evaluations). "
            "Success: mean over seeds of each seed's rate, 95% interval from a bootstrap over seeds, then episodes; per-seed rates "
            "in brackets (k/n for one seed). Difference: to full attention's row, in points (docs/studies.md).\n\n" + markdown(
                ["task", "policy", "attention", "steps", "extra overrides", "condition", "seeds", "success [95% CI] (per seed)",
                 "− full (points) [95% CI]", "mean max coverage", "train minutes / seed"], [table_row(r, rows[r], rows) for r in order]) + "\n")


def best(rows: dict, task, policy, attention, extra, condition, steps=None) -> list[Record] | None:
    """The matching row with the most seeds (older single-seed rows stay in the tables); ``extra`` less ``train.steps``."""
    wanted = canonical(extra).split()  # rows' own extra is canonical already (Record)
    found = [recs for (t, p, a, s, e, c), recs in rows.items() if (t, p, a, c) == (task, policy, attention, condition)
             and [w for w in e.split() if not w.startswith("train.steps=")] == wanted and steps in (None, s)]
    return max(found, key=len, default=None)


def compare(a: list[Record], b: list[Record], claim_sign: int = 1) -> dict:
    """Mean of ``a`` minus mean of ``b``, with interval, seeds and verdict."""
    oa, ob = outcomes(a), outcomes(b)
    d = bootstrap_difference(oa, ob)
    return {"effect": f"{pct(d)} points", "rates": f"{bootstrap_rate(oa).fmt()} vs {bootstrap_rate(ob).fmt()}",
            "seeds": f"{len(a)} vs {len(b)}", "n_seeds": [len(a), len(b)], "diff": d.mean, "ci95": [d.lo, d.hi],
            "verdict": _verdict(d, claim_sign, min(len(a), len(b)))}


def _verdict(diff, claim_sign: int, seeds: int) -> str:
    v = verdict(diff, claim_sign)
    return v if seeds >= 3 or v == "not resolved at this scale" else f"{v} on {seeds} seed{'s' * (seeds > 1)} (fewer than 3)"


def spaced(condition: str) -> str:  # brightness1 -> brightness 1
    return re.sub(r"(\d)$", r" \1", condition)


def _label(a: str, e: str) -> str:
    return LABELS[(a, e)] + (" †" if e in (ROBOT, MULT) else "")


def claims(results: Path, task: str, policy: str) -> list[dict]:
    out = []
    side = {"supported": "better than full attention", "contradicted": "worse than full attention"}

    def add(claim, measurement, result, attention=""):
        """One row; the sparse baseline (BigBird) claims nothing: its verdict says only which side of full attention it is on."""
        if attention:
            claim += ": sparse baseline (BigBird; no claim)" if attention == "bigbird" else \
                f" ({'Fibottention' if attention.startswith('fib') else 'LookHere'})"
        if attention == "bigbird" and result:
            v = result["verdict"]
            result = {**result, "verdict": next((v.replace(k, w, 1) for k, w in side.items() if v.startswith(k)), v)}
        out.append({"claim": claim, "measurement": measurement, **(result or {"effect": "not measured yet", "verdict": "—"})})

    main = rows_of(load(results, "main"))
    steps = (full := best(main, task, policy, "full", "", "clean")) and full[0].steps
    for a, e in ARMS["fib"] + ARMS["lookhere"] + ARMS["bigbird"]:
        row = best(main, task, policy, a, e, "clean", steps)
        add("Better task success", f"{task} {policy}, clean, {_label(a, e)} − full", compare(row, full) if row and full else None, a)
    eff = rows_of(load(results, "data_efficiency"))
    for n in sorted({int(w.split("=")[1]) for row in eff for w in row[4].split() if w.startswith("train.max_episodes=")}):
        base = best(eff, task, policy, "full", f"train.max_episodes={n}", "clean")
        for a in ["fibottention", "lookhere"]:
            row = best(eff, task, policy, a, f"train.max_episodes={n}", "clean")
            add("Better with scarce data", f"{task} {policy}, {n} demonstrations, {LABELS[(a, '')]} − full",
                compare(row, base) if row and base else None, a)
    rob = rows_of(load(results, "robustness"))
    conditions = sorted({row[5] for row in rob} - {"clean"})
    for a, e in ARMS["fib"] + [("fibottention", MULT)] + ARMS["lookhere"] + ARMS["bigbird"]:
        for c in conditions:
            row, base = best(rob, task, policy, a, e, c), best(rob, task, policy, "full", "", c)
            if row and base:
                add("More robust to corruptions", f"{task} {policy}, {spaced(c)}, {_label(a, e)} − full", compare(row, base), a)
    res = rows_of(load(results, "resolution"))
    larger = sorted({tuple(row[5].split()) for row in res if row[5][0].isdigit()}, key=lambda c: (len(c) > 1, int(c[0][:-2])))
    for c in [c for c in larger if all(w.startswith("global_slope=") for w in c[1:])]:
        row, base = best(res, task, policy, "lookhere", "", " ".join(c)), best(res, task, policy, "full", "", c[0])
        if row and base:
            add("Extrapolates to larger images (LookHere)", f"{task} {policy}, rendered at {c[0][:-2]} px, "
                f"lookhere{' (s_g scaled)' * (len(c) > 1)} − full", compare(row, base))
    if not any(r["claim"].startswith("Extrapolates") for r in out):
        add("Extrapolates to larger images (LookHere)", f"{task} {policy}, rendered larger than in training, LookHere − full", None)
    for study, t, p in OTHER_TASKS:  # clean and corrupted rows from the task's own study, three seeds each
        rows = rows_of(load(results, study))
        for (a, e), c in ((arm, c) for arm in ARMS["fib"][:1] + ARMS["lookhere"] for c in ("clean", "brightness1", "contrast2")):
            row, base = best(rows, t, p, a, e, c), best(rows, t, p, "full", "", c)
            add("Better task success" if c == "clean" else "More robust to corruptions", f"{t} {p}, {spaced(c)}, "
                f"{_label(a, e)} − full", compare(row, base) if row and base else None, a)
    out += diversity(results, task, policy)
    sparse, dense = best(main, task, policy, "fibottention", "", "clean", steps), best(main, task, policy, "fibottention", MULT, "clean", steps)
    add("The gain needs the sparsity (Fibottention)", f"{task} {policy}, clean, Fibottention − the same with the public "
        "code's multiplicative mask †", compare(sparse, dense) if sparse and dense else None)
    order = list(dict.fromkeys(r["claim"] for r in out))
    return sorted(out, key=lambda r: order.index(r["claim"]))  # each claim's rows together, tasks in turn


def task_verdicts(rows: list[dict]) -> dict[str, list[tuple[str, str]]]:
    """Per claim, each task's (verdict, its row counts) over its rows of 3+ seeds (the authors' settings † and BigBird aside)."""
    out = {}
    for claim in dict.fromkeys(r["claim"] for r in rows if "BigBird" not in r["claim"]):
        out[claim] = []
        for t in TASKS:
            mine = [r for r in rows if r["claim"] == claim and r["measurement"].startswith(f"{t} ") and "† − full" not in r["measurement"]
                    and r["verdict"] != "—"]
            found = [r["verdict"] for r in mine if min(r["n_seeds"]) >= 3]
            kind = ("mixed" if "contradicted" in found else "supported") if "supported" in found else \
                "contradicted" if "contradicted" in found else "not resolved" if found else FEW if mine else "not measured"
            out[claim].append((kind, f" ({sum(v.startswith(kind) for v in found)} of {len(mine)} rows)" if found else
                               f" ({len(mine)} rows)" if mine else ""))
    return out


def task_counts(verdicts: dict[str, list[tuple[str, str]]]) -> list[list[str]]:
    """claims.md's table: each task's verdict with its row counts, and on how many tasks each verdict holds."""
    out = []
    for claim, per_task in verdicts.items():
        count = {k: sum(kind == k for kind, _ in per_task) for k in ("supported", "contradicted", "not resolved", FEW, "not measured", "mixed")}
        out.append([claim, *(kind + rows for kind, rows in per_task),
                    ", ".join(f"{k} on {n}" for k, n in count.items() if n) + f" of {len(TASKS)} tasks"])
    return out


def headline(verdicts: dict[str, list[tuple[str, str]]]) -> list[list[str]]:
    """The README's verdict per claim and task, without the row counts."""
    return [[claim, *(kind for kind, _ in per_task)] for claim, per_task in verdicts.items()]


def lottery(results: Path, task: str, policy: str) -> list[list]:
    """How many training seeds of each encoder collapse under each corruption (the papers' setting), Wilson interval."""
    from core.stats import wilson_interval

    rob, out = rows_of(load(results, "robustness")), []
    for a, c in ((a, c) for a in ("full", "fibottention", "lookhere", "bigbird") for c in ("brightness1", "contrast2")):
        if recs := sorted(best(rob, task, policy, a, "", c) or [], key=lambda r: r.seed):
            k = sum(r.successes / r.episodes < COLLAPSE for r in recs)
            low, high = wilson_interval(k, len(recs))
            out.append([LABELS[(a, "")], spaced(c), f"{k} of {len(recs)}", f"[{100 * low:.0f}, {100 * high:.0f}]%",
                        " ".join(f"s{r.seed} {100 * r.successes / r.episodes:.0f}" for r in recs)])
    return out


def diversity(results: Path, task: str, policy: str) -> list[dict]:
    """Head diversity rows from ``results/diversity/results.json`` (one value per seed, not an evaluation)."""
    path = results / "diversity" / "results.json"
    out = []
    for r in json.loads(path.read_text())["rows"] if path.exists() else []:
        if (r["task"], r["policy"]) != (task, policy) or "diff" not in r:
            continue
        kind, *parts = r["attention"].split(":")  # labels of the studies of that time: "fibottention:windows=robot"
        extra, seeds = " ".join(f"attention.{p}" for p in parts), len(r["values"])
        out.append({"claim": f"More diverse heads ({'Fibottention' if kind.startswith('fib') else 'LookHere'})",
                    "measurement": f"{task} {policy}, 1 − mean pairwise CKA of the heads' outputs, {_label(kind, extra)} − full",
                    "effect": r["diff_text"], "rates": f"{r['diversity']} (per seed {r['per_seed']})", "seeds": str(seeds), "n_seeds": [seeds],
                    "verdict": _verdict(Estimate(r["diff"], *r["diff_ci95"], seeds, 0), 1, seeds)})
    return out


def fix_table(results: Path, task: str, policy: str, fix: str, encoders=("full", "fibottention")) -> list[dict]:
    """A training-side fix (extra overrides ``fix``) per encoder and condition, against full attention
    on the recipe's input, the encoder itself without the fix, and full attention with the fix."""
    rob, out = rows_of(load(results, "robustness")), []
    conditions = sorted({row[5] for row in rob}, key=lambda c: (c != "clean", c))
    for a, c in ((a, c) for a in encoders for c in conditions):
        if not (row := best(rob, task, policy, a, fix, c)):
            continue
        against = {"full attention": ("full", ""), "itself without": (a, "") if a != "full" else None,
                   "full attention, with the fix": ("full", fix) if a != "full" else None}
        bases = {k: b and best(rob, task, policy, *b, c) for k, b in against.items()}
        out.append({"encoder": LABELS[(a, "")], "condition": spaced(c), "seeds": len(row), "success": bootstrap_rate(outcomes(row)).fmt(),
                    **{k: compare(row, base)["effect"] if base else "—" for k, base in bases.items()}})
    return out


def readme_table(results: Path, task: str, policy: str) -> list[list[str]]:
    """Mean success per README row and condition, and its difference to full attention (seed counts other than 3 named).
    Clean rows come from ``main``, except for the training-side fixes, whose clean rows sit in ``robustness``."""
    main, rob, out = rows_of(load(results, "main")), rows_of(load(results, "robustness")), []
    for a, e, label in README_ROWS:
        cells = []
        for c in ("clean", "brightness1", "contrast2"):
            src = rob if c != "clean" or e in (PER_IMAGE, AUGMENT) else main
            row, base = best(src, task, policy, a, e, c), best(src, task, policy, "full", "", c)
            if not row:
                cells.append("—")
                continue
            rate, seeds = f"{100 * bootstrap_rate(outcomes(row)).mean:.0f}%", f"{len(row)} seeds" if len(row) != 3 else ""
            if row is base or not base:
                cells.append(rate + (f" ({seeds})" * bool(seeds)))
            else:
                effect = pct(bootstrap_difference(outcomes(row), outcomes(base))).replace("-", "−")
                cells.append(f"{rate} ({effect}{'; ' * bool(seeds)}{seeds})")
        out.append([label, *cells])
    return out


def markdown(header: list[str], rows: list[list]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(map(str, r)) + " |" for r in rows)])


def write(md: Path, text: str, begin: str = BEGIN, end: str = END, append: bool = True) -> None:
    """Put ``text`` between the markers of ``md``; where they are absent, append them (``append``) or
    say where the table would go (the optional tables sit where the prose of claims.md places them)."""
    old, block = md.read_text() if md.exists() else "", f"{begin}\n{text}\n{end}"
    if begin not in old and not append:
        print(f"note: {md} has no {begin} ... {end} markers; put them where this table belongs and rerun")
        return
    replace_file(md, re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, old, flags=re.S) if begin in old
                 else old + ("\n" if old else "") + block + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m studies.claims", description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results")
    parser.add_argument("--task", default="lift")
    parser.add_argument("--policy", default="bc")
    args = parser.parse_args(argv)
    results = Path(args.results)
    from studies.catalog import STUDIES

    for study in sorted({*STUDIES, *(p.parent.name for p in results.glob("*/records.jsonl"))}):
        if records := load(results, study):
            replace_file(results / study / "table.md", study_table(study, records))
        print(f"{study}: {len(records)} records -> {results / study / 'table.md'}" if records else
              f"{study}: nothing evaluated yet (no records in {results / study / 'records.jsonl'}); no table written")
    rows = claims(results, args.task, args.policy)
    text = markdown(["claim (paper)", "measurement", "value, mean [95% CI] (success, or head diversity)", "effect [95% CI]",
                     "seeds", "verdict"], [[r["claim"], r["measurement"], r.get("rates", ""), r["effect"], r.get("seeds", ""),
                                            r["verdict"]] for r in rows])
    write(results / "claims.md", text)  # the † note on the authors' code follows the markers, by hand
    tables = {name: ([f"encoder, {label}", "condition", "seeds", "success, mean [95% CI]", "− full attention (papers' setting)",
                      "− itself without it", f"− full attention with {label}"], fix_table(results, args.task, args.policy, fix, encoders))
              for name, (fix, label, encoders) in FIXES.items()}
    verdicts = task_verdicts(rows)
    tables["tasks"] = (["claim (paper)", *TASKS, "on the three tasks"], task_counts(verdicts))
    tables["lottery"] = (["encoder (papers' setting)", "condition", f"seeds under {COLLAPSE:.0%}", "95% Wilson interval",
                          "per-seed success"], lottery(results, args.task, args.policy))
    for name, (header, body) in tables.items():  # each between its markers, where the prose of claims.md places it
        if body:
            write(results / "claims.md", markdown(header, [list(r.values()) if isinstance(r, dict) else r for r in body]),
                  f"<!-- {name}:begin -->", f"<!-- {name}:end -->", append=False)
    replace_file(results / "claims.json", json.dumps({"task": args.task, "policy": args.policy, "rows": rows, **{
        k.replace("-", "_"): body for k, (_, body) in tables.items()}}, indent=2) + "\n")
    if (readme := results.parent / "README.md").exists():  # the repository's README, beside results/
        write(readme, markdown(["encoder", "clean", "brightness +0.1", "contrast ×0.5"], readme_table(results, args.task, args.policy)),
              "<!-- evidence:begin -->", "<!-- evidence:end -->", append=False)
        write(readme, markdown(["claim (paper)", *TASKS], headline(verdicts)), "<!-- tasks:begin -->",
              "<!-- tasks:end -->", append=False)
    print(text)
    return rows


if __name__ == "__main__":
    main()
