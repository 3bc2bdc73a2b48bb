"""BC policy (MLP / GMM heads) on tiny synthetic tensors: learns, samples in range, replans, fails clearly."""
import numpy as np
import pytest
import torch

from policies.registry import get_policy_class, make_policy, make_policy_config
from policies.bc.heads import GMMConfig, GMMHead
from policies.checkpoint import load_policy, save_checkpoint

from tests.helpers import ACT_MAX, ACT_MIN, TINY_ENCODER
from tests.helpers import TINY_STATS as STATS

TINY = dict(TINY_ENCODER, n_obs_steps=2, horizon=8, n_action_steps=4, hidden_dims=[64])


def tiny_bc(**fields):
    torch.manual_seed(0)
    return make_policy({**TINY, **fields}, STATS, name="bc")


def synthetic_batch(b=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    frac = torch.rand(b, 8, 2, generator=g)
    return {
        "image": torch.randint(0, 256, (b, 2, 32, 32, 3), generator=g, dtype=torch.uint8),  # (B, To, H, W, C)
        "agent_pos": torch.rand(b, 2, 2, generator=g) * 512,
        "action": torch.as_tensor(ACT_MIN) + frac * torch.as_tensor(ACT_MAX - ACT_MIN),  # (B, T, Da)
    }


def obs_of(batch):
    return {k: batch[k] for k in ("image", "agent_pos")}


@pytest.mark.parametrize("fields", [dict(head="mlp", loss="l2"), dict(head="mlp", loss="l1"),
                                    dict(head="gmm"), dict(head="gmm", gmm_over="step")], ids=str)
def test_loss_decreases_on_a_fixed_batch(fields):
    policy = tiny_bc(**fields)
    batch = synthetic_batch()
    opt = torch.optim.Adam(policy.parameters(), lr=2e-3)
    losses = []
    for _ in range(40):
        loss, info = policy.compute_loss(batch)
        assert set(info) >= {"loss"} and info["loss"] == pytest.approx(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    first, last = losses[0], min(losses[-5:])
    if fields["head"] == "mlp":
        assert last < 0.7 * first, losses
    else:  # a negative log-likelihood per action dimension: it can go below zero
        assert last < first - 1.0, losses


def test_gmm_low_noise_samples_are_mode_means_within_the_data_range():
    policy = tiny_bc(head="gmm").eval()
    batch = synthetic_batch(b=6)
    obs = obs_of(batch)
    out = policy.predict_action_chunk(obs, generator=torch.Generator().manual_seed(1))
    assert out.shape == (6, 4, 2) and not out.requires_grad
    tol = 1e-3 * (ACT_MAX - ACT_MIN)
    assert (out >= torch.as_tensor(ACT_MIN - tol)).all() and (out <= torch.as_tensor(ACT_MAX + tol)).all()
    # with std 1e-4 each chunk is (almost exactly) the mean of one of the modes
    with torch.no_grad():
        means, _, _ = policy.head(policy.obs_encoder(obs))  # (B, 1, K, T*Da)
    means = means.reshape(6, 5, 8, 2)[:, :, 1:5]  # (B, K, Ta, Da), normalized
    err = (means - policy.normalizer.normalize("action", out)[:, None]).abs().amax(dim=(2, 3)).min(dim=1).values
    assert (err < 1e-3).all(), err  # distance to the nearest mode, in normalized units
    # the same generator seed gives the same chunk; without low noise the samples spread out
    again = policy.predict_action_chunk(obs, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(out, again, rtol=0, atol=0)
    policy.config.gmm.low_noise_eval = False
    noisy = policy.predict_action_chunk(obs, generator=torch.Generator().manual_seed(1))
    assert (noisy - out).abs().max() > 1e-2


def test_gmm_head_keeps_two_demonstrated_modes_apart():
    """Half the demos go to +0.8, half to -0.8 from the same input: a regressor would average
    to 0; the mixture samples near one mode or the other."""
    torch.manual_seed(0)
    head = GMMHead(4, horizon=3, action_dim=2, hidden_dims=[32], gmm=GMMConfig(num_modes=5), tanh=True, over="chunk")
    cond = torch.ones(64, 4)
    target = torch.cat([torch.full((32, 3, 2), 0.8), torch.full((32, 3, 2), -0.8)])
    opt = torch.optim.Adam(head.parameters(), lr=1e-2)
    for _ in range(150):
        loss = -head.log_prob(cond, target).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        samples = head.sample(cond, generator=torch.Generator().manual_seed(0))  # (64, 3, 2)
    assert ((samples.abs() - 0.8).abs() < 0.1).all()
    positive = (samples[:, 0, 0] > 0).float().mean()
    assert 0.2 < positive < 0.8, positive


@pytest.mark.parametrize("head", ["mlp", "gmm"])
def test_select_action_replans_every_n_action_steps(monkeypatch, head):
    policy = tiny_bc(head=head).eval()
    calls = []
    original = policy.predict_action_chunk

    def counting(obs, *args, **kwargs):
        calls.append(obs["image"].shape)
        chunk = original(obs, *args, **kwargs)
        return chunk

    monkeypatch.setattr(policy, "predict_action_chunk", counting)
    batch = synthetic_batch(b=3)
    policy.reset()
    for t in range(10):
        action = policy.select_action({k: v[:, t % 2] for k, v in obs_of(batch).items()})
        assert action.shape == (3, 2)
    assert len(calls) == 3  # steps 0, 4, 8 with n_action_steps=4
    assert calls[0] == (3, 2, 32, 32, 3)  # batched, with the n_obs_steps history
    policy.reset()
    policy.select_action({k: v[:, 0] for k, v in obs_of(batch).items()})
    assert len(calls) == 4


def test_gmm_checkpoint_round_trip(tmp_path):
    policy = tiny_bc(head="gmm", gmm_over="step", gmm=dict(num_modes=3))
    save_checkpoint(tmp_path / "ckpt", policy)
    loaded = load_policy(tmp_path / "ckpt", expected_policy="bc")
    assert loaded.config.head == "gmm" and loaded.config.gmm_over == "step"
    obs = obs_of(synthetic_batch(b=2))
    a = policy.eval().predict_action_chunk(obs, generator=torch.Generator().manual_seed(5))
    b = loaded.predict_action_chunk(obs, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_registry_error_lists_known_policies():
    assert get_policy_class("bc").name == "bc"
    with pytest.raises(ValueError, match="unknown policy 'bcq'; known policies: bc, bc_rnn, diffusion"):
        get_policy_class("bcq")


def test_unknown_config_field_is_named():
    with pytest.raises(ValueError, match=r"policy 'bc' has no config fields \['heads'\]"):
        make_policy_config("bc", **TINY, heads="mlp")


def test_photometric_augmentation_jitters_each_training_image_on_its_own():
    import torch

    from policies.obs_encoder import ImageAugConfig, jitter_images
    from torchvision.transforms import v2

    with pytest.raises(ValueError, match="policy.image_aug.brightness must be in"):
        ImageAugConfig(brightness=1.5)
    torch.manual_seed(0)
    x = torch.full((6, 3, 4, 4), 0.5)
    x[:, :, :2] = 0.25  # some contrast to scale
    out = jitter_images(x, v2.ColorJitter(brightness=0.3, contrast=0.5))
    means = out.mean(dim=(1, 2, 3))
    assert out.shape == x.shape and not torch.equal(out, x)
    assert len(set(means.tolist())) == 6  # a factor per image, not one for the batch
    assert 0.375 * 0.7 - 1e-6 <= means.min() and means.max() <= 0.375 * 1.3 + 1e-6  # brightness x U(0.7, 1.3), contrast keeps the mean


def test_the_encoder_jitters_in_training_only():
    plain, jittered = tiny_bc(crop_size=32), tiny_bc(crop_size=32, image_aug=dict(brightness=0.3, contrast=0.5))
    obs = obs_of(synthetic_batch())
    for mode in ("eval", "train"):
        getattr(plain.obs_encoder, mode)(), getattr(jittered.obs_encoder, mode)()
        torch.manual_seed(1)
        same = torch.equal(plain.obs_encoder(obs), jittered.obs_encoder(obs))
        assert same == (mode == "eval")  # the same weights: only training sees jittered images
