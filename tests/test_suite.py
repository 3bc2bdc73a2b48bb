"""python -m studies.suite: one robustness report per checkpoint (clean + a named suite, matched pairs)."""
import json

import pytest

from studies import suite
from core.training import train
from tests.helpers import run_command, tiny_train_cfg


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_pusht_zarr):
    tmp = tmp_path_factory.mktemp("suite")
    train(tiny_train_cfg(tmp, tiny_pusht_zarr, attention="full"))
    return tmp / "run"


def test_a_suite_writes_the_table_the_plot_and_lerobots_eval_info_and_skips_what_is_done(tiny_run):
    seen = []
    kw = dict(options=suite.SuiteOptions(workers=0, episodes=2, clean_episodes=3, max_steps=2), log=seen.append,
              progress=False)  # pairs on the 2 common seeds
    folder = suite.evaluate_suite(tiny_run, "tiny", **kw)
    assert sorted(p.name for p in folder.iterdir()) == ["brightness1", "clean", "colour1", "eval_info.json", "report.md",
                                                        "report.png"]
    info = json.loads((folder / "eval_info.json").read_text())
    assert set(info) == {"clean", "colour1", "brightness1"}
    episode = info["colour1"]["per_episode"][0]
    assert set(episode) == {"episode_ix", "sum_reward", "max_reward", "success", "seed"} and episode["seed"] == 100000
    assert set(info["clean"]["aggregated"]) == {"pc_success", "avg_max_reward", "eval_s"}
    shifted = json.loads((folder / "colour1" / "summary.json").read_text())
    assert shifted["corruptions"] == [["colour", 1]] and shifted["paired"]["episodes"] == 2
    assert "| colour1 |" in (folder / "report.md").read_text()
    assert (folder / "report.png").read_bytes()[:4] == b"\x89PNG"
    seen.clear()
    suite.evaluate_suite(tiny_run, "tiny", **kw)  # a second run evaluates nothing
    assert seen == ["clean: evaluated already, kept", "colour1: evaluated already, kept", "brightness1: evaluated already, kept"]


def test_the_suite_leaves_out_what_the_task_cannot_render_and_refuses_unknown_suites():
    assert ("lighting", 2) not in suite.settings("standard", "pusht") and ("colour", 2) in suite.settings("standard", "pusht")
    assert ("lighting", 2) in suite.settings("standard", "lift")
    with pytest.raises(ValueError, match="suite='bogus' does not exist; choose one of standard, scene, tiny"):
        suite.settings("bogus", "lift")


def test_a_bad_suite_is_one_line_before_anything_loads(tiny_run):
    out = run_command(["-m", "studies.suite", str(tiny_run), "--suite", "bogus"])
    assert out.returncode != 0
    assert out.stderr.strip() == "python -m studies.suite: error: suite='bogus' does not exist; choose one of standard, scene, tiny"


def test_the_suite_writes_records_and_sets_each_setting_against_the_tasks_blind_floor(tiny_run, tmp_path):
    from studies.records import Record, load, save

    kw = dict(options=suite.SuiteOptions(workers=0, episodes=2, clean_episodes=3, max_steps=2), log=[].append, progress=False)
    folder = suite.evaluate_suite(tiny_run, "tiny", results=tmp_path, **kw)
    records = {json.dumps(r.condition): r for r in load(tmp_path, "suite_tiny")}
    assert set(records) == {"{}", '{"corruption": [["colour", 1]]}', '{"corruption": [["brightness", 1]]}'}
    clean = json.loads((folder / "clean" / "summary.json").read_text())
    assert (records["{}"].successes, records["{}"].episodes, records["{}"].max_steps) == (clean["successes"], 3, 2)
    assert "no camera" not in (folder / "report.md").read_text()  # no floor recorded for pusht yet
    # a blind PushT policy at 20 of 50: a two-step tiny policy is not resolved above it anywhere
    save(tmp_path, "floor", [Record("pusht", "diffusion", "full", 2, {"~task.input_shapes.image": None}, s, {}, 20, 50) for s in range(3)])
    suite.evaluate_suite(tiny_run, "tiny", results=tmp_path, **kw)  # evaluates nothing again, records the same, reports the floor
    report = (folder / "report.md").read_text()
    assert "− no camera (points) [95% CI]" in report
    assert all("✗" in line for line in report.splitlines() if line.startswith(("| clean", "| colour1", "| brightness1")))
    assert len(load(tmp_path, "suite_tiny")) == 3  # recorded once, not twice
