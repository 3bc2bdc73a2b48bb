"""The benchmarks' own arithmetic (never their timings): the auto-threshold rule and the pairs bound."""
import json

import pytest

from benchmarks.attention import visible_fraction
from benchmarks.calibrate_auto import main as calibrate_main
from benchmarks.calibrate_auto import threshold


def rows(times: dict[str, dict[int, float]]) -> list[dict]:
    return [{"impl": impl, "N": n, "fwdbwd_ms": t} for impl, by_n in times.items() for n, t in by_n.items()]


def test_the_threshold_is_where_sparse_starts_winning_for_good():
    measured = rows({"d": {81: 1.0, 256: 2.0, 1024: 8.0, 4096: 40.0}, "s": {81: 2.0, 256: 1.5, 1024: 9.0, 4096: 10.0}})
    start, ratios = threshold(measured, "d", "s")
    assert start == 4096  # wins at 256 too, but loses again at 1024: only from 4096 on for good
    assert [round(r["dense_over_sparse"], 2) for r in ratios] == [0.5, 1.33, 0.89, 4.0]
    assert threshold(rows({"d": {81: 1.0}, "s": {81: 3.0}}), "d", "s")[0] is None  # never wins: keep dense


def test_calibration_reads_a_benchmark_file_and_refuses_another(tmp_path, capsys):
    bench = {"metadata": {"device": "cuda", "dtype": "float32"},
             "results": rows({"lookhere-dense": {256: 4.0, 1024: 40.0}, "lookhere-efficient": {256: 5.0, 1024: 20.0}})}
    (tmp_path / "b.json").write_text(json.dumps(bench))
    calibrate_main([str(tmp_path / "b.json"), "--json", str(tmp_path / "auto.json")])
    assert json.loads((tmp_path / "auto.json").read_text())[str(tmp_path / "b.json")]["lookhere"]["min_tokens"] == 1024
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(SystemExit):
        calibrate_main([str(tmp_path / "bad.json")])
    assert "is not an attention benchmark's JSON" in capsys.readouterr().err


def test_visible_pairs_count_what_the_masks_let_through():
    assert visible_fraction("full", 8, (9, 9), False) == 1.0
    # LH-90 with 8 heads: 3 undirected heads see all 81 x 81 pairs, 5 directed heads about a quarter
    lh = visible_fraction("lookhere-dense", 8, (9, 9), False)
    assert 3 / 8 + 5 / 8 * 0.25 < lh < 3 / 8 + 5 / 8 * 0.35
    assert visible_fraction("lookhere45-dense", 8, (9, 9), False) < lh


def test_the_encoder_benchmark_builds_each_tasks_recipe_policy_with_only_the_encoder_changed(tmp_path):
    from benchmarks.encoder_speed import main

    main(["--task", "pusht", "--encoders", "resnet18", "vit full", "--rounds", "1", "--warmup", "0", "--latency-calls", "1",
          "--batch-size", "2", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "pusht_cpu_1thread.json").read_text())
    assert (report["meta"]["task"], report["meta"]["policy"], report["meta"]["recipe"]) == ("pusht", "diffusion", "cpu")
    resnet, vit = report["results"]
    # the recipe's whole 96-px frame reaches both; torchvision's ResNet-18 trunk is 11.2M parameters, the ViT 0.29M
    assert resnet["crop_size"] == vit["crop_size"] == 96 and resnet["input_shapes"] == vit["input_shapes"]
    assert round(resnet["encoder_params_M"], 1) == 11.2 and vit["encoder_params_M"] < 0.5
    assert len(resnet["train_step_s_all"]) == 1
