"""Records as typed data: numbers as numbers, the condition and reliance of an evaluation, damaged files named, head diversity measured into records."""
import json

import pytest

from studies.records import Record, condition_text, load, overrides_text, save


def test_a_line_is_typed_data_and_the_tables_render_it(tmp_path):
    record = Record("lift", "bc", "fibottention", 4000, {"+task.input_shapes.x": "[3,84,84]", "~task.input_shapes.y": None,
                                                         "policy.vit.pool": "cls"}, 1,
                    {"corruption": [["contrast", 2], ["blur", 1]], "image_size": 112, "attention": {"w_max": 33, "offset_grid": [10, 10]},
                     "seed_start": 100050}, 7, 30, reliance=0.42)
    assert list(record.overrides) == ["policy.vit.pool", "+task.input_shapes.x", "~task.input_shapes.y"]  # sorted by key
    assert condition_text(record.condition) == "contrast2+blur1 112px offset_grid=[10,10] w_max=33 seed100050"
    assert condition_text(record.condition, " ").startswith("contrast 2+blur 1 ")
    assert overrides_text(record.overrides) == "policy.vit.pool=cls +task.input_shapes.x=[3,84,84] ~task.input_shapes.y"
    save(tmp_path, "s", [record])
    line = json.loads((tmp_path / "s" / "records.jsonl").read_text())
    assert line["reliance"] == 0.42 and line["successes"] == 7 and load(tmp_path, "s") == [record]  # numbers as numbers
    save(tmp_path, "t", [Record("lift", "bc", "full", 4000, {}, 0, {}, 1, 2)])
    assert "reliance" not in (tmp_path / "t" / "records.jsonl").read_text()  # written only where measured


def test_another_inference_option_is_part_of_the_condition():
    """camera_pose=nominal (and any option the identity names beyond shifts, image size and attention settings) keeps two
    evaluations of one shift apart, and the tables name it."""
    from core.run_info import condition_of

    def summary(**inference):
        return {"identity": {"shifts": [["camera", 2]], "inference": inference}, "seed_start": 100000}

    told = condition_of(summary(camera_pose="nominal"))
    assert told == {"corruption": [["camera", 2]], "camera_pose": "nominal"} and condition_of(summary()) == {"corruption": [["camera", 2]]}
    assert condition_text(told) == "camera2 camera_pose=nominal" and condition_text(condition_of(summary())) == "camera2"
    both = {**summary(image_size=112, global_slope=0.75, n_action_steps=4), "image_size": 112, "attention_overrides": {"global_slope": 0.75}}
    assert condition_of(both) == {"corruption": [["camera", 2]], "image_size": 112, "attention": {"global_slope": 0.75}, "n_action_steps": 4}


def test_a_runs_reliance_is_read_for_the_same_weights_only(tmp_path):
    from core.rundir import RunPathError
    from core.run_info import reliance_of

    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "eval" / "vision_reliance.json").write_text(json.dumps({"reliance": 0.05, "weights_sha256": "ab" * 32, "checkpoint_step": 4000}))
    assert reliance_of(run, "ab" * 32) == 0.05 and reliance_of(run, "cd" * 32) is None  # another checkpoint's: nothing
    assert reliance_of(tmp_path / "elsewhere", "ab" * 32) is None  # never measured
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "eval").symlink_to(run / "eval")
    with pytest.raises(RunPathError, match="symbolic link"):
        reliance_of(linked, "ab" * 32)


def test_a_row_whose_policy_ignores_its_images_is_marked_not_looking():
    from studies.pages import NOT_LOOKING, study_table

    rows = [Record("lift", "bc", a, 4000, {}, s, {}, 40, 50, reliance=r) for a, rs in (("full", (0.5, 0.4, None)), ("fibottention", (0.1, 0.05, 0.0)))
            for s, r in enumerate(rs)]
    table = study_table("s", [*rows, Record("lift", "bc", "lookhere", 4000, {}, 0, {}, 40, 50)])
    fib, full, lookhere = (line for line in table.splitlines() if line.startswith("| lift "))
    assert NOT_LOOKING == 0.15 and "reliance under 0.15: the policy does not use its images" in table
    assert " | 0.45 | " in full and " | 0.05 not looking | " in fib and " |  |  |  |" in lookhere  # mean of the seeds measured


def test_a_damaged_line_ends_the_report_in_one_line_naming_the_file_and_the_line(tmp_path, capsys):
    from studies.claims import main

    save(tmp_path, "main", [Record("lift", "bc", "full", 4000, {}, 0, {}, 50, 50)])
    path = tmp_path / "main" / "records.jsonl"
    path.write_text(path.read_text() + '{"task": "lift", "policy": "bc", "attenti\n')  # a write cut short
    with pytest.raises(SystemExit):
        main(["--results", str(tmp_path)])
    err = capsys.readouterr().err
    assert err.startswith(f"python -m studies.claims: error: {path} line 2 is not a record (") and err.count("\n") == 1
    assert err.rstrip().endswith("restore it from version control or delete that line") and "Traceback" not in err


def test_head_diversity_is_measured_from_a_checkpoint_into_records(tmp_path, tiny_pusht_zarr, capsys):
    from core.training import train
    from studies.claims import main as report
    from probes.diversity import main
    from tests.helpers import tiny_train_cfg

    run = train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, "bc", "fibottention")).checkpoint.parents[1]
    results = tmp_path / "results"
    [record] = main([str(run), "--results", str(results), "--frames", "4", "--recipe", "none"])
    assert (record.task, record.policy, record.attention, record.measure, record.condition) == ("pusht", "bc", "fibottention",
                                                                                               "head_diversity", {})
    layers = record.detail["layers"]
    assert len(layers) == 2 and record.value == pytest.approx(sum(layers) / 2) and all(0 <= v <= 1 for v in layers)
    assert load(results, "diversity") == [record] and record.steps == 2 and record.overrides["policy.vit.dim"] == "32"
    capsys.readouterr()
    report(["--results", str(results)])
    table = (results / "diversity" / "table.md").read_text()
    assert f"| pusht | bc | fibottention | 2 |" in table and f"{record.value:.3f} [" in table and "value [95% CI]" in table
    with pytest.raises(SystemExit):
        main([str(tmp_path / "missing"), "--results", str(results)])
    assert "error:" in capsys.readouterr().err and load(results, "diversity") == [record]


def _save_one_by_one(results, first: int, count: int) -> None:
    for seed in range(first, first + count):
        save(results, "s", [Record(task="lift", policy="bc", attention="full", steps=1, overrides={}, seed=seed,
                                   condition={}, successes=1, episodes=1)])


def test_two_study_runs_saving_side_by_side_lose_no_record(tmp_path):
    """Two cells of one study run side by side (the evidence queues do): each merges its records into the same file,
    and neither's read-merge-write may drop the other's lines."""
    import multiprocessing
    per_process = 60
    workers = [multiprocessing.get_context("fork").Process(target=_save_one_by_one, args=(tmp_path, n * per_process, per_process))
               for n in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert [w.exitcode for w in workers] == [0, 0]
    assert sorted(r.seed for r in load(tmp_path, "s")) == list(range(2 * per_process))
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [".records.lock", "records.jsonl"]  # no temporary left
