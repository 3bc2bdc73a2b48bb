"""train_policy.train on tiny synthetic data: finite losses, checkpoints, resume."""
import json

import pytest
import torch
from safetensors.torch import load_file

from datasets.factory import make_dataset
from datasets.sampler import SequenceDataset, compute_stats
from policies.base import POLICIES, get_policy_class, make_policy, policy_from_cfg
from policies.checkpoint import load_policy, load_training_state, read_checkpoint_meta
from tests.conftest import ATTENTIONS, tiny_train_cfg
from train_policy import train

POLICY_NAMES = ["diffusion", "bc"]


def _batch(cfg, n=4):
    data = make_dataset(cfg["task"])
    name, pc = policy_from_cfg(cfg)
    ds = SequenceDataset(data, list(pc.input_shapes), n_obs_steps=pc.n_obs_steps, horizon=pc.horizon, n_action_steps=pc.n_action_steps)
    batch = torch.utils.data.default_collate([ds[i] for i in range(n)])
    policy = make_policy(name, pc, compute_stats(data, pc.lowdim_keys + ["action"]))
    return policy, batch


@pytest.mark.parametrize("policy_name", POLICY_NAMES)
@pytest.mark.parametrize("attention", ATTENTIONS)
def test_one_training_step_is_finite_and_updates_parameters(tmp_path, tiny_pusht_zarr, policy_name, attention):
    torch.manual_seed(0)
    cfg = tiny_train_cfg(tmp_path, tiny_pusht_zarr, policy_name, attention)
    policy, batch = _batch(cfg)
    before = {k: v.clone() for k, v in policy.named_parameters()}
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    loss, info = policy.compute_loss(batch)
    assert torch.isfinite(loss) and loss.item() > 0
    opt.zero_grad()
    loss.backward()
    opt.step()
    vit_params = [k for k in before if k.startswith("obs_encoder.vits")]
    assert vit_params
    changed = [k for k, v in policy.named_parameters() if not torch.equal(v, before[k])]
    assert set(vit_params) <= set(changed), "the visual encoder must be trained end to end"


@pytest.mark.parametrize("policy_name", POLICY_NAMES)
def test_train_checkpoint_load_gives_identical_actions(tmp_path, tiny_pusht_zarr, policy_name):
    cfg = tiny_train_cfg(tmp_path, tiny_pusht_zarr, policy_name, "lookhere")
    last = train(cfg).checkpoint
    meta = read_checkpoint_meta(last)
    assert meta["policy"] == policy_name and meta["cfg"]["attention"]["kind"] == "lookhere"
    state = load_file(str(last / "model.safetensors"))
    assert "normalizer.action__min" in state and torch.isfinite(state["normalizer.action__max"]).all()
    a, b = load_policy(last), load_policy(last)
    _, batch = _batch(cfg, 2)
    obs = {k: batch[k] for k in a.config.input_shapes}
    torch.manual_seed(3)
    out_a = a.predict_action_chunk(obs)
    torch.manual_seed(3)
    out_b = b.predict_action_chunk(obs)
    assert out_a.shape == (2, a.config.n_action_steps, 2)
    torch.testing.assert_close(out_a, out_b, rtol=0, atol=0)
    assert (tmp_path / "run" / "tb").is_dir()


def test_resume_continues_the_step_count(tmp_path, tiny_pusht_zarr, capsys):
    cfg = tiny_train_cfg(tmp_path, tiny_pusht_zarr)
    train(cfg)
    first = load_training_state(tmp_path / "run" / "checkpoints" / "last")
    assert first["step"] == 2
    assert first["train_seconds"] > 0
    with pytest.raises(FileExistsError, match="resume=true"):
        train(cfg)
    cfg2 = tiny_train_cfg(tmp_path, tiny_pusht_zarr, extra=["resume=true", "train.steps=4"])
    capsys.readouterr()
    result = train(cfg2)
    # a longer train.steps reshapes the rest of the cosine: at step 2 of 4 after 1 warmup step, 0.5 * (1 + cos(pi / 3)) of the peak
    peak = cfg2["train"]["lr"]
    assert f"train.steps 2 -> 4: the cosine schedule now ends at step 4, so the learning rate continues from {peak * 0.75:.3g}" in capsys.readouterr().out
    state = load_training_state(tmp_path / "run" / "checkpoints" / "last")
    assert state["step"] == 4
    # the wall-time total carries over a resume
    assert state["train_seconds"] > first["train_seconds"] and result.train_seconds >= state["train_seconds"]
    assert state["scheduler"]["last_epoch"] == 4
    assert state["optimizer"]["state"][0]["step"].item() == 4
    assert (tmp_path / "run" / "checkpoints" / "step_0000002").is_dir()
    assert (tmp_path / "run" / "checkpoints" / "step_0000004").is_dir()
    # a run already at train.steps has nothing left to do: say so instead of returning silently
    with pytest.raises(ValueError, match=r"already at step 4 and train.steps=4: pass a larger train.steps="):
        train(cfg2)


def test_checkpoint_of_another_policy_is_refused(tmp_path, tiny_pusht_zarr):
    cfg = tiny_train_cfg(tmp_path, tiny_pusht_zarr)
    last = train(cfg).checkpoint
    with pytest.raises(ValueError, match="holds a 'diffusion' policy, not the requested 'bc'"):
        load_policy(last, expected_policy="bc")


def test_registry_lists_known_policies():
    with pytest.raises(ValueError, match="unknown policy 'act'; known policies: bc, diffusion"):
        get_policy_class("act")


def test_config_errors_name_the_field(tmp_path, tiny_pusht_zarr):
    cfg = tiny_train_cfg(tmp_path, tiny_pusht_zarr, extra=["policy.horizon=4", "policy.n_action_steps=8"])
    with pytest.raises(ValueError, match=r"policy.horizon \(4\) must cover"):
        policy_from_cfg(cfg)
    cfg = tiny_train_cfg(tmp_path, tiny_pusht_zarr, extra=["attention.kind=nope"])
    with pytest.raises(ValueError, match="attention.kind='nope' is unknown"):
        policy_from_cfg(cfg)

    cfg = tiny_train_cfg(tmp_path, tiny_pusht_zarr, extra=["policy.n_image_obs_steps=3"])
    with pytest.raises(ValueError, match=r"policy.n_image_obs_steps \(3\) must be between 1 and n_obs_steps \(2\)"):
        policy_from_cfg(cfg)


@pytest.mark.parametrize("policy_name", POLICY_NAMES)
def test_image_history_of_one_frame_keeps_the_low_dim_history(tmp_path, tiny_pusht_zarr, policy_name):
    cfg = tiny_train_cfg(tmp_path, tiny_pusht_zarr, policy=policy_name, extra=["policy.n_image_obs_steps=1"])
    policy, batch = _batch(cfg)
    policy.eval()
    enc = policy.obs_encoder
    assert enc.output_dim == 1 * policy.config.vit.out_dim + 2 * 2  # one frame of the camera, To=2 of agent_pos
    base = policy.encode_obs(batch)
    assert base.shape == (4, enc.output_dim)
    older_image = {**batch, "image": batch["image"].clone()}
    older_image["image"][:, 0] = 255 - older_image["image"][:, 0]  # the first of the To frames
    assert torch.equal(policy.encode_obs(older_image), base)  # never looked at
    older_pos = {**batch, "agent_pos": batch["agent_pos"].clone()}
    older_pos["agent_pos"][:, 0] += 50.0
    assert not torch.allclose(policy.encode_obs(older_pos), base)  # the velocity is seen
    latest = {**batch, "image": batch["image"].clone()}
    latest["image"][:, 1] = 255 - latest["image"][:, 1]
    assert not torch.allclose(policy.encode_obs(latest), base)
    loss, _ = policy.compute_loss(batch)
    assert torch.isfinite(loss)
