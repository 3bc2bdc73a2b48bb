"""Camera corruptions (``envs/corruptions.py``) and the one vocabulary of shifts (``envs/shifts.py``)."""
import numpy as np
import pytest

from envs.corruptions import corrupt, obs_corruptor
from envs.shifts import (RECIPE_PIXEL, SCENE_KINDS, Shift, ShiftError, parse_randomised_kinds, parse_shifts, scene_set,
                         shift_tag, split_stages)

# One pixel (row 5, column 9) of each of the four kinds of before at severities 1, 2, 3, computed with the
# hand-written code as it was before the library kinds came (committed records are named by these kinds).
FRAME = np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)  # pixel (5, 9) is [148, 185, 117]
PINNED = {
    "gaussian_noise": [[146, 171, 109], [144, 156, 100], [140, 127, 83]],
    "blur": [[137, 137, 86], [128, 118, 81], [131, 112, 93]],
    "brightness": [[174, 211, 143], [199, 236, 168], [237, 255, 206]],
    "contrast": [[143, 169, 120], [137, 153, 122], [133, 140, 125]],
}
NEW_KINDS = ("jpeg_compression", "motion_blur", "shot_noise", "pixelate")


@pytest.mark.parametrize("kind", sorted(PINNED))
def test_the_four_kinds_of_before_keep_their_exact_values(kind):
    got = [corrupt(FRAME, kind, s, np.random.default_rng(0))[5, 9].tolist() for s in (1, 2, 3)]
    assert got == PINNED[kind]
    assert corrupt(FRAME, kind, 0) is FRAME
    with pytest.raises(ValueError, match="severity must be 0 or 1-3"):
        corrupt(FRAME, kind, 4)


@pytest.mark.parametrize("kind", NEW_KINDS)
def test_imagenet_c_kinds_come_from_the_library_at_five_severities(kind):
    from imagecorruptions import corrupt as imagenet_c

    frame = np.random.default_rng(1).integers(0, 256, (84, 84, 3), dtype=np.uint8)
    before = np.random.get_state()
    changes = []
    for severity in (1, 2, 3, 4, 5):
        out = corrupt(frame, kind, severity, np.random.default_rng(7))
        assert out.shape == frame.shape and out.dtype == np.uint8
        assert np.array_equal(out, corrupt(frame, kind, severity, np.random.default_rng(7)))  # repeatable
        np.random.seed(int(np.random.default_rng(7).integers(2**32)))  # the draw ours seeds the library with
        assert np.array_equal(out, imagenet_c(frame, severity=severity, corruption_name=kind))
        np.random.set_state(before)
        changes.append(np.abs(out.astype(int) - frame).mean())
    after = np.random.get_state()
    assert np.array_equal(after[1], before[1]) and after[2] == before[2]  # numpy's global generator: as it was
    assert 0 < changes[0] < changes[-1]  # severity 5 changes the frame more than severity 1
    with pytest.raises(ValueError, match="severity must be 0 or 1-5"):
        corrupt(frame, kind, 6)


@pytest.mark.parametrize("bad", [42, True, {"brightness": 1}, "brightness", "brightness:4", "brightness:x",
                                 "brightness:1:2", "jpeg_compression:6", "rain:1", "lighting:4", [("blur", "1")]])
def test_a_malformed_value_is_refused_in_one_line(bad):
    with pytest.raises(ShiftError, match="give KIND:SEVERITY") as err:
        parse_shifts(bad)
    assert "\n" not in str(err.value) and str(err.value).startswith("corruption=")


def test_one_parser_tells_stage_and_tag_and_keeps_the_tags_of_before():
    shifts = parse_shifts(["brightness:1", "jpeg_compression:3", "lighting:2", ("camera", 1)], task="lift")
    assert shifts == [("brightness", 1), ("jpeg_compression", 3), ("lighting", 2), ("camera", 1)]
    assert [s.stage for s in shifts] == ["pixel", "pixel", "scene", "scene"]
    assert shift_tag(shifts) == "brightness1+jpeg_compression3+lighting2+camera1"
    assert split_stages(shifts) == ([("brightness", 1), ("jpeg_compression", 3)], [("lighting", 2), ("camera", 1)])
    assert parse_shifts("brightness:1") == [Shift("brightness", 1)] and parse_shifts(None) == []
    assert shift_tag(parse_shifts(["brightness:1", "blur:2"])) == "brightness1+blur2"
    assert shift_tag([]) is None


def test_a_scene_shift_the_task_cannot_render_is_refused_naming_what_it_can():
    with pytest.raises(ShiftError) as err:
        parse_shifts("lighting:2", task="pusht", option="shift")
    assert str(err.value) == ("shift=lighting:2: the pusht task cannot render a lighting shift; "
                              "its scene shifts: colour, camera")
    with pytest.raises(ShiftError, match="give each scene shift once"):
        parse_shifts(["camera:1", "camera:2"], task="lift")
    assert parse_shifts(["brightness:1", "brightness:2"]) == [("brightness", 1), ("brightness", 2)]


def test_obs_corruptor_leaves_scene_shifts_to_the_environment():
    img = np.zeros((8, 8, 3), np.uint8)
    assert obs_corruptor([], ["cam"])({"cam": img})["cam"] is img
    with pytest.raises(ValueError, match="lighting:1: a scene shift is rendered by the environment"):
        obs_corruptor([("brightness", 1), ("lighting", 1)], ["cam"])


def test_the_named_sets_are_shifts_spelt_one_way():
    # the four pixel corruptions the recipes are measured under, and every scene shift a task renders
    assert RECIPE_PIXEL == (("brightness", 1), ("contrast", 2), ("gaussian_noise", 2), ("blur", 2))
    assert [(s.tag, str(s), s.label) for s in RECIPE_PIXEL[2:]] == [("gaussian_noise2", "gaussian_noise:2", "gaussian noise 2"),
                                                                  ("blur2", "blur:2", "blur 2")]
    assert scene_set("pusht", (2,)) == (("colour", 2), ("camera", 2)) and len(scene_set("lift")) == 3 * len(SCENE_KINDS)
    assert [parse_shifts(str(s), task="can") for s in scene_set("can")] == [[s] for s in scene_set("can")]


def test_evaluation_shifts_and_randomised_demonstrations_check_kinds_alike():
    """One check of a scene kind for both parsers: the same refusal, a ShiftError, for a kind the task cannot render."""
    with pytest.raises(ShiftError, match="the pusht task cannot render a lighting shift; its scene shifts: colour, camera"):
        parse_randomised_kinds(["lighting"], 2, "pusht")
    with pytest.raises(ShiftError, match="the pusht task cannot render a lighting shift; its scene shifts: colour, camera"):
        parse_shifts("lighting:2", task="pusht")
    with pytest.raises(ShiftError, match="scene_randomization=blur: not a scene shift"):  # a pixel kind is no scene
        parse_randomised_kinds("blur", 2, "lift")
    assert parse_randomised_kinds("all", 2, "pusht") == (("colour", "camera"), 2) and parse_randomised_kinds([], 2, "lift") is None
    assert ShiftError.__name__ == "ShiftError" and issubclass(ShiftError, ValueError)  # the CLIs print a ValueError's line
