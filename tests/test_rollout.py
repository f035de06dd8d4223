"""Tests for rlkit.rollout: gymnasium 1.x autoreset handled correctly (SAME_STEP + final_obs)."""
import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from rlkit.returns import from_gymnasium, gae
from rlkit.rollout import Batch, RolloutCollector, make_vec_env


class CountEnv(gym.Env):
    """obs = [k, 1] where k counts steps in the episode (0 at reset); reward = k + 1 at step k.

    Terminates after ``term_len`` steps (if given); a TimeLimit wrapper adds truncation.
    With ``len_from_seed`` the episode length is 2 + seed % 3, fixed at the seeded reset.
    """

    def __init__(self, term_len=None, len_from_seed=False):
        self.observation_space = gym.spaces.Box(-1e6, 1e6, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.term_len, self.len_from_seed = term_len, len_from_seed
        self.k = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.len_from_seed and seed is not None:
            self.term_len = 2 + seed % 3
        self.k = 0
        return np.array([self.k, 1.0], dtype=np.float32), {}

    def step(self, action):
        self.k += 1
        reward = float(self.k)          # k-th step of the episode gives reward k (never 0)
        terminated = self.term_len is not None and self.k >= self.term_len
        return np.array([self.k, 1.0], dtype=np.float32), reward, terminated, False, {}


def policy_zero(obs):
    n = obs.shape[0]
    return torch.zeros(n, dtype=torch.long), torch.full((n,), -0.5)


def test_make_vec_env_uses_same_step_and_collector_rejects_next_step():
    envs = make_vec_env(lambda: CountEnv(3), 2)
    assert envs.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    bad = gym.vector.SyncVectorEnv([lambda: CountEnv(3)] * 2)     # gymnasium's default NEXT_STEP
    with pytest.raises(ValueError, match="SAME_STEP"):
        RolloutCollector(bad)
    with pytest.raises(TypeError, match="envs"):
        RolloutCollector("CartPole-v1")
    with pytest.raises(ValueError, match="num_envs"):
        make_vec_env("CartPole-v1", 0)
    with pytest.raises(TypeError, match="env"):
        make_vec_env(3, 2)


def test_next_step_pitfall_is_real():
    """Documents the gymnasium behaviour we avoid: with NEXT_STEP the step after an end is a dummy."""
    envs = gym.vector.SyncVectorEnv([lambda: CountEnv(2)])
    envs.reset(seed=0)
    rewards = [envs.step(np.array([0]))[1][0] for _ in range(4)]
    assert rewards == [1.0, 2.0, 0.0, 1.0]          # the 0.0 is a dummy reset transition


def test_terminations_no_dummy_transitions_and_final_obs():
    envs = make_vec_env(lambda: CountEnv(3), 2)
    col = RolloutCollector(envs, seed=0)
    b = col.collect(policy_zero, 7, value_fn=lambda o: 10.0 * o[..., 0])
    assert isinstance(b, Batch)
    assert b.obs.shape == (2, 7, 2) and b.rewards.shape == (2, 7) and b.next_obs.shape == (2, 7, 2)
    k = b.obs[0, :, 0].tolist()
    assert k == [0, 1, 2, 0, 1, 2, 0]                               # every s_t is a real state
    assert b.rewards[0].tolist() == [1, 2, 3, 1, 2, 3, 1]           # never a reward-0 dummy step
    assert b.terminated[0].tolist() == [False, False, True, False, False, True, False]
    assert not b.truncated.any()
    # the true successor: the final observation (k=3) at a termination, else the next obs
    assert b.next_obs[0, :, 0].tolist() == [1, 2, 3, 1, 2, 3, 1]
    assert torch.equal(b.values, 10.0 * b.obs[..., 0])
    assert torch.equal(b.next_values, 10.0 * b.next_obs[..., 0])
    assert b.actions.dtype == torch.long and torch.all(b.logp == -0.5) and b.mask.all()
    # episode log: 2 envs x 2 finished episodes, return 1+2+3 = 6, length 3
    assert col.episodes.returns == [6.0] * 4 and col.episodes.lengths == [3] * 4
    assert col.episodes.steps == [6, 6, 12, 12]                     # env steps when they finished
    assert col.env_steps == 14


def test_truncation_bootstraps_from_final_obs():
    envs = make_vec_env(lambda: gym.wrappers.TimeLimit(CountEnv(None), max_episode_steps=4), 1)
    col = RolloutCollector(envs, seed=0)
    b = col.collect(policy_zero, 6, value_fn=lambda o: 10.0 * o[..., 0] + 1.0)
    assert b.truncated[0].tolist() == [False, False, False, True, False, False]
    assert not b.terminated.any()
    assert b.obs[0, :, 0].tolist() == [0, 1, 2, 3, 0, 1]
    # V(final obs) = 10*4 + 1 at the truncated step, not V(reset obs) = 1
    assert b.next_values[0, 3].item() == 41.0
    assert col.episodes.returns == [10.0] and col.episodes.lengths == [4]


def _gae_reference(rewards, values, next_values, terminated, truncated, gamma, lam):
    """Slow reference: split each row into episodes, GAE inside each episode separately."""
    N, T = rewards.shape
    adv = torch.zeros(N, T, dtype=torch.float64)
    for i in range(N):
        a = 0.0
        for t in reversed(range(T)):
            end = bool(terminated[i, t] or truncated[i, t])
            if end:
                a = 0.0                      # nothing of the next episode leaks back
            boot = 0.0 if terminated[i, t] else float(next_values[i, t])
            delta = float(rewards[i, t]) + gamma * boot - float(values[i, t])
            a = delta + gamma * lam * a
            adv[i, t] = a
    return adv


def test_gae_on_collected_batch_matches_per_episode_reference():
    # env 0 truncates at 4 (term_len 5 never reached), env 1 terminates at 3
    fns = [lambda: gym.wrappers.TimeLimit(CountEnv(5), max_episode_steps=4), lambda: CountEnv(3)]
    envs = gym.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    col = RolloutCollector(envs, seed=1)
    b = col.collect(policy_zero, 11, value_fn=lambda o: 0.3 * o[..., 0] - 0.7)
    assert b.truncated[0].any() and b.terminated[1].any()
    gamma, lam = 0.9, 0.8
    discounts, lam_mask = from_gymnasium(b.terminated, b.truncated, gamma)
    adv, ret = gae(b.rewards.double(), b.values.double(), b.next_values.double(), discounts.double(),
                   lam * lam_mask.double())
    ref = _gae_reference(b.rewards, b.values, b.next_values, b.terminated, b.truncated, gamma, lam)
    assert torch.allclose(adv, ref, atol=1e-6)


def test_collect_episodes_masks_filler_steps():
    envs = make_vec_env(lambda: CountEnv(len_from_seed=True), 3)
    col = RolloutCollector(envs, seed=0)          # lengths 2, 3, 4 (seed + i = 0, 1, 2)
    b = col.collect_episodes(policy_zero, value_fn=lambda o: o[..., 0])
    assert b.obs.shape == (3, 4, 2)
    assert b.mask.sum(1).tolist() == [2, 3, 4]
    assert b.mask[0].tolist() == [True, True, False, False]
    # each real row is one episode from a reset, ending with a termination at its last real step
    assert b.obs[2, :, 0].tolist() == [0, 1, 2, 3]
    assert b.terminated.sum(1).tolist() == [1, 1, 1]
    assert b.terminated[0, 1] and b.terminated[1, 2] and b.terminated[2, 3]
    assert (b.rewards * ~b.mask).abs().sum() == 0             # filler steps carry no reward
    assert col.env_steps == 9                                 # filler steps are not counted
    assert sorted(col.episodes.returns) == [3.0, 6.0, 10.0]
    # a second call starts again from resets
    b2 = col.collect_episodes(policy_zero)
    assert b2.mask.sum(1).tolist() == [2, 3, 4] and col.env_steps == 18


def test_episode_spanning_two_collects_is_logged_whole():
    envs = make_vec_env(lambda: CountEnv(5), 1)
    col = RolloutCollector(envs, seed=0)
    col.collect(policy_zero, 3)
    assert col.episodes.returns == []
    col.collect(policy_zero, 3)
    assert col.episodes.returns == [15.0] and col.episodes.steps == [5]


def test_cartpole_smoke_and_device():
    envs = make_vec_env("CartPole-v1", 4)
    col = RolloutCollector(envs, seed=0, device="cpu")
    def act(o):
        n = o.shape[0]
        return torch.randint(0, 2, (n,)), torch.full((n,), float(np.log(0.5)))
    b = col.collect(act, 50)
    assert b.obs.dtype == torch.float32 and b.obs.shape == (4, 50, 4)
    done = b.dones
    # wherever an episode ended, next_obs differs from the following obs (that one is a reset state)
    i, t = torch.nonzero(done[:, :-1], as_tuple=True)
    assert len(i) > 0
    assert not torch.allclose(b.next_obs[i, t], b.obs[i, t + 1])
    # elsewhere next_obs[t] == obs[t+1]
    keep = ~done[:, :-1]
    assert torch.equal(b.next_obs[:, :-1][keep], b.obs[:, 1:][keep])


# ---------------------------------------------------------------------------------------------
# sample_episodes (chapter 2): NEXT_STEP autoreset with the dummy steps masked out
# ---------------------------------------------------------------------------------------------

def test_sample_episodes_are_complete_cartpole_episodes():
    """Every episode replays step by step through CartPole's own dynamics (obs IS the state):
    a dummy autoreset step inside an episode would break the chain."""
    import gymnasium as gym

    from rlkit.nets import CategoricalPolicy
    from rlkit.rollout import sample_episodes
    torch.manual_seed(0)
    policy = CategoricalPolicy(4, 2, hidden=8)
    state = torch.get_rng_state()
    ep = sample_episodes(policy, 10, seed=5, num_envs=4)
    assert torch.equal(state, torch.get_rng_state())                   # the global RNG is left alone
    n, L = ep["mask"].shape
    assert n == 10 and ep["obs"].shape == (10, L, 4) and L == int(ep["lengths"].max())
    assert torch.equal(ep["lengths"], ep["mask"].sum(1))
    env = gym.make("CartPole-v1").unwrapped
    env.reset(seed=0)
    for j in range(n):
        m = int(ep["lengths"][j])
        assert ep["mask"][j, :m].all() and not ep["mask"][j, m:].any()   # real steps first, then padding
        assert (ep["rewards"][j, :m] == 1).all() and (ep["rewards"][j, m:] == 0).all()
        done = ep["terminated"][j] | ep["truncated"][j]
        assert done[m - 1] and not done[:m - 1].any() and not done[m:].any()
        for t in range(m):                                            # replay the dynamics
            env.state = ep["obs"][j, t].double().numpy()
            nxt, _, term, _, _ = env.step(int(ep["actions"][j, t]))
            if t + 1 < m:
                assert np.allclose(nxt, ep["obs"][j, t + 1].numpy(), atol=1e-5)
            assert term == bool(ep["terminated"][j, t])
    again = sample_episodes(policy, 10, seed=5, num_envs=4)
    assert all(torch.equal(ep[k], again[k]) for k in ep)              # reproducible


def test_sample_episodes_validation():
    from rlkit.nets import CategoricalPolicy
    from rlkit.rollout import make_vec_env, sample_episodes
    policy = CategoricalPolicy(4, 2)
    with pytest.raises(ValueError, match="n_episodes"):
        sample_episodes(policy, 0, seed=0)
    with pytest.raises(TypeError, match="seed"):
        sample_episodes(policy, 2, seed=1.5)
    with pytest.raises(TypeError, match="policy"):
        sample_episodes("pi", 2, seed=0)
    with pytest.raises(ValueError, match="NEXT_STEP"):                # a SAME_STEP env would be misread
        sample_episodes(policy, 2, seed=0, num_envs=2, make_env=lambda n: make_vec_env("CartPole-v1", n))
