"""Tests for rlkit.algos (trainers), rlkit.nets and rlkit.algos.history. Fast: tiny envs, few steps."""
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlkit.algos import A2CConfig, History, PPOConfig, ReinforceConfig, TRPOConfig
from rlkit.nets import ActorCritic, CategoricalPolicy, ValueNet, layer_init, mlp

# ---------------------------------------------------------------------------------------------
# tiny environments
# ---------------------------------------------------------------------------------------------

class BanditEnv(gym.Env):
    """One-step episodes: a constant observation, action 1 pays 1, action 0 pays 0."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.array([1.0, 0.0], dtype=np.float32), {}

    def step(self, action):
        return np.array([1.0, 0.0], dtype=np.float32), float(action == 1), True, False, {}


class ChainEnv(gym.Env):
    """Walk right (action 1) along 0..L-1 to reach +1 at the end; action 0 stays. Time limit 2L."""

    def __init__(self, L=4):
        self.L = L
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(L,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def _obs(self):
        o = np.zeros(self.L, dtype=np.float32)
        o[self.pos] = 1.0
        return o

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.t = 0, 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        self.pos = min(self.pos + int(action), self.L - 1)
        done = self.pos == self.L - 1
        return self._obs(), float(done), done, (not done) and self.t >= 2 * self.L, {}


def p_right(model, obs):
    with torch.no_grad():
        return torch.softmax(model.actor(torch.as_tensor(obs)), -1)[..., 1]


# ---------------------------------------------------------------------------------------------
# nets
# ---------------------------------------------------------------------------------------------

def test_layer_init_is_orthogonal_with_gain():
    torch.manual_seed(0)
    lin = layer_init(torch.nn.Linear(8, 5), std=2.0)
    W = lin.weight.detach()                                   # [5, 8], rows orthogonal
    assert torch.allclose(W @ W.T, 4.0 * torch.eye(5), atol=1e-5)
    assert torch.all(lin.bias == 0)


def test_nets_shapes_and_init_near_uniform():
    torch.manual_seed(0)
    pol = CategoricalPolicy(3, 4)
    x = torch.randn(5, 7, 3)
    logits = pol(x)
    assert logits.shape == (5, 7, 4)
    # output gain 0.01: the initial policy is nearly uniform
    assert torch.allclose(torch.softmax(logits, -1), torch.full((5, 7, 4), 0.25), atol=0.02)
    assert ValueNet(3)(x).shape == (5, 7)
    ac = ActorCritic(3, 4)
    a, logp, v = ac.act(x[0])
    assert a.shape == (7,) and logp.shape == (7,) and v.shape == (7,)
    lp, ent, v2, lg = ac.evaluate(x[0], a)
    assert torch.allclose(lp, logp) and torch.allclose(v, v2)
    assert torch.allclose(ent, -(torch.softmax(lg, -1) * torch.log_softmax(lg, -1)).sum(-1))
    assert len(mlp(3, 2, hidden=[16, 8])) == 5


def test_nets_validation():
    with pytest.raises(ValueError, match="obs"):
        CategoricalPolicy(3, 2)(torch.zeros(4, 5))
    with pytest.raises(TypeError, match="obs"):
        CategoricalPolicy(3, 2)([0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="in_dim"):
        mlp(0, 2)
    with pytest.raises(TypeError, match="layer"):
        layer_init(torch.nn.Conv1d(1, 1, 1))


# ---------------------------------------------------------------------------------------------
# history
# ---------------------------------------------------------------------------------------------

def test_history_thresholds_and_rolling_mean():
    h = History()
    h.episode_returns = [10.0, 20.0, 30.0, 40.0, 50.0]
    h.episode_steps = [5, 9, 20, 31, 40]
    h.episode_wall_time = [0.1, 0.2, 0.3, 0.4, 0.5]
    # windows of 2: means 15, 25, 35, 45 -> first >= 30 is the window ending at episode index 3
    assert h.steps_to(30.0, window=2) == 31
    assert h.time_to(30.0, window=2) == 0.4
    assert h.steps_to(46.0, window=2) is None
    assert h.steps_to(10.0, window=6) is None            # not enough episodes yet
    x, y = h.rolling_return(window=2)
    assert x.tolist() == [5, 9, 20, 31, 40] and y.tolist() == [10.0, 15.0, 25.0, 35.0, 45.0]
    assert h.mean_return(3) == 40.0


def test_history_log_update_pads_missing_stats_with_nan():
    h = History()
    h.log_update(10, 0.1, loss=1.0)
    h.log_update(20, 0.2, loss=2.0, kl=0.5)
    h.log_update(30, 0.3, kl=0.7)
    assert h.steps == [10, 20, 30]
    assert h["loss"][:2] == [1.0, 2.0] and math.isnan(h["loss"][2])
    assert math.isnan(h["kl"][0]) and h["kl"][1:] == [0.5, 0.7]
    d = h.to_dict()
    assert d["steps"] == [10, 20, 30] and len(d["kl"]) == 3
    with pytest.raises(KeyError, match="clip_frac"):
        h["clip_frac"]


# ---------------------------------------------------------------------------------------------
# REINFORCE
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("baseline", [None, "mean", "value"])
def test_reinforce_learns_bandit(baseline):
    from rlkit.algos import train_reinforce
    obs = np.array([1.0, 0.0], dtype=np.float32)
    model, h = train_reinforce(BanditEnv, ReinforceConfig(total_steps=16 * 40, num_envs=16, lr=0.05, baseline=baseline,
                                                          seed=0), progress=False)
    assert len(h.steps) == 40 and h.steps[-1] == 640          # 16 one-step episodes per update
    assert len(h.episode_returns) == 640
    first = np.mean(h.episode_returns[:16])            # the initial, near-uniform policy
    last = np.mean(h.episode_returns[-64:])
    assert first < 0.8 and last > 0.9, (first, last)
    assert p_right(model, obs) > 0.9
    for k in ("loss", "kl", "entropy", "grad_norm", "lr", "adv_std"):
        assert len(h[k]) == len(h.steps) and all(np.isfinite(h[k])), k
    assert all(x >= -1e-6 for x in h["kl"])            # exact KL, up to float32 rounding
    assert ("value_loss" in h.stats) == (baseline == "value")


def test_reinforce_history_shapes_and_reproducible():
    from rlkit.algos import train_reinforce
    cfg = ReinforceConfig(total_steps=300, num_envs=4, seed=3)
    _, h1 = train_reinforce(ChainEnv, cfg, progress=False)
    _, h2 = train_reinforce(ChainEnv, cfg, progress=False)
    assert h1.episode_returns == h2.episode_returns and h1["loss"] == h2["loss"]
    n = len(h1.steps)
    assert all(len(v) == n for v in h1.stats.values()) and len(h1.wall_time) == n
    assert h1.steps == sorted(h1.steps) and h1.steps[-1] >= 300
    # 4 episodes per update, episode step stamps never exceed the update's step count
    assert len(h1.episode_returns) == 4 * n
    assert len(h1.episode_steps) == len(h1.episode_lengths) == len(h1.episode_wall_time) == 4 * n
    assert sum(h1.episode_lengths) == h1.steps[-1]


def test_reinforce_validation():
    from rlkit.algos import train_reinforce
    with pytest.raises(ValueError, match="ReinforceConfig.baseline"):
        ReinforceConfig(total_steps=10, baseline="median")
    with pytest.raises(ValueError, match="ReinforceConfig.gamma"):
        ReinforceConfig(total_steps=10, gamma=1.5)
    with pytest.raises(ValueError, match="ReinforceConfig.lr"):
        ReinforceConfig(total_steps=10, lr=0.0)
    with pytest.raises(ValueError, match="ReinforceConfig.total_steps"):
        ReinforceConfig(total_steps=0)
    with pytest.raises(ValueError, match="ReinforceConfig.num_envs"):
        ReinforceConfig(total_steps=10, num_envs=0)
    with pytest.raises(TypeError, match="action space"):
        train_reinforce("Pendulum-v1", ReinforceConfig(total_steps=10), progress=False)
    with pytest.raises(TypeError, match="cfg must be a ReinforceConfig"):
        train_reinforce(BanditEnv, PPOConfig(total_steps=10), progress=False)
    with pytest.raises(TypeError, match="total_steps"):         # the old keyword style is refused
        train_reinforce(BanditEnv, total_steps=10, progress=False)


def test_target_return_and_callback_stop_early():
    from rlkit.algos import train_reinforce
    _, h = train_reinforce(BanditEnv, ReinforceConfig(total_steps=10_000, num_envs=16, lr=0.05, target_return=0.9,
                                                      target_window=32), progress=False)
    assert h.steps[-1] < 10_000 and h.mean_return(32) >= 0.9
    calls = []
    _, h = train_reinforce(BanditEnv, ReinforceConfig(total_steps=10_000, num_envs=4), progress=False,
                           callback=lambda hist: calls.append(len(hist.steps)) or len(hist.steps) >= 3)
    assert len(h.steps) == 3 and calls == [1, 2, 3]


# ---------------------------------------------------------------------------------------------
# a fixed CartPole batch for the update-level tests
# ---------------------------------------------------------------------------------------------

def _fixed_batch(seed=0, num_envs=4, T=64, gamma=0.99, lam=0.95):
    from rlkit.returns import from_gymnasium, gae
    from rlkit.rollout import RolloutCollector, make_vec_env
    torch.manual_seed(seed)
    model = ActorCritic(4, 2)
    col = RolloutCollector(make_vec_env("CartPole-v1", num_envs), seed=seed)
    b = col.collect(model.actor.act, T, value_fn=model.critic)
    d, lm = from_gymnasium(b.terminated, b.truncated, gamma)
    adv, ret = gae(b.rewards, b.values, b.next_values, d, lam * lm)
    B = num_envs * T
    return model, (b.obs.reshape(B, -1), b.actions.reshape(-1), b.logp.reshape(-1), adv.reshape(-1),
                   ret.reshape(-1), b.values.reshape(-1))


def _clip_objective_by_hand(model, obs, actions, logp_old, adv, ret, eps=0.2):
    """Independent PPO-clip + value loss with full-batch advantage normalisation."""
    with torch.no_grad():
        logits = model.actor(obs)
        logp = torch.log_softmax(logits, -1).gather(-1, actions[:, None]).squeeze(-1)
        a = (adv - adv.mean()) / (adv.std() + 1e-8)
        r = torch.exp(logp - logp_old)
        pol = -torch.minimum(r * a, r.clamp(1 - eps, 1 + eps) * a).mean()
        val = 0.5 * ((model.critic(obs) - ret) ** 2).mean()
    return float(pol), float(val), logits


def _kl_by_hand(logits_p, logits_q):
    p = torch.softmax(logits_p.double(), -1)
    return float((p * (torch.log(p) - torch.log(torch.softmax(logits_q.double(), -1)))).sum(-1).mean())


# ---------------------------------------------------------------------------------------------
# PPO
# ---------------------------------------------------------------------------------------------

def test_ppo_update_decreases_loss_on_fixed_batch():
    from rlkit.algos.ppo import ppo_update
    model, (obs, act, logp_old, adv, ret, v_old) = _fixed_batch()
    pol0, val0, logits0 = _clip_objective_by_hand(model, obs, act, logp_old, adv, ret)
    assert abs(pol0 - 0.0) < 1e-5          # at theta_old the ratio is 1 and normalised A has mean 0
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-5)
    st = ppo_update(model, opt, obs, act, logp_old, adv, ret, v_old, epochs=8, num_minibatches=1)
    pol1, val1, logits1 = _clip_objective_by_hand(model, obs, act, logp_old, adv, ret)
    assert pol1 < pol0 - 1e-3 and val1 < val0, (pol0, pol1, val0, val1)
    assert st["epochs_run"] == 8
    assert abs(st["kl"] - _kl_by_hand(logits0, logits1)) < 1e-5 and st["kl"] > 0
    assert 0.0 <= st["clip_frac"] <= 1.0


def test_ppo_update_target_kl_stops_epochs_and_penalty_restrains_kl():
    from rlkit.algos.ppo import ppo_update
    model, data = _fixed_batch(seed=1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    st = ppo_update(model, opt, *data, epochs=10, target_kl=1e-12)
    # the approximate KL is measured on each minibatch before its step (as CleanRL does): with one
    # minibatch, epoch 1 sees KL = 0 exactly, epoch 2 sees the first step's KL > 0 and stops
    assert st["epochs_run"] == 2
    kls = {}
    for beta in (0.0, 100.0):
        model, data = _fixed_batch(seed=1)
        torch.manual_seed(0)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        kls[beta] = ppo_update(model, opt, *data, epochs=10, mode="penalty", beta=beta)["kl"]
    assert kls[100.0] < kls[0.0] / 3, kls


def test_ppo_update_validation():
    from rlkit.algos.ppo import ppo_update
    model, (obs, act, logp_old, adv, ret, v_old) = _fixed_batch(T=8)
    opt = torch.optim.Adam(model.parameters())
    with pytest.raises(ValueError, match="adv"):
        ppo_update(model, opt, obs, act, logp_old, adv[:5], ret, v_old)
    with pytest.raises(ValueError, match="mode"):
        ppo_update(model, opt, obs, act, logp_old, adv, ret, v_old, mode="trust")
    with pytest.raises(ValueError, match="num_minibatches"):
        ppo_update(model, opt, obs, act, logp_old, adv, ret, v_old, num_minibatches=1000)


def test_kl_lr_controller_rule():
    from rlkit.controllers import KLLearningRateController
    c = KLLearningRateController(target_kl=0.01, factor=2.0, band=1.5, lr_min=1e-4, lr_max=1.0)
    assert c(0.02, 0.1) == 0.05            # KL above 1.5 x target: halve
    assert c(0.001, 0.1) == 0.2            # below target / 1.5: double
    assert c(0.01, 0.1) == 0.1             # inside the band: keep
    assert c(1.0, 1.5e-4) == 1e-4          # clipped at lr_min
    assert c(0.0, 0.9) == 1.0              # clipped at lr_max
    assert len(c.history) == 5
    with pytest.raises(ValueError, match="target_kl"):
        KLLearningRateController(target_kl=0.0)


def test_train_ppo_history_and_lr_annealing():
    from rlkit.algos import train_ppo
    model, h = train_ppo("CartPole-v1", PPOConfig(total_steps=4 * 32 * 6, num_envs=4, num_steps=32, epochs=2, seed=0),
                         progress=False)
    assert len(h.steps) == 6 and h.steps == [128 * (i + 1) for i in range(6)]
    for k in ("loss", "policy_loss", "value_loss", "entropy", "kl", "approx_kl", "clip_frac", "grad_norm", "lr",
              "epochs_run", "explained_variance"):
        assert len(h[k]) == 6, k
    assert np.allclose(h["lr"], [2e-3 * (1 - 128 * i / 768) for i in range(6)])   # linear to 0
    assert np.allclose(h["clip_eps"], [0.2 * (1 - 128 * i / 768) for i in range(6)])
    assert all(0 <= c <= 1 for c in h["clip_frac"]) and all(k > -1e-6 for k in h["kl"])
    assert h.config["epochs"] == 2 and h.algo == "ppo-clip" and h.config["env_id"] == "CartPole-v1"
    assert h.config["anneal_lr"] is True and h.config["anneal_clip"] is True      # resolved from None


def test_train_ppo_lr_controller_closes_the_loop():
    from rlkit.algos import train_ppo
    from rlkit.controllers import KLLearningRateController
    ctl = KLLearningRateController(target_kl=0.002, factor=1.5, band=1.5)
    _, h = train_ppo(ChainEnv, PPOConfig(total_steps=4 * 16 * 8, num_envs=4, num_steps=16, lr=1e-2, epochs=4, seed=0),
                     lr_controller=ctl, progress=False)
    assert len(ctl.history) == 8
    for i in range(7):                   # next lr = rule(measured kl, current lr)
        kl, lr = h["kl"][i], h["lr"][i]
        want = lr / 1.5 if kl > 0.003 else (lr * 1.5 if kl < 0.002 / 1.5 else lr)
        assert h["lr"][i + 1] == pytest.approx(want)
    assert len(set(h["lr"])) > 1
    with pytest.raises(ValueError, match="anneal_lr"):
        train_ppo(ChainEnv, PPOConfig(total_steps=64, anneal_lr=True), lr_controller=ctl, progress=False)


def test_train_ppo_penalty_mode_adapts_beta():
    from rlkit.algos import train_ppo
    _, h = train_ppo(ChainEnv, PPOConfig(total_steps=4 * 16 * 8, num_envs=4, num_steps=16, mode="penalty",
                                         kl_coef=1.0, kl_target=0.001, epochs=4, seed=0), progress=False)
    assert h.algo == "ppo-penalty" and h["kl_coef"][0] == 1.0
    for i in range(7):                   # Schulman's rule, independently
        kl, b = h["kl"][i], h["kl_coef"][i]
        want = 2 * b if kl > 0.0015 else (b / 2 if kl < 0.001 / 1.5 else b)
        assert h["kl_coef"][i + 1] == pytest.approx(want)
    assert all(c == 0 for c in h["clip_frac"])


def test_ppo_learns_chain():
    from rlkit.algos import train_ppo
    L = 4
    model, h = train_ppo(lambda: ChainEnv(L), PPOConfig(total_steps=4 * 16 * 25, num_envs=4, num_steps=16, lr=5e-3,
                                                        gamma=0.9, seed=0), progress=False)
    obs = np.eye(L, dtype=np.float32)[:-1]
    assert (p_right(model, obs) > 0.9).all()
    assert np.mean(h.episode_lengths[-10:]) < 4.0       # optimal: 3 steps


def test_train_ppo_validation():
    from rlkit.algos import train_ppo
    for kw, match in ((dict(mode="kl"), "PPOConfig.mode"), (dict(epochs=0), "PPOConfig.epochs"),
                      (dict(clip_eps=0.0), "PPOConfig.clip_eps"), (dict(num_minibatches=10_000), "num_minibatches"),
                      (dict(gae_lambda=-0.1), "PPOConfig.gae_lambda")):
        with pytest.raises(ValueError, match=match):
            PPOConfig(total_steps=64, **kw)
    with pytest.raises(TypeError, match="lr_controller"):
        train_ppo(ChainEnv, PPOConfig(total_steps=64), lr_controller=3, progress=False)
    with pytest.raises(TypeError, match="callback"):
        train_ppo(ChainEnv, PPOConfig(total_steps=64), callback="stop", progress=False)


# ---------------------------------------------------------------------------------------------
# A2C
# ---------------------------------------------------------------------------------------------

def test_a2c_learns_chain_and_history():
    from rlkit.algos import train_a2c
    L = 4
    model, h = train_a2c(lambda: ChainEnv(L), A2CConfig(total_steps=8 * 5 * 60, num_envs=8, num_steps=5, lr=5e-3,
                                                        gamma=0.9, seed=0), progress=False)
    assert len(h.steps) == 60 and h.steps[-1] == 2400
    assert (p_right(model, np.eye(L, dtype=np.float32)[:-1]) > 0.9).all()
    for k in ("loss", "policy_loss", "value_loss", "entropy", "kl", "grad_norm", "lr", "explained_variance"):
        assert len(h[k]) == 60
    with pytest.raises(ValueError, match="A2CConfig.gae_lambda"):
        A2CConfig(total_steps=64, gae_lambda=2.0)


# ---------------------------------------------------------------------------------------------
# TRPO
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("max_kl", [1e-4, 0.01, 0.3])
def test_trpo_step_respects_kl_bound_and_improves(max_kl):
    from rlkit.algos.trpo import trpo_step
    accepted = 0
    for seed in range(3):
        model, (obs, act, logp_old, adv, ret, v_old) = _fixed_batch(seed=seed, T=32)
        a = (adv - adv.mean()) / (adv.std() + 1e-8)
        with torch.no_grad():
            logits0 = model.actor(obs)
        info = trpo_step(model.actor, obs, act, logp_old, a, max_kl=max_kl)
        with torch.no_grad():
            logits1 = model.actor(obs)
            logp1 = torch.log_softmax(logits1, -1).gather(-1, act[:, None]).squeeze(-1)
            surr1 = float((torch.exp(logp1 - logp_old) * a).mean())
        kl = _kl_by_hand(logits0, logits1)
        assert kl <= max_kl * (1 + 1e-4), (kl, max_kl)         # the bound holds on the measured KL
        if info["accepted"]:
            accepted += 1
            assert abs(info["step_kl"] - kl) < 1e-4 * max(kl, 1e-3)
            assert surr1 > 0.0 + 1e-7                          # surrogate at theta_old is mean(A) = 0
        else:
            assert kl == 0.0
    assert accepted >= 2


def test_trpo_step_validation_and_trainer_history():
    from rlkit.algos import train_trpo
    from rlkit.algos.trpo import trpo_step
    model, (obs, act, logp_old, adv, ret, v_old) = _fixed_batch(T=8)
    with pytest.raises(ValueError, match="logp_old"):
        trpo_step(model.actor, obs, act, logp_old[:3], adv)
    with pytest.raises(ValueError, match="max_kl"):
        trpo_step(model.actor, obs, act, logp_old, adv, max_kl=0.0)
    _, h = train_trpo(ChainEnv, TRPOConfig(total_steps=4 * 32 * 5, num_envs=4, num_steps=32, max_kl=0.02, seed=0),
                      progress=False)
    assert len(h["step_kl"]) == 5 and all(0.0 <= k <= 0.02 for k in h["step_kl"])
    assert np.allclose(h["step_kl"], h["kl"], atol=1e-6)
    assert set(h["accepted"]) <= {0.0, 1.0}


# ---------------------------------------------------------------------------------------------
# reuse_one_batch (chapter 5)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("clip", [True, False])
def test_reuse_one_batch_matches_a_hand_written_loop(clip):
    from rlkit.algos import reuse_one_batch
    model, (obs, act, logp_old, adv, ret, v_old) = _fixed_batch(seed=2, T=16)
    a = (adv - adv.mean()) / (adv.std() + 1e-8)
    before = [p.detach().clone() for p in model.parameters()]
    rows = reuse_one_batch(model, (obs, act, logp_old, a), epochs=3, clip=clip, lr=1e-2)
    assert all(torch.equal(p, q) for p, q in zip(before, model.parameters()))     # model left unchanged
    assert rows.shape == (4, 3)
    assert abs(rows[0, 0]) < 1e-7 and abs(rows[0, 1] - 1) < 1e-6 and rows[0, 2] == 0
    # the same three steps by hand: Adam on the (clipped) surrogate written out, norm clip 0.5
    import copy
    actor = copy.deepcopy(model.actor)
    opt = torch.optim.Adam(actor.parameters(), lr=1e-2, eps=1e-5)
    with torch.no_grad():
        logits0 = model.actor(obs)
    for k in range(1, 4):
        logp = torch.log_softmax(actor(obs), -1).gather(-1, act[:, None]).squeeze(-1)
        r = torch.exp(logp - logp_old)
        loss = (-torch.minimum(r * a, r.clamp(0.8, 1.2) * a) if clip else -r * a).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(actor.parameters(), 0.5)
        opt.step()
        with torch.no_grad():
            logits = actor(obs)
            w = torch.exp(torch.log_softmax(logits.double(), -1).gather(-1, act[:, None]).squeeze(-1)
                          - logp_old.double())
        ess = float(w.sum() ** 2 / (len(w) * (w ** 2).sum()))
        outside = float(((w - 1).abs() > 0.2).double().mean())
        assert rows[k, 0] == pytest.approx(_kl_by_hand(logits0, logits), rel=1e-3, abs=1e-7)
        assert rows[k, 1] == pytest.approx(ess, rel=1e-5)
        assert rows[k, 2] == pytest.approx(outside, abs=1.5 / len(w))
    assert rows[-1, 0] > 0


def test_reuse_one_batch_validation():
    from rlkit.algos import reuse_one_batch
    model, (obs, act, logp_old, adv, ret, v_old) = _fixed_batch(T=8)
    with pytest.raises(ValueError, match="adv"):
        reuse_one_batch(model, (obs, act, logp_old, adv[:3]))
    with pytest.raises(TypeError, match="data"):
        reuse_one_batch(model, (obs, act, logp_old))
    with pytest.raises(ValueError, match="epochs"):
        reuse_one_batch(model, (obs, act, logp_old, adv), epochs=0)
    with pytest.raises(ValueError, match="empty"):
        reuse_one_batch(model, (obs[:0], act[:0], logp_old[:0], adv[:0]))
