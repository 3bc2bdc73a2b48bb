"""LeRobotDataset v3.0 in and out: datasets.lerobot (reader), datasets.export (writer; export_dataset.py), checked
against lerobot's own reader and writer (``ledataset``) where it is installed."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from fractions import Fraction

import numpy as np
import pytest

from core.config import load_task
from datasets.describe import describe
from datasets.episodes import EpisodeData
from datasets.export import ExportConfig, export
from datasets.factory import guess_format, make_dataset, read_dataset
from datasets.lerobot import read_lerobot
from datasets.robomimic_hdf5 import write_robomimic_hdf5
from datasets.zarr_replay import write_pusht_zarr
from tests.helpers import run_command, tiny_train_cfg

av = pytest.importorskip("av")
pytest.importorskip("pyarrow")
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

PUSHT = {"image": "observation.image", "agent_pos": "observation.state", "action": "action"}
LENGTHS = (12, 9, 7)
FPS = 10
MAX_MEAN_PIXEL_ERROR = 4.0  # lossy video (AV1/H.264, crf 30) against the uint8 source, on smooth images


def _smooth_images(rng, n, size=96):
    """Moving blobs on a gradient: images a video codec keeps close (random noise it cannot)."""
    yy, xx = np.mgrid[0:size, 0:size]
    frames = np.empty((n, size, size, 3), np.uint8)
    cx, cy = rng.uniform(20, 76, 2)
    for t in range(n):
        blob = ((xx - cx - 2 * t) ** 2 + (yy - cy) ** 2) < 150
        frames[t, ..., 0] = (xx * 2).astype(np.uint8)
        frames[t, ..., 1] = np.where(blob, 230, 40)
        frames[t, ..., 2] = (yy * 2).astype(np.uint8)
    return frames


def _pusht_episodes(lengths=LENGTHS, seed=0):
    rng = np.random.default_rng(seed)
    return [dict(img=_smooth_images(rng, n), state=rng.uniform(0, 512, (n, 5)).astype(np.float32),
                 action=rng.uniform(0, 512, (n, 2)).astype(np.float32),
                 keypoint=rng.uniform(0, 512, (n, 9, 2)).astype(np.float32), n_contacts=np.zeros((n, 1), np.float32))
            for n in lengths]


@pytest.fixture(scope="module")
def pusht_zarr(tmp_path_factory):
    path = tmp_path_factory.mktemp("src") / "pusht.zarr"
    write_pusht_zarr(path, _pusht_episodes(), attrs={"task": "pusht"})
    return path


@pytest.fixture(scope="module")
def exported(pusht_zarr, tmp_path_factory):
    out = tmp_path_factory.mktemp("le") / "pusht_lerobot"
    export(ExportConfig(src=str(pusht_zarr), out=str(out)), load_task)
    return out


def _assert_same(data: EpisodeData, source: EpisodeData, keys=("agent_pos", "action")):
    np.testing.assert_array_equal(data.episode_ends, source.episode_ends)
    for k in keys:
        np.testing.assert_array_equal(data.data[k], source.data[k])
    err = np.abs(data.data["image"].astype(np.int16) - source.data["image"].astype(np.int16))
    assert err.mean() < MAX_MEAN_PIXEL_ERROR, f"decoded frames differ by {err.mean():.2f} on average"


# --------------------------------------------------------------------------------------- export + read
@pytest.mark.parametrize("codec", ["av1", "h264"])
def test_export_reads_back_equal(pusht_zarr, tmp_path, codec):
    out = tmp_path / "le"
    report = export(ExportConfig(src=str(pusht_zarr), out=str(out), codec=codec), load_task)
    assert report["episodes"] == len(LENGTHS) and report["frames"] == sum(LENGTHS) and report["fps"] == FPS
    assert guess_format(out) == "lerobot"
    info = json.loads((out / "meta/info.json").read_text())
    assert info["features"]["observation.image"]["info"]["video.codec"] == codec
    _assert_same(read_lerobot(out, ["image", "agent_pos"], PUSHT), read_dataset(pusht_zarr))


def test_export_layout(exported):
    info = json.loads((exported / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == FPS
    assert info["total_episodes"] == len(LENGTHS) and info["total_frames"] == sum(LENGTHS)
    assert info["features"]["observation.image"]["shape"] == [96, 96, 3]
    assert info["features"]["observation.state"] == {"dtype": "float32", "shape": [2], "names": None}
    assert info["features"]["state"]["shape"] == [5]  # keys the task does not name keep their own name
    assert info["data_path"].format(chunk_index=0, file_index=0) == "data/chunk-000/file-000.parquet"
    episodes = pq.read_table(exported / "meta/episodes/chunk-000/file-000.parquet").to_pydict()
    assert episodes["length"] == list(LENGTHS)
    assert episodes["dataset_from_index"] == [0, 12, 21] and episodes["dataset_to_index"] == [12, 21, 28]
    assert episodes["videos/observation.image/from_timestamp"] == [0.0, 1.2, 2.1]
    frames = pq.read_table(exported / "data/chunk-000/file-000.parquet").to_pydict()
    assert frames["frame_index"][10:14] == [10, 11, 0, 1] and frames["episode_index"][11:13] == [0, 1]
    assert pq.read_table(exported / "meta/tasks.parquet").to_pydict()["__index_level_0__"] == ["pusht"]
    stats = json.loads((exported / "meta/stats.json").read_text())
    assert np.array(stats["observation.image"]["mean"]).shape == (3, 1, 1)
    assert stats["action"]["count"] == [sum(LENGTHS)] and len(stats["action"]["q50"]) == 2


def test_export_stats_match_source(exported, pusht_zarr):
    stats = json.loads((exported / "meta/stats.json").read_text())
    action = read_dataset(pusht_zarr).data["action"]
    np.testing.assert_allclose(stats["action"]["mean"], action.mean(0), rtol=1e-5)
    np.testing.assert_allclose(stats["action"]["max"], action.max(0), rtol=1e-6)


def test_video_timestamps_are_exact(exported):
    with av.open(str(exported / "videos/observation.image/chunk-000/file-000.mp4")) as container:
        stream = container.streams.video[0]
        times = [Fraction(f.pts) * stream.time_base for f in container.decode(stream)]
    assert times == [Fraction(i, FPS) for i in range(sum(LENGTHS))]


def test_export_robomimic_hdf5(tmp_path):
    rng = np.random.default_rng(1)
    episodes = []
    for n in (6, 5):
        obs = {"agentview_image": _smooth_images(rng, n, 84), "robot0_eef_pos": rng.normal(size=(n, 3)).astype(np.float32)}
        episodes.append({"actions": rng.uniform(-1, 1, (n, 7)).astype(np.float32), "states": rng.normal(size=(n, 4)),
                         "rewards": np.r_[np.zeros(n - 1), 1.0], "dones": np.r_[np.zeros(n - 1, np.int64), 1],
                         "obs": obs, "next_obs": obs, "model_file": "<mujoco/>"})
    src = tmp_path / "lift.hdf5"
    write_robomimic_hdf5(src, episodes, {"env_name": "Lift", "env_version": "1.5.2", "type": 1, "env_kwargs": {}})
    out = tmp_path / "lift_le"
    report = export(ExportConfig(src=str(src), out=str(out)), load_task)
    assert report["task"] == "lift" and report["fps"] == load_task("lift").fps
    assert report["features"]["agentview_image"] == "observation.images.agentview"
    data = read_lerobot(out, ["agentview_image", "robot0_eef_pos"], load_task("lift").dataset.features)
    source = read_dataset(src)
    np.testing.assert_array_equal(data.data["robot0_eef_pos"], source.data["robot0_eef_pos"])
    err = np.abs(data.data["agentview_image"].astype(np.int16) - source.data["agentview_image"].astype(np.int16))
    assert data.data["agentview_image"].shape == (11, 84, 84, 3) and err.mean() < MAX_MEAN_PIXEL_ERROR
    np.testing.assert_array_equal(data.data["action"], source.data["action"])


# --------------------------------------------------------------------------------- overwrite safety
def test_export_refuses_to_overwrite(pusht_zarr, exported, tmp_path):
    before = (exported / "meta/info.json").read_text()
    with pytest.raises(FileExistsError, match="overwrite=true"):
        export(ExportConfig(src=str(pusht_zarr), out=str(exported)), load_task)
    assert (exported / "meta/info.json").read_text() == before
    other = tmp_path / "not_lerobot"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a dataset written by export_dataset.py"):
        export(ExportConfig(src=str(pusht_zarr), out=str(other), overwrite=True), load_task)
    assert (other / "keep.txt").read_text() == "mine"
    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)
    (copy / "stale.txt").write_text("old")  # a file the exporter did not write: overwrite deletes only its own
    with pytest.raises(FileExistsError, match="holds stale.txt, which export_dataset.py did not write"):
        export(ExportConfig(src=str(pusht_zarr), out=str(copy), overwrite=True), load_task)
    (copy / "stale.txt").unlink()
    export(ExportConfig(src=str(pusht_zarr), out=str(copy), overwrite=True, codec="h264"), load_task)
    assert "h264" in (copy / "meta/info.json").read_text()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left behind


def test_export_command_errors_are_one_line(tmp_path):
    result = run_command(["export_dataset.py", f"src={tmp_path / 'missing.zarr'}", f"out={tmp_path / 'o'}"])
    assert result.returncode == 1 and result.stderr.strip().count("\n") == 0
    assert "missing.zarr does not exist" in result.stderr
    result = run_command(["export_dataset.py", f"src={tmp_path}", "codec=vp9"])
    assert result.returncode == 1 and "out" in result.stderr and result.stderr.strip().count("\n") == 0


# ------------------------------------------------------------------------------------- reader checks
def _copy(exported, tmp_path):
    root = tmp_path / "le"
    shutil.copytree(exported, root)
    return root


def _rewrite_data(root, column, fn):
    path = root / "data/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    i = table.column_names.index(column)
    pq.write_table(table.set_column(i, column, fn(table.column(column))), path)


def test_reader_refuses_truncated_video(exported, tmp_path):
    root = _copy(exported, tmp_path)
    video = root / "videos/observation.image/chunk-000/file-000.mp4"
    video.write_bytes(video.read_bytes()[: video.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"file-000.mp4 .*(truncated|damaged)") as exc:
        read_lerobot(root, ["image", "agent_pos"], PUSHT)
    assert "\n" not in str(exc.value)
    assert any("truncated" in p or "damaged" in p for p in describe(root)["problems"])


def test_reader_refuses_truncated_parquet(exported, tmp_path):
    root = _copy(exported, tmp_path)
    data = root / "data/chunk-000/file-000.parquet"
    data.write_bytes(data.read_bytes()[:-100])
    with pytest.raises(ValueError, match="file-000.parquet cannot be read .* truncated or damaged"):
        read_lerobot(root, ["image", "agent_pos"], PUSHT)


def test_reader_refuses_nan_action(exported, tmp_path):
    root = _copy(exported, tmp_path)

    def poison(col):
        values = col.combine_chunks().flatten().to_numpy().copy()
        values[2 * 14] = np.nan  # frame 14 = episode 1, step 2
        return pa.FixedSizeListArray.from_arrays(pa.array(values), 2)

    _rewrite_data(root, "action", poison)
    with pytest.raises(ValueError, match=r"'action' holds NaN or inf in episode 1 \(first at step 2"):
        read_lerobot(root, ["agent_pos"], PUSHT)
    assert describe(root)["valid"] is False


def test_reader_refuses_wrong_shape_and_missing_feature(exported, tmp_path):
    root = _copy(exported, tmp_path)
    with pytest.raises(ValueError, match=r"not in meta/info.json.*task.dataset.features"):
        read_lerobot(root, ["image"], {"image": "observation.images.top"})
    info = json.loads((root / "meta/info.json").read_text())
    info["features"]["observation.state"]["shape"] = [3]
    (root / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(ValueError, match=r"'observation.state' holds 2 values per frame but meta/info.json says shape \[3\]"):
        read_lerobot(root, ["agent_pos"], PUSHT)


def test_reader_refuses_other_versions_and_bad_bounds(exported, tmp_path):
    root = _copy(exported, tmp_path)
    info = json.loads((root / "meta/info.json").read_text())
    (root / "meta/info.json").write_text(json.dumps({**info, "codebase_version": "v2.1"}))
    with pytest.raises(ValueError, match="v2.1; only v3.x is read"):
        read_lerobot(root)
    (root / "meta/info.json").write_text(json.dumps(info))
    path = root / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    lengths = table.column("length").to_numpy().copy()
    lengths[1] += 1
    pq.write_table(table.set_column(table.column_names.index("length"), "length", pa.array(lengths)), path)
    with pytest.raises(ValueError, match="episode 1 has length 10 but spans dataset index 12..21"):
        read_lerobot(root)


def test_make_dataset_uses_task_feature_names(exported, pusht_zarr):
    task = load_task("pusht")
    task.dataset.path = str(exported)
    _assert_same(make_dataset(task), read_dataset(pusht_zarr))
    info = describe(exported)
    assert info["format"] == "lerobot" and info["valid"] and info["episodes"] == len(LENGTHS)


# -------------------------------------------------------------------------- lerobot's own reader/writer
def _ledataset(script: str, cwd, timeout=600) -> subprocess.CompletedProcess:
    """Run ``script`` with lerobot's ``ledataset`` outside the repository (our datasets/ package
    shadows HuggingFace's there); skip when ledataset or its torchcodec backend is absent."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run([sys.executable, "-c", "import ledataset.datasets.lerobot_dataset, torchcodec.decoders"],
                           cwd=cwd, env=env, capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f"lerobot's reader is not usable here (pip install '.[dev]' and FFmpeg: make sysdeps): "
                    f"{probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else ''}")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_ledataset_reads_export(exported, pusht_zarr, tmp_path):
    result = _ledataset(f"""
        import numpy as np
        from ledataset.datasets.lerobot_dataset import LeRobotDataset
        ds = LeRobotDataset("local/export", root={str(exported)!r})
        items = [ds[i] for i in range(len(ds))]
        np.savez({str(tmp_path / 'le.npz')!r}, n=len(ds),
                 image=np.stack([it["observation.image"].numpy() for it in items]),
                 action=np.stack([it["action"].numpy() for it in items]),
                 state=np.stack([it["observation.state"].numpy() for it in items]),
                 episode=np.array([int(it["episode_index"]) for it in items]),
                 start=np.array(ds.meta.episodes["dataset_from_index"]), end=np.array(ds.meta.episodes["dataset_to_index"]),
                 task=np.array([it["task"] for it in items]))
    """, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    got, source = np.load(tmp_path / "le.npz"), read_dataset(pusht_zarr)
    assert got["n"] == sum(LENGTHS)
    np.testing.assert_array_equal(got["action"], source.data["action"])
    np.testing.assert_array_equal(got["state"], source.data["agent_pos"])
    np.testing.assert_array_equal(got["end"], source.episode_ends)
    np.testing.assert_array_equal(got["start"], np.r_[0, source.episode_ends[:-1]])
    np.testing.assert_array_equal(got["episode"], np.repeat(np.arange(len(LENGTHS)), LENGTHS))
    assert set(got["task"]) == {"pusht"}
    image = np.rint(got["image"].transpose(0, 2, 3, 1) * 255)  # (N, C, H, W) float 0-1 -> (N, H, W, C) 0-255
    assert np.abs(image - source.data["image"]).mean() < MAX_MEAN_PIXEL_ERROR


def test_train_on_dataset_written_by_ledataset(tmp_path):
    root = tmp_path / "written_by_lerobot"
    result = _ledataset(f"""
        import numpy as np
        from ledataset.datasets.lerobot_dataset import LeRobotDataset
        features = {{
            "observation.image": {{"dtype": "video", "shape": (96, 96, 3), "names": ["height", "width", "channel"]}},
            "observation.state": {{"dtype": "float32", "shape": (2,), "names": None}},
            "action": {{"dtype": "float32", "shape": (2,), "names": None}},
        }}
        ds = LeRobotDataset.create("local/tiny", fps=10, features=features, root={str(root)!r}, use_videos=True)
        rng = np.random.default_rng(0)
        for episode, length in enumerate((8, 7, 9)):
            for t in range(length):
                ds.add_frame({{"observation.image": np.full((96, 96, 3), 10 * t + 40 * episode, np.uint8),
                              "observation.state": rng.uniform(0, 512, 2).astype(np.float32),
                              "action": rng.uniform(0, 512, 2).astype(np.float32), "task": "push"}})
            ds.save_episode()
        ds.finalize()
    """, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    data = read_lerobot(root, ["image", "agent_pos"], PUSHT)
    np.testing.assert_array_equal(data.episode_ends, [8, 15, 24])
    grey = data.data["image"].reshape(len(data.data["image"]), -1).mean(1)  # (N,): frame t of episode e is 10 t + 40 e
    want = np.r_[np.arange(8), np.arange(7) + 4, np.arange(9) + 8] * 10  # episodes 1 and 2 start 0.8 s / 1.5 s into the video
    np.testing.assert_allclose(grey, want, atol=MAX_MEAN_PIXEL_ERROR)
    from core.training import train

    cfg = tiny_train_cfg(tmp_path, root, policy="bc", attention="full")
    assert cfg.task.dataset.features == PUSHT
    result = train(cfg)
    assert result.checkpoint.exists()
