"""Claims as rows of data: a new condition, task or claim is a row, measured by the one loop."""

import studies.measure
from studies.catalog import ARMS, CLAIMS, SETTINGS, STUDIES, TASKS, VARIANTS, Claim, grid
from studies.pages import adoption_table, fix_rows
from studies.records import Record, save

AUGMENT, COLOUR, SHIFT, WRIST = (VARIANTS[v].overrides for v in ("augment", "colour", "shift", "wrist"))


def test_every_claim_row_names_a_study_a_task_and_its_rows_stand_together():
    assert {c.study for c in CLAIMS} <= {*STUDIES, "diversity"} and {c.task for c in CLAIMS} <= set(TASKS)
    # each row names its arms, setting and variant by id, each defined once
    assert all({c.arm, c.baseline} <= set(ARMS) and c.setting in SETTINGS and c.variant in VARIANTS for c in CLAIMS)
    order = [c.claim for c in CLAIMS]
    assert all(order.index(c) == i or order[i - 1] == c for i, c in enumerate(order))  # each claim's rows in one block
    assert {c.measure for c in CLAIMS} == {"success", "head_diversity"}


def pts(estimate) -> int:
    """An estimate's mean in points, as the tables round it."""
    return round(100 * estimate.mean)


def _seeds(attention, condition, successes, episodes=100, seeds=3):
    return [Record("lift", "bc", attention, 4000, {}, s, condition, successes, episodes) for s in range(seeds)]


def test_a_new_condition_is_a_row_and_reads_equivalent_or_holm_marked(tmp_path, monkeypatch):
    noise = {"corruption": [["gaussian_noise", 2]]}
    save(tmp_path, "robustness", [*_seeds("full", {}, 98), *_seeds("fibottention", {}, 97),
                                  *_seeds("full", noise, 90), *_seeds("fibottention", noise, 82)])
    rows = grid("More robust to corruptions (Fibottention)", [("robustness", "lift", "bc")], ["fibottention"], ["clean", "gaussian_noise2"])
    monkeypatch.setattr(studies.measure, "CLAIMS", rows)
    clean, noisy = studies.measure.claims(studies.measure.load_all(tmp_path))
    assert clean["measurement"] == "lift bc, clean, Fibottention − full" and clean["verdict"] == "equivalent within ±5 points"
    assert studies.measure.effect_text(clean).startswith("-1 [") and -0.05 <= clean["difference"].lo < clean["difference"].hi <= 0.05
    # 82% against 90%: the interval excludes 0 (0.025 < p < 0.05). The equivalence's own p (under 0.025) passes first
    # in Holm's order, so the difference is then held to 0.05 and kept
    assert noisy["kind"] == "contradicted" and noisy["difference"].hi < 0 and 0.025 < noisy["difference"].p < 0.05
    assert clean["difference"].p_equivalent < 0.025 and clean["holm_significant"] and noisy["holm_significant"]
    assert noisy["verdict"] == "contradicted"
    # with a clean row that is not resolved (95% against 98%: its p is large), the same difference is held to 0.025 and marked
    save(tmp_path, "robustness", [*_seeds("fibottention", {}, 95)])
    clean, noisy = studies.measure.claims(studies.measure.load_all(tmp_path))
    assert clean["kind"] == "not resolved at this scale" and clean["difference"].p > 0.05
    assert noisy["verdict"] == "contradicted ‡ (not after Holm over 2)" and noisy["holm_significant"] is False


def test_a_row_without_records_says_so_and_a_claim_about_a_new_task_is_data(tmp_path, monkeypatch):
    row = Claim("Better task success (Fibottention)", "can", "can", "bc", "fibottention", "clean")
    monkeypatch.setattr(studies.measure, "CLAIMS", [row])
    assert studies.measure.claims(studies.measure.load_all(tmp_path))[0] | {} == {"claim": row.claim, "measurement": "can bc, clean, Fibottention − full",
                                                      "task": "can", "study": "can", "counts": True, "verdict": "—"}


def test_a_fix_on_top_of_the_recipe_is_compared_with_the_recipe_not_the_papers_setting(tmp_path):
    from studies.catalog import FIXES

    camera = {"corruption": [["camera", 2]]}

    def cell(attention, overrides, successes):
        return [Record("lift", "bc", attention, 4000, overrides, s, camera, successes, 30) for s in range(3)]

    save(tmp_path, "scene_training", [*cell("full", {}, 3),  # the papers' setting: must not be the baseline here
                                      *cell("full", AUGMENT, 12), *cell("full", {**AUGMENT, **SHIFT}, 27),
                                      *cell("fibottention", AUGMENT, 6), *cell("fibottention", {**AUGMENT, **SHIFT}, 21)])
    full, fib = studies.measure.fix_table(studies.measure.load_all(tmp_path), FIXES["shift"])
    assert (full["encoder"], full["condition"], full["seeds"]) == ("full", "camera 2", 3)
    assert pts(full["success"]) == 90 and pts(full["full attention"]) == 50  # 90% against the recipe's 40%
    assert full["itself without"] is full["full attention, with the fix"] is None
    assert pts(fib["full attention"]) == 30 and pts(fib["itself without"]) == 50  # 70% vs 40%, vs its own 20%
    assert pts(fib["full attention, with the fix"]) == -20


def test_the_resnet_baseline_is_its_own_arm_beside_full_attention_of_the_same_study(tmp_path):
    resnet = [Record("lift", "bc", "full", 4000, {"policy.encoder": "resnet18"}, s, {}, 40, 50) for s in range(3)]
    save(tmp_path, "encoders", [*resnet, *_seeds("full", {}, 49, episodes=50)])
    rows = [studies.measure.measure(c, studies.measure.load_all(tmp_path)) for c in CLAIMS
            if (c.arm, c.setting, c.variant) == ("resnet18", "clean", "papers")]
    # 80% against 98%: the ResNet's records are not full attention's, though both say attention=full
    assert len(rows) == 1 and rows[0]["measurement"] == "lift bc, clean, ResNet-18 − full"
    assert pts(rows[0]["difference"]) == -18 and rows[0]["verdict"] == "worse than full attention"


def test_the_recipe_on_another_task_is_compared_with_that_tasks_papers_setting_study(tmp_path):
    from studies.catalog import FIXES

    def cell(task, policy, attention, overrides, successes, condition=None):
        return [Record(task, policy, attention, 15000, overrides, s, condition or {}, successes, 50) for s in range(3)]

    save(tmp_path, "pusht", cell("pusht", "diffusion", "full", {}, 32))  # the papers' setting, its own study
    save(tmp_path, "pusht_recipe", [*cell("pusht", "diffusion", "full", AUGMENT, 22),
                                    *cell("pusht", "diffusion", "full", AUGMENT, 20, {"corruption": [["camera", 2]]})])
    full, full_camera = studies.measure.fix_table(studies.measure.load_all(tmp_path), FIXES["augment-pusht"])
    assert (full["encoder"], full["condition"]) == ("full", "clean") and pts(full["full attention"]) == -20  # 44% vs 64%
    assert full_camera["condition"] == "camera 2" and full_camera["full attention"] is None  # no camera cell without the jitter
    save(tmp_path, "can", [*cell("can", "bc", "full", {}, 32), *cell("can", "bc", "fibottention", {}, 30)])
    save(tmp_path, "can_recipe", [*cell("can", "bc", "full", AUGMENT, 22), *cell("can", "bc", "fibottention", AUGMENT, 25)])
    fib = studies.measure.fix_table(studies.measure.load_all(tmp_path), FIXES["augment-can"])[1]
    assert pts(fib["itself without"]) == -10 and pts(fib["full attention, with the fix"]) == 6  # 50% vs 60%, vs 44%


def test_hue_saturation_on_can_and_pusht_is_compared_with_each_tasks_recipe(tmp_path):
    from studies.catalog import FIXES

    def cell(task, policy, attention, overrides, successes):
        return [Record(task, policy, attention, 15000, overrides, s, {}, successes, 50) for s in range(3)]

    # Can's recipe has the jitter, PushT's is the papers' setting: each fix sits on top of that, never on the other
    assert [v.overrides for v in STUDIES["can_scene_training"].variants] == [{**AUGMENT, **COLOUR}]
    assert [v.overrides for v in STUDIES["pusht_scene_training"].variants] == [COLOUR]
    assert not any(s.id.startswith("lighting") for s in STUDIES["pusht_scene_training"].settings)
    assert {"colour1", "colour3", "camera3", "blur2"} <= {s.id for s in STUDIES["pusht_scene_training"].settings}
    save(tmp_path, "can", cell("can", "bc", "full", {}, 10))  # the papers' setting: must not be Can's baseline
    save(tmp_path, "can_recipe", cell("can", "bc", "full", AUGMENT, 40))
    save(tmp_path, "can_scene_training", cell("can", "bc", "full", {**AUGMENT, **COLOUR}, 45))
    (can,) = studies.measure.fix_table(studies.measure.load_all(tmp_path), FIXES["colour-can"])
    assert pts(can["full attention"]) == 10  # 90% vs 80%, not vs 20%
    save(tmp_path, "pusht", [*cell("pusht", "diffusion", "full", {}, 30), *cell("pusht", "diffusion", "full", AUGMENT, 5)])
    save(tmp_path, "pusht_scene_training", [*cell("pusht", "diffusion", "full", COLOUR, 35),
                                            *cell("pusht", "diffusion", "fibottention", COLOUR, 25)])
    full, fib = studies.measure.fix_table(studies.measure.load_all(tmp_path), FIXES["colour-pusht"])
    assert pts(full["full attention"]) == 10 and pts(fib["full attention, with the fix"]) == -20
    assert fib["itself without"] is None  # no Fibottention cell in the papers' setting here


def test_a_fix_row_against_fewer_seeds_names_the_baselines_seeds(tmp_path):
    from studies.catalog import FIXES

    camera = {"corruption": [["camera", 2]]}
    cell = lambda overrides, successes, seeds: [Record("pusht", "diffusion", "full", 15000, overrides, s, condition, successes, 30)
                                                for s in range(seeds) for condition in ({}, camera)]
    save(tmp_path, "pusht", cell({}, 15, 1))  # one papers'-setting seed retrained so far
    save(tmp_path, "pusht_recipe", cell(AUGMENT, 24, 3))
    clean, shifted = studies.measure.fix_table(studies.measure.load_all(tmp_path), FIXES["augment-pusht"])
    assert pts(clean["full attention"]) == 30 and clean["full attention"].seeds == 1
    text = fix_rows([clean, shifted])
    assert text[0][4].startswith("+30 [") and text[0][4].endswith(" points (against 1 seed)")
    assert shifted["condition"] == "camera 2" and text[1][4].endswith(" points (against 1 seed)")
    save(tmp_path, "pusht", cell({}, 15, 3))
    again = studies.measure.fix_table(studies.measure.load_all(tmp_path), FIXES["augment-pusht"])
    assert fix_rows(again)[1][4].endswith(" points")


def test_pushts_recipe_rows_are_its_papers_setting_study_and_cans_are_jittered():
    pusht = [c for c in CLAIMS if c.task == "pusht"]
    # the recipe dropped the jitter on PushT: no claim row asks for a jittered PushT cell
    assert pusht and all(c.study == "pusht" and c.variant == "papers" for c in pusht)
    assert {"gaussian_noise2", "blur2", "colour2", "camera2"} <= {c.setting for c in pusht}
    can_recipe = [c for c in CLAIMS if c.study == "can_recipe"]
    assert can_recipe and all(c.variant == "augment" for c in can_recipe)


def test_each_task_is_evaluated_under_the_scene_shifts_it_renders():
    for study in ("pusht", "pusht_recipe"):
        assert [s.id for s in STUDIES[study].settings if s.id[-1] == "2" and s.id[:-1] in ("lighting", "colour", "camera")] == \
            ["colour2", "camera2"]
    assert {"lighting2", "colour2", "camera2"} <= {s.id for s in STUDIES["can_recipe"].settings}
    rows = [c.setting for c in CLAIMS if c.study == "pusht" and c.claim.startswith("More robust to scene shifts")]
    assert rows and not any(w.startswith("lighting") for w in rows)


def test_a_resnet_row_takes_full_attention_from_the_studies_that_hold_its_cells_counting_each_cell_once(tmp_path):
    resnet = [Record("lift", "bc", "full", 4000, {"policy.encoder": "resnet18", **AUGMENT}, 0, {}, 50, 50)]
    # seeds 0-2 at 80%, recorded by two studies (the same run directories)
    full = [Record("lift", "bc", "full", 4000, AUGMENT, s, {}, 40, 50) for s in range(3)]
    save(tmp_path, "encoders", resnet)
    save(tmp_path, "robustness", full)
    save(tmp_path, "scene_training", full)
    row = next(studies.measure.measure(c, studies.measure.load_all(tmp_path)) for c in CLAIMS
               if (c.arm, c.setting, c.variant) == ("resnet18", "clean", "augment"))
    assert row["n_seeds"] == [1, 3] and pts(row["difference"]) == 20  # 100% against 80%, three seeds, not six


def test_the_adoption_rule_holds_only_a_fix_that_keeps_clean_success_and_every_scene_shift(tmp_path):
    from studies.figures import adoption_figure

    shifts = [{"corruption": [[kind, 2]]} for kind in ("lighting", "colour", "camera")]

    def cell(attention, overrides, clean, under, seeds=3, conditions=shifts):
        return [Record("lift", "bc", attention, 4000, overrides, s, c, k, n) for s in range(seeds)
                for c, k, n in [({}, clean, 50), *((c, k, 30) for c, k in zip(conditions, under))]]

    wrist = {f"+{k}": v for k, v in WRIST.items()}  # as records name a key the recipe lacks: compared canonically
    save(tmp_path, "scene_training", [*cell("full", AUGMENT, 49, (30, 28, 13)),  # the recipe: camera 2 at 43%
                                      *cell("full", {**AUGMENT, **COLOUR}, 50, (30, 29, 12)),  # keeps clean, not the camera
                                      *cell("full", {**AUGMENT, **SHIFT}, 48, (28, 28, 27)),  # 96% clean (-2 points), >= 90%
                                      *cell("fibottention", AUGMENT, 50, (30, 27, 12)),
                                      *cell("fibottention", {**AUGMENT, **SHIFT}, 45, (29, 29, 29)),  # 90% clean: -10 points
                                      *cell("full", {**AUGMENT, **wrist}, 50, (30, 30, 30), seeds=1),
                                      *cell("fibottention", {**AUGMENT, **COLOUR}, 50, (30, 30), conditions=shifts[:2])])
    rows = studies.measure.adoption(studies.measure.load_all(tmp_path))
    verdicts = {(r["fix"], r["encoder"]): r["verdict"] for r in rows}
    assert verdicts == {("random shift", "full"): "holds",
                        ("random shift", "Fibottention"): "does not hold: clean -10 points",
                        ("hue/saturation jitter", "full"): "does not hold: camera 2 40% (< 90%)",
                        ("hue/saturation jitter", "Fibottention"): "not measured under camera 2",
                        ("wrist camera", "full"): "1 seed (fewer than 3)"}
    shift = next(r for r in rows if r["fix"] == "random shift" and r["encoder"] == "full")
    assert shift["success"]["recipe"]["camera 2"].mean == 13 / 30 and shift["success"]["fix"]["clean"].mean == 48 / 50
    table, names = adoption_table(rows)
    assert names == ["lighting 2", "colour 2", "camera 2"] and table[0][4].startswith("96% [") and table[0][5] == "-2"
    adoption_figure(rows, tmp_path / "a.png")
    adoption_figure(rows, tmp_path / "b.png")  # a rerun writes the same bytes (no version stamp)
    assert (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG" and (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
    # a task that renders no light (PushT) is one more panel with fewer bars
    no_light = {**rows[0], "task": "pusht", "success": {side: {k: v for k, v in per.items() if k != "lighting 2"}
                                                         for side, per in rows[0]["success"].items()}}
    adoption_figure([*rows, no_light], tmp_path / "c.png")
    assert len((tmp_path / "c.png").read_bytes()) > len((tmp_path / "a.png").read_bytes())


def test_the_camera_rule_asks_each_tasks_own_least_success_against_the_recipes_clean_run(tmp_path):
    """Lift's camera rule: camera 2 at 90% and camera 3 at 75%; a camera variant's cells (study camera) are set against
    the recipe's (scene_training's jitter cells)."""
    from studies.catalog import CAMERA_FIXES, CAMERA_RULE

    camera = [{"corruption": [["camera", s]]} for s in (2, 3)]

    def cell(attention, overrides, clean, under, seeds=3):
        return [Record("lift", "bc", attention, 4000, overrides, s, c, k, n) for s in range(seeds)
                for c, k, n in [({}, clean, 50), *((c, k, 30) for c, k in zip(camera, under))]]

    affine = {**AUGMENT, **VARIANTS["shift"].overrides, "policy.image_aug.rotate": "3.0", "policy.image_aug.scale": "0.06",
              "policy.image_aug.geometric_p": "0.5"}  # as a run's config gives the numbers back: compared as numbers
    save(tmp_path, "scene_training", [*cell("full", AUGMENT, 49, (14, 13)), *cell("fibottention", AUGMENT, 50, (12, 10))])
    save(tmp_path, "camera", [*cell("full", affine, 49, (27, 23)),  # 90% and 77%: holds
                              *cell("fibottention", affine, 49, (22, 18))])  # 73% and 60%: both under
    rows = studies.measure.adoption(studies.measure.load_all(tmp_path), CAMERA_FIXES, CAMERA_RULE)
    assert {(r["fix"], r["encoder"]): r["verdict"] for r in rows} == {
        ("random shift + affine warp", "full"): "holds",
        ("random shift + affine warp", "Fibottention"): "does not hold: camera 2 73% (< 90%), camera 3 60% (< 75%)"}
    assert rows[0]["least"] == {"camera 2": 0.9, "camera 3": 0.75} and rows[1]["success"]["recipe"]["camera 3"].mean == 10 / 30


def test_no_committed_equivalence_rests_on_two_failing_sides():
    """claims.json holds numbers: every "equivalent" row has both success intervals above the floor, and where both
    lie below it the row reads "both fail" (PushT under contrast x0.5, where every encoder scores 0%)."""
    import json
    from pathlib import Path

    data = json.loads((Path(__file__).resolve().parents[1] / "results" / "claims.json").read_text())
    floor, rows = data["equivalence_floor"], [r for r in data["rows"] if r.get("measure") == "success"]
    equivalent = [r for r in rows if r["kind"].startswith("equivalent")]
    assert equivalent and all(min(r["arm"]["lo"], r["baseline"]["lo"]) > floor for r in equivalent)
    failing = [r for r in rows if r["kind"] == "both fail"]
    assert failing and all(max(r["arm"]["hi"], r["baseline"]["hi"]) < floor for r in failing)
    assert any(r["measurement"].startswith("pusht diffusion, contrast 2") for r in failing)
    assert all(isinstance(r["difference"]["mean"], float) for r in rows if "difference" in r)


def test_each_tasks_blind_floor_deletes_every_camera_its_recipe_reads(tmp_path):
    can_one = {"~task.input_shapes.agentview_image": None}  # the wrist camera still seen: not blind
    can_none = {**can_one, "~task.input_shapes.robot0_eye_in_hand_image": None, "task.dataset.path": "data/can/ph_lowdim.hdf5"}
    save(tmp_path, "floor", [Record("can", "bc", "full", 15000, can_one, 0, {}, 40, 50),
                             *(Record("can", "bc", "full", 15000, can_none, s, {}, 5, 50) for s in range(3)),
                             *(Record("pusht", "diffusion", "full", 15000, {"task.input_shapes.image": "null"}, s, {}, 0, 50) for s in range(3)),
                             Record("pusht", "diffusion", "full", 15000, {"task.input_shapes.image": "null"}, 0,
                                    {"corruption": [["camera", 2]]}, 0, 30)])  # a shifted run is no floor
    found = studies.measure.floors(studies.measure.load_all(tmp_path))
    assert {t: [(r.seed, r.successes) for r in recs] for t, recs in found.items()} == {
        "can": [(0, 5), (1, 5), (2, 5)], "pusht": [(0, 0), (1, 0), (2, 0)]}
