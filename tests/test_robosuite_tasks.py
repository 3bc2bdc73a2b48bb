import os

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np
import pytest

from envs.robosuite_tasks import RobosuiteEnv, SimulationError, convert_env_meta_v14

# robomimic's public v1.4 datasets store robosuite 1.4 metadata like this (arm-only OSC_POSE config)
ENV_META_V14 = {
    "env_name": "Lift",
    "env_version": "1.4.1",
    "type": 1,
    "env_kwargs": {
        "has_renderer": False,
        "has_offscreen_renderer": True,
        "ignore_done": True,
        "use_object_obs": True,
        "use_camera_obs": True,
        "control_freq": 20,
        "controller_configs": {
            "type": "OSC_POSE",
            "input_max": 1,
            "input_min": -1,
            "output_max": [0.05, 0.05, 0.05, 0.5, 0.5, 0.5],
            "output_min": [-0.05, -0.05, -0.05, -0.5, -0.5, -0.5],
            "kp": 150,
            "damping": 1,
            "impedance_mode": "fixed",
            "kp_limits": [0, 300],
            "damping_limits": [0, 10],
            "position_limits": None,
            "orientation_limits": None,
            "uncouple_pos_ori": True,
            "control_delta": True,
            "interpolation": None,
            "ramp_ratio": 0.2,
        },
        "robots": ["Panda"],
        "camera_depths": False,
        "camera_heights": 84,
        "camera_widths": 84,
        "camera_names": ["agentview", "robot0_eye_in_hand"],
        "render_gpu_device_id": 0,
        "reward_shaping": False,
    },
}


@pytest.fixture(scope="module")
def lift_env():
    env = RobosuiteEnv("lift", cameras=("agentview", "robot0_eye_in_hand"), image_size=32)
    yield env
    env.close()


def _check_obs(env, obs):
    assert set(obs) == set(env.observation_space.spaces)
    for key, space in env.observation_space.spaces.items():
        assert obs[key].shape == space.shape, key
        assert obs[key].dtype == space.dtype, key
    assert env.observation_space.contains(obs)


def test_observations_match_space(lift_env):
    env = lift_env
    assert set(env.observation_space.spaces) == {
        "agentview_image", "robot0_eye_in_hand_image", "robot0_eef_pos", "robot0_eef_quat",
        "robot0_gripper_qpos", "object",
    }
    assert env.observation_space["agentview_image"].shape == (32, 32, 3)
    assert env.observation_space["object"].shape == (10,)
    assert env.action_space.shape == (7,)
    obs, info = env.reset(seed=0)
    _check_obs(env, obs)
    assert info == {"success": False, "reward": 0.0}
    obs, reward, terminated, truncated, info = env.step(np.zeros(7, dtype=np.float32))
    _check_obs(env, obs)
    assert isinstance(info["success"], bool) and info["reward"] == reward
    assert not terminated and not truncated


def test_images_are_upright(lift_env):
    env = lift_env
    obs, _ = env.reset(seed=1)
    raw = env.unwrapped_robosuite.sim.render(camera_name="agentview", width=32, height=32)
    np.testing.assert_array_equal(obs["agentview_image"], raw[::-1])
    assert not np.array_equal(obs["agentview_image"], raw)
    np.testing.assert_array_equal(env.render(), obs["agentview_image"])
    assert env.render(size=48).shape == (48, 48, 3)


def test_frames_do_not_depend_on_other_environments_in_the_process(lift_env):
    """robosuite renders in the current GL context: another environment built, then closed, in the
    same process must not change this one's frames (it turned them nearly black)."""
    before = lift_env.reset(seed=2)[0]["agentview_image"]
    other = RobosuiteEnv("can", cameras=("agentview",), image_size=32)
    np.testing.assert_array_equal(lift_env.reset(seed=2)[0]["agentview_image"], before)
    other.close()
    np.testing.assert_array_equal(lift_env.reset(seed=2)[0]["agentview_image"], before)
    assert before.mean() > 50  # a lit scene, not an empty frame


def test_seeded_reset_state_round_trip_and_meta(lift_env):
    env = lift_env
    a, _ = env.reset(seed=3)
    state = env.get_state()
    b, _ = env.reset(seed=3)
    np.testing.assert_array_equal(a["object"], b["object"])
    c, _ = env.reset(seed=4)
    assert not np.allclose(a["object"], c["object"])
    d = env.reset_to(state)
    np.testing.assert_allclose(d["object"], a["object"], atol=1e-6)
    np.testing.assert_array_equal(env.get_state(), state)
    # stored states reproduce the recorded observations exactly (images included)
    env.reset(seed=5)
    for _ in range(3):
        obs, *_ = env.step(np.r_[0.3, -0.2, -0.5, 0, 0, 0.1, 1.0])
    state = env.get_state()
    again = env.reset_to(state)
    for key in obs:
        np.testing.assert_array_equal(again[key], obs[key], err_msg=key)
    meta = env.env_meta()
    assert meta["env_name"] == "Lift" and meta["type"] == 1
    assert meta["env_kwargs"]["camera_names"] == ["agentview", "robot0_eye_in_hand"]
    assert meta["env_kwargs"]["camera_heights"] == 32


def test_truncation_and_simulation_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MuJoCo appends its instability warning to ./MUJOCO_LOG.TXT
    env = RobosuiteEnv("lift", cameras=(), max_episode_steps=2)
    assert "agentview_image" not in env.observation_space.spaces
    env.reset(seed=0)
    zero = np.zeros(7)
    assert env.step(zero)[3] is False
    assert env.step(zero)[3] is True  # truncated at max_episode_steps
    with pytest.raises(RuntimeError, match="reset"):
        env.step(zero)
    env.reset(seed=0)
    env.unwrapped_robosuite.sim.data.qvel[0] = np.nan
    with pytest.raises(SimulationError):
        env.step(zero)
    env.close()


@pytest.mark.parametrize("task", ["lift", "can"])
def test_expert_succeeds(task):
    if task == "lift":
        from envs.experts.lift import collect_episode
    else:
        from envs.experts.can import collect_episode
    for seed in (0, 1):
        ep = collect_episode(seed, cameras=())
        assert ep is not None, f"{task} expert failed on seed {seed}"
        T = ep["info"]["steps"]
        assert ep["actions"].shape == (T, 7) and ep["actions"].dtype == np.float32
        assert np.all(np.abs(ep["actions"]) <= 1.0)
        assert ep["states"].shape[0] == T and ep["states"].dtype == np.float64
        assert ep["rewards"].shape == (T,) and ep["rewards"][-1] == 1.0
        assert ep["dones"].shape == (T,) and ep["dones"][-1] == 1
        assert set(ep["obs"]) == {"robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos", "object"}
        assert all(v.shape[0] == T for v in ep["next_obs"].values())
        np.testing.assert_array_equal(ep["obs"]["object"][1:], ep["next_obs"]["object"][:-1])
        assert ep["model_file"].lstrip().startswith("<mujoco")
        assert ep["info"]["seed"] == seed


def test_convert_env_meta_v14_builds_env():
    meta = convert_env_meta_v14(ENV_META_V14)
    assert ENV_META_V14["env_kwargs"]["controller_configs"]["type"] == "OSC_POSE"  # input not modified
    cfg = meta["env_kwargs"]["controller_configs"]
    assert cfg["type"] == "BASIC"
    arm = cfg["body_parts"]["right"]
    assert arm["type"] == "OSC_POSE" and arm["gripper"] == {"type": "GRIP"}
    assert arm["damping_ratio"] == 1 and arm["damping_ratio_limits"] == [0, 10] and arm["input_type"] == "delta"
    assert "damping" not in arm and "control_delta" not in arm
    assert convert_env_meta_v14(meta) == meta  # idempotent on 1.5 metadata

    env = RobosuiteEnv.from_env_meta(meta, cameras=())
    assert env.env_name == "Lift" and env.image_size == 84
    controller = env.unwrapped_robosuite.robots[0].composite_controller.part_controllers["right"]
    assert type(controller).__name__ == "OperationalSpaceController"
    assert controller.input_type == "delta" and np.allclose(controller.kp, 150)
    env.reset(seed=0)
    obs, *_ = env.step(np.r_[0, 0, 1.0, 0, 0, 0, -1])
    assert obs["robot0_eef_pos"].shape == (3,)
    env.close()


def _python_in_repo(probe: str):
    """Run ``probe`` in a fresh interpreter at the repository root: what a pool worker or a new command sees."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", "import os; os.environ.setdefault('MUJOCO_GL', 'egl'); " + probe],
                          capture_output=True, text=True, check=True, cwd=os.path.dirname(os.path.dirname(__file__)))


@pytest.fixture(scope="module")
def two_fresh_processes():
    """Two fresh interpreters that each import the package, build a Lift environment, reset, print what they
    built and close it (one interpreter start costs seconds: both tests below read these two)."""
    probe = ("from envs.robosuite_tasks import RobosuiteEnv; e = RobosuiteEnv('lift', cameras=()); "
             "o = e.reset(seed=100000)[0]; m = e._env.sim.model; "
             "print(repr(m.geom_size[m.geom_name2id('cube_g0')].round(6).tolist() + o['object'][:3].round(6).tolist())); "
             "e.close(); print('built')")
    return [_python_in_repo(probe) for _ in range(2)]


def test_every_process_builds_the_same_lift_cube_so_a_seed_means_one_initial_state(two_fresh_processes):
    """robosuite draws the cube's size when it builds the model: two builds (two processes, two pool workers,
    a clean run and its shifted pair) must draw the same one, or one episode seed starts two different scenes."""
    runs = [run.stdout.strip().splitlines()[-2] for run in two_fresh_processes]
    assert runs[0] == runs[1]


def test_a_process_that_builds_an_environment_prints_no_robosuite_warnings(two_fresh_processes):
    """robosuite warns at import (no private macro file, optional robot packages) and at every build; each
    generation or rollout worker repeated them, burying the progress bar and any real error."""
    for run in two_fresh_processes:
        assert run.stdout.strip().endswith("built")
        assert "[robosuite WARNING]" not in run.stderr, run.stderr
