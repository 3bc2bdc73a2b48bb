"""The seed-then-episode bootstrap: real intervals on known cases."""
import json
from pathlib import Path

import numpy as np
import pytest

from core.stats import bootstrap_difference, bootstrap_rate, holm, verdict

B1 = {"corruption": [["brightness", 1]]}  # a record's condition: brightness +0.1


def test_identical_seeds_give_the_binomial_width():
    seed = np.array([1] * 40 + [0] * 10)  # 80% of 50
    est = bootstrap_rate([seed])
    assert est.mean == pytest.approx(0.8)
    # one seed: the interval is the episodes' alone, about +-11 points for 50 episodes at 80%
    assert 0.67 < est.lo < 0.72 and 0.88 < est.hi < 0.92


def test_disagreeing_seeds_widen_the_interval():
    agree = [np.array([1] * 45 + [0] * 5)] * 3  # 90% each
    disagree = [np.ones(50), np.array([1] * 40 + [0] * 10), np.array([1] * 45 + [0] * 5)]  # 100, 80, 90
    a, d = bootstrap_rate(agree), bootstrap_rate(disagree)
    assert a.mean == pytest.approx(d.mean) == pytest.approx(0.9)
    assert (d.hi - d.lo) > 1.3 * (a.hi - a.lo)


def test_difference_interval_and_verdicts():
    better = [np.ones(50)] * 3
    worse = [np.array([1] * 25 + [0] * 25)] * 3
    diff = bootstrap_difference(better, worse)
    assert diff.mean == pytest.approx(0.5) and diff.lo > 0.3
    assert verdict(diff) == "supported" and verdict(diff, claim_sign=-1) == "contradicted"
    same = bootstrap_difference([np.array([1, 0] * 25)] * 3, [np.array([0, 1] * 25)] * 3)
    assert same.lo < 0 < same.hi and verdict(same) == "not resolved at this scale"
    with pytest.raises(ValueError, match="at least one evaluated episode"):
        bootstrap_rate([np.array([])])


def _records(root, study, rows):
    """rows: (attention, overrides, condition, [(successes, episodes) per seed])."""
    from studies.records import Record, save

    save(root, study, [Record("lift", "bc", a, 4000, extra, seed, cond, k, n)
                       for a, extra, cond, counts in rows for seed, (k, n) in enumerate(counts)])


def test_the_claims_page_is_written_whole_comparing_each_method_with_full_attention(tmp_path):
    from studies.catalog import ARMS
    from studies.claims import main
    from studies.measure import effect_text

    _records(tmp_path, "main", [("full", {}, {}, [(50, 50)] * 3), ("fibottention", {}, {}, [(49, 50), (50, 50), (48, 50)]),
                                ("fibottention", {"train.steps": "4000"}, {}, [(50, 50)]),  # fewer seeds: the 3-seed row is used
                                ("lookhere", {}, {}, [(25, 50)] * 3), ("fibottention", {"attention.mask_mode": "multiplicative"}, {}, [(40, 50)])])
    assert ARMS["fibottention:mask_mode=multiplicative"].overrides["attention.mask_mode"] == "multiplicative"
    _records(tmp_path, "robustness", [(a, {}, c, [(k, n)] * 3) for a, bright in [("full", 30), ("fibottention", 3), ("bigbird", 3)]
                                      for c, k, n in [({}, 50, 50), (B1, bright, 30)]])
    (tmp_path / "claims.md").write_text("# Claims\n\nprose by hand\n")
    rows = {r["measurement"]: r for r in main(["--results", str(tmp_path)])}
    fib = rows["lift bc, clean, Fibottention − full"]
    assert effect_text(fib).startswith("-2 [") and fib["verdict"] == "not resolved at this scale" and fib["n_seeds"] == [3, 3]
    assert fib["arm"].mean == pytest.approx(147 / 150) and fib["baseline"].lo == 1.0  # numbers, not text
    assert rows["lift bc, clean, LookHere-90 − full"]["verdict"] == "contradicted"
    assert effect_text(rows["lift bc, brightness 1, Fibottention − full"]).startswith("-90 [")
    # the sparse baseline claims nothing: its verdict names the side of full attention, not a claim's fate
    assert rows["lift bc, brightness 1, Fibottention − full"]["verdict"] == "contradicted"
    assert rows["lift bc, brightness 1, BigBird − full"]["verdict"] == "worse than full attention"
    assert effect_text(rows["lift bc, clean, Fibottention (robot windows) † − full"]) == "not measured yet"
    sparsity = rows["lift bc, clean, Fibottention − Fibottention (multiplicative mask) †"]
    assert sparsity["difference"].mean == pytest.approx(0.98 - 0.8) and sparsity["verdict"] == "supported on 1 seed (fewer than 3)"
    md = (tmp_path / "claims.md").read_text()
    assert md.startswith("# Claims of the two papers") and "prose by hand" not in md  # generated whole
    assert "| More robust to corruptions (Fibottention) | lift bc, brightness 1, Fibottention − full | 10% [" in md
    assert "- **Better task success (LookHere)**: 1 of 5 rows measured; contradicted 1; the largest resolved effect: " \
        "lift bc, clean, LookHere-90 − full, -50 [-60, -40] points (contradicted)." in md  # what its rows show
    data = json.loads((tmp_path / "claims.json").read_text())
    row = next(r for r in data["rows"] if r["measurement"] == "lift bc, brightness 1, Fibottention − full")
    assert row["arm"]["mean"] == pytest.approx(0.1) and row["difference"]["hi"] < 0 and 0 <= row["difference"]["p"] < 0.05
    # every study table from the records; a study with none says so and writes nothing
    assert "| lift | bc | fibottention | 4000 |  | brightness1 | 3 | 10% [3, 19] (10/10/10) | -90 [-97, -81] |" in \
        (tmp_path / "robustness" / "table.md").read_text()
    assert not (tmp_path / "resolution").exists()


def test_the_per_image_table_compares_the_fix_with_both_baselines_and_its_own_encoder(tmp_path):
    from studies.catalog import VARIANTS
    from studies.claims import main

    PER_IMAGE = VARIANTS["per-image"].overrides

    def arm(a, extra, clean, bright):
        return [(a, extra, {}, [(clean, 50)] * 3), (a, extra, B1, [(bright, 30)] * 3)]
    _records(tmp_path, "robustness", [*arm("full", {}, 50, 30), *arm("fibottention", {}, 50, 3),
                                      *arm("fibottention", {**PER_IMAGE, "train.steps": "4000"}, 45, 27),
                                      *arm("full", PER_IMAGE, 50, 30), *arm("fibottention", {"attention.foo": "1"}, 0, 0)])
    main(["--results", str(tmp_path)])
    fixed = json.loads((tmp_path / "claims.json").read_text())["per_image"]
    fib = {r["condition"]: r for r in fixed if r["encoder"] == "Fibottention"}
    assert fib["brightness 1"]["success"]["mean"] == pytest.approx(0.9) and fib["brightness 1"]["seeds"] == 3
    assert fib["brightness 1"]["itself without"]["mean"] == pytest.approx(0.8)  # 27/30 against 3/30
    assert fib["clean"]["full attention"]["mean"] == pytest.approx(-0.1) == fib["clean"]["full attention, with the fix"]["mean"]
    full = {r["condition"]: r for r in fixed if r["encoder"] == "full"}
    assert full["clean"]["full attention, with the fix"] is full["clean"]["itself without"] is None
    assert full["clean"]["full attention"]["mean"] == 0
    page = (tmp_path / "robustness" / "fixes.md").read_text()  # each fix's table beside its study's
    assert "| Fibottention | brightness 1 | 3 | 90% [" in page and "+80 [" in page
    assert "](robustness/fixes.md)" in (tmp_path / "claims.md").read_text()


def test_each_row_is_compared_with_full_attention_less_its_attention_settings():
    from studies.measure import baseline_row
    from studies.records import Record

    lookhere = Record("lift", "bc", "lookhere", 4000, {"attention.global_slope": "1.0", "policy.vit.pool": "cls"}, 0,
                      {"image_size": 112, "attention": {"global_slope": 0.75}})
    assert baseline_row(lookhere) == Record("lift", "bc", "full", 4000, {"policy.vit.pool": "cls"}, 1, {"image_size": 112}).row
    fib = Record("can", "bc", "fibottention", 15000, {}, 0, B1)
    assert baseline_row(fib) == Record("can", "bc", "full", 15000, {}, 0, B1).row


def test_runs_with_the_same_overrides_in_another_order_pool_in_one_row(tmp_path):
    """A dataclass whose fields were reordered since lists a newer run's overrides in another order; the catalog's
    command-line form ("key=null", "key" for "+key") finds the records' form ("~key", "+key")."""
    from studies.measure import pick, rows_of
    from studies.records import Record, load, save
    from studies.study import Arm

    save(tmp_path, "main", [Record("lift", "bc", "lookhere", 4000, {"policy.vit.pool": "cls", "attention.rotate_directions": "false",
                                                                    "~task.x": None, "+task.y": "[13]"}, 0, {}, 46, 50),
                            Record("lift", "bc", "lookhere", 4000, {"~task.x": None, "+task.y": "[13]", "policy.vit.pool": "cls",
                                                                    "attention.rotate_directions": "false"}, 2, {}, 40, 50),
                            Record("lift", "bc", "lookhere", 4000, {"policy.vit.pool": "cls", "attention.rotate_directions": "false"},
                                   1, {}, 10, 50)])  # without the two keys: another row
    records = load(tmp_path, "main")
    assert len(rows_of(records)) == 2 and list(records[0].overrides) == ["attention.rotate_directions", "policy.vit.pool", "~task.x", "+task.y"]
    lookhere = Arm("lookhere:cls", "", {"attention": "lookhere", "attention.rotate_directions": "false"})
    wanted = {"policy.vit.pool": "cls", "task.x": "null", "task.y": "[13]"}
    assert [r.seed for r in pick(records, "lift", "bc", lookhere, wanted, {})] == [0, 2]
    assert [r.seed for r in pick(records, "lift", "bc", lookhere, {"policy.vit.pool": "cls"}, {})] == [1]


def test_the_committed_pages_are_what_the_committed_records_give(tmp_path):
    """``python -m studies.claims`` on a fresh clone changes nothing, and a second run changes nothing either: every
    generated file (study tables, fix tables, claims.md, claims.json, the generated blocks of README and findings)."""
    import shutil
    from pathlib import Path

    from studies.claims import main

    repo = Path(__file__).resolve().parents[1]
    results = repo / "results"
    written = ["claims.md", "claims.json", *(str(p.relative_to(results)) for p in results.glob("*/fixes.md")),
               *(str(p.relative_to(results).parent / "table.md") for p in results.glob("*/records.jsonl"))]
    assert len(written) >= 12
    shutil.copytree(results, tmp_path / "results", ignore=shutil.ignore_patterns("*.png", "cells"))
    (tmp_path / "docs").mkdir()
    for page in ("README.md", "docs/findings.md"):
        shutil.copy(repo / page, tmp_path / page)
    readme = (tmp_path / "README.md").read_text()
    verdicts = "| More diverse heads (LookHere) | supported | not measured | not measured |"  # its verdict per task
    full_row = next(line for line in readme.splitlines() if line.startswith("| full attention | "))  # the evidence table's
    recipe_row = next(line for line in readme.splitlines() if line.startswith("| can | bc | both cameras"))
    assert verdicts in readme  # a row of each block, made stale below
    (tmp_path / "README.md").write_text(readme.replace(full_row, "| stale |").replace(verdicts, "| stale |").replace(recipe_row, "|"))
    (tmp_path / "results" / "claims.md").write_text("stale\n")
    for name in written[2:]:
        (tmp_path / "results" / name).unlink()
    for _ in range(2):
        main(["--results", str(tmp_path / "results")])
        for name in written:
            assert (tmp_path / "results" / name).read_text() == (results / name).read_text(), name
        for page in ("README.md", "docs/findings.md"):
            assert (tmp_path / page).read_text() == (repo / page).read_text(), page
    assert len((results / "claims.md").read_text().splitlines()) < 300


def test_a_generated_block_that_no_function_fills_is_one_line(tmp_path, capsys):
    from studies.claims import main

    (tmp_path / "results").mkdir()
    (tmp_path / "README.md").write_text("<!-- generated:camera-advice -->\n<!-- /generated:camera-advice -->\n")
    with pytest.raises(SystemExit):
        main(["--results", str(tmp_path / "results")])
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "camera-advice" in err and "studies.pages.BLOCKS" in err


def test_the_lottery_counts_collapsing_seeds_and_each_claim_counts_its_tasks(tmp_path):
    from studies.claims import main
    from studies.records import Record, save

    _records(tmp_path, "main", [("full", {}, {}, [(50, 50)] * 3), ("fibottention", {}, {}, [(40, 50)] * 3)])
    _records(tmp_path, "robustness", [("full", {}, B1, [(30, 30), (27, 30), (30, 30), (29, 30)]),
                                      ("fibottention", {}, B1, [(18, 30), (0, 30), (0, 30), (30, 30)])])
    save(tmp_path, "can", [Record("can", "bc", a, 15000, {}, s, c, k, 50) for s in range(3) for a, c, k in
                           [("full", {}, 45), ("fibottention", {}, 20), ("full", B1, 45), ("fibottention", B1, 44)]])
    save(tmp_path, "pusht", [Record("pusht", "diffusion", a, 15000, {}, 0, {}, k, 50) for a, k in
                             (("full", 45), ("lookhere", 5), ("fibottention", 44))])
    main(["--results", str(tmp_path)])
    data = json.loads((tmp_path / "claims.json").read_text())
    lottery = {(r["encoder"], r["condition"]): r for r in data["lottery"]}
    # seeds below 50% success: 60/0/0/100% -> 2 of 4, Wilson interval [15, 85]%; none of full attention's, [0, 49]%
    fib = lottery[("Fibottention", "brightness 1")]
    assert (fib["collapsed"], fib["seeds"], fib["per_seed"]) == (2, 4, {"0": 0.6, "1": 0.0, "2": 0.0, "3": 1.0})
    assert [round(100 * w) for w in fib["wilson"]] == [15, 85] and lottery[("full", "brightness 1")]["collapsed"] == 0
    md = (tmp_path / "claims.md").read_text()
    assert "| Fibottention | brightness 1 | 2 of 4 | [15, 85]% | s0 60 s1 0 s2 0 s3 100 |" in md
    tasks = {r[0]: r[1:] for r in (line.strip("| ").split(" | ") for line in md.splitlines() if line.count(" | ") == 4)}
    assert tasks["Better task success (Fibottention)"] == ["contradicted (1 of 1 rows)", "contradicted (1 of 1 rows)",
                                                          "fewer than 3 seeds (1 rows)", "contradicted on 2, fewer than 3 seeds on 1 of 3 tasks"]
    assert tasks["More robust to corruptions (Fibottention)"][1:3] == ["not resolved (1 of 1 rows)", "not measured"]
    # one seed each on PushT: a row's one-seed verdict, resolved (LookHere) or not (Fibottention), gives the task none
    assert tasks["Better task success (LookHere)"][1:] == ["not measured", "fewer than 3 seeds (1 rows)",
                                                          "fewer than 3 seeds on 1, not measured on 2 of 3 tasks"]
    assert tasks["Extrapolates to larger images (LookHere)"][:3] == ["not measured"] * 3


def test_a_whole_interval_within_the_margin_reads_equivalent_and_holm_keeps_only_what_survives():
    from core.stats import EQUIVALENCE_MARGIN

    same = bootstrap_difference([np.array([1] * 97 + [0] * 3)] * 3, [np.array([1] * 98 + [0] * 2)] * 3)  # 97% vs 98%, 100 episodes
    assert -EQUIVALENCE_MARGIN <= same.lo < 0 < same.hi <= EQUIVALENCE_MARGIN
    assert verdict(same, margin=EQUIVALENCE_MARGIN) == "equivalent within ±5 points" and verdict(same) == "not resolved at this scale"
    wide = bootstrap_difference([np.array([1, 0] * 25)] * 3, [np.array([0, 1] * 25)] * 3)  # 50% vs 50%, +-20 points
    assert verdict(wide, margin=EQUIVALENCE_MARGIN) == "not resolved at this scale" and wide.p == pytest.approx(1.0, abs=0.1)
    better = bootstrap_difference([np.ones(50)] * 3, [np.array([1] * 25 + [0] * 25)] * 3)
    assert better.p == 0.0  # no draw on the far side of 0
    # the equivalence test's p-value: below 0.05 exactly when the 95% interval lies within the margin
    assert same.p_equivalent < 0.05 <= wide.p_equivalent and better.p_equivalent == 1.0
    # Holm over 3: the smallest p against 0.05/3, the next against 0.05/2, the last against 0.05; the first failure stops
    assert holm([0.01, 0.04, 0.03]) == [True, False, False] and holm([0.001, 0.02, 0.04]) == [True, True, True]
    assert holm([0.02]) == [True] and holm([]) == []


def test_equivalence_needs_both_sides_above_the_floor_and_two_failing_sides_read_both_fail():
    from core.stats import BOTH_FAIL, EQUIVALENCE_FLOOR, EQUIVALENCE_MARGIN

    def compared(a, b, n=30, seeds=3):
        a_, b_ = ([np.array([1] * k + [0] * (n - k))] * seeds for k in (a, b))
        return bootstrap_difference(a_, b_), (bootstrap_rate(a_), bootstrap_rate(b_))

    zero = compared(0, 0)  # PushT under contrast x0.5: every seed of both encoders at 0%
    assert zero[0].lo == zero[0].hi == 0 and verdict(zero[0], margin=EQUIVALENCE_MARGIN) == "equivalent within ±5 points"
    assert verdict(*zero[:1], margin=EQUIVALENCE_MARGIN, rates=zero[1]) == BOTH_FAIL == "both fail"
    low = compared(1, 0)  # 3% against 0%: both intervals below the floor
    assert max(r.hi for r in low[1]) < EQUIVALENCE_FLOOR and verdict(low[0], margin=EQUIVALENCE_MARGIN, rates=low[1]) == BOTH_FAIL
    high = compared(97, 98, n=100)  # both well above the floor, the difference within the margin
    assert verdict(high[0], margin=EQUIVALENCE_MARGIN, rates=high[1]) == "equivalent within ±5 points"
    edge = compared(3, 2, n=100)  # 3% against 2%: within the margin, yet neither side above the floor nor both below
    assert edge[1][0].lo < EQUIVALENCE_FLOOR < 1 and verdict(edge[0], margin=EQUIVALENCE_MARGIN, rates=edge[1]) in (
        BOTH_FAIL, "not resolved at this scale")
    resolved = compared(0, 9)  # a resolved difference keeps its verdict even below the floor
    assert verdict(resolved[0], rates=resolved[1]) == "contradicted"


def test_holm_marks_an_equivalence_that_would_not_survive_it(tmp_path, monkeypatch):
    import studies.measure
    from studies.catalog import grid
    from studies.records import Record, save

    conditions = [{}, *({"corruption": [[k, 2]]} for k in ("gaussian_noise", "blur", "contrast"))]
    # three rows of one claim each within the margin (equivalent alone; p_equivalent 0.017, 0.017, 0.041) and one resolved
    rates = {"full": (98, 98, 97, 60), "fibottention": (97, 97, 96, 30)}
    save(tmp_path, "robustness", [Record("lift", "bc", a, 4000, {}, s, c, k, 100) for a, ks in rates.items()
                                  for c, k in zip(conditions, ks) for s in range(3)])
    rows = grid("More robust to corruptions (Fibottention)", [("robustness", "lift", "bc")], ["fibottention"],
                ["clean", "gaussian_noise2", "blur2", "contrast2"])
    monkeypatch.setattr(studies.measure, "CLAIMS", rows)
    measured = studies.measure.claims(studies.measure.load_all(tmp_path))
    assert [r["kind"] for r in measured[:3]] == ["equivalent within ±5 points"] * 3 and measured[3]["kind"] == "contradicted"
    # Holm over 4: the resolved row's p (about 0) passes 0.05/4, the next smallest (0.017) fails 0.05/3 and stops the rest
    assert measured[3]["holm_significant"] and measured[3]["verdict"] == "contradicted"
    assert [r["verdict"] for r in measured[:3]] == ["equivalent within ±5 points ‡ (not after Holm over 4)"] * 3
