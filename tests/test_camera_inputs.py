"""Camera-aware inputs and camera dropout: the pose each frame was rendered from, drawn as a ray map that
moves with the camera and is cropped and moved with its image; a learned "absent" camera in training only;
both through a checkpoint and a rollout, for BC and diffusion. And the geometric augmentation's affine warp."""
import json

import numpy as np

import pytest
import torch

from common.camera_pose import POSE_DIM, RAY_CHANNELS, pose_key, ray_map
from core.evaluation import evaluate_checkpoint
from core.training import train
from datasets.generate import generate
from envs.robosuite_tasks import RobosuiteEnv
from envs.scene_shifts import SceneRandomization
from policies.checkpoint import load_policy
from policies.obs_encoder import ImageAugConfig
from tests.helpers import TINY_DIFFUSION, TINY_POLICY, compose
from tests.test_encoders import encoder_inputs, policy_and_batch

SIZE = 32  # the tiny demonstrations' frames
CAMERA = "agentview_image"
POSE = pose_key(CAMERA)
SHIFT = 2


def red_centroid(image: np.ndarray) -> tuple[float, float]:
    """Where Lift's red cube is in an upright frame: the mean (row, column) of its pixels."""
    rows, cols = np.nonzero((image[..., 0] > 150) & (image[..., 1] < 100) & (image[..., 2] < 100))
    assert len(rows) > 3, "the cube is in view"
    return rows.mean(), cols.mean()


def ray_pixel(pose: np.ndarray, target: np.ndarray, size: int) -> tuple[int, int]:
    """The pixel whose ray points most nearly at ``target`` (world)."""
    d = ray_map(torch.from_numpy(pose)[None], size, size)[0, :3].permute(1, 2, 0).reshape(-1, 3).numpy()  # (H*W, 3)
    v = (target - pose[:3]) / np.linalg.norm(target - pose[:3])
    return divmod(int(np.argmax(d @ v)), size)


def cube_seen_and_aimed_at(env, seed: int):
    """(the red cube's centroid in the frame, the pixel whose ray points at the cube's centre, the pose)."""
    obs, _ = env.reset(seed=seed)
    sim = env.unwrapped_robosuite.sim
    cube = sim.data.body_xpos[sim.model.body_name2id("cube_main")]
    return np.array(red_centroid(obs[CAMERA])), np.array(ray_pixel(obs[POSE], cube, 84)), obs


@pytest.mark.parametrize("severity", [2, 3])
def test_the_ray_map_moves_with_the_camera_and_points_at_what_each_pixel_shows(severity):
    env = RobosuiteEnv("lift", cameras=("agentview",), image_size=84, camera_poses=True)
    # a bumped camera nobody recalibrated: the frame moves, the reported pose does not
    bumped = RobosuiteEnv("lift", cameras=("agentview",), image_size=84, nominal_camera_pose=True,
                          scene_shifts=[("camera", severity)])
    try:
        seen, aimed, clean = cube_seen_and_aimed_at(env, 5)
        env.set_scene_shifts([("camera", severity)])
        seen_s, aimed_s, shifted = cube_seen_and_aimed_at(env, 5)
        obs_b, _ = bumped.reset(seed=5)
    finally:
        env.close()
        bumped.close()
    # the cube's centre lies a little below its visible top face
    assert np.abs(aimed - seen).max() <= 3 and np.abs(aimed_s - seen_s).max() <= 3, (aimed, seen, aimed_s, seen_s)
    assert np.abs(seen_s - seen).max() >= 2, "the camera move moves the cube in the frame"
    assert np.abs((aimed_s - aimed) - (seen_s - seen)).max() <= 1.5, "and the ray map follows it"
    assert np.abs(shifted[POSE] - clean[POSE]).max() > 1e-3, "the pose is the one that rendered the frame"
    assert np.array_equal(obs_b[POSE], clean[POSE]) and np.array_equal(obs_b[CAMERA], shifted[CAMERA])


def test_a_ray_map_is_unit_directions_and_their_moments_and_its_centre_looks_along_the_camera():
    rot = np.eye(3)  # MuJoCo's camera frame: looking along -z
    pose = torch.from_numpy(np.concatenate([[1.0, 2.0, 3.0], rot.ravel(), [45.0]]).astype(np.float32))[None]
    rays = ray_map(pose, 8, 8)[0]  # (6, 8, 8)
    d, m = rays[:3], rays[3:]
    torch.testing.assert_close(d.norm(dim=0), torch.ones(8, 8))
    torch.testing.assert_close((d * m).sum(dim=0), torch.zeros(8, 8), atol=1e-5, rtol=0)  # a moment is normal to its ray
    centre = d[:, 3:5, 3:5].mean(dim=(1, 2))
    torch.testing.assert_close(centre / centre.norm(), torch.tensor([0.0, 0.0, -1.0]), atol=1e-6, rtol=0)
    assert d[1, 0, 4] > 0 > d[1, 7, 4] and d[0, 4, 0] < 0 < d[0, 4, 7]  # row 0 is up, column 0 is left
    # the half-angle to the top edge's pixel centres is just under half the field of view
    assert abs(np.degrees(np.arctan2(d[1, 0].mean().item(), -d[2, 0].mean().item())) - 22.5 * 7 / 8) < 0.5


@pytest.fixture(scope="module")
def camera_demos(tmp_path_factory):
    """Two Lift demonstrations at 32 px under randomised camera poses (the poses recorded beside the frames)."""
    out = tmp_path_factory.mktemp("camera") / "lift.hdf5"
    generate("lift", 2, out, progress=False, image_size=SIZE, scene_randomization=SceneRandomization(("camera",), 3))
    return out


def camera_overrides(tmp_path, dataset, policy: str, extra=()) -> list[str]:
    out = [f"task=lift", f"policy={policy}", "attention=full", "recipe=none", f"task.dataset.path={dataset}",
           f"task.input_shapes.{CAMERA}=[3,{SIZE},{SIZE}]", f"task.input_shapes.robot0_eye_in_hand_image=[3,{SIZE},{SIZE}]",
           f"+task.input_shapes.{POSE}=[{POSE_DIM}]", f"+task.input_shapes.robot0_eye_in_hand_camera=[{POSE_DIM}]",
           "task.crop_size=24", "policy.ray_maps=true", f"run_dir={tmp_path / 'run'}", "train.steps=2",
           "train.batch_size=4", "train.warmup_steps=1", "train.val_fraction=0.5", "train.checkpoint_every=2", *TINY_POLICY]
    return out + (TINY_DIFFUSION if policy == "diffusion" else []) + list(extra)


def test_demonstrations_under_drawn_cameras_record_each_frames_pose(camera_demos):
    from datasets.robomimic_hdf5 import read_robomimic_hdf5

    data = read_robomimic_hdf5(camera_demos, obs_keys=[CAMERA, POSE])
    poses = data.data[POSE]
    assert poses.shape[1:] == (POSE_DIM,)
    first = [0, int(data.episode_ends[0])]
    assert np.abs(poses[first[0]] - poses[first[1]]).max() > 1e-3, "each episode its own camera"
    assert np.array_equal(poses[first[0]], poses[first[0] + 1]), "and it stays put within the episode"


def test_the_ray_map_is_cropped_and_moved_with_its_image(tmp_path, camera_demos):
    cfg = compose(camera_overrides(tmp_path, camera_demos, "bc", [f"policy.image_aug.shift={SHIFT}"]))
    policy, batch = policy_and_batch(cfg)
    steps = policy.obs_encoder.image_steps
    frames = batch[CAMERA][:, -steps:].flatten(0, 1).permute(0, 3, 1, 2).float() / 255.0  # (B*To, 3, H, W)
    rays = ray_map(batch[POSE][:, -steps:].flatten(0, 1), SIZE, SIZE)  # (B*To, 6, H, W)
    full = torch.cat([frames, rays], dim=1)
    seen = encoder_inputs(policy, batch, train_mode=False)  # evaluation: the centre crop of both
    assert seen.shape[1] == 3 + RAY_CHANNELS
    torch.testing.assert_close(seen, full[:, :, 4:28, 4:28])
    # training: the shift moves image and rays alike (the crop is the whole frame here, so any move is the shift's)
    cfg = compose(camera_overrides(tmp_path, camera_demos, "bc", [f"policy.image_aug.shift={SHIFT}", f"task.crop_size={SIZE}"]))
    policy, _ = policy_and_batch(cfg)
    torch.manual_seed(0)
    seen = encoder_inputs(policy, batch, train_mode=True)
    padded = torch.nn.functional.pad(full, (SHIFT,) * 4, mode="replicate")
    moved = set()
    for x, source in zip(seen, padded):
        hits = [(dy, dx) for dy in range(2 * SHIFT + 1) for dx in range(2 * SHIFT + 1)
                if torch.equal(x[:3], source[:3, dy:dy + SIZE, dx:dx + SIZE])]
        assert hits, "the image is the frame moved by at most the shift"
        assert any(torch.equal(x[3:], source[3:, dy:dy + SIZE, dx:dx + SIZE]) for dy, dx in hits), "its rays moved alike"
        moved.add(hits[0])
    assert len(moved) > 1, "each image a move of its own"


def test_camera_dropout_replaces_a_cameras_features_in_training_only(tmp_path, camera_demos):
    cfg = compose(camera_overrides(tmp_path, camera_demos, "bc", ["policy.camera_dropout=0.5"]))
    policy, batch = policy_and_batch(cfg, n=8)
    enc = policy.obs_encoder
    with torch.no_grad():
        enc.absent.copy_(torch.full_like(enc.absent, 7.0))  # a value no encoder outputs
    obs = {k: batch[k] for k in policy.config.input_shapes}
    width = enc.image_steps * policy.config.feature_dim
    enc.eval()
    with torch.no_grad():
        evaluation = [enc(obs) for _ in range(3)]
    assert all(torch.equal(e, evaluation[0]) for e in evaluation) and not (evaluation[0] == 7.0).any()
    enc.train()
    torch.manual_seed(0)
    with torch.no_grad():
        trained = torch.cat([enc(obs) for _ in range(20)])  # (20 * B, output_dim)
    for camera in range(2):
        block = trained[:, camera * width:(camera + 1) * width]
        dropped = (block == 7.0).all(dim=1)
        assert 0.3 < dropped.float().mean() < 0.7, "about half the samples, each on its own"
        kept = ~dropped & ~(block == 7.0).any(dim=1)
        assert bool((dropped | kept).all()), "a camera is dropped whole or not at all"


@pytest.mark.parametrize("policy_name", ["bc", "diffusion"])
def test_a_camera_aware_policy_trains_keeps_its_actions_through_a_checkpoint_and_rolls_out(tmp_path, camera_demos,
                                                                                         policy_name):
    # without the EMA the checkpoint holds the very weights the run ended with
    cfg = compose(camera_overrides(tmp_path, camera_demos, policy_name, ["policy.camera_dropout=0.3", "train.ema=false"]))
    result = train(cfg)
    loaded = load_policy(result.checkpoint)
    assert loaded.config.ray_maps and loaded.config.camera_dropout == 0.3
    _, batch = policy_and_batch(cfg)
    obs = {k: batch[k] for k in cfg.policy.input_shapes}
    actions = []
    for policy in (result.policy, loaded):
        policy.eval()
        torch.manual_seed(3)  # diffusion's noise
        actions.append(policy.predict_action_chunk(obs))
    torch.testing.assert_close(actions[0], actions[1], rtol=0, atol=0)
    # the pose changes the action: the rays are read
    moved = obs[POSE].clone()
    moved[..., 0] += 0.05  # the camera 5 cm to the side
    other = dict(obs, **{POSE: moved})
    torch.manual_seed(3)
    assert not torch.equal(loaded.predict_action_chunk(other), actions[1])
    runs = {pose: evaluate_checkpoint(result.checkpoint, num_episodes=1, max_steps=3, out_dir=tmp_path / f"eval_{pose}",
                                      progress=False, corruption="camera:2", camera_pose=pose)
            for pose in (None, "nominal")}
    assert all(s["episodes"][0]["steps"] == 3 for s in runs.values())
    # the two answer different questions: told the moved pose, or the one before the bump
    assert runs[None]["identity"] != runs["nominal"]["identity"]


def test_the_nominal_pose_is_refused_for_a_policy_that_reads_no_pose_and_for_an_unknown_value(tmp_path, camera_demos):
    from core.inference import OverrideError

    cfg = compose([o for o in camera_overrides(tmp_path, camera_demos, "bc")
                   if "_camera=" not in o and "ray_maps" not in o])
    last = train(cfg).checkpoint
    with pytest.raises(OverrideError, match=r"camera_pose=nominal applies to camera-aware policies .* drop camera_pose="):
        evaluate_checkpoint(last, num_episodes=1, max_steps=2, progress=False, camera_pose="nominal")
    with pytest.raises(ValueError, match=r"camera_pose='fixed': give camera_pose=nominal"):
        evaluate_checkpoint(last, num_episodes=1, max_steps=2, progress=False, camera_pose="fixed")


def test_a_ray_map_needs_each_cameras_pose_and_dropout_is_a_probability(tmp_path, camera_demos):
    base = camera_overrides(tmp_path, camera_demos, "bc")
    with pytest.raises(ValueError, match=r"does not read robot0_eye_in_hand_camera: add \+task.input_shapes."
                                         r"robot0_eye_in_hand_camera=\[13\]") as err:
        compose([o for o in base if "robot0_eye_in_hand_camera" not in o])
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"policy.camera_dropout must be in \[0, 1\)"):
        compose(base + ["policy.camera_dropout=1.0"])


def test_the_affine_warp_turns_zooms_and_moves_each_image_on_its_own_with_the_chosen_probability():
    aug = ImageAugConfig(shift=3, rotate=4.0, scale=0.05, geometric_p=0.5)
    move = aug.geometric_transform(32)
    x = torch.rand(64, 9, 32, 32)  # an image and a ray map below it
    torch.manual_seed(0)
    out = torch.stack([move(img) for img in x])
    unchanged = torch.tensor([torch.equal(a, b) for a, b in zip(out, x)])
    assert 0.3 < unchanged.float().mean() < 0.7, "about half the images are left as rendered"
    assert out.shape == x.shape
    assert ImageAugConfig(shift=3).geometric_transform(32).__class__.__name__ == "RandomCrop"  # DrQ's shift as before
    with pytest.raises(ValueError, match=r"policy.image_aug.rotate must be in \[0, 45\)"):
        ImageAugConfig(rotate=50)
    with pytest.raises(ValueError, match=r"geometric_p must be a probability"):
        ImageAugConfig(shift=2, geometric_p=1.5)


def test_proprioception_only_demonstrations_train_and_roll_out_a_policy_without_a_camera(tmp_path):
    """The blind floor's data: no frame rendered, the environment's metadata says so, and a policy that reads
    no camera trains on it and rolls out."""
    from datasets.describe import describe

    out = tmp_path / "blind.hdf5"
    generate("lift", 2, out, progress=False, cameras=())
    keys = describe(out)["keys"]
    assert not [k for k in keys if k.endswith("_image")] and "obs/robot0_eef_pos" in keys
    blind = ["task=lift", "policy=bc", "recipe=none", f"task.dataset.path={out}", f"task.input_shapes.{CAMERA}=null",
             "task.input_shapes.robot0_eye_in_hand_image=null", f"run_dir={tmp_path / 'run'}", "train.steps=2",
             "train.batch_size=4", "train.warmup_steps=1", "train.val_fraction=0.5", "train.checkpoint_every=2", *TINY_POLICY]
    result = train(compose(blind))
    assert result.policy.config.image_keys == []
    s = evaluate_checkpoint(result.checkpoint, num_episodes=1, max_steps=3, progress=False, corruption="camera:2")
    assert s["episodes"][0]["steps"] == 3
    from probes.vision_reliance import measure

    probe = measure(result.checkpoint, frames=4)
    assert probe["reliance"] == 0.0 and probe["action_spread"] > 0  # it acts, and no image moves its action
    # --into-run: the value lands in the run, naming the weights the evaluation above rolled out
    from probes.vision_reliance import main as probe_main

    probe_main([str(tmp_path / "run"), "--frames", "4", "--into-run"])
    written = json.loads((tmp_path / "run" / "eval" / "vision_reliance.json").read_text())
    assert written["reliance"] == 0.0 and written["weights_sha256"] == s["identity"]["weights_sha256"]
    assert written["checkpoint_step"] == s["identity"]["checkpoint_step"] == 2
    (tmp_path / "run" / "eval" / "vision_reliance.json").unlink()
    (tmp_path / "elsewhere.json").write_text("{}")
    (tmp_path / "run" / "eval" / "vision_reliance.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(SystemExit, match="symbolic link"):  # a link inside a run is never followed, never written through
        probe_main([str(tmp_path / "run"), "--frames", "4", "--into-run"])
    assert (tmp_path / "elsewhere.json").read_text() == "{}"
    with pytest.raises(ValueError, match=r"cameras= applies to lift and can"):
        generate("pusht", 1, tmp_path / "p.zarr", progress=False, cameras=())


def test_fine_tuning_starts_from_another_runs_weights_and_refuses_another_shape(tmp_path, tiny_pusht_zarr):
    from tests.helpers import tiny_overrides

    donor = train(compose(tiny_overrides(tmp_path / "a", tiny_pusht_zarr, "bc", extra=["train.ema=false"])))
    # a learning rate too small to move a weight: what the run ends with is what it started from
    tuned = train(compose(tiny_overrides(tmp_path / "b", tiny_pusht_zarr, "bc", extra=[
        "train.ema=false", "train.steps=1", "train.lr=1e-12", f"train.init_from={tmp_path / 'a' / 'run'}",
        "policy.image_aug.shift=2"])))
    theirs, mine = donor.policy.state_dict(), tuned.policy.state_dict()
    assert mine.keys() == theirs.keys()
    for k in theirs:
        torch.testing.assert_close(mine[k], theirs[k], rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match=r"train.init_from=.*differs from this one in \d+ tensor\(s\)") as err:
        train(compose(tiny_overrides(tmp_path / "c", tiny_pusht_zarr, "bc", extra=[
            f"train.init_from={tmp_path / 'a' / 'run'}", "policy.vit.dim=48"])))
    assert "\n" not in str(err.value)
