import json

import h5py
import numpy as np
import pytest

from datasets.episodes import EpisodeData
from datasets.robomimic_hdf5 import (
    MissingObsKeyError,
    RobomimicFormatError,
    describe_robomimic_hdf5,
    read_robomimic_hdf5,
    write_robomimic_hdf5,
)

ENV_META = {"env_name": "Lift", "env_version": "1.5.2", "type": 1, "env_kwargs": {"robots": ["Panda"]}}


def _episode(rng, T):
    obs = {
        "agentview_image": rng.integers(0, 256, (T, 8, 8, 3), dtype=np.uint8),
        "robot0_eef_pos": rng.normal(size=(T, 3)).astype(np.float32),
        "object": rng.normal(size=(T, 10)).astype(np.float32),
    }
    return {
        "actions": rng.uniform(-1, 1, (T, 7)).astype(np.float32),
        "states": rng.normal(size=(T, 32)),
        "rewards": np.r_[np.zeros(T - 1), 1.0],
        "dones": np.r_[np.zeros(T - 1, dtype=np.int64), 1],
        "obs": obs,
        "next_obs": {k: np.concatenate([v[1:], v[-1:]]) for k, v in obs.items()},
        "model_file": "<mujoco/>",
        "info": {"seed": T, "steps": T, "seconds": 0.1},
    }


@pytest.fixture
def episodes():
    rng = np.random.default_rng(0)
    return [_episode(rng, 5), _episode(rng, 7)]


def test_round_trip_layout_and_read(tmp_path, episodes):
    path = tmp_path / "demo.hdf5"
    write_robomimic_hdf5(path, episodes, ENV_META)
    with h5py.File(path, "r") as f:
        assert f["data"].attrs["total"] == 12
        assert json.loads(f["data"].attrs["env_args"]) == ENV_META
        assert sorted(f["data"].keys()) == ["demo_0", "demo_1"]
        g = f["data/demo_1"]
        assert g.attrs["num_samples"] == 7 and g.attrs["model_file"] == "<mujoco/>"
        for k in ("actions", "states", "rewards", "dones", "obs/object", "next_obs/agentview_image"):
            assert k in g
        assert g["obs/agentview_image"].compression == "gzip"
        train, valid = f["mask/train"][:], f["mask/valid"][:]
        assert train.dtype.kind == "S" and valid.dtype.kind == "S"
        assert sorted(list(train) + list(valid)) == [b"demo_0", b"demo_1"]

    data = read_robomimic_hdf5(path)
    assert isinstance(data, EpisodeData)
    assert data.num_episodes == 2 and list(data.episode_ends) == [5, 12]
    assert set(data.data) == {"action", "agentview_image", "robot0_eef_pos", "object"}
    np.testing.assert_array_equal(data.episode(1)["agentview_image"], episodes[1]["obs"]["agentview_image"])
    np.testing.assert_allclose(data.episode(0)["action"], episodes[0]["actions"])
    assert data.data["agentview_image"].dtype == np.uint8 and data.data["object"].dtype == np.float32
    assert data.meta["format"] == "robomimic_hdf5" and data.meta["env_args"] == ENV_META

    sub = read_robomimic_hdf5(path, obs_keys=["object"], filter_key="valid")
    assert set(sub.data) == {"object", "action"} and sub.num_episodes == 1

    info = describe_robomimic_hdf5(path)
    assert info["episodes"] == 2 and info["frames"] == 12 and info["env_name"] == "Lift"
    assert info["keys"]["obs/agentview_image"] == {"shape": [8, 8, 3], "dtype": "uint8", "compression": "gzip",
                                                   "image": "uint8 0-255"}
    assert info["valid"] and info["problems"] == []
    assert len(info["action_min"]) == 7


def test_demos_sorted_numerically(tmp_path):
    rng = np.random.default_rng(1)
    eps = [_episode(rng, 2 + i) for i in range(11)]  # demo_10 sorts before demo_2 as a string
    path = tmp_path / "many.hdf5"
    write_robomimic_hdf5(path, eps, ENV_META)
    data = read_robomimic_hdf5(path, obs_keys=["object"])
    assert list(np.diff(np.r_[0, data.episode_ends])) == [2 + i for i in range(11)]
    assert data.meta["demos"][-1] == "demo_10"


def test_robomimic_sequence_dataset_reads_file(tmp_path, episodes):
    import robomimic.utils.obs_utils as ObsUtils
    from robomimic.utils.dataset import SequenceDataset

    path = tmp_path / "demo.hdf5"
    write_robomimic_hdf5(path, episodes, ENV_META)
    ObsUtils.initialize_obs_modality_mapping_from_dict(
        {"low_dim": ["robot0_eef_pos", "object"], "rgb": ["agentview_image"]}
    )
    ds = SequenceDataset(
        hdf5_path=str(path),
        obs_keys=("agentview_image", "robot0_eef_pos", "object"),
        dataset_keys=("actions", "rewards", "dones"),
        seq_length=3,
        hdf5_cache_mode=None,
        hdf5_use_swmr=False,
        filter_by_attribute="train",
    )
    assert len(ds) > 0
    item = ds[0]
    assert item["actions"].shape == (3, 7)
    assert item["obs"]["agentview_image"].shape[0] == 3 and item["obs"]["object"].shape == (3, 10)
    train_demo = ds.demos[0]
    src = episodes[int(train_demo.split("_")[1])]
    np.testing.assert_allclose(item["actions"], src["actions"][:3])
    np.testing.assert_allclose(item["obs"]["object"], src["obs"]["object"][:3])


def test_missing_file_message(tmp_path):
    path = tmp_path / "nope.hdf5"
    with pytest.raises(FileNotFoundError) as e:
        read_robomimic_hdf5(path)
    msg = str(e.value)
    assert str(path) in msg and f"python generate_demos.py task=lift out={path}" in msg


def test_wrong_layout_lists_keys(tmp_path):
    path = tmp_path / "bad.hdf5"
    with h5py.File(path, "w") as f:
        f.create_dataset("actions", data=np.zeros((3, 7)))
        f.create_group("observations")
    with pytest.raises(RobomimicFormatError) as e:
        read_robomimic_hdf5(path)
    assert "'data'" in str(e.value) and "observations" in str(e.value) and "actions" in str(e.value)

    path2 = tmp_path / "bad_demo.hdf5"
    with h5py.File(path2, "w") as f:
        f.create_group("data/demo_0").create_dataset("action", data=np.zeros((3, 7)))
    with pytest.raises(RobomimicFormatError) as e:
        read_robomimic_hdf5(path2)
    assert "actions" in str(e.value) and "'action'" in str(e.value)

    path3 = tmp_path / "not_hdf5.hdf5"
    path3.write_text("hello")
    with pytest.raises(RobomimicFormatError):
        read_robomimic_hdf5(path3)


def test_missing_obs_key_and_filter_key(tmp_path, episodes):
    path = tmp_path / "demo.hdf5"
    write_robomimic_hdf5(path, episodes, ENV_META)
    with pytest.raises(MissingObsKeyError) as e:
        read_robomimic_hdf5(path, obs_keys=["robot0_eye_in_hand_image"])
    msg = str(e.value)
    assert "robot0_eye_in_hand_image" in msg and "agentview_image" in msg and "robot0_eef_pos" in msg
    with pytest.raises(RobomimicFormatError, match="available filter keys"):
        read_robomimic_hdf5(path, filter_key="20_percent")


def test_refuses_overwrite(tmp_path, episodes):
    path = tmp_path / "demo.hdf5"
    write_robomimic_hdf5(path, episodes, ENV_META)
    before = path.stat().st_size
    with pytest.raises(FileExistsError):
        write_robomimic_hdf5(path, episodes[:1], ENV_META)
    assert path.stat().st_size == before
    write_robomimic_hdf5(path, episodes[:1], ENV_META, overwrite=True)
    assert read_robomimic_hdf5(path).num_episodes == 1
    assert [p.name for p in tmp_path.iterdir()] == ["demo.hdf5"]  # no temp files left behind


def test_rejects_inconsistent_episode(tmp_path, episodes):
    bad = dict(episodes[0], actions=episodes[0]["actions"][:-1])
    with pytest.raises(ValueError, match="steps but actions"):
        write_robomimic_hdf5(tmp_path / "x.hdf5", [bad], ENV_META)
    assert not (tmp_path / "x.hdf5").exists()
