"""What the dataset readers refuse or convert, and what ``python -m datasets.describe`` says about it.

Each case is checked on both formats (PushT zarr and robomimic hdf5): the reader's message is one
line naming the file, the key and (for NaN/inf) the episode; describe reports the same message
instead of crashing, and names each image key's encoding.
"""
import json
import os
import subprocess
import sys
import warnings
from types import SimpleNamespace

import h5py
import numpy as np
import pytest
import zarr

from datasets.factory import read_dataset
from datasets.robomimic_hdf5 import write_robomimic_hdf5
from datasets.zarr_replay import write_pusht_zarr
from tests.helpers import REPO, pusht_episodes

ENV_META = {"env_name": "Lift", "env_version": "1.5.2", "type": 1, "env_kwargs": {}}
LENGTHS = (5, 7, 6)


def _images(rng, n):
    return rng.integers(0, 256, (n, 8, 8, 3)).astype(np.uint8)


def write_zarr(path, img=None, state=None, action=None, ends=None):
    """A replay buffer written raw (not through write_pusht_zarr), as a foreign tool would."""
    rng = np.random.default_rng(0)
    n = sum(LENGTHS)
    arrays = {
        "img": _images(rng, n) if img is None else img,
        "state": rng.uniform(0, 512, (n, 5)).astype(np.float32) if state is None else state,
        "action": rng.uniform(0, 512, (n, 2)).astype(np.float32) if action is None else action,
    }
    root = zarr.open_group(str(path), mode="w", zarr_format=2)
    data = root.create_group("data")
    for k, v in arrays.items():
        data.create_array(k, shape=v.shape, dtype=v.dtype)[...] = v
    ends = np.cumsum(LENGTHS) if ends is None else np.asarray(ends)
    root.create_group("meta").create_array("episode_ends", shape=ends.shape, dtype=np.int64)[...] = ends
    return path


def write_hdf5(path, img=None, eef=None, action=None):
    """A robomimic file with the episodes of LENGTHS; arrays given are (sum(LENGTHS), ...) and split."""
    rng = np.random.default_rng(0)
    n = sum(LENGTHS)
    img = _images(rng, n) if img is None else img
    eef = rng.normal(size=(n, 3)).astype(np.float32) if eef is None else eef
    action = rng.uniform(-1, 1, (n, 7)).astype(np.float32) if action is None else action
    bounds = np.cumsum((0,) + LENGTHS)
    eps = [{"actions": action[a:b], "obs": {"agentview_image": img[a:b], "robot0_eef_pos": eef[a:b]}}
           for a, b in zip(bounds[:-1], bounds[1:])]
    write_robomimic_hdf5(path, eps, ENV_META)
    return path


IMAGE_KEY = {"zarr": "data/img", "hdf5": "obs/agentview_image"}
READ_KEY = {"zarr": "image", "hdf5": "agentview_image"}


def write(fmt, tmp_path, img=None, action=None):
    if fmt == "zarr":
        return write_zarr(tmp_path / "d.zarr", img=img, action=action if action is None else action[:, :2])
    return write_hdf5(tmp_path / "d.hdf5", img=img, action=action)


def describe(path):
    from datasets.describe import describe as describe_dataset

    return describe_dataset(path)


def _one_line(exc) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


# --------------------------------------------------------------------------------------- item 1: rename
def test_no_dataset_module_shadows_the_standard_library():
    names = {p.stem for p in (REPO / "datasets").glob("*.py")}
    assert not names & set(sys.stdlib_module_names), "a module in datasets/ shadows the standard library"
    assert "describe" in names


def test_the_reader_and_describe_run_as_modules(tmp_path):
    path = write_hdf5(tmp_path / "d.hdf5")
    env = dict(os.environ, MUJOCO_GL="egl")
    # from the repository root, as the package runs (it installs no modules): python -m, not a file path
    run = subprocess.run([sys.executable, "-m", "datasets.robomimic_hdf5", str(path)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout)["episodes"] == 3
    run = subprocess.run([sys.executable, "-m", "datasets.describe", str(path), "--json"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout)["keys"]["obs/agentview_image"]["image"] == "uint8 0-255"


# ------------------------------------------------------------------------------------- item 2: images
@pytest.mark.parametrize("fmt", ["zarr", "hdf5"])
def test_float_0_255_images_become_uint8_without_warning(tmp_path, fmt):
    img = np.random.default_rng(1).uniform(0, 255, (sum(LENGTHS), 8, 8, 3)).astype(np.float32)
    path = write(fmt, tmp_path, img=img)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data = read_dataset(path)
    got = data.data[READ_KEY[fmt]]
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, np.rint(img).astype(np.uint8))
    assert describe(path)["keys"][IMAGE_KEY[fmt]]["image"] == "float 0-255 → uint8"


@pytest.mark.parametrize("fmt", ["zarr", "hdf5"])
def test_float_0_1_images_are_scaled_x255_with_one_warning(tmp_path, fmt):
    img = np.random.default_rng(2).uniform(0, 1, (sum(LENGTHS), 8, 8, 3)).astype(np.float32)
    path = write(fmt, tmp_path, img=img)
    with pytest.warns(UserWarning) as record:
        data = read_dataset(path)
    scale = [w for w in record if "[0, 1]" in str(w.message)]
    assert len(scale) == 1
    assert IMAGE_KEY[fmt] in str(scale[0].message) and "x255" in str(scale[0].message)
    got = data.data[READ_KEY[fmt]]
    assert got.dtype == np.uint8 and got.max() > 200  # was max 1 (zarr) or float 0..1 read as 0..255 (hdf5)
    np.testing.assert_array_equal(got, np.rint(img * np.float32(255)).astype(np.uint8))
    assert describe(path)["keys"][IMAGE_KEY[fmt]]["image"] == "float 0-1 → ×255 (warning)"


def _bad_images(kind):
    img = np.random.default_rng(3).uniform(0, 255, (sum(LENGTHS), 8, 8, 3)).astype(np.float32)
    if kind == "negative":
        img[3, 0, 0, 0] = -4.0
    elif kind == "above 255":
        img[3, 0, 0, 0] = 300.0
    elif kind == "nan":
        img[3, 0, 0, 0] = np.nan
    elif kind == "inf":
        img[3, 0, 0, 0] = np.inf
    elif kind == "int32":
        img = img.astype(np.int32)
    return img


@pytest.mark.parametrize("fmt", ["zarr", "hdf5"])
@pytest.mark.parametrize("kind", ["negative", "above 255", "nan", "inf", "int32"])
def test_other_images_are_refused_naming_file_key_and_fix(tmp_path, fmt, kind):
    path = write(fmt, tmp_path, img=_bad_images(kind))
    with pytest.raises(ValueError) as exc:
        read_dataset(path)
    msg = _one_line(exc)
    assert str(path) in msg and repr(IMAGE_KEY[fmt]) in msg and "uint8 0-255" in msg
    info = describe(path)  # reports, does not crash
    assert not info["valid"] and msg in info["problems"]
    assert info["keys"][IMAGE_KEY[fmt]]["image"] == "refused"


def test_describe_cli_names_each_image_case(tmp_path, capsys):
    from datasets import describe as describe_cli

    write_zarr(tmp_path / "u.zarr")
    write_zarr(tmp_path / "f.zarr", img=np.full((sum(LENGTHS), 8, 8, 3), 200.0, np.float32))
    write_zarr(tmp_path / "o.zarr", img=np.full((sum(LENGTHS), 8, 8, 3), 0.5, np.float32))
    for name, case in [("u", "uint8 0-255"), ("f", "float 0-255 → uint8"), ("o", "float 0-1 → ×255 (warning)")]:
        assert describe_cli.main([str(tmp_path / f"{name}.zarr")]) == 0
        assert f"image: {case}" in capsys.readouterr().out


# ------------------------------------------------------------------------------------- item 3: NaN/inf
@pytest.mark.parametrize("fmt", ["zarr", "hdf5"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_actions_are_refused_naming_file_key_and_episode(tmp_path, fmt, bad):
    action = np.random.default_rng(4).uniform(-1, 1, (sum(LENGTHS), 7)).astype(np.float32)
    action[LENGTHS[0] + 2, 1] = bad  # episode 1, step 2
    path = write(fmt, tmp_path, action=action)
    with pytest.raises(ValueError) as exc:
        read_dataset(path)
    msg = _one_line(exc)
    key = "data/action" if fmt == "zarr" else "actions"
    assert str(path) in msg and repr(key) in msg and "NaN or inf" in msg and "episode 1" in msg
    assert "step 2" in msg
    info = describe(path)
    assert not info["valid"] and info["problems"] == [msg]


@pytest.mark.parametrize("fmt", ["zarr", "hdf5"])
def test_non_finite_low_dim_observations_are_refused(tmp_path, fmt):
    n = sum(LENGTHS)
    low = np.random.default_rng(5).normal(size=(n, 5)).astype(np.float32)
    low[n - 1, 0] = np.nan  # last frame of episode 2
    if fmt == "zarr":
        path, key = write_zarr(tmp_path / "d.zarr", state=low), "data/state"
    else:
        path, key = write_hdf5(tmp_path / "d.hdf5", eef=low[:, :3]), "obs/robot0_eef_pos"
    with pytest.raises(ValueError) as exc:
        read_dataset(path)
    msg = _one_line(exc)
    assert str(path) in msg and repr(key) in msg and "episode 2" in msg
    if fmt == "hdf5":
        assert "data/demo_2" in msg
    assert msg in describe(path)["problems"]


# ------------------------------------------------------------------------------- item 4: episode_ends
def test_describe_says_decreasing_episode_ends_are_invalid_with_the_training_message(tmp_path, capsys):
    from datasets import describe as describe_cli
    from datasets.factory import make_dataset

    path = write_zarr(tmp_path / "d.zarr", ends=[5, 12, 5])
    task = SimpleNamespace(name="pusht", dataset=SimpleNamespace(path=str(path), format="pusht_zarr"),
                           input_shapes={"image": [3, 8, 8]}, action_dim=2)
    with pytest.raises(ValueError) as exc:  # what training reports (training calls make_dataset(cfg.task, ...))
        make_dataset(task)
    msg = _one_line(exc)
    assert str(path) in msg and "strictly increasing" in msg and "episode 2 ends at 5" in msg
    assert describe_cli.main([str(path)]) == 1
    out = capsys.readouterr().out
    assert msg in out and "invalid" in out
    assert "min -" not in out and "episode length" not in out  # was "episode length: min -7 ..."
    info = describe(path)
    assert info["problems"] == [msg] and "episode_length" not in info


def test_empty_first_episode_is_invalid(tmp_path):
    path = write_zarr(tmp_path / "d.zarr", ends=[0, 12, 18])
    with pytest.raises(ValueError, match="strictly increasing.*episode 0 ends at 0 after the start"):
        read_dataset(path)


def test_writer_converts_float_images_by_the_readers_rules(tmp_path):
    eps = pusht_episodes((3, 4), img_dtype=np.float32)
    for ep in eps:
        ep["img"] = ep["img"] / np.float32(255)
    with pytest.warns(UserWarning, match=r"\[0, 1\].*x255"):
        write_pusht_zarr(tmp_path / "w.zarr", eps)
    assert zarr.open_group(str(tmp_path / "w.zarr"), mode="r")["data"]["img"][:].max() > 200  # was 0/1 (astype)


def test_hdf5_float_image_sample_and_per_demo_check_agree(tmp_path):
    """The case is judged on the first and last demos; a middle demo on another scale is refused."""
    img = np.random.default_rng(6).uniform(0, 1, (sum(LENGTHS), 8, 8, 3)).astype(np.float32)
    img[LENGTHS[0]: LENGTHS[0] + LENGTHS[1]] *= 255  # demo_1 holds 0-255
    path = write_hdf5(tmp_path / "d.hdf5", img=img)
    with pytest.warns(UserWarning), pytest.raises(ValueError) as exc:
        read_dataset(path)
    msg = _one_line(exc)
    assert "mixes encodings" in msg and "episode 1 (data/demo_1)" in msg and str(path) in msg
    with h5py.File(path) as f:
        assert f["data/demo_1/obs/agentview_image"].dtype == np.float32
