"""Scene shifts rendered by the simulator (``envs/scene_shifts.py``): the frames change, the episode's state
does not, the same seed draws the same scene, and the clean scene comes back exactly after a shifted episode."""
import os

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from envs.shifts import ShiftError  # noqa: E402
from envs.factory import EnvPool, env_kwargs_from_task  # noqa: E402

SEED = 100_003
ACTIONS = np.random.default_rng(0).uniform(-1, 1, (3, 7)).astype(np.float32)


def _episode(env, seed, actions, key):
    """(frames, states) of a reset and a few steps."""
    obs, _ = env.reset(seed=seed)
    frames, states = [obs[key]], [env.get_state()]
    for action in actions:
        obs, *_ = env.step(action)
        frames.append(obs[key])
        states.append(env.get_state())
    return frames, states


def _check_shift(env, shifts, actions, key):
    clean_frames, clean_states = _episode(env, SEED, actions, key)
    env.set_scene_shifts(shifts)
    frames, states = _episode(env, SEED, actions, key)
    assert all(np.array_equal(a, b) for a, b in zip(states, clean_states))  # same start, same physics
    assert all(np.abs(a.astype(int) - b).mean() > 0.5 for a, b in zip(frames, clean_frames))  # every frame shifted
    assert np.array_equal(_episode(env, SEED, actions[:0], key)[0][0], frames[0])  # the seed draws the scene
    env.set_scene_shifts([])
    assert np.array_equal(_episode(env, SEED, actions[:0], key)[0][0], clean_frames[0])  # clean again, pixel for pixel


@pytest.fixture(scope="module")
def lift_env():
    from envs.robosuite_tasks import RobosuiteEnv

    env = RobosuiteEnv("lift", cameras=("agentview",), image_size=84)
    yield env
    env.close()


@pytest.mark.parametrize("kind", ["lighting", "colour", "camera"])
def test_lift_scene_shift_changes_frames_not_the_episode_and_leaves_nothing_behind(lift_env, kind):
    _check_shift(lift_env, [(kind, 2)], ACTIONS, "agentview_image")


def test_lift_severity_and_seed_choose_the_scene(lift_env):
    def first_frame(shifts, seed):
        lift_env.set_scene_shifts(shifts)
        return lift_env.reset(seed=seed)[0]["agentview_image"].astype(int)

    clean = first_frame([], SEED)
    moved = [np.abs(first_frame([("camera", s)], SEED) - clean).mean() for s in (1, 2, 3)]
    assert moved[0] < moved[1] < moved[2]  # 5 mm, 15 mm, 4 cm
    assert not np.array_equal(first_frame([("colour", 2)], SEED), first_frame([("colour", 2)], SEED + 1))
    lift_env.set_scene_shifts([("camera", 3)])
    with pytest.raises(ValueError, match=r"a camera shift is drawn from the episode's seed: give reset\(seed=...\)"):
        lift_env.reset()
    assert np.array_equal(first_frame([], SEED), clean)


def test_can_renders_all_three_at_once_and_restores():
    from envs.robosuite_tasks import RobosuiteEnv

    env = RobosuiteEnv("can", cameras=("agentview",), image_size=84)
    try:
        _check_shift(env, ["lighting:1", "colour:3", "camera:1"], ACTIONS[:1], "agentview_image")
    finally:
        env.close()


def test_pusht_colour_and_camera_through_its_own_drawing():
    from envs.pusht import PushTEnv, PushTScene

    env = PushTEnv(image_size=96)
    actions = np.array([[200.0, 300.0], [220.0, 310.0]], dtype=np.float32)
    try:
        for kind in ("colour", "camera"):
            _check_shift(env, [(kind, 1)], actions, "image")
        gym_env = env.unwrapped_pusht  # the default scene, drawn by our drawing, is gym-pusht's drawing
        ours = gym_env.__class__.__mro__[1]._draw(gym_env)
        gym_env.scene = PushTScene()
        import pygame

        assert np.array_equal(pygame.surfarray.pixels3d(gym_env._draw()), pygame.surfarray.pixels3d(ours))
        gym_env.scene = None
    finally:
        env.close()


def test_a_kind_the_task_cannot_render_is_refused_in_one_line():
    from envs.pusht import PushTEnv

    with pytest.raises(ShiftError) as err:
        PushTEnv(scene_shifts=[("lighting", 1)])
    assert str(err.value) == ("scene_shifts=lighting:1: the pusht task cannot render a lighting shift; "
                              "its scene shifts: colour, camera")
    with pytest.raises(ShiftError, match="brightness:1: a pixel corruption applies to observations"):
        PushTEnv(scene_shifts=["brightness:1"])


def test_a_worker_applies_the_shift_it_is_sent():
    """The pool's message carries the shift; a worker's frame is the one an environment here renders."""
    from types import SimpleNamespace

    from envs.pusht import PushTEnv

    task = SimpleNamespace(name="pusht", env=SimpleNamespace(max_episode_steps=5))
    kwargs = env_kwargs_from_task(task, ["image"], scene_shifts=[("colour", 2)])
    assert kwargs == {"max_episode_steps": 5, "scene_shifts": (("colour", 2),)}
    here = PushTEnv(**kwargs)
    expected = here.reset(seed=SEED)[0]["image"]
    with EnvPool("pusht", env_kwargs_from_task(task, ["image"]), workers=1) as pool:
        worker = pool.envs[0]
        worker.send("scene_shifts", [("colour", 2)])
        worker.recv()
        worker.send("reset", SEED)
        assert np.array_equal(worker.recv()["image"], expected)
        worker.send("scene_shifts", ["lighting:1"])
        with pytest.raises(Exception, match="cannot render a lighting shift"):
            worker.recv()
    here.close()
