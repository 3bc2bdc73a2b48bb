"""Replay-buffer round trips, the window sampler and the dataset CLIs."""
import json
from types import SimpleNamespace

import numpy as np
import pytest
import zarr

from datasets import describe as describe_cli
from datasets.episodes import EpisodeData, atomic_output
from datasets.factory import make_dataset
from datasets.sampler import SequenceDataset, compute_stats, split_episodes, window_indices
from datasets.zarr_replay import read_pusht_zarr, write_pusht_zarr
from tests.helpers import pusht_episodes


@pytest.mark.parametrize("img_dtype", [np.uint8, np.float32])
def test_zarr_round_trip(tmp_path, img_dtype):
    eps = pusht_episodes((5, 7), img_dtype=img_dtype)
    path = tmp_path / "d.zarr"
    if img_dtype == np.uint8:
        write_pusht_zarr(path, eps)
    else:  # the public file: float32 images holding 0..255, zarr format 2
        root = zarr.open_group(str(path), mode="w", zarr_format=2)
        for k in ("img", "state", "action", "keypoint", "n_contacts"):
            arr = np.concatenate([e[k] for e in eps])
            root.create_group("data") if "data" not in root else None
            root["data"].create_array(k, shape=arr.shape, dtype=arr.dtype)[...] = arr
        root.create_group("meta").create_array("episode_ends", shape=(2,), dtype=np.int64)[...] = np.array([5, 12])
    data = read_pusht_zarr(path)
    assert data.episode_ends.tolist() == [5, 12]
    assert data.data["image"].dtype == np.uint8
    np.testing.assert_array_equal(data.data["image"], np.concatenate([e["img"] for e in eps]).astype(np.uint8))
    np.testing.assert_array_equal(data.data["agent_pos"], np.concatenate([e["state"][:, :2] for e in eps]))
    np.testing.assert_array_equal(data.data["action"], np.concatenate([e["action"] for e in eps]))
    assert zarr.open_group(str(path), mode="r").metadata.zarr_format == 2


def test_writer_refuses_to_overwrite_and_leaves_no_partial_file(tmp_path):
    path = tmp_path / "d.zarr"
    write_pusht_zarr(path, pusht_episodes((4,)))
    with pytest.raises(FileExistsError, match="overwrite=true"):
        write_pusht_zarr(path, pusht_episodes((6,)))
    assert read_pusht_zarr(path).num_frames == 4
    bad = pusht_episodes((3,))
    bad[0]["img"] = bad[0]["img"][:2]  # inconsistent lengths
    with pytest.raises(ValueError, match=r"episode 0: \{'img': 2\} frames but 3 actions"):
        write_pusht_zarr(tmp_path / "x.zarr", bad + pusht_episodes((2,)))
    assert not (tmp_path / "x.zarr").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["d.zarr"]


def test_atomic_output_keeps_old_file_when_writer_fails(tmp_path):
    target = tmp_path / "f.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_output(target, overwrite=True) as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash")
    assert target.read_text() == "old"


def test_wrong_layout_lists_expected_and_found(tmp_path):
    root = zarr.open_group(str(tmp_path / "w.zarr"), mode="w", zarr_format=2)
    root.create_group("data").create_array("pixels", shape=(2, 2), dtype="f4")
    with pytest.raises(ValueError, match=r"missing \['data/img', 'data/state', 'data/action', 'meta/episode_ends'\].*found data/\['pixels'\]"):
        read_pusht_zarr(tmp_path / "w.zarr")


def _task(name, path, fmt, input_shapes, action_dim):
    """The fields of a TaskConfig that make_dataset reads."""
    return SimpleNamespace(name=name, dataset=SimpleNamespace(path=str(path), format=fmt),
                           input_shapes=input_shapes, action_dim=action_dim)


def test_missing_dataset_names_generate_command(tmp_path):
    task = _task("pusht", tmp_path / "nope.zarr", "pusht_zarr", {"image": [3, 96, 96]}, 2)
    with pytest.raises(FileNotFoundError, match="python generate_demos.py task=pusht num_episodes=200 out=.*nope.zarr"):
        make_dataset(task)


def test_missing_randomised_dataset_names_scene_randomization(tmp_path):
    # the name the studies train the randomised-scene variant on: the hint must render the scenes too
    task = _task("lift", tmp_path / "ph_image_scene.hdf5", "robomimic_hdf5", {"agentview_image": [3, 84, 84]}, 7)
    with pytest.raises(FileNotFoundError, match=r"task=lift num_episodes=200 out=.*ph_image_scene.hdf5 scene_randomization=all$"):
        make_dataset(task)
    plain = _task("lift", tmp_path / "ph_image.hdf5", "robomimic_hdf5", {"agentview_image": [3, 84, 84]}, 7)
    with pytest.raises(FileNotFoundError, match=r"out=.*ph_image.hdf5$"):
        make_dataset(plain)


def test_dataset_for_another_task_names_the_mismatch(tiny_pusht_zarr):
    task = _task("lift", tiny_pusht_zarr, "pusht_zarr", {"agentview_image": [3, 84, 84]}, 7)
    with pytest.raises(ValueError, match=r"does not fit task 'lift': it lacks \['agentview_image'\]"):
        make_dataset(task)


def test_window_padding_repeats_edge_frames():
    ends = np.array([5, 8])
    idx = window_indices(ends, np.array([0, 1]), horizon=4, pad_before=1, pad_after=2)
    # episode 0 (frames 0..4): starts -1..3
    assert idx[0].tolist() == [0, 0, 1, 2]
    assert idx[4].tolist() == [3, 4, 4, 4]
    # episode 1 (frames 5..7): starts -1..1, never crossing into episode 0
    ep1 = idx[5:]
    assert ep1.tolist() == [[5, 5, 6, 7], [5, 6, 7, 7], [6, 7, 7, 7]]
    assert len(idx) == 5 + 3


def test_sequence_dataset_items_and_padding():
    frames = np.arange(8, dtype=np.float32)
    data = EpisodeData({"agent_pos": np.stack([frames, -frames], 1), "action": frames[:, None].repeat(2, 1)}, [5, 8])
    ds = SequenceDataset(data, ["agent_pos"], n_obs_steps=2, horizon=4, n_action_steps=3)
    first = ds[0]
    assert first["agent_pos"].shape == (2, 2) and first["action"].shape == (4, 2)
    assert first["agent_pos"][:, 0].tolist() == [0, 0]  # padded start
    assert first["action"][:, 0].tolist() == [0, 0, 1, 2]
    last = ds[len(ds) - 1]
    assert last["action"][:, 0].tolist() == [6, 7, 7, 7]


def test_split_by_episode_and_stats():
    train, val = split_episodes(10, 0.2, seed=0)
    assert len(val) == 2 and len(train) == 8 and not set(train) & set(val)
    assert split_episodes(10, 0.2, seed=0)[1].tolist() == val.tolist()
    data = EpisodeData({"action": np.arange(10, dtype=np.float32)[:, None]}, [4, 10])
    s = compute_stats(data, ["action"], episodes=[1])
    assert s["action"]["min"].tolist() == [4.0] and s["action"]["max"].tolist() == [9.0]


def test_describe_cli_json(tiny_pusht_zarr, capsys):
    assert describe_cli.main([str(tiny_pusht_zarr), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["episodes"] == 3 and info["frames"] == 36
    assert info["keys"]["data/img"] == {"shape": [36, 96, 96, 3], "dtype": "uint8", "image": "uint8 0-255"}
    assert info["valid"] and info["problems"] == []
    assert len(info["action_min"]) == 2
    assert describe_cli.main([str(tiny_pusht_zarr)]) == 0
    assert "episodes: 3" in capsys.readouterr().out


def test_describe_missing_file_is_a_clear_error(tmp_path, capsys):
    assert describe_cli.main([str(tmp_path / "none.zarr")]) == 2
    assert "does not exist" in capsys.readouterr().err
