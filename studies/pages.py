"""The pages ``python -m studies.claims`` writes whole (results/claims.md, each study's fixes.md) and the generated
blocks of hand-written pages (README.md, docs/findings.md): every number a reader sees there comes from here.

A hand-written page holds ``<!-- generated:NAME -->`` ... ``<!-- /generated:NAME -->``; ``BLOCKS[NAME]`` fills it
from the records and the measured claim rows. A new block is one function and one entry of ``BLOCKS``.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np

from core.preflight import replace_file
from core.stats import ALPHA, EQUIVALENCE_FLOOR, EQUIVALENCE_MARGIN, N_BOOT, UNRESOLVED, bootstrap_difference
from envs.shifts import SCENE_SEVERITIES, Shift
from studies.catalog import (ADOPT_CLEAN_MARGIN, ADOPT_SHIFT_FLOOR, ARMS, CAMERA_RULE, COLLAPSE, FIXES, LIFT_CAP, PIXEL, README_ROWS, README_SETTINGS,
                             RECIPES, SETTINGS, STUDIES, TASKS, VARIANTS, VERDICT_SEEDS, scene, variant)
from studies.measure import (FIX_AGAINST, NOT_ABOVE_FLOOR, above_floor, baseline_row, effect_against, effect_text, floors, outcomes, pair, pct, pick,
                             pooled, rate, rates_text, rows_of, study_records, task_counts, task_verdicts, value_text)
from studies.records import Record, condition_text, overrides_text
from studies.study import BUDGETS

NOT_LOOKING = 0.15  # a row's mean vision reliance below this: the policy does not use its images (the blind floor measures 0)

BLOCK = re.compile(r"(<!-- generated:([\w-]+) -->\n).*?(<!-- /generated:\2 -->)", re.S)
RESOLVED = ("supported", "contradicted", "better than full attention", "worse than full attention")

METHOD = """\
Each row compares two encoders trained alike, on {seeds} training seeds each unless it says otherwise. A seed's
success is its rate over {clean} clean episodes or {shifted} under a shift (held-out initial states; Lift's shifted
episodes stop at {cap} steps). A side's value is the mean over seeds, with a 95% interval from a bootstrap over seeds
and then each seed's episodes ({boot} draws, both sides resampled independently: `core/stats.py`).

Verdicts: **supported** / **contradicted**: the 95% interval of the difference excludes 0 on the claimed / the other
side; **equivalent within ±{margin} points**: the whole interval lies within ±{margin} points *and* both sides' success
intervals lie above {floor}%; **both fail**: both sides' success intervals lie below {floor}% (two failing policies say
nothing about their encoders); **not resolved at this scale**: anything else. A verdict needs {seeds} seeds per side;
a task's verdict counts only such rows. The table makes {tests} comparisons, so a few resolved rows are expected false
alarms: each row's test (the difference's, or for an equivalence its two one-sided tests) has a bootstrap p-value, and a
resolved or equivalent verdict that would not survive Holm's correction over the measured rows of its claim
(family-wise {alpha}%) is marked ‡. † marks a setting of the authors' code, left out of a task's verdict
([why](../docs/findings.md#the-authors-code)); baselines that claim nothing (BigBird, ResNet-18) say on which side of
full attention they fall."""


def markdown(header: list[str], rows: list[list]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(map(str, r)) + " |" for r in rows)])


def pct_text(e) -> str:
    return f"{100 * e.mean:.0f}%"


def reliance_text(recs: list[Record]) -> str:
    """The row's mean vision reliance over the seeds that measured it, "not looking" under ``NOT_LOOKING``; blank if none did."""
    known = [r.reliance for r in recs if r.reliance is not None]
    mean = sum(known) / len(known) if known else None
    return "" if mean is None else f"{mean:.2f}" + " not looking" * (mean < NOT_LOOKING)


def table_row(row: tuple, recs: list[Record], rows: dict, floor: list[Record] | None = None) -> list:
    r0, base = recs[0], rows.get(baseline_row(recs[0]))
    diff = pct(bootstrap_difference(outcomes(recs), outcomes(base)), measure=r0.measure) if base and baseline_row(r0) != row else ""
    cov = f"{sum(r.coverage * r.episodes for r in recs) / sum(r.episodes for r in recs):.3f}" if None not in [r.coverage for r in recs] else ""
    secs = [r.train_seconds for r in recs if r.train_seconds]
    return [r0.task, r0.policy, r0.attention, r0.steps, overrides_text(r0.overrides), condition_text(r0.condition), len(recs),
            value_text(recs), diff, *([above_floor(recs, floor)] if floor is not None else []), reliance_text(recs), cov,
            f"{np.mean(secs) / 60:.1f}" if secs else ""]


def study_table(study: str, records: list[Record], floors: dict[str, list[Record]] | None = None) -> str:
    """A study's every row; where its task has a blind floor (``studies.measure.floors``), each row against it."""
    rows = rows_of(records)
    floors = {t: f for t, f in (floors or {}).items() if any(r.task == t and r.measure == "success" for r in records)}
    body = sorted((table_row(r, rows[r], rows, floors.get(rows[r][0].task, []) if floors else None) for r in rows),
                  key=lambda t: (*map(str, t[:5]), t[5] != "clean", t[5]))
    what, noun, intro, unit = ("success", "evaluations", SUCCESS_INTRO, " (points)") if all(r.measure == "success" for r in records) \
        else ("value", "measurements", VALUE_INTRO, "")
    return (f"# {study}\n\nWritten by `python -m studies.claims` from [records.jsonl](records.jsonl) ({len(records)} {noun}). "
            f"{intro} Difference: to full attention's row{unit.replace(' (', ', in ').rstrip(')')} (docs/studies.md).{FLOOR_INTRO * bool(floors)}"
            f"{RELIANCE_INTRO}\n\n" + markdown(["task", "policy", "attention", "steps", "extra overrides", "condition", "seeds",
                                                f"{what} [95% CI] (per seed)", f"− full{unit} [95% CI]",
                                                *(["− no camera (points) [95% CI]"] if floors else []), "reliance",
                                                "mean max coverage", "train minutes / seed"], body) + "\n")


FLOOR_INTRO = (f" − no camera: to the task's blind floor, a policy trained alike without any camera (its clean success, "
               f"which holds under every visual shift: it never sees a frame); {NOT_ABOVE_FLOOR}: not resolved above it, "
               "so the images have not been shown to help there.")
RELIANCE_INTRO = (" Reliance: `python -m probes.vision_reliance` on the evaluated weights, mean over the seeds that measured it; "
                  f"reliance under {NOT_LOOKING}: the policy does not use its images (the blind floor measures 0.00; recipe=cpu's "
                  "Lift BC 0.41–0.53), marked not looking.")
SUCCESS_INTRO = ("Success: mean over seeds of each seed's rate, 95% interval from a bootstrap over seeds, then episodes; per-seed "
                 "rates in brackets (k/n for one seed).")
VALUE_INTRO = ("Value: one per training seed (head diversity: 1 − mean pairwise CKA of the heads' outputs), mean over seeds, "
               "95% interval from a bootstrap over seeds; per-seed values in brackets.")


def claim_sentence(claim: str, rows: list[dict]) -> str:
    """What a claim's rows show: how many are measured, how their verdicts split, and the largest resolved effect."""
    measured = [r for r in rows if "difference" in r]
    if not measured:
        return f"- **{claim}**: none of its {len(rows)} rows is measured yet."
    kinds = Counter({UNRESOLVED: "not resolved"}.get(r["kind"], r["kind"]) for r in measured)
    text = f"- **{claim}**: {len(measured)} of {len(rows)} rows measured; " + ", ".join(f"{k} {n}" for k, n in kinds.most_common())
    if resolved := [r for r in measured if r["kind"] in RESOLVED]:
        top = max(resolved, key=lambda r: abs(r["difference"].mean))
        text += f"; the largest resolved effect: {top['measurement']}, {effect_text(top)} ({top['verdict']})"
    return text + "."


def fmt(e) -> str:
    return "—" if e is None else e.fmt()


def adoption_table(rows: list[dict]) -> tuple[list[list], list[str]]:
    """claims.md's adoption table (the fix's success clean and under each scene shift, its clean gap to the recipe, the
    verdict) and the names of its shift columns."""
    shifts = list(dict.fromkeys(name for r in rows for name in r["success"]["fix"] if name != "clean"))
    return [[r["task"], r["fix"], r["encoder"], r["seeds"], fmt(r["success"]["fix"]["clean"]),
             "—" if r["clean_gap"] is None else f"{100 * r['clean_gap']:+.0f}",
             *(fmt(r["success"]["fix"][name]) if name in r["success"]["fix"] else "not rendered" for name in shifts), r["verdict"]]
            for r in rows], shifts


def claims_page(rows: list[dict], rule: list[dict], lots: list[dict], fixes: dict, records: dict, camera: list[dict]) -> str:
    """results/claims.md, whole."""
    budget, verdicts = BUDGETS["cpu"], task_verdicts(rows)
    method = METHOD.format(seeds=VERDICT_SEEDS, clean=budget.episodes, shifted=budget.shifted_episodes, cap=LIFT_CAP,
                           boot=N_BOOT, margin=f"{100 * EQUIVALENCE_MARGIN:.0f}", floor=f"{100 * EQUIVALENCE_FLOOR:.0f}",
                           tests=sum("difference" in r for r in rows), alpha=f"{100 * ALPHA:.0f}")
    claims_table = markdown(["claim (paper)", "measurement", "value, mean [95% CI] (success, or head diversity)", "effect [95% CI]",
                             "seeds", "verdict"], [[r["claim"], r["measurement"], rates_text(r), effect_text(r),
                                                   " vs ".join(map(str, r.get("n_seeds", ()))), r["verdict"]] for r in rows])
    adoption, shifts = adoption_table(rule)
    camera_table, camera_shifts = adoption_table(camera)
    lottery = [[r["encoder"], r["condition"], f"{r['collapsed']} of {r['seeds']}", f"[{100 * r['wilson'][0]:.0f}, {100 * r['wilson'][1]:.0f}]%",
                " ".join(f"s{s} {100 * v:.0f}" for s, v in r["per_seed"].items())] for r in lots]
    fix_links = ", ".join(f"[{path.split('/')[0]}]({path})" for path in fix_pages(fixes))
    studies = ", ".join(f"[{s}]({s}/table.md)" for s, recs in records.items() if recs)
    return "\n\n".join([
        "# Claims of the two papers, tested at the CPU budget",
        "Written whole by `python -m studies.claims` from the records (`results/<study>/records.jsonl`) and the claim rows of "
        "`studies/catalog.py`; edits by hand are overwritten. What it means, and why the sparse encoders break: "
        "[docs/findings.md](../docs/findings.md).",
        "## Method", method,
        "## Per task", f"Each claim on each of the papers' three tasks (rows of {VERDICT_SEEDS}+ seeds; the authors' settings † "
        "and the baselines aside):", markdown(["claim (paper)", *TASKS, "on the three tasks"], task_counts(verdicts)),
        "## What each claim's rows show", "\n".join(claim_sentence(c, [r for r in rows if r["claim"] == c])
                                                   for c in dict.fromkeys(r["claim"] for r in rows)),
        "## Every comparison", claims_table,
        "## Training fixes for the scene",
        f"Adopted into a task's recipe only if, on the means over {VERDICT_SEEDS} seeds, clean success stays within "
        f"{100 * ADOPT_CLEAN_MARGIN:.0f} points of the same encoder's recipe and success under every scene shift the task renders "
        f"is at least {100 * ADOPT_SHIFT_FLOOR:.0f}% ([figure](scene_training/adoption.png); each fix against its recipe, per "
        f"condition: {fix_links}):",
        markdown(["task", "training fix", "encoder", "seeds", "clean, mean [95% CI]", "clean − the recipe's (points)",
                  *(f"{name}, mean [95% CI]" for name in shifts), "the rule"], adoption),
        "## Training for a moved camera",
        f"Adopted into a task's recipe only if, on the means over {VERDICT_SEEDS} seeds, clean success stays within "
        f"{100 * ADOPT_CLEAN_MARGIN:.0f} points of the same encoder's recipe and success under the camera reaches "
        + "; ".join(f"{task}: " + ", ".join(f"{SETTINGS[i].label} {100 * v:.0f}%" for i, v in least.items()) for task, least in CAMERA_RULE.items())
        + ", and the standard suite's other settings are not resolved below the recipe (a \"holds\" here is on clean and the camera; "
        "the suite comes next). Each variant against the recipe per condition: [camera](camera/fixes.md); against the blind "
        "floor: [camera's table](camera/table.md).",
        markdown(["task", "training for the camera", "encoder", "seeds", "clean, mean [95% CI]", "clean − the recipe's (points)",
                  *(f"{name}, mean [95% CI]" for name in camera_shifts), "the rule"], camera_table),
        "## The seed lottery",
        f"Training seeds whose success falls below {COLLAPSE:.0%} under a pixel corruption (Lift BC, the papers' setting):",
        markdown(["encoder (papers' setting)", "condition", f"seeds under {COLLAPSE:.0%}", "95% Wilson interval", "per-seed success"], lottery),
        "## Every study's table", studies + "."]) + "\n"


def fix_rows(rows: list[dict]) -> list[list]:
    """A fix table as text: each difference in points, naming the other side's seeds where fewer than a verdict needs."""
    text = lambda d: "—" if d is None else pct(d) + " points" + f" (against {d.seeds} seed{'s' * (d.seeds > 1)})" * (d.seeds < VERDICT_SEEDS)
    return [[r["encoder"], r["condition"], r["seeds"], r["success"].fmt(), *(text(r[k]) for k in FIX_AGAINST)] for r in rows]


def fix_pages(fixes: dict[str, list[dict]]) -> dict[str, str]:
    """``<study>/fixes.md`` per study holding a fix: each fix's table (per encoder and condition, three differences)."""
    pages = {}
    for name, rows in ((name, rows) for name, rows in fixes.items() if rows):
        fix, label, base = FIXES[name], variant(FIXES[name].variant).label, VARIANTS[FIXES[name].base]
        task, policy = STUDIES[fix.study].tasks[0], STUDIES[fix.study].policies[0]
        header = [f"encoder, {label}", "condition", "seeds", "success, mean [95% CI]", f"− full attention ({base.note or base.label})",
                  "− itself without it", f"− full attention with {label}"]
        section = f"## {label} ({task} {policy}, on {base.note or base.label})\n\n" + markdown(header, fix_rows(rows))
        pages[f"{fix.study}/fixes.md"] = pages.get(f"{fix.study}/fixes.md", f"# Training fixes in {fix.study}\n\nWritten by "
                                                   "`python -m studies.claims` from the records ([claims](../claims.md)).") + "\n\n" + section
    return {path: text + "\n" for path, text in pages.items()}


def recipe_cells(records: list[Record], recipe, condition: dict) -> list[list[Record] | None]:
    return [pick(records, recipe.task, recipe.policy, ARMS[a], variant(recipe.variant).overrides, condition) for a in recipe.arms]


def recipes_block(records: dict, rows: list[dict]) -> str:
    """The README's recipe table: each recipe's clean success per encoder and its training minutes per seed."""
    out = []
    for recipe in RECIPES:
        cells = recipe_cells(pooled(records, recipe.studies), recipe, {})
        found = [c for c in cells if c]
        seeds = sorted({len(c) for c in found})
        success = " / ".join(pct_text(rate(c)) if c else "—" for c in cells)
        success = f"{ARMS[recipe.arms[0]].label}: {success}" if len(recipe.arms) == 1 else success  # one encoder measured
        if found and found[0][0].coverage is not None:
            success += " (mean max coverage " + " / ".join(f"{np.mean([r.coverage for r in c]):.2f}" for c in found) + ")"
        minutes = sorted({f"{r.train_seconds / 60:.0f}" for c in found for r in c if r.train_seconds}, key=float)
        seeds_text = f"{'–'.join(map(str, seeds))} seed{'s' * (seeds != [1])}" + " each" * (len(recipe.arms) > 1)
        out.append([recipe.task, recipe.label, recipe.pieces, f"{success}, {seeds_text}" if found else "not measured",
                    f"{'–'.join(dict.fromkeys([minutes[0], minutes[-1]]))} min" if minutes else ""])
    return markdown(["task", "policy", "`recipe=cpu` (pieces under `configs/recipe/`)", "clean success: " + " / ".join(
        ARMS[a].label.split(" (")[0] for a in RECIPES[0].arms), "training minutes per seed (1 thread, on 2 CPU cores)"], out)


def shift_name(condition: dict) -> str:
    return " ".join(Shift(*s).label for s in condition.get("corruption", [])) or "clean"


def against_full(recs, recipe, arm: str, conditions: list[dict]) -> str:
    """An encoder against full attention on the recipe: clean, then every shift whose interval excludes 0."""
    out = []
    for c in conditions:
        a, b = pair(recs, recipe.task, recipe.policy, ARMS[arm], variant(recipe.variant).overrides, c, ARMS[recipe.arms[0]])
        if a and b and (c == {} or (d := effect_against(a, b)).lo > 0 or d.hi < 0):
            out.append(f"{shift_name(c)} {pct(effect_against(a, b))}")
    return "; ".join(out) or "—"


def pick_block(records: dict, rows: list[dict]) -> str:
    """"Which to pick": per task, full attention on the recommended recipe, clean and under each shift, and the sparse
    encoders against it (clean, and every shift where the difference is resolved)."""
    out = []
    for recipe in (r for r in RECIPES if r.pick):
        recs = pooled(records, recipe.studies)
        pixel, shifts = [s.condition for s in PIXEL], [s.condition for s in scene(recipe.task)]
        full = lambda c: recipe_cells(recs, recipe, c)[0]
        under = lambda cs: ", ".join(f"{shift_name(c)} {pct_text(rate(full(c))) if full(c) else '—'}" for c in cs)
        out.append([recipe.task, f"{recipe.policy}, `recipe=cpu`", pct_text(rate(full({}))) if full({}) else "—", under(pixel), under(shifts),
                    *(against_full(recs, recipe, arm, [{}, *pixel, *shifts]) for arm in recipe.arms[1:])])
    return markdown(["task", "train", "full attention, clean", "under the pixel corruptions", "under the scene shifts (severity 2)",
                     "Fibottention − full (points; clean, and where resolved)", "LookHere-90 − full (likewise)"], out)


def evidence_block(records: dict, rows: list[dict]) -> str:
    """Mean success per README row and condition, and its difference to full attention (seed counts other than VERDICT_SEEDS named)."""
    out = []
    for label, arm, vid, clean_study in README_ROWS:
        cells = []
        for c in (SETTINGS[s].condition for s in README_SETTINGS):
            recs = records.get(clean_study if c == {} else "robustness", [])
            base = pick(recs, "lift", "bc", ARMS["full"], {}, c)  # full attention in the papers' setting
            row = pick(recs, "lift", "bc", ARMS[arm], VARIANTS[vid].overrides, c, steps=base and base[0].steps)
            seeds = row and (f"{len(row)} seeds" * (len(row) != VERDICT_SEEDS))
            diff = row and base and (arm, vid) != ("full", "papers") and pct(effect_against(row, base)).replace("-", "−")
            cells.append("—" if not row else pct_text(rate(row)) + (f" ({diff}{'; ' * bool(seeds)}{seeds})" if diff else f" ({seeds})" * bool(seeds)))
        out.append([label, *cells])
    return markdown(["encoder", "clean", "brightness +0.1", "contrast ×0.5"], out)


def tasks_block(records: dict, rows: list[dict]) -> str:
    return markdown(["claim (paper)", *TASKS], [[c, *(k for k, _ in per_task)] for c, per_task in task_verdicts(rows).items()])


CAMERA_STUDIES = ("scene_training", "camera")  # the recipe's own cells, and the camera variants on top of recipe=cpu
CAMERA_CONDITIONS = ({}, *({"corruption": [["camera", s]]} for s in SCENE_SEVERITIES))


def camera_block(records: dict, rows: list[dict]) -> str:
    """The camera advice: per task with a blind floor, each encoder on the recipe and with each camera variant (on top of
    recipe=cpu) clean and under the camera shifts, against that floor (✗: not resolved above it), with its reliance."""
    out = []
    for task, floor in floors(records).items():
        # the floor never sees a frame: its clean success is its success under every camera shift
        out.append([task, "no camera (the floor)", "", len(floor), *[pct_text(rate(floor))] * len(CAMERA_CONDITIONS), reliance_text(floor)])
        for study in (STUDIES[name] for name in CAMERA_STUDIES if task in STUDIES[name].tasks):
            recs = study_records(records, study.name)
            # the recipe itself from scene_training (its scene fixes are claims.md's), every camera variant from camera
            for v in (v for v in study.variants if "no-camera" not in v.id and (study.name == "camera" or v.id == "augment")):
                for arm in study.arms:
                    cells = [pick(recs, task, study.policies[0], arm, v.overrides, c) for c in CAMERA_CONDITIONS]
                    if not all(cells):
                        continue  # not measured under every camera shift
                    label = "recipe=cpu" if v.id == "augment" else v.label.removeprefix(VARIANTS["augment"].label + " + ")
                    out.append([task, label, arm.label, min(len(c) for c in cells),
                                *(pct_text(rate(c)) + f" {NOT_ABOVE_FLOOR}" * (NOT_ABOVE_FLOOR in above_floor(c, floor)) for c in cells),
                                reliance_text(cells[0])])
    return markdown(["task", "training (on top of `recipe=cpu`)", "encoder", "seeds", "clean", *(f"camera {s}" for s in SCENE_SEVERITIES),
                     "reliance"], out)


BLOCKS = {"tasks": tasks_block, "evidence": evidence_block, "recipes": recipes_block, "which-to-pick": pick_block, "camera": camera_block}


def fill_blocks(page: Path, records: dict, rows: list[dict]) -> None:
    """Fill every generated block of ``page``; a block no function fills is one line naming it and the fix."""
    text = page.read_text()
    unknown = [m[2] for m in BLOCK.finditer(text) if m[2] not in BLOCKS]
    if unknown:
        raise ValueError(f"{page} has generated block{'s' * (len(unknown) > 1)} {', '.join(unknown)} that no function fills: "
                         f"name one of {', '.join(BLOCKS)}, or add a function to studies.pages.BLOCKS")
    replace_file(page, BLOCK.sub(lambda m: m[1] + BLOCKS[m[2]](records, rows) + "\n" + m[3], text))
