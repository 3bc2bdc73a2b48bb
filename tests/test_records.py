"""Records as typed data: old lines read through one upgrade, damaged files named, head diversity measured into records."""
import json

import pytest

from studies.records import Record, condition_text, load, overrides_text, save


def test_an_old_line_is_read_through_the_upgrade_and_written_back_typed(tmp_path):
    old = dict(task="lift", policy="bc", attention="fibottention", steps=4000, seed=1, successes=7, episodes=30, coverage=None,
               train_seconds=None, commit="abc", extra="policy.vit.pool=cls +task.input_shapes.x=[3,84,84] ~task.input_shapes.y",
               condition="contrast2+blur1 112px offset_grid=[10,10] w_max=33 seed100050")
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "records.jsonl").write_text(json.dumps(old) + "\n")
    [record] = load(tmp_path, "s")
    assert record.overrides == {"policy.vit.pool": "cls", "+task.input_shapes.x": "[3,84,84]", "~task.input_shapes.y": None}
    assert list(record.overrides) == ["policy.vit.pool", "+task.input_shapes.x", "~task.input_shapes.y"]  # sorted by key
    assert record.condition == {"corruption": [["contrast", 2], ["blur", 1]], "image_size": 112,
                                "attention": {"offset_grid": [10, 10], "w_max": 33}, "seed_start": 100050}
    # the tables name them as before
    assert condition_text(record.condition) == old["condition"] and condition_text(record.condition, " ") .startswith("contrast 2+blur 1 ")
    assert overrides_text(record.overrides) == "policy.vit.pool=cls +task.input_shapes.x=[3,84,84] ~task.input_shapes.y"
    save(tmp_path, "s", [])  # rewritten in today's form, read back the same
    line = json.loads((tmp_path / "s" / "records.jsonl").read_text())
    assert "extra" not in line and line["overrides"] == record.overrides and load(tmp_path, "s") == [record]


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
