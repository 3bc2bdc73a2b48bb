"""BC-RNN on tiny synthetic tensors: learns, resets its state, keeps one state per environment
(select_action, also inside core.evaluation.evaluate), saves and loads, trains and rolls out end to end."""
import numpy as np
import pytest
import torch

from policies.registry import make_policy, make_policy_config
from policies.checkpoint import load_policy, read_checkpoint_meta, save_checkpoint

from tests.helpers import ACT_MAX, ACT_MIN, TINY_ENCODER
from tests.helpers import TINY_STATS as STATS

TINY = dict(TINY_ENCODER, horizon=6, rnn_hidden_dim=32, rnn_num_layers=2, gmm=dict(num_modes=1))


def tiny_rnn(**fields):
    torch.manual_seed(0)
    return make_policy(make_policy_config("bc_rnn", **{**TINY, **fields}), STATS)


@pytest.fixture(autouse=True)
def deterministic_actions(monkeypatch):
    """With one mode and no sampling noise an action is that mode's mean: comparisons across
    batches and runs are then exact up to float rounding (the GMM's sampling has its own tests)."""
    monkeypatch.setattr("policies.bc.heads.LOW_NOISE_STD", 0.0)


def episode(length=8, seed=0, b=1):
    """obs[key] (b, length, ...) and actions (b, length, Da) of a synthetic episode."""
    g = torch.Generator().manual_seed(seed)
    frac = torch.rand(b, length, 2, generator=g)
    return {
        "image": torch.randint(0, 256, (b, length, 32, 32, 3), generator=g, dtype=torch.uint8),
        "agent_pos": torch.rand(b, length, 2, generator=g) * 512,
        "action": torch.as_tensor(ACT_MIN) + frac * torch.as_tensor(ACT_MAX - ACT_MIN),
    }


def step(ep, t, to=1):
    """The To frames that end at time t, as the rollout stacks them: {key: (b, To, ...)}."""
    return {k: ep[k][:, max(0, t - to + 1) : t + 1] for k in ("image", "agent_pos")}


def frame(ep, t):
    """One step's observation, as select_action takes it: {key: (b, ...)}."""
    return {k: ep[k][:, t] for k in ("image", "agent_pos")}


def test_defaults_are_robomimics():
    c = make_policy_config("bc_rnn", **{k: v for k, v in TINY.items() if k not in ("horizon", "rnn_hidden_dim",
                                                                                     "rnn_num_layers", "gmm")})
    assert (c.n_obs_steps, c.horizon, c.n_action_steps, c.rnn_steps, c.window_obs_steps) == (1, 10, 1, 10, 10)
    assert (c.rnn_hidden_dim, c.rnn_num_layers, c.gmm.num_modes, c.gmm.min_std, c.gmm.std_activation, c.gmm.low_noise_eval) == (
        400, 2, 5, 1e-4, "softplus", True)
    assert c.hidden_dims == [] and c.state_reset_every == 10


@pytest.mark.parametrize("fields", [dict(gmm=dict(num_modes=5)), dict(n_obs_steps=2, n_image_obs_steps=1, horizon=7, n_action_steps=2)],
                         ids=str)
def test_loss_decreases_on_a_fixed_batch(fields):
    policy = tiny_rnn(**fields)
    c = policy.config
    batch = episode(c.horizon, b=6)
    batch = {k: (v if k == "action" else v[:, : c.window_obs_steps]) for k, v in batch.items()}  # as the sampler cuts
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        loss, info = policy.compute_loss(batch)
        assert info["loss"] == pytest.approx(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert min(losses[-5:]) < losses[0] - 0.3, losses  # a negative log-likelihood per action dimension: falls below 0


def test_window_of_the_sampler_feeds_every_step():
    from datasets.episodes import EpisodeData
    from datasets.sampler import SequenceDataset

    c = tiny_rnn(n_obs_steps=2, horizon=7, n_action_steps=2).config  # 3 LSTM steps, at frames 1, 3, 5
    assert (c.rnn_steps, c.window_obs_steps) == (3, 6)
    ep = episode(12)
    data = EpisodeData({k: v[0].numpy() for k, v in ep.items()}, np.array([12]), {})
    ds = SequenceDataset(data, ["image", "agent_pos"], n_obs_steps=c.n_obs_steps, horizon=c.horizon,
                         n_action_steps=c.n_action_steps, obs_steps=c.window_obs_steps)
    item = ds[0]
    assert item["agent_pos"].shape == (6, 2) and item["action"].shape == (7, 2)


def test_state_is_carried_and_reset_at_episode_start():
    ep = episode(8, seed=1, b=2)
    policy = tiny_rnn(reset_every=0).eval()
    first = torch.stack([policy.select_action(frame(ep, t)) for t in range(8)], 1)
    assert first.shape == (2, 8, 2)
    # the state matters: the same frame after another history gives another action
    stateless = torch.stack([policy.predict_action_chunk(step(ep, t))[:, 0] for t in range(8)], 1)
    assert torch.allclose(first[:, 0], stateless[:, 0], atol=1e-3)  # step 0 starts from a zero state
    assert not torch.allclose(first[:, 1:], stateless[:, 1:], atol=1e-3)
    # after reset() the same observations give the same actions as a fresh policy
    policy.reset()
    again = torch.stack([policy.select_action(frame(ep, t)) for t in range(8)], 1)
    fresh = tiny_rnn(reset_every=0).eval()
    fresh_actions = torch.stack([fresh.select_action(frame(ep, t)) for t in range(8)], 1)
    torch.testing.assert_close(again, first, atol=1e-3, rtol=0)
    torch.testing.assert_close(fresh_actions, first, atol=1e-3, rtol=0)
    # and so does reset(envs), the per-environment reset that core.evaluation calls at every episode start
    policy.reset()
    for t in range(5):
        policy.select_action(frame(ep, t), envs=["x", "y"])
    policy.reset(["x", "y"])
    after = torch.stack([policy.select_action(frame(ep, t), envs=["x", "y"]) for t in range(8)], 1)
    torch.testing.assert_close(after, first, atol=1e-3, rtol=0)


def test_rollout_state_resets_every_training_unroll_by_default():
    ep = episode(9, seed=2)
    policy = tiny_rnn(horizon=3).eval()  # 3 LSTM steps: a zero state at steps 0, 3, 6 (robomimic's rollout)
    carried = torch.stack([policy.select_action(frame(ep, t), envs=["a"]) for t in range(9)], 1)[0]
    restarted = torch.cat([policy.predict_action_chunk(step(ep, t)) for t in (0, 3, 6)], 1)[0]
    torch.testing.assert_close(carried[[0, 3, 6]], restarted, atol=1e-3, rtol=0)
    assert not torch.allclose(carried[[1, 4, 7]], torch.cat([policy.predict_action_chunk(step(ep, t)) for t in (1, 4, 7)], 1)[0],
                              atol=1e-3)


def test_parallel_environments_keep_separate_states():
    policy = tiny_rnn(reset_every=0, gmm=dict(num_modes=1)).eval()
    a, b, b2 = episode(8, seed=3), episode(8, seed=4), episode(8, seed=5)
    both = lambda x, y, t: {k: torch.cat([frame(x, t)[k], frame(y, t)[k]]) for k in ("image", "agent_pos")}
    with_b = torch.stack([policy.select_action(both(a, b, t)) for t in range(8)], 1)
    policy.reset()
    with_b2 = torch.stack([policy.select_action(both(a, b2, t)) for t in range(8)], 1)
    policy.reset()
    alone = torch.stack([policy.select_action(frame(a, t)) for t in range(8)], 1)
    torch.testing.assert_close(with_b[0], with_b2[0], atol=1e-3, rtol=0)  # environment 0 never sees 1's frames
    torch.testing.assert_close(with_b[0], alone[0], atol=1e-3, rtol=0)
    assert not torch.allclose(with_b[1], with_b2[1], atol=1e-3)
    # environments in another order, or only some of them in a batch, each still get their own state
    policy.reset()
    mixed = []
    for t in range(8):
        if t % 2:
            mixed.append(policy.select_action(both(b, a, t), envs=["y", "x"])[1])
        else:
            mixed.append(policy.select_action(frame(a, t), envs=["x"])[0])
            policy.select_action(frame(b, t), envs=["y"])
    torch.testing.assert_close(torch.stack(mixed), alone[0], atol=1e-3, rtol=0)
    with pytest.raises(ValueError, match="one distinct environment per batch row"):
        policy.select_action(both(a, b, 0), envs=[0, 0])


EPISODE_LENGTHS = (5, 3, 6, 2, 4)  # with 3 environments the second falls idle while the other two still run


class _FakeEnv:
    """PushT-shaped observations from (seed, step) alone, ending after EPISODE_LENGTHS[seed] steps."""

    def __init__(self, log):
        self.log = log

    def send(self, cmd, arg=None):
        self._pending = (cmd, arg)

    def _obs(self):
        g = np.random.default_rng(self.seed * 1000 + self.t)
        return {"image": g.integers(0, 256, (32, 32, 3)).astype(np.uint8), "agent_pos": g.uniform(0, 512, 2).astype(np.float32)}

    def recv(self):
        cmd, arg = self._pending
        if cmd == "reset":
            self.seed, self.t = arg, 0
            return self._obs()
        if cmd == "step":
            self.log.setdefault(self.seed, []).append(np.array(arg))
            self.t += 1
            return self._obs(), 0.0, False, self.t >= EPISODE_LENGTHS[self.seed], {}
        raise ValueError(cmd)

    def close(self):
        pass


def _evaluate_with_fake_pool(monkeypatch, policy, n_envs):
    from core import evaluation
    from core.config import compose

    log = {}

    class FakePool:
        def __init__(self, *args):
            self.envs = [_FakeEnv(log) for _ in range(n_envs)]

        def __len__(self):
            return n_envs

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(evaluation, "EnvPool", FakePool)
    task = compose("config", ["task=pusht", "recipe=none"]).task
    summary = evaluation.evaluate(policy, task, num_episodes=5, seed=0, progress=False)
    assert summary["num_episodes"] == 5
    return log


@pytest.mark.parametrize("n_action_steps", [1, 2])
def test_evaluate_gives_every_environment_its_own_state(monkeypatch, n_action_steps):
    policy = tiny_rnn(reset_every=0, gmm=dict(num_modes=1), n_action_steps=n_action_steps)
    one = _evaluate_with_fake_pool(monkeypatch, policy, 1)  # episodes one after another in one environment
    three = _evaluate_with_fake_pool(monkeypatch, policy, 3)  # staggered episodes, environments reused
    assert sorted(one) == sorted(three) == list(range(5))
    for seed in one:
        assert len(one[seed]) == len(three[seed]) == EPISODE_LENGTHS[seed]
        np.testing.assert_allclose(np.stack(three[seed]), np.stack(one[seed]), atol=1e-3, rtol=0)
    # and the rollout is the policy's own: the same as select_action on that episode alone
    policy.reset()
    env = _FakeEnv({})
    env.send("reset", 2)
    obs = env.recv()
    for t in range(len(one[2])):
        action = policy.select_action({k: torch.from_numpy(v)[None] for k, v in obs.items()})[0].numpy()
        np.testing.assert_allclose(action, one[2][t], atol=1e-3, rtol=0)
        env.send("step", action)
        obs = env.recv()[0]


def test_save_load_gives_identical_actions(tmp_path):
    policy = tiny_rnn().eval()
    ep = episode(6, seed=6, b=3)
    save_checkpoint(tmp_path / "ckpt", policy)
    loaded = load_policy(tmp_path / "ckpt")
    assert type(loaded) is type(policy) and loaded.config == policy.config
    for t in range(6):
        torch.manual_seed(t)
        a = policy.select_action(frame(ep, t))
        torch.manual_seed(t)
        b = loaded.select_action(frame(ep, t))
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_train_and_evaluate_checkpoint_end_to_end(tmp_path, tiny_pusht_zarr):
    from core.evaluation import evaluate_checkpoint
    from core.training import train
    from tests.helpers import tiny_train_cfg

    cfg = tiny_train_cfg(tmp_path, tiny_pusht_zarr, "bc_rnn", "fibottention",
                         extra=["policy.horizon=4", "policy.n_action_steps=1", "policy.rnn_hidden_dim=16"])
    assert cfg.policy.rnn_steps == cfg.policy.window_obs_steps == 4
    result = train(cfg)
    summary = evaluate_checkpoint(result.checkpoint, num_episodes=2, max_steps=5, num_videos=0, progress=False,
                                  out_dir=tmp_path / "eval")
    assert summary["policy"] == "bc_rnn" and summary["num_episodes"] == 2
    assert all(e["steps"] == 5 for e in summary["episodes"])
    assert (tmp_path / "eval" / "summary.json").is_file()
    # Ta sets the GMM head's size: a rollout may restate it, not change it
    from core.evaluation import OverrideError

    same = evaluate_checkpoint(result.checkpoint, num_episodes=1, max_steps=2, num_videos=0, progress=False, n_action_steps=1)
    assert same["n_action_steps"] == 1
    with pytest.raises(OverrideError, match="n_action_steps= cannot change at rollout for a 'bc_rnn' checkpoint"):
        evaluate_checkpoint(result.checkpoint, num_episodes=1, max_steps=2, num_videos=0, progress=False, n_action_steps=4)


def test_a_checkpoint_with_the_flat_gmm_fields_of_before_loads(tmp_path):
    """Checkpoints written before policy.gmm held num_modes, min_std, std_activation, low_noise_eval
    among the policy's own fields: they load into policy.gmm."""
    import json

    policy = tiny_rnn(gmm=dict(num_modes=2, min_std=1e-3)).eval()
    save_checkpoint(tmp_path / "ckpt", policy, cfg={"seed": 0})
    meta_path = tmp_path / "ckpt" / "config.json"
    meta = json.loads(meta_path.read_text())
    flat = meta["policy_config"]
    flat.update(flat.pop("gmm"))  # the old, flat layout, which its run config held again then
    meta["cfg"]["policy"] = dict(flat)
    meta_path.write_text(json.dumps(meta))
    assert read_checkpoint_meta(tmp_path / "ckpt")["cfg"]["policy"]["gmm"]["num_modes"] == 2
    loaded = load_policy(tmp_path / "ckpt")
    assert (loaded.config.gmm.num_modes, loaded.config.gmm.min_std) == (2, 1e-3)
    ep = episode(3, seed=7)
    torch.manual_seed(0)
    a = policy.select_action(frame(ep, 0))
    torch.manual_seed(0)
    torch.testing.assert_close(loaded.select_action(frame(ep, 0)), a, rtol=0, atol=0)
