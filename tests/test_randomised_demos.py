"""Demonstrations rendered under randomised scenes (``generate_demos.py scene_randomization=...``): the same
seeds give the same actions and states as a clean generation (the shift is visual only), the frames differ,
each episode has a scene of its own, the dataset says so in additional attributes and the readers of
before load it; a wrong option is refused in one line at composition."""
import json
import os

os.environ.setdefault("MUJOCO_GL", "egl")

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import zarr  # noqa: E402

from datasets.describe import describe  # noqa: E402
from datasets.factory import read_dataset  # noqa: E402
from datasets.generate import generate  # noqa: E402
from envs.scene_shifts import SceneRandomization, at_severity, in_training_range  # noqa: E402
from envs.shifts import TRAINING_RANGE  # noqa: E402
from core.config import compose  # noqa: E402

LIFT_SIZE = 32  # px: the smallest frames keep the Lift generations to seconds


def _pair(tmp_path_factory, task, kinds, **kw):
    """(clean, randomised) datasets of the same two seeds."""
    folder = tmp_path_factory.mktemp(task)
    suffix = ".zarr" if task == "pusht" else ".hdf5"
    clean, randomised = folder / f"clean{suffix}", folder / f"randomised{suffix}"
    generate(task, 2, clean, progress=False, **kw)
    generate(task, 2, randomised, progress=False, scene_randomization=SceneRandomization(kinds, 2), **kw)
    return clean, randomised


@pytest.fixture(scope="module")
def pusht_pair(tmp_path_factory):
    return _pair(tmp_path_factory, "pusht", ("colour", "camera"))


@pytest.fixture(scope="module")
def lift_pair(tmp_path_factory):
    return _pair(tmp_path_factory, "lift", ("lighting", "colour", "camera"), image_size=LIFT_SIZE)


def _same_expert_other_frames(clean, randomised, image_keys):
    a, b = read_dataset(clean), read_dataset(randomised)
    assert np.array_equal(a.episode_ends, b.episode_ends)
    for key in a.data:
        if key in image_keys:  # every frame re-rendered: no frame of the clean scene is left
            diff = np.abs(a.data[key].astype(int) - b.data[key]).reshape(len(a.data[key]), -1).mean(axis=1)
            assert diff.min() > 0.5, key
        else:  # the expert's actions and the low-dim states are the clean scene's, to the bit
            assert np.array_equal(a.data[key], b.data[key]), key
    return a, b


def test_pusht_randomised_frames_keep_the_experts_actions_and_states(pusht_pair):
    clean, randomised = pusht_pair
    a, b = _same_expert_other_frames(clean, randomised, {"image"})
    first = [0, int(a.episode_ends[0])]  # the first frame of each episode
    corner = lambda d: [tuple(d.data["image"][i][4, 4]) for i in first]  # noqa: E731 (the background)
    assert corner(a)[0] == corner(a)[1]  # clean: one background
    assert corner(b)[0] != corner(b)[1]  # randomised: a scene per episode


def test_lift_randomised_frames_keep_the_experts_actions_and_states(lift_pair):
    clean, randomised = lift_pair
    _same_expert_other_frames(clean, randomised, {"agentview_image", "robot0_eye_in_hand_image"})
    with h5py.File(randomised) as f:  # the states robomimic replays are the clean ones too
        with h5py.File(clean) as g:
            for demo in ("demo_0", "demo_1"):
                assert np.array_equal(f["data"][demo]["states"][()], g["data"][demo]["states"][()])
                assert np.array_equal(f["data"][demo]["actions"][()], g["data"][demo]["actions"][()])
    a, b = read_dataset(clean), read_dataset(randomised)
    first = [0, int(a.episode_ends[0])]  # the first frame of each episode
    # what the scene changed, as a mean colour change per episode: the same scene twice would change both alike
    change = [(b.data["agentview_image"][i].astype(float) - a.data["agentview_image"][i]).mean(axis=(0, 1)) for i in first]
    assert np.abs(change[0] - change[1]).max() > 5


def test_the_attributes_say_so_and_are_additional(pusht_pair, lift_pair):
    expected = {"kinds": ["colour", "camera"], "max_severity": 2}
    clean_attrs, attrs = (dict(zarr.open(str(p), mode="r").attrs) for p in pusht_pair)
    assert {k: attrs["scene_randomization"][k] for k in expected} == expected
    assert [e["seed"] for e in attrs["scene_randomization"]["episodes"]] == attrs["seeds"]
    assert set(clean_attrs) | {"scene_randomization"} == set(attrs)  # nothing renamed or dropped
    assert all(attrs[k] == clean_attrs[k] for k in ("task", "generator", "seeds"))
    with h5py.File(lift_pair[0]) as g, h5py.File(lift_pair[1]) as f:
        meta = json.loads(f["data"].attrs["scene_randomization"])
        assert (meta["kinds"], meta["max_severity"]) == (["lighting", "colour", "camera"], 2)
        assert [e["seed"] for e in meta["episodes"]] == [0, 1]  # the expert solves seeds 0 and 1
        assert all(0 <= e[kind] <= 2 for e in meta["episodes"] for kind in meta["kinds"])
        assert set(g["data"].attrs) | {"scene_randomization"} == set(f["data"].attrs)
        assert f["data"].attrs["env_args"] == g["data"].attrs["env_args"]  # robomimic rebuilds the clean env


def test_the_readers_of_before_load_a_randomised_dataset(pusht_pair, lift_pair):
    # the same keys, and on Lift each camera's pose beside its frames (its camera was drawn per episode)
    poses = {"pusht": set(), "lift": {"agentview_camera", "robot0_eye_in_hand_camera"}}
    for task, (clean, randomised) in zip(("pusht", "lift"), (pusht_pair, lift_pair)):
        a, b = describe(clean), describe(randomised)
        added = {f"obs/{k}" for k in poses[task]} | {f"next_obs/{k}" for k in poses[task]}
        assert b["episodes"] == a["episodes"] and set(b["keys"]) == set(a["keys"]) | added
        assert all(b["keys"][k] == a["keys"][k] for k in a["keys"])
        assert set(read_dataset(randomised).data) == set(read_dataset(clean).data) | poses[task]


@pytest.mark.parametrize("overrides, message", [
    (["task=pusht", "scene_randomization=[lighting]"],
     "scene_randomization=lighting: the pusht task cannot render a lighting shift; its scene shifts: colour, camera"),
    (["task=lift", "scene_randomization=[fog]"],
     r"scene_randomization=fog: not a scene shift; the lift task's: lighting, colour, camera \(or scene_randomization=all\)"),
    (["task=lift", "scene_randomization=[camera:2]"],
     r"scene_randomization=camera:2: give kinds without a severity, and the highest severity drawn with "
     r"scene_randomization_max=N \(default 2\)"),
    (["task=lift", "scene_randomization=all", "scene_randomization_max=4"],
     r"scene_randomization_max=4: give a severity 1-3 \(default 2\)"),
    (["task=can", "scene_randomization=[colour,colour]"], "scene_randomization: give each kind once"),
])
def test_out_of_range_options_are_refused_at_composition(overrides, message):
    with pytest.raises(ValueError, match=message):
        compose("generate", overrides)


def test_all_means_every_kind_the_task_renders_and_the_default_is_the_training_range():
    g = compose("generate", ["task=pusht", "scene_randomization=all"])
    assert g.randomization() == SceneRandomization(("colour", "camera"), TRAINING_RANGE)
    assert compose("generate", ["task=lift"]).randomization() is None


def test_continuous_severities_meet_the_evaluation_tables_and_the_range_splits_them():
    table = (0.2, 0.45, 0.75)
    assert [at_severity(table, s) for s in (1, 2, 3)] == list(table)  # the evaluation's magnitudes, exactly
    assert at_severity(table, 0) == 0 and at_severity(table, 1.5) == pytest.approx(0.325)
    assert at_severity((1.3, 1.6, 2.0), 0.5, clean=1.0) == pytest.approx(1.15)
    r = SceneRandomization(("colour", "camera"), TRAINING_RANGE)
    levels = [level for seed in range(200) for _, level, _ in r.draw(seed)]
    assert 0 <= min(levels) < 0.1 and TRAINING_RANGE - 0.1 < max(levels) <= TRAINING_RANGE
    assert [in_training_range("colour", s, r) for s in (1, 2, 3)] == [True, True, False]
    assert not in_training_range("lighting", 1, r) and not in_training_range("colour", 1, None)
