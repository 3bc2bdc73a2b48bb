"""The reliability round (issue 30): nothing the package did not write is deleted, every mismatch is
refused before work starts, every damaged file is named, Ctrl-C ends in one line."""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from core import evaluation
from core.cli import INTERRUPTED_EXIT
from core.training import train
from datasets.describe import main as describe_main
from datasets.factory import make_dataset
from datasets.generate import generate
from datasets.robomimic_hdf5 import TASK_ENV_NAMES, read_robomimic_hdf5, write_robomimic_hdf5
from datasets.zarr_replay import read_pusht_zarr, write_pusht_zarr
from envs.factory import ctrl_c_deferred, worker_context
from tests.helpers import REPO, TINY_POLICY, compose, pusht_episodes, run_command, tiny_train_cfg
from tests.sigint_probe import report_sigint_ignored

LIFT_OBS = {"agentview_image": (84, 84, 3), "robot0_eye_in_hand_image": (84, 84, 3), "robot0_eef_pos": (3,),
            "robot0_eef_quat": (4,), "robot0_gripper_qpos": (2,)}  # configs/task/lift.yaml


def _lift_file(path, env_name="Lift", drop=(), lengths=(6, 5)):
    rng = np.random.default_rng(0)
    episodes = []
    for n in lengths:
        obs = {k: (rng.integers(0, 256, (n, *s), dtype=np.uint8) if len(s) == 3 else rng.normal(size=(n, *s)).astype(np.float32))
               for k, s in LIFT_OBS.items() if k not in drop}
        episodes.append({"actions": rng.uniform(-1, 1, (n, 7)).astype(np.float32), "states": rng.normal(size=(n, 8)),
                         "rewards": np.zeros(n), "dones": np.r_[np.zeros(n - 1, np.int64), 1], "obs": obs,
                         "next_obs": obs, "model_file": "<mujoco/>"})
    write_robomimic_hdf5(path, episodes, {"env_name": env_name, "env_version": "1.5.2", "type": 1, "env_kwargs": {}})
    return path


def _lift_task(path, *extra):
    return compose(["task=lift", "policy=bc", "recipe=none", f"task.dataset.path={path}", *extra]).task


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


# --- overwrite=true deletes only a run, and only after the new run is checked ------------------------------
def test_overwrite_refuses_a_folder_that_is_not_a_run(tmp_path, tiny_pusht_zarr):
    data = _copy(tiny_pusht_zarr, tmp_path / "X" / "data.zarr")  # the training data inside run_dir
    cfg = tiny_train_cfg(tmp_path, data, policy="bc", extra=[f"run_dir={tmp_path / 'X'}", "overwrite=true"])
    with pytest.raises(FileExistsError, match=r"X is a folder holding data.zarr/, not a run of train_policy.py"):
        train(cfg)
    assert read_pusht_zarr(data).num_episodes == 3  # untouched
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holding a.txt, not a run"):
        train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, policy="bc", extra=[f"run_dir={notes}", "overwrite=true"]))
    assert (notes / "a.txt").read_text() == "mine" and sorted(p.name for p in notes.iterdir()) == ["a.txt"]


def test_overwrite_deletes_the_old_run_only_after_the_new_one_is_checked(tmp_path, tiny_pusht_zarr):
    train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, policy="bc", extra=["train.steps=4"]))
    run = tmp_path / "run"
    (run / "notes.txt").write_text("mine")  # the user's file beside the run
    with pytest.raises(FileNotFoundError, match="typo.zarr does not exist"):
        train(tiny_train_cfg(tmp_path, tmp_path / "typo.zarr", policy="bc", extra=["overwrite=true"]))
    assert (run / "checkpoints" / "step_0000004").is_dir()  # the finished run is still there
    with pytest.raises(ValueError, match="train.steps must be >= 1"):
        train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, policy="bc", extra=["overwrite=true", "train.steps=0"]))
    assert (run / "checkpoints" / "step_0000004").is_dir()
    train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, policy="bc", extra=["overwrite=true"]))
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last", "step_0000002"]
    assert (run / "notes.txt").read_text() == "mine"  # only what a run writes was deleted
    assert json.loads((run / ".run").read_text())["written_by"] == "train_policy.py"


def test_a_run_from_before_the_marker_still_counts_as_a_run(tmp_path, tiny_pusht_zarr):
    train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, policy="bc", extra=["train.steps=4"]))
    (tmp_path / "run" / ".run").unlink()  # as written before the marker existed: checkpoints/ + config.json
    train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, policy="bc", extra=["overwrite=true"]))
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["last", "step_0000002"]


def test_a_failed_fresh_run_leaves_no_folder(tmp_path):
    with pytest.raises(FileNotFoundError):
        train(tiny_train_cfg(tmp_path, tmp_path / "typo.zarr", policy="bc"))
    assert not (tmp_path / "run").exists()


def test_run_dir_that_is_a_file_is_refused(tmp_path, tiny_pusht_zarr):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(FileExistsError, match=r"run_dir=.*afile is a file \(1 bytes\), not a folder"):
        train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, policy="bc", extra=[f"run_dir={tmp_path / 'afile'}"]))
    with pytest.raises(FileExistsError, match=r"cannot be created: .*afile is a file"):
        train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, policy="bc", extra=[f"run_dir={tmp_path / 'afile' / 'sub'}"]))


def _without_dac(cmd: list[str]) -> list[str]:
    """Root ignores file permissions: drop the capability (as the issue's probes do)."""
    if os.geteuid() != 0:
        return cmd
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: a read-only folder cannot be tested")
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}", *cmd]


def test_read_only_run_dir_parent_is_one_line(tmp_path, tiny_pusht_zarr):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    args = ["train_policy.py", "task=pusht", "policy=bc", "recipe=none", f"task.dataset.path={tiny_pusht_zarr}",
            f"run_dir={ro / 'run'}", "train.steps=1", *TINY_POLICY]
    proc = subprocess.run(_without_dac([sys.executable, *args]), cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (f"train_policy.py: error: run_dir={ro / 'run'} cannot be written: {ro} "
                                                    f"is read-only for this user; make it writable or choose another run_dir=")
    assert "Traceback" not in proc.stderr and list(ro.iterdir()) == []


# --- generate_demos.py overwrite=true replaces only a dataset ------------------------------------------------
def test_generate_overwrite_replaces_only_a_dataset(tmp_path, tiny_pusht_zarr):
    train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, policy="bc"))
    with pytest.raises(FileExistsError, match=r"out=.*run is a folder holding .run, checkpoints/, config.json, environment.json, tb/, not a PushT zarr"):
        generate("pusht", 1, tmp_path / "run", overwrite=True, progress=False)
    assert (tmp_path / "run" / "checkpoints" / "last").is_dir()
    lift_out = _lift_file(tmp_path / "lift.hdf5")
    with pytest.raises(FileExistsError, match="not a PushT zarr replay buffer"):
        generate("pusht", 1, lift_out, overwrite=True, progress=False)
    with pytest.raises(FileExistsError, match="not a robomimic hdf5 file"):
        generate("lift", 1, tmp_path / "run", overwrite=True, progress=False)
    data = _copy(tiny_pusht_zarr, tmp_path / "data.zarr")  # a dataset generate did not write is kept
    with pytest.raises(FileExistsError, match=r"not a dataset written by generate_demos.py \(no .generate marker"):
        generate("pusht", 1, data, overwrite=True, progress=False, max_attempts=5)
    assert read_pusht_zarr(data).num_episodes == 3
    generated = tmp_path / "generated.zarr"  # a dataset generate wrote is replaced
    generate("pusht", 1, generated, progress=False, max_attempts=5)
    report = generate("pusht", 1, generated, seed=7, overwrite=True, progress=False, max_attempts=5)
    assert report["episodes"] == 1 and read_pusht_zarr(generated).meta["seeds"] == [7]  # the new episode


def test_generate_refuses_an_out_it_cannot_write_before_any_episode(tmp_path, monkeypatch):
    import datasets.generate as gen

    monkeypatch.setattr(gen, "_collect", lambda job: pytest.fail("an episode ran"))
    (tmp_path / "afile").write_text("x")
    with pytest.raises(FileExistsError, match=r"out=.*afile/d.zarr cannot be created: .*afile is a file"):
        generate("pusht", 1, tmp_path / "afile" / "d.zarr", progress=False)


# --- resume fingerprints the data ------------------------------------------------------------------------
def test_resume_refuses_changed_data_naming_what_changed(tmp_path, tiny_pusht_zarr, capsys):
    data = _copy(tiny_pusht_zarr, tmp_path / "data.zarr")
    train(tiny_train_cfg(tmp_path, data, policy="bc"))
    resume = ["resume=true", "train.steps=3"]
    shutil.rmtree(data)
    write_pusht_zarr(data, pusht_episodes((14, 10, 12, 11)))  # the same path, one episode more
    with pytest.raises(ValueError, match=r"cannot resume .*last: the dataset .*data.zarr changed since it was written "
                                         r"\(episodes 3 -> 4, frames 36 -> 47\)"):
        train(tiny_train_cfg(tmp_path, data, policy="bc", extra=resume))
    episodes = pusht_episodes((14, 10, 12))
    episodes[1]["action"][3] += 1.0  # the same episodes, one action changed
    write_pusht_zarr(data, episodes, overwrite=True)
    with pytest.raises(ValueError, match=r"changed since it was written \(the contents of 'action'\)"):
        train(tiny_train_cfg(tmp_path, data, policy="bc", extra=resume))
    write_pusht_zarr(data, pusht_episodes((14, 10, 12)), overwrite=True)  # the data it trained on, rewritten
    assert train(tiny_train_cfg(tmp_path, data, policy="bc", extra=resume)).step == 3


def test_a_checkpoint_without_a_fingerprint_resumes_with_a_note(tmp_path, tiny_pusht_zarr, capsys):
    train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, policy="bc"))
    state_path = tmp_path / "run" / "checkpoints" / "last" / "training_state.json"
    skeleton = json.loads(state_path.read_text())
    del skeleton["__dict__"]["data_fingerprint"]  # as written before fingerprints
    state_path.write_text(json.dumps(skeleton))
    assert train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, policy="bc", extra=["resume=true", "train.steps=3"])).step == 3
    assert "records no data fingerprint" in capsys.readouterr().out


# --- data of another task, a camera no demo has -----------------------------------------------------------
def test_a_robomimic_file_of_another_task_is_refused(tmp_path):
    can = _lift_file(tmp_path / "can.hdf5", env_name="PickPlaceCan")
    with pytest.raises(ValueError, match=r"can.hdf5 was recorded in PickPlaceCan \(data.attrs env_args.env_name\), but "
                                         r"task=lift runs Lift; pass task=can, or the Lift dataset with task.dataset.path="):
        make_dataset(_lift_task(can))
    assert make_dataset(_lift_task(_lift_file(tmp_path / "lift.hdf5"))).num_episodes == 2


def test_task_env_names_match_the_environments():
    from envs.robosuite_tasks import TASK_TO_ENV_NAME

    assert TASK_ENV_NAMES == TASK_TO_ENV_NAME


def test_a_camera_missing_from_every_demo_names_the_fix(tmp_path):
    path = _lift_file(tmp_path / "lift.hdf5", drop=("robot0_eye_in_hand_image",))
    with pytest.raises(ValueError, match=r"\['robot0_eye_in_hand_image'\] not present.*drop it from the task with "
                                         r"task.input_shapes.robot0_eye_in_hand_image=null$"):
        make_dataset(_lift_task(path))
    task = _lift_task(path, "task.input_shapes.robot0_eye_in_hand_image=null")
    assert "robot0_eye_in_hand_image" not in make_dataset(task).data


def test_the_missing_dataset_hint_writes_what_the_recipe_reads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the recipe's relative path does not exist here
    task = compose(["task=pusht", "policy=diffusion"]).task  # recipe=cpu, the default
    assert task.dataset.path == "data/pusht/demos1000.zarr"
    with pytest.raises(FileNotFoundError, match=r"generate it with: python generate_demos.py task=pusht "
                                                r"num_episodes=1000 out=data/pusht/demos1000.zarr$"):
        make_dataset(task)


# --- composition ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("config, overrides, message", [
    ("config", ["+train.stepz=5"], "unknown key train.stepz (given with or without +): train has no such setting; "
                                   "did you mean train.steps?"),
    ("config", ["+foo=1"], "unknown key foo (given with or without +): the config has no such setting"),
    ("config", ["+policy.vit.dimm=3"], "did you mean policy.vit.dim?"),
    ("rollout", ["checkpoint=x", "+foo=1"], "unknown key foo"),
    ("generate", ["task=pusht", "+num_episodez=3"], "did you mean num_episodes?"),
    ("rollout", ["checkpoint=x", "task=lift"], "task= cannot be chosen at rollout: the checkpoint fixes the task"),
    ("config", ["attention=full", "attention.impl=sparse"], "attention.impl=sparse: full attention has no sparse path"),
    ("config", ["attention=bigbird", "attention.impl=sparse"], "bigbird attention has no sparse path"),
])
def test_composition_refuses_in_one_line(config, overrides, message):
    with pytest.raises(ValueError) as e:
        compose(overrides, config)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("command, message", [
    (["train_policy.py", "task=bogus"], "train_policy.py: error: In 'config': Could not find 'task/bogus'; "
                                        "Available options in 'task': can, lift, pusht"),
    (["train_policy.py", "trian.steps=3"], "Could not override 'trian.steps'; To append to your config use +trian.steps=3; "
                                           "Key 'trian' not in 'TrainRunConfig'"),
    (["rollout.py", "checkpoint=x", "num_episodes=abc"], "rollout.py: error: Error merging override num_episodes=abc; "
                                                        "Value 'abc' of type 'str' could not be converted to Integer"),
    (["generate_demos.py", "task=lift", "policy=bc"], "generate_demos.py: error: Could not override 'policy'"),
])
def test_a_command_line_hydra_refuses_ends_in_one_line(command, message):
    """Hydra prints a bad group option, key or type over several lines and a HYDRA_FULL_ERROR hint;
    the entry points compose first and say it in one line."""
    proc = run_command(command, timeout=120)
    assert proc.returncode == 1 and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_sparse_is_recorded_only_where_it_runs():
    for kind in ("fibottention", "lookhere"):  # the kinds whose sparse path exists
        assert compose([f"attention={kind}", "attention.impl=sparse"]).attention.impl == "sparse"
    assert compose(["+task.input_shapes.extra=[2]"]).task.input_shapes["extra"] == [2]  # a dict takes new keys


# --- damaged files ----------------------------------------------------------------------------------------
def test_a_damaged_zarr_chunk_names_file_key_chunk_and_episode(tmp_path, capsys):
    path = tmp_path / "d.zarr"
    write_pusht_zarr(path, pusht_episodes((14, 10, 12)))
    os.truncate(path / "data" / "img" / "0.0.0.0", 1000)
    expected = (f"{path}: data/img (chunk file data/img/0.0.0.0: frames 0-35, episodes 0-2) cannot be read, the file is "
                f"damaged (")
    with pytest.raises(ValueError) as e:
        read_pusht_zarr(path)
    assert str(e.value).startswith(expected) and str(e.value).endswith("regenerate it or restore it from a copy")
    with pytest.raises(ValueError, match="data/img/0.0.0.0"):
        train(tiny_train_cfg(tmp_path, path, policy="bc"))
    assert describe_main([str(path)]) == 1
    assert f"  INVALID: {expected}" in capsys.readouterr().out


def test_a_damaged_hdf5_chunk_names_file_key_and_episode(tmp_path, capsys):
    path = _lift_file(tmp_path / "lift.hdf5")
    with h5py.File(path, "r") as f:
        info = f["data/demo_1/obs/agentview_image"].id.get_chunk_info(0)  # a gzip chunk of episode 1
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + info.size // 2)
        fh.write(b"\xff" * 64)
    with pytest.raises(ValueError) as e:
        read_robomimic_hdf5(path)
    message = str(e.value)
    assert message.startswith(f"{path}: data/demo_1/obs/agentview_image (episode 1) cannot be read, the file is damaged (OSError")
    assert "\n" not in message
    with pytest.raises(ValueError, match=r"data/demo_1/obs/agentview_image \(episode 1\)"):
        make_dataset(_lift_task(path))
    assert describe_main([str(path)]) == 1
    assert f"INVALID: {path}: data/demo_1/obs/agentview_image (episode 1) cannot be read" in capsys.readouterr().out


# --- rollout.py checks its out_dir before any episode -------------------------------------------------------
def test_rollout_out_dir_that_is_a_file_is_refused_before_the_policy_loads(tmp_path, tiny_pusht_zarr, monkeypatch):
    ckpt = train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, policy="bc")).checkpoint
    monkeypatch.setattr(evaluation, "load_policy", lambda *a, **k: pytest.fail("the policy loaded"))
    (tmp_path / "afile").write_text("x")
    with pytest.raises(FileExistsError, match=r"out_dir=.*afile is a file \(1 bytes\), not a folder; choose another out_dir="):
        evaluation.run(compose([f"checkpoint={ckpt}", f"out_dir={tmp_path / 'afile'}", "num_episodes=1"], "rollout"))


# --- Ctrl-C: one line, saying what was written ----------------------------------------------------------
EXIT_AFTER_CTRL_C_S = 120  # generous: the commands exit within seconds, on a loaded machine too


def _interrupt(args: list[str], ready, limit: float = 240.0) -> subprocess.CompletedProcess:
    """Start a command in a session of its own, wait until ``ready(pid)``, SIGINT its process group (what
    Ctrl-C in a terminal does), and return how it ended."""
    # faulthandler: a command that hangs after the Ctrl-C prints every thread's stack when SIGABRT ends it
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    chunks: list[str] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: proc.stdout.read(64), "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + limit
    while not ready(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "".join(chunks)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=EXIT_AFTER_CTRL_C_S)
    except subprocess.TimeoutExpired:
        children = _spawned_children(proc.pid)
        os.killpg(proc.pid, signal.SIGABRT)  # the stacks of the hang, then the test fails with them
        proc.wait(timeout=30)
        reader.join(timeout=10)
        pytest.fail(f"{args[0]} still ran {EXIT_AFTER_CTRL_C_S} s after Ctrl-C (spawned children then: {children}); "
                    f"its output and stacks:\n{''.join(chunks)[-20000:]}")
    reader.join(timeout=10)
    return subprocess.CompletedProcess(args, proc.returncode, "".join(chunks), "")


def _last_line(out: str) -> str:
    return [line for line in out.replace("\r", "\n").splitlines() if line.strip()][-1]


@pytest.mark.timeout(600)
def test_ctrl_c_in_training_is_one_line_naming_the_checkpoint(tmp_path, tiny_pusht_zarr):
    run = tmp_path / "run"
    args = ["train_policy.py", "task=pusht", "policy=bc", "recipe=none", f"task.dataset.path={tiny_pusht_zarr}",
            f"run_dir={run}", "train.steps=100000", "train.checkpoint_every=1", "train.batch_size=4",
            "train.val_fraction=0.34", "train.num_threads=1", *TINY_POLICY]
    proc = _interrupt(args, lambda _: (run / "checkpoints" / "step_0000002").exists())
    assert proc.returncode == INTERRUPTED_EXIT and "Traceback" not in proc.stdout
    assert _last_line(proc.stdout).startswith(f"train_policy.py: interrupted; the newest checkpoint is {run}/checkpoints/")
    assert _last_line(proc.stdout).endswith(": resume=true continues from it")


@pytest.mark.timeout(600)
def test_ctrl_c_in_a_rollout_is_one_line_saying_what_was_written(tmp_path, tiny_pusht_zarr):
    ckpt = train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, policy="bc")).checkpoint
    out = tmp_path / "eval"
    args = ["rollout.py", f"checkpoint={ckpt}", f"out_dir={out}", "num_episodes=100000", "max_steps=3", "workers=1",
            "num_videos=1", "device=cpu"]
    # the first video is filmed into the evaluation's temporary folder: an interrupted evaluation leaves none of it
    proc = _interrupt(args, lambda _: any(out.glob(".videos.*.tmp/episode_100000.mp4")))
    assert proc.returncode == INTERRUPTED_EXIT and "Traceback" not in proc.stdout, proc.stdout
    assert _last_line(proc.stdout) == "rollout.py: interrupted; nothing was written"
    assert not (out / "summary.json").exists() and not list(out.rglob("*.mp4"))


@pytest.mark.timeout(600)
def test_ctrl_c_in_generation_is_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "g.zarr"
    args = ["generate_demos.py", "task=pusht", "num_episodes=1000", f"out={out}", "workers=2"]
    # as soon as the pool's workers exist, while they still import torch: a Ctrl-C then killed them with a
    # traceback each
    proc = _interrupt(args, lambda pid: len(_spawned_children(pid)) == 2)
    assert proc.returncode == INTERRUPTED_EXIT and "Traceback" not in proc.stdout, proc.stdout
    assert _last_line(proc.stdout) == "generate_demos.py: interrupted; nothing was written"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(600)
def test_ctrl_c_while_rollout_workers_start_is_one_line_and_stops_them(tmp_path, tiny_pusht_zarr):
    ckpt = train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, policy="bc")).checkpoint
    out, workers = tmp_path / "eval", []
    args = ["rollout.py", f"checkpoint={ckpt}", f"out_dir={out}", "num_episodes=4", "workers=2", "device=cpu"]
    proc = _interrupt(args, lambda pid: len(found := _spawned_children(pid)) == 2 and not workers.extend(found))
    assert proc.returncode == INTERRUPTED_EXIT and "Traceback" not in proc.stdout, proc.stdout
    assert _last_line(proc.stdout) == "rollout.py: interrupted; nothing was written"
    assert len(workers) == 2 and not [w for w in workers if Path(f"/proc/{w}").exists()]  # none outlives it
    assert not out.exists()


def test_a_command_that_hangs_after_ctrl_c_fails_its_test_with_its_stacks(monkeypatch):
    # a rare hang of these tests on a loaded machine left nothing to read but a TimeoutExpired
    monkeypatch.setattr(sys.modules[__name__], "EXIT_AFTER_CTRL_C_S", 2)
    deaf = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(600)"
    with pytest.raises(pytest.fail.Exception) as failure:
        _interrupt(["-c", deaf], _holds_back_sigint)
    assert "-c still ran 2 s after Ctrl-C" in str(failure.value)
    assert "Current thread" in str(failure.value) and 'File "<string>", line 1' in str(failure.value)


@pytest.mark.parametrize("args", [["train_policy.py", "task=lift"], ["rollout.py", "checkpoint=/nonexistent"],
                                  ["generate_demos.py", "task=pusht", "out=/nonexistent/g.zarr"]])
def test_ctrl_c_while_a_command_still_imports_is_one_line(args):
    # as soon as it loads its first compiled library (numpy's, torch's: seconds of imports follow), which
    # only the entry script's imports do: Python's own traceback before. Earlier, while Python itself
    # starts, no code of ours has run yet
    proc = _interrupt(args, _loads_site_packages_library)
    assert proc.returncode == INTERRUPTED_EXIT, proc.stdout
    assert proc.stdout.strip() == f"{args[0]}: interrupted; nothing was written"


def _spawned_children(parent: int) -> list[int]:
    """The multiprocessing-spawned children of process ``parent``."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            if int(status.read_text().split("PPid:")[1].split()[0]) == parent and \
                    b"spawn_main" in (status.parent / "cmdline").read_bytes():
                found.append(int(status.parent.name))
        except (OSError, IndexError, ValueError):  # a process that ended while we read
            continue
    return found


def _holds_back_sigint(pid: int) -> bool:
    """Whether process ``pid`` blocks or ignores SIGINT now (its SigBlk and SigIgn masks, from /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(status.split("SigBlk:")[1].split()[0], 16) | int(status.split("SigIgn:")[1].split()[0], 16)
    return bool(mask >> (signal.SIGINT - 1) & 1)


def _loads_site_packages_library(pid: int) -> bool:
    return any("site-packages" in line and ".so" in line for line in open(f"/proc/{pid}/maps"))


def test_a_ctrl_c_while_workers_start_is_held_until_they_all_have():
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        reached = []
        with pytest.raises(KeyboardInterrupt):
            with ctrl_c_deferred():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)  # a signal is handled between bytecodes: here, had it not been held
                reached.append("end of block")
        assert reached == ["end of block"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job ignores Ctrl-C: it stays ignored
        with ctrl_c_deferred():
            os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def _start_and_report(ctx) -> tuple[bool, bool]:
    """(a child of ``ctx`` holds SIGINT back right after its launch, while it still imports; it ignores
    SIGINT once its own code runs)."""
    queue = ctx.SimpleQueue()
    child = ctx.Process(target=report_sigint_ignored, args=(queue,))
    child.start()
    at_launch = _holds_back_sigint(child.pid)
    in_code = queue.get()
    child.join()
    return at_launch, in_code


def test_workers_hold_ctrl_c_back_from_their_first_instruction_and_the_parent_loses_none(monkeypatch):
    import multiprocessing as mp

    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (a background job ignores it)
    try:
        assert _start_and_report(worker_context()) == (True, True)
        assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # this thread: as it was
        assert _start_and_report(mp.get_context("spawn")) == (False, False)  # plain spawn: Ctrl-C as usual
        seen = []  # launched from another thread: the same
        launcher = threading.Thread(target=lambda: seen.append(_start_and_report(worker_context())))
        launcher.start()
        launcher.join()
        assert seen == [(True, True)]
        # a Ctrl-C in the middle of a launch reaches this process after it (ignored during launches, it was lost)
        launch = mp.context.SpawnProcess._Popen

        def interrupted_launch(process_obj):
            os.kill(os.getpid(), signal.SIGINT)
            return launch(process_obj)

        monkeypatch.setattr(mp.context.SpawnProcess, "_Popen", staticmethod(interrupted_launch))
        child = worker_context().Process(target=time.sleep, args=(0,))
        with pytest.raises(KeyboardInterrupt), ctrl_c_deferred():  # as where the package starts workers
            child.start()
        child.join()
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_worker_that_cannot_start_takes_the_started_ones_with_it(monkeypatch):
    """The second launch fails (e.g. no memory for a process): the first worker, already running, is killed."""
    from envs import factory

    started, killed = [], []

    class Launch:
        def __init__(self, task, kwargs, ctx):
            if started:
                raise OSError("[Errno 12] Cannot allocate memory")
            started.append(self)

        def kill(self):
            killed.append(self)

    monkeypatch.setattr(factory, "WorkerEnv", Launch)
    with pytest.raises(OSError, match="Cannot allocate memory"):
        factory.EnvPool("pusht", {}, workers=3)
    assert len(started) == 1 and killed == started


def test_the_first_worker_of_a_process_holds_ctrl_c_back_too():
    """The first launch also starts multiprocessing's resource tracker, whose start unblocks SIGINT in the
    launching thread: in a fresh process, the first worker must still hold Ctrl-C back from its launch."""
    code = "import time; from tests.test_reliability import _holds_back_sigint; from envs.factory import worker_context; " \
           "child = worker_context().Process(target=time.sleep, args=(30,)); child.start(); " \
           "print(_holds_back_sigint(child.pid)); child.kill()"  # no queue or lock first: they start the tracker
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1:] == ["True"], out.stdout + out.stderr
