"""The one loop: each claim row's records looked up and compared, and the other tables' rows (fixes, adoption, the seed
lottery, blind floors), as numbers. The rows are data (``studies/catalog.py``); ``studies.pages`` renders them.
Verdicts: ``core.stats.verdict``; Holm's correction over each claim's measured rows.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from core.stats import BOTH_FAIL, EQUIVALENCE_MARGIN, UNRESOLVED, Estimate, bootstrap_difference, bootstrap_rate, equivalent_text, holm, \
    verdict, wilson_interval
from studies.catalog import (ADOPT_CLEAN_MARGIN, ADOPT_SHIFT_FLOOR, ARMS, CLAIMS, COLLAPSE, FIXES, LOTTERY, NO_CAMERA, SCENE_FIXES, SETTINGS, STUDIES,
                             TASKS, VERDICT_SEEDS, VARIANTS, Claim, Fix, scene, variant)
from studies.records import Record, canonical, condition_text, load
from studies.study import Arm

SCALE = {"success": (100, 0), "coverage": (1, 3), "head_diversity": (1, 3)}  # a measure's display: factor, decimals
NOT_MEASURED, NOT_MEASURED_TEXT = "—", "not measured yet"
NOT_ABOVE_FLOOR = "✗"  # a row whose success is not resolved above its task's blind floor
ROUNDING = 1e-9  # float error of a difference of means of k/n rates, far below one episode
SIDES = {"supported": "better than full attention", "contradicted": "worse than full attention"}  # a baseline claims nothing
FEW = f"fewer than {VERDICT_SEEDS} seeds"  # a task whose rows all rest on fewer seeds than a verdict needs


def outcomes(recs: list[Record]) -> list[np.ndarray]:
    """Each seed's outcomes, in seed order (the bootstrap draws seed by seed): 0/1 per episode, or the seed's one value."""
    return [np.r_[np.ones(r.successes), np.zeros(r.episodes - r.successes)] if r.measure == "success" else np.array([r.seed_value()])
            for r in sorted(recs, key=lambda r: r.seed)]


def rate(recs: list[Record] | None) -> Estimate | None:
    return bootstrap_rate(outcomes(recs)) if recs else None


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


def value_text(recs: list[Record]) -> str:
    """Mean [95% CI] over seeds, then each seed's value (k/n for one seed's episodes)."""
    m = recs[0].measure
    est, values = pct(rate(recs), False, m), [o.mean() for o in outcomes(recs)]
    if m != "success":
        return f"{est} ({', '.join(f'{v:.3f}' for v in values)})"
    per_seed = "/".join(f"{100 * v:.0f}" for v in values) if len(recs) > 1 else f"{recs[0].successes}/{recs[0].episodes}"
    return f"{est.replace(' [', '% [', 1)} ({per_seed})"


def pick(records: list[Record], task: str, policy: str, arm: Arm, extra: dict, condition: dict, measure="success", steps=None):
    """``arm`` trained with ``extra`` overrides: its row with the most seeds (older single-seed rows stay in the tables),
    overrides compared in their canonical form (``studies.records.canonical``)."""
    want = canonical({k: v for k, v in {**arm.overrides, **extra}.items() if k != "attention"})
    found = rows_of([r for r in records if (r.task, r.policy, r.attention, r.condition, r.measure) == (task, policy, arm.attention,
                     condition, measure) and steps in (None, r.steps) and canonical(r.overrides) == want])
    return max(found.values(), key=len, default=None)


def pair(records, task, policy, arm: Arm, extra: dict, condition: dict, baseline: Arm, measure="success"):
    """The records of ``arm`` and of ``baseline`` (the latter under ``condition`` less its attention settings), trained as long."""
    base = pick(records, task, policy, baseline, extra, {k: v for k, v in condition.items() if k != "attention"}, measure)
    return pick(records, task, policy, arm, extra, condition, measure, base and base[0].steps), base


def compare(a: list[Record], b: list[Record], claim_sign: int = 1, side_only: bool = False) -> dict:
    """Mean of ``a`` minus mean of ``b`` as numbers (each side's estimate, the difference with its p-values), and the verdict."""
    m = a[0].measure
    d, sides = bootstrap_difference(outcomes(a), outcomes(b)), (rate(a), rate(b))
    v = verdict(d, claim_sign, EQUIVALENCE_MARGIN, sides) if m == "success" else verdict(d, claim_sign)
    v = SIDES.get(v, v) if side_only else v
    seeds = min(len(a), len(b))
    return {"measure": m, "arm": sides[0], "baseline": sides[1], "per_seed": [float(o.mean()) for o in outcomes(a)],
            "difference": d, "n_seeds": [len(a), len(b)], "kind": v,
            "verdict": v if seeds >= VERDICT_SEEDS or v == UNRESOLVED else
            f"{v} on {seeds} seed{'s' * (seeds > 1)} (fewer than {VERDICT_SEEDS})"}


def effect_text(row: dict) -> str:
    """A compared row's difference as the tables print it, or that it is not measured yet."""
    if "difference" not in row:
        return NOT_MEASURED_TEXT
    return pct(row["difference"], measure=row["measure"]) + " points" * (row["measure"] == "success")


def rates_text(row: dict) -> str:
    if "arm" not in row:
        return ""
    if row["measure"] == "success":
        return f"{row['arm'].fmt()} vs {row['baseline'].fmt()}"
    return f"{row['arm'].mean:.3f} (per seed {', '.join(f'{v:.3f}' for v in row['per_seed'])})"


def effect_against(a: list[Record], b: list[Record]) -> Estimate:
    """``a`` minus ``b`` (an ``Estimate``, its ``seeds`` those of ``b``: a table names them where fewer than a verdict needs)."""
    return replace(bootstrap_difference(outcomes(a), outcomes(b)), seeds=len(b))


def pooled(records: dict[str, list[Record]], studies) -> list[Record]:
    """The records of ``studies``, a cell's evaluation counted once where two studies recorded the same run directory."""
    seen, out = set(), []
    for r in (r for study in studies for r in records.get(study, [])):
        if (r.row, r.seed) not in seen:
            seen.add((r.row, r.seed))
            out.append(r)
    return out


def study_records(records: dict[str, list[Record]], study: str) -> list[Record]:
    """A study's records and those of the studies whose run directories are some of its cells (``Study.shares``)."""
    return pooled(records, (study, *(STUDIES[study].shares if study in STUDIES else ())))


def where(c: Claim) -> str:
    """How a claim row names its setting, and the training both sides share beyond the papers' setting."""
    v = variant(c.variant)
    return SETTINGS[c.setting].label + (f" ({v.note or v.label})" if v.overrides else "")


def measure(c: Claim, records: dict[str, list[Record]]) -> dict:
    """The one loop's body: a claim row's records, compared."""
    arm, base = ARMS[c.arm], ARMS[c.baseline]
    a, b = pair(study_records(records, c.study), c.task, c.policy, arm, variant(c.variant).overrides, SETTINGS[c.setting].condition,
                base, c.measure)
    return {"claim": c.claim, "measurement": f"{c.task} {c.policy}, {where(c)}, {arm.label} − {base.label}", "task": c.task,
            "study": c.study, "counts": not (c.side_only or arm.authors),
            **(compare(a, b, c.sign, c.side_only) if a and b else {"verdict": NOT_MEASURED})}


def tested_p(row: dict) -> float:
    """The p-value of the test behind a row's verdict: equivalence's where it reads equivalent, else the difference's."""
    return row["difference"].p_equivalent if row["kind"] == equivalent_text() else row["difference"].p


def claims(records: dict[str, list[Record]]) -> list[dict]:
    """Every claim row measured; a resolved or equivalent verdict that would not survive Holm's correction over its
    claim's measured rows marked ‡."""
    rows = [measure(c, records) for c in CLAIMS]
    for claim in dict.fromkeys(r["claim"] for r in rows):
        family = [r for r in rows if r["claim"] == claim and "difference" in r]
        for r, kept in zip(family, holm([tested_p(r) for r in family])):
            r["holm_significant"] = kept
            if r["kind"] in (*SIDES, *SIDES.values(), equivalent_text()) and not kept:
                r["verdict"] += f" ‡ (not after Holm over {len(family)})"
    return rows


def task_verdicts(rows: list[dict]) -> dict[str, list[tuple[str, str]]]:
    """Per claim, each task's (verdict, its row counts) over its rows of VERDICT_SEEDS+ seeds (the authors' settings † and
    baselines aside); rows where both sides fail are counted beside the verdict."""
    out = {}
    for claim in dict.fromkeys(r["claim"] for r in rows if r["counts"]):
        out[claim] = []
        for t in TASKS:
            mine = [r for r in rows if r["claim"] == claim and r["task"] == t and r["counts"] and "kind" in r]
            found = [{UNRESOLVED: "not resolved"}.get(r["kind"], r["kind"]) for r in mine if min(r["n_seeds"]) >= VERDICT_SEEDS]
            kind = ("mixed" if "contradicted" in found else "supported") if "supported" in found else "contradicted" if \
                "contradicted" in found else found[0] if len(set(found)) == 1 else "not resolved" if found else FEW if mine else "not measured"
            failing = f"; both fail in {found.count(BOTH_FAIL)}" * (kind != BOTH_FAIL and BOTH_FAIL in found)
            out[claim].append((kind, f" ({found.count(kind)} of {len(mine)} rows{failing})" if found else f" ({len(mine)} rows)" if mine else ""))
    return out


def task_counts(verdicts: dict[str, list[tuple[str, str]]]) -> list[list[str]]:
    """claims.md's table: each task's verdict with its row counts, and on how many tasks each verdict holds."""
    out = []
    for claim, per_task in verdicts.items():
        kinds = dict.fromkeys(["supported", "contradicted", "not resolved", BOTH_FAIL, FEW, "not measured", "mixed", *(k for k, _ in per_task)])
        count = {k: sum(kind == k for kind, _ in per_task) for k in kinds}
        out.append([claim, *(kind + n for kind, n in per_task), ", ".join(f"{k} on {n}" for k, n in count.items() if n) + f" of {len(TASKS)} tasks"])
    return out


def lottery(records: dict[str, list[Record]]) -> list[dict]:
    """How many training seeds of each encoder collapse under each condition (the papers' setting), Wilson interval."""
    out = []
    for study, task, policy, arm, setting in LOTTERY:
        condition = SETTINGS[setting].condition
        if recs := sorted(pick(records.get(study, []), task, policy, ARMS[arm], {}, condition) or [], key=lambda r: r.seed):
            k = sum(r.successes / r.episodes < COLLAPSE for r in recs)
            out.append({"encoder": ARMS[arm].label, "condition": condition_text(condition, " "), "collapsed": k, "seeds": len(recs),
                        "wilson": list(wilson_interval(k, len(recs))), "per_seed": {r.seed: r.successes / r.episodes for r in recs}})
    return out


def fix_side(records: dict[str, list[Record]], fix: Fix, arm: str, fixed: bool, condition: dict) -> list[Record] | None:
    """``arm`` on the fix's base, with the fix or without it, under ``condition``: from the study that holds that side."""
    study, extra = (fix.study, {**VARIANTS[fix.base].overrides, **variant(fix.variant).overrides}) if fixed else \
        (fix.base_study or fix.study, VARIANTS[fix.base].overrides)
    task, policy = STUDIES[fix.study].tasks[0], STUDIES[fix.study].policies[0]
    return pick(study_records(records, study), task, policy, ARMS[arm], extra, condition)


FIX_AGAINST = ("full attention", "itself without", "full attention, with the fix")  # a fix table's three differences


def fix_table(records: dict[str, list[Record]], fix: Fix) -> list[dict]:
    """A training-side fix per encoder and condition, against full attention on the recipe's input, the encoder
    itself without the fix, and full attention with the fix (each None where it is the row itself or not measured)."""
    conditions = sorted({json.dumps(r.condition): r.condition for r in study_records(records, fix.study)}.values(),
                        key=lambda c: (c != {}, condition_text(c)))
    out = []
    for arm, c in ((a, c) for a in fix.encoders for c in conditions):
        if not (row := fix_side(records, fix, arm, True, c)):
            continue
        plain = {k: v for k, v in c.items() if k != "attention"}
        bases = dict(zip(FIX_AGAINST, (fix_side(records, fix, "full", False, plain), *(
            (fix_side(records, fix, arm, False, plain), fix_side(records, fix, "full", True, plain)) if arm != "full" else (None, None)))))
        out.append({"encoder": ARMS[arm].label, "condition": condition_text(c, " "), "seeds": len(row), "success": rate(row),
                    **{k: effect_against(row, base) if base else None for k, base in bases.items()}})
    return out


def adoption(records: dict[str, list[Record]], names=SCENE_FIXES, rule: dict[str, dict[str, float]] | None = None) -> list[dict]:
    """The adoption rule per fix and encoder: does it keep the recipe's clean success and reach, under each setting the
    rule names, its least success (``rule``: task -> setting id -> least mean; by default every scene shift the task
    renders at ADOPT_SHIFT_FLOOR)? Each row carries the fix's and the recipe's success per condition (``Estimate`` or
    None) for the table and the figure."""
    out = []
    for fix in (FIXES[name] for name in names):
        task = STUDIES[fix.study].tasks[0]
        least = rule[task] if rule else {s.id: ADOPT_SHIFT_FLOOR for s in scene(task)}
        conditions = {"clean": {}, **{SETTINGS[i].label: SETTINGS[i].condition for i in least}}
        for encoder in fix.encoders:
            rows = {side: {name: fix_side(records, fix, encoder, side == "fix", c) for name, c in conditions.items()} for side in ("fix", "recipe")}
            if not any(rows["fix"].values()):
                continue
            rates = {side: {name: rate(r) for name, r in per.items()} for side, per in rows.items()}
            seeds, recipe_seeds = (min(len(r or ()) for r in rows[side].values()) for side in ("fix", "recipe"))
            clean = rates["fix"]["clean"], rates["recipe"]["clean"]
            gap = None if None in clean else clean[0].mean - clean[1].mean
            limits = {SETTINGS[i].label: v for i, v in least.items()}
            out.append({"task": task, "fix": variant(fix.variant).label, "encoder": ARMS[encoder].label, "seeds": seeds,
                        "recipe_seeds": recipe_seeds, "clean_gap": gap, "least": limits,
                        "verdict": adopted(rates["fix"], gap, seeds, limits), "success": rates})
    return out


def adopted(fix: dict[str, Estimate | None], gap: float | None, seeds: int, least: dict[str, float]) -> str:
    """"holds", or what breaks the rule (on the means), or what is missing for a verdict."""
    if None in fix.values() or gap is None:
        return f"not measured under {', '.join(name for name, e in fix.items() if e is None) or 'clean (the recipe)'}"
    if seeds < VERDICT_SEEDS:
        return f"{seeds} seed{'s' * (seeds > 1)} (fewer than {VERDICT_SEEDS})"
    below = lambda value, limit: value < limit - ROUNDING  # a mean exactly at the limit passes (e.g. 0.96 - 0.98)
    broken = [f"clean {100 * gap:+.0f} points"] * below(gap, -ADOPT_CLEAN_MARGIN) + [
        f"{name} {100 * e.mean:.0f}% (< {100 * least[name]:.0f}%)" for name, e in fix.items() if name != "clean" and below(e.mean, least[name])]
    return f"does not hold: {', '.join(broken)}" if broken else "holds"


def floors(records: dict[str, list[Record]]) -> dict[str, list[Record]]:
    """Each task's blind floor: the clean records of its policy with every camera deleted (``NO_CAMERA``), from any
    study. Such a policy's actions never see a frame, so the same floor holds under every visual shift."""
    blind = {}
    for r in (r for recs in records.values() for r in recs):
        deleted = canonical(NO_CAMERA.get(r.task, {"-": "-"})).items()  # a task without a floor defined matches nothing
        if r.measure == "success" and not r.condition and deleted <= canonical(r.overrides).items():
            blind.setdefault(r.task, []).append(r)
    return {task: max(rows_of(recs).values(), key=len) for task, recs in blind.items()}  # the row with the most seeds


def above_floor(recs: list[Record], floor: list[Record] | None) -> str:
    """A row against its task's blind floor, in points [95% CI]; ✗ where it is not resolved above the floor."""
    if not floor or recs[0].measure != "success":
        return ""
    if recs[0].row == floor[0].row:
        return "the floor"
    d = bootstrap_difference(outcomes(recs), outcomes(floor))
    return pct(d) + ("" if d.lo > 0 else f" {NOT_ABOVE_FLOOR}")


def load_all(results: Path) -> dict[str, list[Record]]:
    """Every study's records (the catalog's and any other folder's), all read before anything is written."""
    return {study: load(results, study) for study in sorted({*STUDIES, *(p.parent.name for p in results.glob("*/records.jsonl"))})}
