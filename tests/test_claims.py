"""Claims as rows of data: a new condition, task or claim is a row, measured by the one loop."""

import studies.claims
from studies.catalog import STUDIES
from studies.evidence import CLAIMS, FIB, TASKS, Claim, Setting, grid
from studies.records import Record, save


def test_every_claim_row_names_a_study_a_task_and_its_rows_stand_together():
    assert {c.study for c in CLAIMS} <= {*STUDIES, "diversity"} and {c.task for c in CLAIMS} <= set(TASKS)
    order = [c.claim for c in CLAIMS]
    assert all(order.index(c) == i or order[i - 1] == c for i, c in enumerate(order))  # each claim's rows in one block
    assert {c.measure for c in CLAIMS} == {"success", "head_diversity"}


def _seeds(attention, condition, successes, episodes=100, seeds=3):
    return [Record("lift", "bc", attention, 4000, {}, s, condition, successes, episodes) for s in range(seeds)]


def test_a_new_condition_is_a_row_and_reads_equivalent_or_holm_marked(tmp_path, monkeypatch):
    noise = {"corruption": [["gaussian_noise", 2]]}
    save(tmp_path, "robustness", [*_seeds("full", {}, 98), *_seeds("fibottention", {}, 97),
                                  *_seeds("full", noise, 90), *_seeds("fibottention", noise, 82)])
    rows = grid("More robust to corruptions (Fibottention)", [("robustness", "lift", "bc")], [FIB],
                [Setting("clean"), Setting("gaussian noise 2", noise)])
    monkeypatch.setattr(studies.claims, "CLAIMS", rows)
    clean, noisy = studies.claims.claims(studies.claims.load_all(tmp_path))
    assert clean["measurement"] == "lift bc, clean, Fibottention − full" and clean["verdict"] == "equivalent within ±5 points"
    assert clean["effect"].startswith("-1 [") and clean["ci95"][0] >= -0.05 and clean["ci95"][1] <= 0.05
    # 82% against 90%: the interval excludes 0, but with two rows of the claim Holm holds its p-value to 0.025
    assert noisy["kind"] == "contradicted" and noisy["ci95"][1] < 0 and 0.025 < noisy["p"] < 0.05
    assert noisy["verdict"] == "contradicted ‡ (not after Holm over 2)" and noisy["holm_significant"] is False


def test_a_row_without_records_says_so_and_a_claim_about_a_new_task_is_data(tmp_path, monkeypatch):
    row = Claim("Better task success (Fibottention)", "can", "can", "bc", FIB, "clean")
    monkeypatch.setattr(studies.claims, "CLAIMS", [row])
    assert studies.claims.claims(studies.claims.load_all(tmp_path))[0] | {} == {"claim": row.claim, "measurement": "can bc, clean, Fibottention − full",
                                                      "task": "can", "counts": True, "effect": "not measured yet", "verdict": "—"}
