"""Lift and Can end to end at a tiny size: two scripted demos -> hdf5 -> one training step -> one rollout."""
import json

import numpy as np
import pytest
import torch

from core.evaluation import evaluate_checkpoint
from core.training import train
from datasets.describe import describe
from datasets.generate import generate
from envs.shifts import Shift
from tests.helpers import TINY_POLICY, compose


def _two_demos(tmp_path_factory, task):
    out = tmp_path_factory.mktemp(task) / f"{task}.hdf5"
    report = generate(task, 2, out, workers=1, progress=False)
    assert report["episodes"] == 2
    return out


@pytest.fixture(scope="module")
def two_demo_lift(tmp_path_factory):
    return _two_demos(tmp_path_factory, "lift")


def _train_and_roll_out(tmp_path, task, dataset, policy):
    overrides = [f"task={task}", f"policy={policy}", "attention=lookhere", "recipe=none", f"task.dataset.path={dataset}",
                 f"run_dir={tmp_path / 'run'}", "train.steps=1", "train.batch_size=4", "train.warmup_steps=1",
                 "train.val_fraction=0.5", "train.checkpoint_every=1", *TINY_POLICY]
    if policy == "diffusion":
        overrides += ["policy.down_dims=[16,32]", "policy.num_inference_steps=2"]
    result = train(compose(overrides))
    assert result.step == 1
    assert len(result.policy.obs_encoder.vits) == 2  # one ViT per camera by default
    s = evaluate_checkpoint(result.checkpoint, num_episodes=1, max_steps=5, out_dir=tmp_path / "eval", num_videos=1, progress=False)
    assert s["episodes"][0]["steps"] == 5 and s["task"] == task
    assert json.loads((tmp_path / "eval" / "summary.json").read_text())["num_episodes"] == 1
    assert (tmp_path / "eval" / "videos" / "episode_100000.mp4").stat().st_size > 0


def test_generated_lift_file_describes_itself(two_demo_lift):
    info = describe(two_demo_lift)
    assert info["episodes"] == 2
    shapes = {k: v["shape"] for k, v in info["keys"].items()}  # per-frame shapes
    assert shapes["obs/agentview_image"] == [84, 84, 3] and shapes["obs/robot0_eye_in_hand_image"] == [84, 84, 3]
    assert shapes["actions"] == [7]


@pytest.mark.parametrize("policy", ["bc", "diffusion"])
def test_lift_train_step_and_one_episode_rollout(tmp_path, two_demo_lift, policy):
    _train_and_roll_out(tmp_path, "lift", two_demo_lift, policy)


def test_can_generate_train_step_and_rollout(tmp_path, tmp_path_factory):
    dataset = _two_demos(tmp_path_factory, "can")
    assert describe(dataset)["env_name"] == "PickPlaceCan"
    _train_and_roll_out(tmp_path, "can", dataset, "bc")


def test_vision_reliance_is_zero_for_a_policy_that_does_not_look_and_positive_for_one_that_does(tmp_path, two_demo_lift):
    from torch import nn

    from probes.vision_reliance import measure, reliance, swapped

    overrides = ["task=lift", "policy=bc", "attention=full", "recipe=none", f"task.dataset.path={two_demo_lift}",
                 f"run_dir={tmp_path / 'run'}", "train.steps=1", "train.batch_size=4", "train.warmup_steps=1",
                 "train.val_fraction=0.5", "train.checkpoint_every=1", *TINY_POLICY]
    train(compose(overrides))
    looks = measure(tmp_path / "run", 8)
    assert looks["reliance"] > 0 and looks["action_change"] > 0 and looks["action_spread"] > 0
    assert looks["action_error"]["own images"] != looks["action_error"]["swapped images"]

    from policies.checkpoint import load_policy, read_checkpoint_meta
    from probes.action_shift import windows

    policy = load_policy(tmp_path / "run").eval()
    batch = windows(policy, read_checkpoint_meta(tmp_path / "run"), 8)
    key = policy.config.image_keys[0]
    assert np.array_equal(swapped(batch, [key])[key][0], batch[key][4]) and swapped(batch, [key])["action"] is batch["action"]

    class Blind(nn.Module):  # every image gives the same features: the policy acts on its low-dim input alone
        def forward(self, x):
            return torch.zeros(x.shape[0], policy.config.feature_dim)

    policy.obs_encoder.vits = nn.ModuleList(Blind() for _ in policy.obs_encoder.vits)
    blind = reliance(policy, batch)
    assert blind["reliance"] == blind["action_change"] == 0.0 and blind["action_spread"] > 0


def test_action_shift_sees_no_change_without_a_corruption_and_reads_the_rollouts(tmp_path, two_demo_lift):
    from probes.action_shift import correlations, measure, spearman

    overrides = ["task=lift", "policy=bc", "attention=fibottention", "recipe=none", f"task.dataset.path={two_demo_lift}",
                 f"run_dir={tmp_path / 'run'}", "train.steps=1", "train.batch_size=4", "train.warmup_steps=1",
                 "train.val_fraction=0.5", "train.checkpoint_every=1", *TINY_POLICY]
    train(compose(overrides))
    run = tmp_path / "run"
    same = measure(run, 6, Shift("brightness", 0))  # severity 0: the frames unchanged
    assert same["action_change"] == same["action_bias"] == same["gripper_flips"] == same["feature_change"] == 0.0
    assert same["action_error"]["clean"] == same["action_error"]["corrupted"] > 0 and same["rollout_success"] is None
    (run / "eval" / "contrast2").mkdir(parents=True)  # where the robustness study's setting contrast2 writes it
    (run / "eval" / "contrast2" / "summary.json").write_text(json.dumps({"success_rate": 0.4}))
    moved = measure(run, 6, Shift("contrast", 2))
    # a summary that does not say it evaluates these weights is not counted
    assert moved["action_change"] > 0 and moved["feature_change"] > 0 and moved["rollout_success"] is None
    evaluated = evaluate_checkpoint(run, num_episodes=2, max_steps=2, corruption="contrast:2", progress=False, num_videos=0,
                                    out_dir=run / "eval" / "contrast2", overwrite=True)
    assert measure(run, 6, Shift("contrast", 2))["rollout_success"] == evaluated["success_rate"]
    assert spearman([1, 2, 3, 4], [8, 6, 4, 2]) == pytest.approx(-1.0) and spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(0.866, abs=1e-3)
    assert correlations([moved, moved]) == {}  # fewer than 3 checkpoints with rollouts: no correlation
