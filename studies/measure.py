"""The one report: every study's table and the claims table, from the committed records.

    python -m studies.claims [--results results]

Writes ``results/<study>/table.md`` for every ``records.jsonl`` (rows pooled over seeds, each compared
with full attention: ``baseline_row``), the claims table between the markers of ``results/claims.md``
(the prose around it is written by hand), ``results/claims.json`` and the README's tables (evidence, verdict
per task) beside ``results/``. The claims are rows of data (``studies/evidence.py``); one loop (``measure``) looks
up each row's records and compares them. It reads records only: the same files on every machine, and a second
run changes nothing. Verdicts: ``core.stats.verdict``; Holm's correction over each claim's rows.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

from core.preflight import replace_file
from core.stats import (ALPHA, EQUIVALENCE_MARGIN, UNRESOLVED, Estimate, bootstrap_difference, bootstrap_rate, holm, verdict,
                        wilson_interval)
from studies.evidence import (ADOPT_CLEAN_MARGIN, ADOPT_SHIFT_FLOOR, CLAIMS, COLLAPSE, FEW, FIXES, FULL, LOTTERY,
                              README_CONDITIONS, README_ROWS, SCENE_FIXES, TASKS, VERDICT_SEEDS, Arm, Claim, scene, with_overrides)
from studies.figures import adoption_figure
from studies.records import Record, condition_text, load, overrides_text

BEGIN, END = "<!-- claims:begin -->", "<!-- claims:end -->"
SCALE = {"success": (100, 0), "coverage": (1, 3), "head_diversity": (1, 3)}  # a measure's display: factor, decimals
NOT_MEASURED = {"effect": "not measured yet", "verdict": "—"}
ROUNDING = 1e-9  # float error of a difference of means of k/n rates, far below one episode
SIDES = {"supported": "better than full attention", "contradicted": "worse than full attention"}  # a baseline claims nothing


def outcomes(recs: list[Record]) -> list[np.ndarray]:
    """Each seed's outcomes, in seed order (the bootstrap draws seed by seed): 0/1 per episode, or the seed's one value."""
    return [np.r_[np.ones(r.successes), np.zeros(r.episodes - r.successes)] if r.measure == "success" else np.array([r.seed_value()])
            for r in sorted(recs, key=lambda r: r.seed)]


def rows_of(records: list[Record]) -> dict[tuple, list[Record]]:
    return {row: [r for r in records if r.row == row] for row in dict.fromkeys(r.row for r in records)}


def baseline_row(r: Record) -> tuple:
    """Full attention's row: same task, policy, steps, measure; overrides less ``attention.*``, condition less attention settings."""
    return Record(r.task, r.policy, "full", r.steps, {k: v for k, v in r.overrides.items() if not k.startswith("attention.")}, r.seed,
                  {k: v for k, v in r.condition.items() if k != "attention"}, measure=r.measure).row


def pct(d: Estimate, sign=True, measure="success") -> str:
    scale, k = SCALE[measure]
    f = f"{{:{'+' * sign}.{k}f}}"
    return f"{f.format(scale * d.mean)} [{f.format(scale * d.lo)}, {f.format(scale * d.hi)}]"


def interval(e: Estimate) -> list[float]:
    """claims.json's form of an estimate in the adoption rows: [mean, low, high]."""
    return [e.mean, e.lo, e.hi]


def value_text(recs: list[Record]) -> str:
    """Mean [95% CI] over seeds, then each seed's value (k/n for one seed's episodes)."""
    m = recs[0].measure
    est, values = pct(bootstrap_rate(outcomes(recs)), False, m), [o.mean() for o in outcomes(recs)]
    if m != "success":
        return f"{est} ({', '.join(f'{v:.3f}' for v in values)})"
    per_seed = "/".join(f"{100 * v:.0f}" for v in values) if len(recs) > 1 else f"{recs[0].successes}/{recs[0].episodes}"
    return f"{est.replace(' [', '% [', 1)} ({per_seed})"


def table_row(row: tuple, recs: list[Record], rows: dict) -> list:
    r0, base = recs[0], rows.get(baseline_row(recs[0]))
    diff = pct(bootstrap_difference(outcomes(recs), outcomes(base)), measure=r0.measure) if base and baseline_row(r0) != row else ""
    cov = f"{sum(r.coverage * r.episodes for r in recs) / sum(r.episodes for r in recs):.3f}" if None not in [r.coverage for r in recs] else ""
    secs = [r.train_seconds for r in recs if r.train_seconds]
    return [r0.task, r0.policy, r0.attention, r0.steps, overrides_text(r0.overrides), condition_text(r0.condition), len(recs),
            value_text(recs), diff, cov, f"{np.mean(secs) / 60:.1f}" if secs else ""]


def study_table(study: str, records: list[Record]) -> str:
    rows = rows_of(records)
    body = sorted((table_row(r, rows[r], rows) for r in rows), key=lambda t: (*map(str, t[:5]), t[5] != "clean", t[5]))
    what, noun, intro, unit = ("success", "evaluations", SUCCESS_INTRO, " (points)") if all(r.measure == "success" for r in records) \
        else ("value", "measurements", VALUE_INTRO, "")
    return (f"# {study}\n\nWritten by `python -m studies.claims` from [records.jsonl](records.jsonl) ({len(records)} {noun}). "
            f"{intro} Difference: to full attention's row{unit.replace(' (', ', in ').rstrip(')')} (docs/studies.md).\n\n" + markdown(
                ["task", "policy", "attention", "steps", "extra overrides", "condition", "seeds", f"{what} [95% CI] (per seed)",
                 f"− full{unit} [95% CI]", "mean max coverage", "train minutes / seed"], body) + "\n")


SUCCESS_INTRO = ("Success: mean over seeds of each seed's rate, 95% interval from a bootstrap over seeds, then episodes; per-seed "
                 "rates in brackets (k/n for one seed).")
VALUE_INTRO = ("Value: one per training seed (head diversity: 1 − mean pairwise CKA of the heads' outputs), mean over seeds, "
               "95% interval from a bootstrap over seeds; per-seed values in brackets.")


def pick(records: list[Record], task: str, policy: str, arm: Arm, condition: dict, measure: str, steps=None) -> list[Record] | None:
    """The arm's row with the most seeds (older single-seed rows stay in the tables); overrides less ``train.steps``."""
    found = rows_of([r for r in records if (r.task, r.policy, r.attention, r.condition, r.measure) == (task, policy, arm.attention,
                     condition, measure) and steps in (None, r.steps) and
                     {k: v for k, v in r.overrides.items() if k != "train.steps"} == arm.overrides])
    return max(found.values(), key=len, default=None)


def pair(records, task, policy, arm: Arm, condition: dict, baseline: Arm, measure="success"):
    """The records of ``arm`` and of ``baseline`` (the latter under ``condition`` less its attention settings), trained as long."""
    base = pick(records, task, policy, baseline, {k: v for k, v in condition.items() if k != "attention"}, measure)
    return pick(records, task, policy, arm, condition, measure, base and base[0].steps), base


def compare(a: list[Record], b: list[Record], claim_sign: int = 1, side_only: bool = False) -> dict:
    """Mean of ``a`` minus mean of ``b``, with interval, p-value, seeds and verdict."""
    m = a[0].measure
    d = bootstrap_difference(outcomes(a), outcomes(b))
    v = verdict(d, claim_sign, EQUIVALENCE_MARGIN if m == "success" else None)
    v = SIDES.get(v, v) if side_only else v
    seeds = min(len(a), len(b))
    return {"effect": pct(d, measure=m) + " points" * (m == "success"), "rates": rates(a, b), "seeds": f"{len(a)} vs {len(b)}",
            "n_seeds": [len(a), len(b)], "diff": d.mean, "ci95": [d.lo, d.hi], "p": d.p, "kind": v,
            "verdict": v if seeds >= VERDICT_SEEDS or v == UNRESOLVED else
            f"{v} on {seeds} seed{'s' * (seeds > 1)} (fewer than {VERDICT_SEEDS})"}


def effect_against(a: list[Record], b: list[Record]) -> str:
    """``a`` minus ``b`` in points, naming ``b``'s seeds where it has fewer than a verdict needs (``a``'s are in their own column)."""
    return compare(a, b)["effect"] + f" (against {len(b)} seed{'s' * (len(b) > 1)})" * (len(b) < VERDICT_SEEDS)


def rates(a: list[Record], b: list[Record]) -> str:
    if a[0].measure == "success":
        return f"{bootstrap_rate(outcomes(a)).fmt()} vs {bootstrap_rate(outcomes(b)).fmt()}"
    return f"{np.mean([o.mean() for o in outcomes(a)]):.3f} (per seed {', '.join(f'{o.mean():.3f}' for o in outcomes(a))})"


def pooled(records: dict[str, list[Record]], studies) -> list[Record]:
    """The records of ``studies``, a cell's evaluation counted once where two studies recorded the same run directory."""
    seen, out = set(), []
    for r in (r for study in studies for r in records.get(study, [])):
        if (r.row, r.seed) not in seen:
            seen.add((r.row, r.seed))
            out.append(r)
    return out


def measure(c: Claim, records: dict[str, list[Record]]) -> dict:
    """The one loop's body: a claim row's records, compared."""
    a, b = pair(pooled(records, (c.study, *c.also)), c.task, c.policy, c.arm, c.condition, c.baseline, c.measure)
    return {"claim": c.claim, "measurement": f"{c.task} {c.policy}, {c.where}, {c.arm.label} − {c.baseline.label}", "task": c.task,
            "counts": not (c.side_only or c.arm.authors), **(compare(a, b, c.sign, c.side_only) if a and b else NOT_MEASURED)}


def claims(records: dict[str, list[Record]]) -> list[dict]:
    """Every claim row measured; rows that would not survive Holm's correction over their claim's measured rows marked."""
    rows = [measure(c, records) for c in CLAIMS]
    for claim in dict.fromkeys(r["claim"] for r in rows):
        family = [r for r in rows if r["claim"] == claim and "p" in r]
        for r, kept in zip(family, holm([r["p"] for r in family])):
            r["holm_significant"] = kept
            if r["kind"] in (*SIDES, *SIDES.values()) and not kept:
                r["verdict"] += f" ‡ (not after Holm over {len(family)})"
    return rows


def task_verdicts(rows: list[dict]) -> dict[str, list[tuple[str, str]]]:
    """Per claim, each task's (verdict, its row counts) over its rows of VERDICT_SEEDS+ seeds (the authors' settings † and baselines aside)."""
    out = {}
    for claim in dict.fromkeys(r["claim"] for r in rows if r["counts"]):
        out[claim] = []
        for t in TASKS:
            mine = [r for r in rows if r["claim"] == claim and r["task"] == t and r["counts"] and "kind" in r]
            found = [{UNRESOLVED: "not resolved"}.get(r["kind"], r["kind"]) for r in mine if min(r["n_seeds"]) >= VERDICT_SEEDS]
            kind = ("mixed" if "contradicted" in found else "supported") if "supported" in found else "contradicted" if \
                "contradicted" in found else found[0] if len(set(found)) == 1 else "not resolved" if found else FEW if mine else "not measured"
            out[claim].append((kind, f" ({found.count(kind)} of {len(mine)} rows)" if found else f" ({len(mine)} rows)" if mine else ""))
    return out


def task_counts(verdicts: dict[str, list[tuple[str, str]]]) -> list[list[str]]:
    """claims.md's table: each task's verdict with its row counts, and on how many tasks each verdict holds."""
    out = []
    for claim, per_task in verdicts.items():
        kinds = dict.fromkeys(["supported", "contradicted", "not resolved", FEW, "not measured", "mixed", *(k for k, _ in per_task)])
        count = {k: sum(kind == k for kind, _ in per_task) for k in kinds}
        out.append([claim, *(kind + n for kind, n in per_task),
                    ", ".join(f"{k} on {n}" for k, n in count.items() if n) + f" of {len(TASKS)} tasks"])
    return out


def lottery(records: dict[str, list[Record]]) -> list[list]:
    """How many training seeds of each encoder collapse under each condition (the papers' setting), Wilson interval."""
    out = []
    for study, task, policy, arm, condition in LOTTERY:
        if recs := sorted(pick(records.get(study, []), task, policy, arm, condition, "success") or [], key=lambda r: r.seed):
            k = sum(r.successes / r.episodes < COLLAPSE for r in recs)
            low, high = wilson_interval(k, len(recs))
            out.append([arm.label, condition_text(condition, " "), f"{k} of {len(recs)}", f"[{100 * low:.0f}, {100 * high:.0f}]%",
                        " ".join(f"s{r.seed} {100 * r.successes / r.episodes:.0f}" for r in recs)])
    return out


def fix_table(records: dict[str, list[Record]], fix) -> list[dict]:
    """A training-side fix per encoder and condition, against full attention on the recipe's input, the encoder
    itself without the fix, and full attention with the fix (each "—" where it is the row itself)."""
    records, out = pooled(records, (fix.study, *fix.also)), []
    conditions = sorted({json.dumps(r.condition): r.condition for r in records}.values(), key=lambda c: (c != {}, condition_text(c)))
    for arm, c in ((with_overrides(a, fix.base), c) for a in fix.encoders for c in conditions):
        fixed = with_overrides(arm, fix.overrides)
        if not (row := pick(records, fix.task, fix.policy, fixed, c, "success")):
            continue
        full = with_overrides(FULL, fix.base)
        against = {"full attention": full, "itself without": arm if arm != full else None,
                   "full attention, with the fix": with_overrides(full, fix.overrides) if arm != full else None}
        bases = {k: b and pair(records, fix.task, fix.policy, fixed, c, b)[1] for k, b in against.items()}
        out.append({"encoder": arm.label, "condition": condition_text(c, " "), "seeds": len(row),
                    "success": bootstrap_rate(outcomes(row)).fmt(),
                    **{k: effect_against(row, base) if base else "—" for k, base in bases.items()}})
    return out


def adoption(records: dict[str, list[Record]]) -> list[dict]:
    """Issue 46's rule per scene fix and encoder: does it keep the recipe's clean success and hold every scene shift?
    Each row carries the fix's and the recipe's success per condition (``Estimate`` or None) for the table and the figure."""
    out = []
    for fix in (FIXES[name] for name in SCENE_FIXES):
        recs, conditions = pooled(records, (fix.study, *fix.also)), {"clean": {}, **{s.where: s.condition for s in scene(fix.task)}}
        for encoder in fix.encoders:
            recipe = with_overrides(encoder, fix.base)
            rows = {side: {name: pick(recs, fix.task, fix.policy, arm, c, "success") for name, c in conditions.items()}
                    for side, arm in (("fix", with_overrides(recipe, fix.overrides)), ("recipe", recipe))}
            if not any(rows["fix"].values()):
                continue
            rates = {side: {name: bootstrap_rate(outcomes(r)) if r else None for name, r in per.items()} for side, per in rows.items()}
            seeds, recipe_seeds = (min(len(r or ()) for r in rows[side].values()) for side in ("fix", "recipe"))
            clean = rates["fix"]["clean"], rates["recipe"]["clean"]
            gap = None if None in clean else clean[0].mean - clean[1].mean
            out.append({"task": fix.task, "fix": fix.label, "encoder": encoder.label, "seeds": seeds, "recipe_seeds": recipe_seeds,
                        "clean_gap": gap, "verdict": adopted(rates["fix"], gap, seeds), "success": rates})
    return out


def adopted(fix: dict[str, Estimate | None], gap: float | None, seeds: int) -> str:
    """"holds", or what breaks the rule (on the means), or what is missing for a verdict."""
    if None in fix.values() or gap is None:
        return f"not measured under {', '.join(name for name, e in fix.items() if e is None) or 'clean (the recipe)'}"
    if seeds < VERDICT_SEEDS:
        return f"{seeds} seed{'s' * (seeds > 1)} (fewer than {VERDICT_SEEDS})"
    below = lambda value, limit: value < limit - ROUNDING  # a mean exactly at the limit passes (e.g. 0.96 - 0.98)
    broken = [f"clean {100 * gap:+.0f} points"] * below(gap, -ADOPT_CLEAN_MARGIN) + [
        f"{name} {100 * e.mean:.0f}%" for name, e in fix.items() if name != "clean" and below(e.mean, ADOPT_SHIFT_FLOOR)]
    return f"does not hold: {', '.join(broken)}" if broken else "holds"


def adoption_table(rows: list[dict]) -> tuple[list[list], list[str]]:
    """claims.md's adoption table (the fix's success clean and under each scene shift, its clean gap to the recipe, the
    verdict) and the names of its shift columns."""
    shifts = list(dict.fromkeys(name for r in rows for name in r["success"]["fix"] if name != "clean"))
    fmt = lambda e: "—" if e is None else e.fmt()
    return [[r["task"], r["fix"], r["encoder"], r["seeds"], fmt(r["success"]["fix"]["clean"]),
             "—" if r["clean_gap"] is None else f"{100 * r['clean_gap']:+.0f}",
             *(fmt(r["success"]["fix"][name]) if name in r["success"]["fix"] else "not rendered" for name in shifts), r["verdict"]]
            for r in rows], shifts


def readme_table(records: dict[str, list[Record]]) -> list[list[str]]:
    """Mean success per README row and condition, and its difference to full attention (seed counts other than VERDICT_SEEDS named)."""
    out = []
    for label, arm, clean_study, shifted_study, task, policy in README_ROWS:
        cells = []
        for c in README_CONDITIONS:
            row, base = pair(records.get(clean_study if c == {} else shifted_study, []), task, policy, arm, c, FULL)
            rate, seeds = row and f"{100 * bootstrap_rate(outcomes(row)).mean:.0f}%", row and (f"{len(row)} seeds" * (len(row) != VERDICT_SEEDS))
            diff = row and base and arm != FULL and pct(bootstrap_difference(outcomes(row), outcomes(base))).replace("-", "−")
            cells.append("—" if not row else f"{rate} ({diff}{'; ' * bool(seeds)}{seeds})" if diff else
                         rate + f" ({seeds})" * bool(seeds))
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


def load_all(results: Path) -> dict[str, list[Record]]:
    """Every study's records (the catalog's and any other folder's), all read before anything is written."""
    from studies.catalog import STUDIES

    return {study: load(results, study) for study in sorted({*STUDIES, *(p.parent.name for p in results.glob("*/records.jsonl"))})}


def report(results: Path) -> list[dict]:
    records = load_all(results)
    for study, recs in records.items():
        if recs:
            replace_file(results / study / "table.md", study_table(study, recs))
        print(f"{study}: {len(recs)} records -> {results / study / 'table.md'}" if recs else
              f"{study}: nothing evaluated yet (no records in {results / study / 'records.jsonl'}); no table written")
    rows = claims(records)
    measured = sum("p" in r for r in rows)
    text = markdown(["claim (paper)", "measurement", "value, mean [95% CI] (success, or head diversity)", "effect [95% CI]",
                     "seeds", "verdict"], [[r["claim"], r["measurement"], r.get("rates", ""), r["effect"], r.get("seeds", ""),
                                            r["verdict"]] for r in rows]) + (
        f"\n\nThe table makes {measured} comparisons. Equivalent: the whole 95% interval within ±{100 * EQUIVALENCE_MARGIN:.0f} "
        f"points (`EQUIVALENCE_MARGIN = {EQUIVALENCE_MARGIN}`, core/stats.py). ‡: the interval excludes 0, but the difference is "
        f"not significant after Holm's correction over the measured rows of its claim (family-wise {ALPHA}; p-value: twice the "
        "share of bootstrap draws on the far side of 0).")
    write(results / "claims.md", text)  # the † note on the authors' code follows the markers, by hand
    tables = {name: ([f"encoder, {fix.label}", "condition", "seeds", "success, mean [95% CI]", f"− full attention ({fix.base_label})",
                      "− itself without it", f"− full attention with {fix.label}"], fix_table(records, fix)) for name, fix in FIXES.items()}
    rule = adoption(records)
    body, shifts = adoption_table(rule)
    tables["adoption"] = (["task", "training fix", "encoder", "seeds", "clean, mean [95% CI]", "clean − the recipe's (points)",
                           *(f"{name}, mean [95% CI]" for name in shifts), "the rule"], body)
    if rule:
        adoption_figure(rule, results / "scene_training" / "adoption.png")
    verdicts = task_verdicts(rows)
    tables["tasks"] = (["claim (paper)", *TASKS, "on the three tasks"], task_counts(verdicts))
    tables["lottery"] = (["encoder (papers' setting)", "condition", f"seeds under {COLLAPSE:.0%}", "95% Wilson interval",
                          "per-seed success"], lottery(records))
    for name, (header, body) in tables.items():  # each between its markers, where the prose of claims.md places it
        if body:
            write(results / "claims.md", markdown(header, [list(r.values()) if isinstance(r, dict) else r for r in body]),
                  f"<!-- {name}:begin -->", f"<!-- {name}:end -->", append=False)
    replace_file(results / "claims.json", json.dumps({"comparisons": measured, "equivalence_margin": EQUIVALENCE_MARGIN, "rows": rows,
                                                      **{k.replace("-", "_"): body for k, (_, body) in tables.items()},
                                                      "adoption": rule}, indent=2, default=interval) + "\n")
    if (readme := results.parent / "README.md").exists():  # the repository's README, beside results/
        write(readme, markdown(["encoder", "clean", "brightness +0.1", "contrast ×0.5"], readme_table(records)),
              "<!-- evidence:begin -->", "<!-- evidence:end -->", append=False)
        write(readme, markdown(["claim (paper)", *TASKS], [[c, *(k for k, _ in per_task)] for c, per_task in verdicts.items()]),
              "<!-- tasks:begin -->", "<!-- tasks:end -->", append=False)
    print(text)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m studies.claims", description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results")
    args = parser.parse_args(argv)
    try:
        return report(Path(args.results))
    except ValueError as exc:  # a damaged records file: which one, which line
        print(f"python -m studies.claims: error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
