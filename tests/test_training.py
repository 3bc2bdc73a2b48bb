"""core.training.train on tiny synthetic data: finite losses, checkpoints, resume, run-directory rules."""
import json

import pytest
import torch
from safetensors.torch import load_file

from datasets.factory import make_dataset
from datasets.sampler import SequenceDataset, compute_stats
from core.training import train
from policies.registry import POLICIES, make_policy
from policies.checkpoint import load_policy, load_training_state, read_checkpoint_meta
from policies.vision.attention import KINDS
from tests.helpers import tiny_train_cfg

POLICY_NAMES = sorted(POLICIES)


def _batch(cfg, n=4):
    pc = cfg.policy
    data = make_dataset(cfg.task, list(pc.input_shapes))
    ds = SequenceDataset(data, list(pc.input_shapes), n_obs_steps=pc.n_obs_steps, horizon=pc.horizon, n_action_steps=pc.n_action_steps)
    batch = torch.utils.data.default_collate([ds[i] for i in range(n)])
    policy = make_policy(pc, compute_stats(data, pc.lowdim_keys + ["action"]))
    return policy, batch


@pytest.mark.parametrize("policy_name", POLICY_NAMES)
@pytest.mark.parametrize("attention", KINDS)
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
    with pytest.raises(FileExistsError, match="already holds a run.*resume=true"):
        train(cfg)
    cfg2 = tiny_train_cfg(tmp_path, tiny_pusht_zarr, extra=["resume=true", "train.steps=4"])
    capsys.readouterr()
    result = train(cfg2)
    # a longer train.steps reshapes the rest of the cosine: at step 2 of 4 after 1 warmup step, 0.5 * (1 + cos(pi / 3)) of the peak
    peak = cfg2.train.lr
    assert f"train.steps 2 -> 4: the cosine schedule now ends at step 4, so the learning rate continues from {peak * 0.75:.3g}" in capsys.readouterr().out
    state = load_training_state(tmp_path / "run" / "checkpoints" / "last")
    assert state["step"] == 4
    # the wall-time total carries over a resume
    assert state["train_seconds"] > first["train_seconds"] and result.train_seconds >= state["train_seconds"]
    assert state["scheduler"]["last_epoch"] == 4
    assert state["optimizer"]["state"][0]["step"].item() == 4
    assert (tmp_path / "run" / "checkpoints" / "step_0000002").is_dir()
    assert (tmp_path / "run" / "checkpoints" / "step_0000004").is_dir()
    # each session says where it trained: from step 0, then from the resumed step 2, on this CPU's torch kernels
    sessions = json.loads((tmp_path / "run" / "environment.json").read_text())
    assert [s["from_step"] for s in sessions] == [0, 2]
    assert {s["torch_cpu_capability"] for s in sessions} == {torch.backends.cpu.get_cpu_capability()}
    # a run already at train.steps has nothing left to do: say so instead of returning silently
    with pytest.raises(ValueError, match=r"already at step 4 and train.steps=4: pass a larger train.steps="):
        train(cfg2)


def test_checkpoint_of_another_policy_is_refused(tmp_path, tiny_pusht_zarr):
    cfg = tiny_train_cfg(tmp_path, tiny_pusht_zarr)
    last = train(cfg).checkpoint
    with pytest.raises(ValueError, match="holds a 'diffusion' policy, not the requested 'bc'"):
        load_policy(last, expected_policy="bc")


@pytest.mark.parametrize("policy_name", POLICY_NAMES)
def test_image_history_of_one_frame_keeps_the_low_dim_history(tmp_path, tiny_pusht_zarr, policy_name):
    cfg = tiny_train_cfg(tmp_path, tiny_pusht_zarr, policy=policy_name, extra=["policy.n_obs_steps=2", "policy.n_image_obs_steps=1"])
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


def _all_finite(ckpt) -> bool:
    return all(torch.isfinite(t).all() for t in load_file(str(ckpt / "model.safetensors")).values() if t.is_floating_point())


def test_a_diverging_run_never_writes_non_finite_weights(tmp_path, tiny_pusht_zarr):
    # lr 1e3 without warm-up: the weights are NaN after a step or two (before the fix, 50 of 54 tensors of
    # `last` were NaN and rollout evaluated them)
    cfg = tiny_train_cfg(tmp_path, tiny_pusht_zarr, policy="bc", extra=[
        "train.steps=10", "train.checkpoint_every=1", "train.lr=1e3", "train.warmup_steps=0", "train.grad_clip=1e9"])
    with pytest.raises(FloatingPointError, match="non-finite|loss became nan"):
        train(cfg)
    ckpts = sorted((tmp_path / "run" / "checkpoints").iterdir())
    assert all(_all_finite(c) for c in ckpts), [c.name for c in ckpts]
    last_step = load_training_state(tmp_path / "run" / "checkpoints" / "last")["step"]
    assert last_step == max(int(c.name[5:]) for c in ckpts if c.name.startswith("step_"))


@pytest.mark.parametrize("change", ["attention=full", "attention.modified=false", "policy.vit.dim=16", "task.crop_size=80",
                                    "train.max_episodes=2"])
def test_resume_refuses_a_change_of_model_or_data(tmp_path, tiny_pusht_zarr, change):
    train(tiny_train_cfg(tmp_path, tiny_pusht_zarr))
    key = change.split("=")[0]
    with pytest.raises(ValueError, match=rf"cannot resume .*{key.split('=')[0].replace('.', '[.]')}"):
        train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, extra=["resume=true", "train.steps=4", change]))
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["attention"]["kind"] == "fibottention" and saved["train"]["steps"] == 2  # the run is untouched
    # what may change on resume does
    result = train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, extra=["resume=true", "train.steps=3", "train.log_every=3"]))
    assert result.step == 3


def test_one_training_per_run_directory(tmp_path, tiny_pusht_zarr):
    from core.rundir import RunDirectory

    holder = RunDirectory(tmp_path / "run")
    assert holder.claim(resume=False, overwrite=False) is None  # another process holds the lock now
    try:
        with pytest.raises(FileExistsError, match="in use by a training running now"):
            train(tiny_train_cfg(tmp_path, tiny_pusht_zarr))
    finally:
        holder.release()
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_overwrite_starts_from_an_empty_directory(tmp_path, tiny_pusht_zarr):
    train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, attention="lookhere", extra=["train.steps=4", "train.checkpoint_every=1"]))
    assert len(list((tmp_path / "run" / "checkpoints").glob("step_*"))) == 4
    train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, attention="full", extra=["overwrite=true"]))
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert names == ["last", "step_0000002"]  # no step_0000003/4 of the LookHere run beside the new one
    assert read_checkpoint_meta(tmp_path / "run")["cfg"]["attention"]["kind"] == "full"


def test_resume_after_a_kill_uses_the_newest_complete_checkpoint(tmp_path, tiny_pusht_zarr):
    import shutil

    train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, extra=["train.steps=3", "train.checkpoint_every=1"]))
    ckpts = tmp_path / "run" / "checkpoints"
    # a kill while `last` was being replaced by step 3: only the old copy and a half-written temporary remain
    (ckpts / "last").rename(ckpts / f".last.old-{12345}")
    shutil.copytree(ckpts / "step_0000003", ckpts / ".last.tmp-12345")
    (ckpts / ".last.tmp-12345" / "model.safetensors").unlink()
    shutil.rmtree(ckpts / "step_0000003")  # and step 3 itself never completed
    result = train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, extra=["resume=true", "train.steps=4", "train.checkpoint_every=1"]))
    assert result.step == 4
    assert not list(ckpts.glob(".*"))  # stale writes cleaned up
    assert load_training_state(ckpts / "last")["step"] == 4


def test_a_checkpoint_from_before_a_setting_existed_resumes_with_its_default_only(tmp_path, tiny_pusht_zarr):
    train(tiny_train_cfg(tmp_path, tiny_pusht_zarr))
    meta_path = tmp_path / "run" / "checkpoints" / "last" / "config.json"
    meta = json.loads(meta_path.read_text())
    del meta["policy_config"]["vit"]["input_norm"]  # as written before vit.input_norm was added
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"policy[.]vit[.]input_norm: None -> 'per_image'"):
        train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, extra=["resume=true", "train.steps=3", "policy.vit.input_norm=per_image"]))
    assert train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, extra=["resume=true", "train.steps=3"])).step == 3


def test_each_setting_is_stored_once_and_checkpoints_of_before_still_load_and_resume(tmp_path, tiny_pusht_zarr):
    """The run's config.json and a checkpoint's hold the attention settings once (the tree at
    ``attention``, the checkpoint in its policy config); a checkpoint in the layout of before (the
    policy config and the attention again in its run config, a ``vit.base_grid``) reads the same."""
    last = train(tiny_train_cfg(tmp_path, tiny_pusht_zarr)).checkpoint
    run_text, ckpt_text = (tmp_path / "run" / "config.json").read_text(), (last / "config.json").read_text()
    assert run_text.count('"w_min"') == ckpt_text.count('"w_min"') == 1
    stored = json.loads(ckpt_text)
    assert "action_dim" not in json.loads(run_text)["policy"] and set(stored["cfg"]) & {"policy", "attention"} == set()
    meta = read_checkpoint_meta(last)
    assert meta["cfg"]["policy"] == meta["policy_config"] and meta["cfg"]["attention"]["kind"] == "fibottention"
    policy = load_policy(last)
    grid = list(policy.config.patch_grid)
    old = dict(stored, policy_config={**stored["policy_config"], "vit": {**stored["policy_config"]["vit"], "base_grid": grid}})
    old["cfg"] = {**stored["cfg"], "policy": old["policy_config"], "attention": stored["policy_config"]["vit"]["attention"]}
    (last / "config.json").write_text(json.dumps(old))
    assert read_checkpoint_meta(last) == meta
    obs = {k: v for k, v in _batch(tiny_train_cfg(tmp_path, tiny_pusht_zarr), 2)[1].items() if k in policy.config.input_shapes}
    reloaded = load_policy(last)
    torch.manual_seed(0)
    expected = policy.predict_action_chunk(obs)
    torch.manual_seed(0)
    torch.testing.assert_close(reloaded.predict_action_chunk(obs), expected, rtol=0, atol=0)
    assert train(tiny_train_cfg(tmp_path, tiny_pusht_zarr, extra=["resume=true", "train.steps=3"])).step == 3
    old["policy_config"]["vit"]["base_grid"] = [grid[0] + 1] * 2  # not its crop's grid: the position embedding would not fit
    (last / "config.json").write_text(json.dumps(old))
    with pytest.raises(ValueError, match=rf"made for a \({grid[0] + 1}, {grid[0] + 1}\) patch grid, but its crop_size "
                                         rf"{policy.config.crop_size} gives \({grid[0]}, {grid[1]}\)"):
        load_policy(last)
