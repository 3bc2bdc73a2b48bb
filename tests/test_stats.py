"""The seed-then-episode bootstrap: real intervals on known cases."""
import json

import numpy as np
import pytest

from studies.stats import bootstrap_difference, bootstrap_rate, verdict


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


def _write(root, study, rows):
    (root / study).mkdir(parents=True)
    (root / study / "results.json").write_text(json.dumps({"rows": rows}))


def test_the_claims_table_compares_each_method_with_full_attention_and_keeps_the_prose(tmp_path):
    from studies.claims import BEGIN, END, main

    row = lambda a, counts, **kw: {"task": "lift", "policy": "bc", "attention": a, "extra": "", **kw,  # noqa: E731
                                   "counts": counts, "per_seed": [k / n for k, n in counts]}
    _write(tmp_path, "main", [row("full", [[50, 50]] * 3), row("fibottention", [[49, 50], [50, 50], [48, 50]]),
                              row("fibottention", [[50, 50]]),  # an older single-seed row: the 3-seed one is used
                              row("lookhere", [[25, 50]] * 3), row("fibottention:mask_mode=multiplicative", [[40, 50]])])
    _write(tmp_path, "robustness", [{**row("full", []), "counts": {"clean": [[50, 50]] * 3, "brightness_1": [[30, 30]] * 3}},
                                    {**row("fibottention", []), "counts": {"clean": [[50, 50]] * 3, "brightness_1": [[3, 30]] * 3}},
                                    {**row("bigbird", []), "counts": {"clean": [[50, 50]] * 3, "brightness_1": [[3, 30]] * 3}}])
    (tmp_path / "claims.md").write_text(f"# Claims\n\nprose before\n\n{BEGIN}\nold table\n{END}\n\nprose after\n")
    rows = {r["measurement"]: r for r in main(["--results", str(tmp_path)])}
    fib = rows["lift bc, clean, Fibottention − full"]
    assert fib["effect"].startswith("-2 [") and fib["verdict"] == "not resolved at this scale" and fib["seeds"] == "3 vs 3"
    assert rows["lift bc, clean, LookHere-90 − full"]["verdict"] == "contradicted"
    assert rows["lift bc, brightness 1, Fibottention − full"]["effect"].startswith("-90 [")
    # the sparse baseline claims nothing: its verdict names the side of full attention, not a claim's fate
    assert rows["lift bc, brightness 1, Fibottention − full"]["verdict"] == "contradicted"
    assert rows["lift bc, brightness 1, BigBird − full"]["verdict"] == "worse than full attention"
    assert rows["lift bc, clean, Fibottention (robot windows) − full"]["effect"] == "not measured yet"
    sparsity = rows["lift bc, clean, Fibottention − the same with the public code's multiplicative mask"]
    assert sparsity["diff"] == pytest.approx(0.98 - 0.8) and sparsity["verdict"] == "supported on 1 seed (fewer than 3)"
    md = (tmp_path / "claims.md").read_text()
    assert md.startswith("# Claims\n\nprose before") and md.rstrip().endswith("prose after") and "old table" not in md
    assert md.count(BEGIN) == 1 and "| More robust to corruptions (Fibottention) |" in md


def test_the_per_image_table_compares_the_fix_with_both_baselines_and_its_own_encoder(tmp_path):
    from studies.claims import FIX_BEGIN, PER_IMAGE, main

    def row(a, extra, clean, bright):
        return {"task": "lift", "policy": "bc", "attention": a, "extra": extra,
                "counts": {"clean": [[clean, 50]] * 3, "brightness_1": [[bright, 30]] * 3}}
    _write(tmp_path, "robustness", [row("full", "", 50, 30), row("fibottention", "", 50, 3),
                                    row("fibottention", f"{PER_IMAGE} train.steps=4000", 45, 27),
                                    row("full", PER_IMAGE, 50, 30), row("fibottention", "attention.foo=1", 0, 0)])
    (tmp_path / "claims.md").write_text("# Claims\n")
    main(["--results", str(tmp_path)])
    fixed = json.loads((tmp_path / "claims.json").read_text())["per_image"]
    fib = {r["condition"]: r for r in fixed if r["encoder"] == "Fibottention"}
    assert fib["brightness 1"]["success"].startswith("90% [") and fib["brightness 1"]["seeds"] == 3
    assert fib["brightness 1"]["itself without"].startswith("+80 [")  # 27/30 against 3/30
    assert fib["clean"]["full attention"].startswith("-10 [") and fib["clean"]["full attention, per-image"].startswith("-10 [")
    full = {r["condition"]: r for r in fixed if r["encoder"] == "full"}
    assert full["clean"]["full attention, per-image"] == full["clean"]["itself without"] == "—"
    assert full["clean"]["full attention"].startswith("+0 [")
    assert (tmp_path / "claims.md").read_text().count(FIX_BEGIN) == 1
