"""The one report: every generated page and table, from the committed records.

    python -m studies.claims [--results results]

Writes ``results/<study>/table.md`` for every ``records.jsonl``, each fix's table in ``results/<study>/fixes.md``,
``results/claims.md`` whole, ``results/claims.json`` (numbers as numbers), the adoption figure, and the generated
blocks of README.md and docs/findings.md beside ``results/``. It reads records only: the same files on every
machine, and a second run changes nothing (``tests/test_claims.py`` regenerates everything and compares).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from core.preflight import replace_file
from core.stats import EQUIVALENCE_FLOOR, EQUIVALENCE_MARGIN, Estimate
from studies.catalog import FIXES
from studies.catalog import CAMERA_FIXES, CAMERA_RULE
from studies.figures import adoption_figure
from studies.measure import adoption, claims, fix_table, floors, load_all, lottery
from studies.pages import claims_page, fill_blocks, fix_pages, study_table

def to_json(value):
    """claims.json's form of what is not plain JSON: an estimate as its numbers."""
    if isinstance(value, Estimate):
        return {k: v for k, v in asdict(value).items() if v is not None}  # a rate has no p-values
    raise TypeError(f"{type(value).__name__} is not JSON")


def report(results: Path) -> list[dict]:
    """Every generated file from the records: study tables, fix tables, claims.md and claims.json, the adoption figure,
    and the generated blocks of the README and docs/findings.md beside ``results``."""
    records = load_all(results)
    blind = floors(records)
    for study, recs in records.items():
        if recs:
            replace_file(results / study / "table.md", study_table(study, recs, blind))
        print(f"{study}: {len(recs)} records -> {results / study / 'table.md'}" if recs else
              f"{study}: nothing evaluated yet (no records in {results / study / 'records.jsonl'}); no table written")
    rows = claims(records)
    fixes = {name: fix_table(records, fix) for name, fix in FIXES.items()}
    rule, lots = adoption(records), lottery(records)
    camera = adoption(records, CAMERA_FIXES, CAMERA_RULE)
    if rule:
        adoption_figure(rule, results / "scene_training" / "adoption.png")
    for path, text in fix_pages(fixes).items():
        (results / path).parent.mkdir(parents=True, exist_ok=True)
        replace_file(results / path, text)
    replace_file(results / "claims.md", claims_page(rows, rule, lots, fixes, records, camera))
    replace_file(results / "claims.json", json.dumps({"comparisons": sum("difference" in r for r in rows),
                                                      "equivalence_margin": EQUIVALENCE_MARGIN, "equivalence_floor": EQUIVALENCE_FLOOR,
                                                      "rows": rows, **{k.replace("-", "_"): v for k, v in fixes.items()},
                                                      "lottery": lots, "adoption": rule,
                                                      "camera_adoption": camera}, indent=2, default=to_json) + "\n")
    for page in (results.parent / "README.md", results.parent / "docs" / "findings.md"):  # the repository's, beside results/
        if page.exists():
            fill_blocks(page, records, rows)
    print(f"{results / 'claims.md'}: {sum('difference' in r for r in rows)} comparisons of {len(rows)} claim rows")
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m studies.claims", description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results")
    args = parser.parse_args(argv)
    try:
        return report(Path(args.results))
    except ValueError as exc:  # a damaged records file, or a page naming a block no function fills
        print(f"python -m studies.claims: error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
