r"""Problem set 1, "From REINFORCE to PPO on CartPole" (instructor side): reference solution and hidden tests.

The student's side (the visible tests) is :mod:`rlkit.exercises.problem_sets.ps1`; the skeleton is
``lessons/problem_sets/ps1_reinforce_to_ppo.ipynb``; the rubric of the written part is
``book/instructor/ps1_rubric.md``.

The reference below is what a student could write from the chapters: plain loops over time, one
gymnasium environment, two small tanh MLPs. It uses nothing from ``rlkit`` (the tests compare it with
``rlkit.returns``). :func:`ppo_update` is a helper of :func:`train_ppo` here (problem set 5 grades it).
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlkit.exercises.problem_sets import Test
from rlkit.exercises.problem_sets import ps1 as _visible
from rlkit.exercises.problem_sets.ps1 import greedy_return

__all__: list[str] = []   # instructor data (the reference and the hidden tests), not library API


# --------------------------------------------------------------------------------- the reference

def reward_to_go(rewards, dones, gamma):
    """G_t = r_t + gamma (1 - done_t) G_{t+1}, with G = 0 after the last step; time is dim 0."""
    out = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        running = rewards[t] + gamma * (1.0 - dones[t].to(rewards.dtype)) * running
        out[t] = running
    return out


def gae_advantages(rewards, values, next_values, terminated, truncated, gamma, lam):
    """GAE: delta_t = r_t + gamma (1 - term_t) V(s_{t+1}) - V(s_t); A_t = delta_t + gamma lam (1 - done_t) A_{t+1}."""
    term = terminated.to(rewards.dtype)
    done = (terminated | truncated).to(rewards.dtype)
    delta = rewards + gamma * (1.0 - term) * next_values - values
    adv = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        running = delta[t] + gamma * lam * (1.0 - done[t]) * running
        adv[t] = running
    return adv


def ppo_clip_loss(logp_new, logp_old, advantages, eps=0.2):
    """-mean(min(rho A, clip(rho, 1 - eps, 1 + eps) A)) with rho = exp(logp_new - logp_old)."""
    ratio = torch.exp(logp_new - logp_old)
    clipped = torch.clamp(ratio, 1.0 - eps, 1.0 + eps)
    return -torch.min(ratio * advantages, clipped * advantages).mean()


def _as_obs(obs):
    return torch.as_tensor(np.asarray(obs), dtype=torch.float32)


def collect_rollout(env, policy, value, obs, num_steps):
    """Run ``policy`` for ``num_steps`` steps of ``env`` from ``obs``; see the skeleton for the returned keys."""
    obs_l, act_l, logp_l, rew_l, val_l, term_l, trunc_l = [], [], [], [], [], [], []
    next_val = {}                               # step -> V(final observation) where an episode ended
    episode_returns = []
    with torch.no_grad():
        for t in range(num_steps):
            o = _as_obs(obs)
            logp_all = torch.log_softmax(policy(o[None])[0], dim=-1)
            a = int(torch.multinomial(logp_all.exp(), 1))
            obs_l.append(o)
            act_l.append(a)
            logp_l.append(float(logp_all[a]))
            val_l.append(float(value(o[None]).reshape(-1)[0]))
            obs, r, term, trunc, info = env.step(a)
            rew_l.append(float(r))
            term_l.append(bool(term))
            trunc_l.append(bool(trunc))
            if term or trunc:
                # the bootstrap value is V of the state the step reached, before the reset
                next_val[t] = float(value(_as_obs(obs)[None]).reshape(-1)[0])
                if "episode" in info:
                    episode_returns.append(float(np.asarray(info["episode"]["r"]).reshape(-1)[0]))
                obs, _ = env.reset()
        last_value = float(value(_as_obs(obs)[None]).reshape(-1)[0])
    nv = [next_val.get(t, val_l[t + 1] if t + 1 < num_steps else last_value) for t in range(num_steps)]
    return {"obs": torch.stack(obs_l), "actions": torch.tensor(act_l), "logp": torch.tensor(logp_l),
            "rewards": torch.tensor(rew_l), "values": torch.tensor(val_l), "next_values": torch.tensor(nv),
            "terminated": torch.tensor(term_l), "truncated": torch.tensor(trunc_l), "last_obs": obs,
            "episode_returns": episode_returns}


def ppo_update(policy, value, optimizer, batch, advantages, returns, epochs=20, eps=0.2, vf_coef=0.5,
               max_grad_norm=0.5):
    """``epochs`` full-batch PPO-clip steps on one rollout; returns the mean loss terms and the clip fraction."""
    obs, actions, logp_old = batch["obs"], batch["actions"], batch["logp"]
    adv = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    stats = {"policy_loss": 0.0, "value_loss": 0.0, "clip_frac": 0.0}
    for _ in range(epochs):
        logp = torch.log_softmax(policy(obs), dim=-1).gather(-1, actions[:, None]).squeeze(-1)
        pl = ppo_clip_loss(logp, logp_old, adv, eps)
        vl = ((value(obs).reshape(-1) - returns) ** 2).mean()
        optimizer.zero_grad()
        (pl + vf_coef * vl).backward()
        nn.utils.clip_grad_norm_(params, max_grad_norm)
        optimizer.step()
        with torch.no_grad():
            stats["policy_loss"] += pl.item() / epochs
            stats["value_loss"] += vl.item() / epochs
            stats["clip_frac"] += ((logp - logp_old).exp().sub(1).abs() > eps).float().mean().item() / epochs
    return stats


def _mlp(n_in, n_out, hidden=64):
    return nn.Sequential(nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                         nn.Linear(hidden, n_out))


def train_ppo(seed=0, total_steps=15_000, lam=0.8, gamma=0.98, num_steps=256, epochs=20, lr=2e-3, eps=0.2,
              vf_coef=0.5, hidden=64):
    """PPO-clip on CartPole-v1; returns ``(policy, history)``."""
    torch.manual_seed(seed)
    env = gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1"))
    obs, _ = env.reset(seed=seed)
    policy, value = _mlp(4, 2, hidden), _mlp(4, 1, hidden)
    optimizer = torch.optim.Adam([*policy.parameters(), *value.parameters()], lr=lr, eps=1e-5)
    iters = max(1, total_steps // num_steps)
    history = {"steps": [], "episode_returns": [], "episode_end_steps": [], "clip_frac": []}
    for it in range(iters):
        frac = 1.0 - it / iters                       # anneal the learning rate and the clip range
        for group in optimizer.param_groups:
            group["lr"] = lr * frac
        batch = collect_rollout(env, policy, value, obs, num_steps)
        obs = batch["last_obs"]
        adv = gae_advantages(batch["rewards"], batch["values"], batch["next_values"], batch["terminated"],
                             batch["truncated"], gamma, lam)
        stats = ppo_update(policy, value, optimizer, batch, adv, adv + batch["values"], epochs, eps * frac, vf_coef)
        steps = (it + 1) * num_steps
        history["steps"].append(steps)
        history["clip_frac"].append(stats["clip_frac"])
        history["episode_returns"].extend(batch["episode_returns"])
        history["episode_end_steps"].extend([steps] * len(batch["episode_returns"]))
    env.close()
    return policy, history


def reference_namespace() -> dict:
    """Task name -> the reference object (what a full-marks submission defines)."""
    return {"reward_to_go": reward_to_go, "gae_advantages": gae_advantages, "ppo_clip_loss": ppo_clip_loss,
            "collect_rollout": collect_rollout, "train_ppo": train_ppo}


# --------------------------------------------------------------------------------- hidden tests

def _batch_rtg(ns):
    """[T, N] rewards with episodes ending in the middle, float64; compared with a per-episode sum."""
    g = torch.Generator().manual_seed(7_001)
    T, N, gamma = 23, 5, 0.93
    r = torch.randn(T, N, generator=g, dtype=torch.float64)
    d = torch.rand(T, N, generator=g) < 0.2
    got = ns["reward_to_go"](r, d, gamma)
    assert tuple(got.shape) == (T, N), f"reward_to_go on [T, N] = [{T}, {N}] returned shape {tuple(got.shape)}"
    for n in range(N):
        for t in range(T):
            want, k = 0.0, 0
            for s in range(t, T):
                want += gamma ** k * float(r[s, n])
                k += 1
                if d[s, n]:
                    break
            assert abs(float(got[t, n]) - want) < 1e-9, (
                f"reward_to_go[{t}, {n}] = {float(got[t, n]):.6f}, expected {want:.6f} (the discounted sum of "
                "this episode's rewards from t on; episodes end where dones is True, columns are independent)")


def hidden_gae_batch(ns):
    """[T, N] float64 GAE with terminations and truncations in the middle; compared with rlkit.returns.gae."""
    from rlkit.returns import gae
    g = torch.Generator().manual_seed(7_002)
    T, N, gamma, lam = 19, 4, 0.97, 0.9
    r = torch.randn(T, N, generator=g, dtype=torch.float64)
    v = torch.randn(T, N, generator=g, dtype=torch.float64)
    nv = torch.randn(T, N, generator=g, dtype=torch.float64)
    u = torch.rand(T, N, generator=g)
    term, trunc = u < 0.12, (u > 0.12) & (u < 0.22)
    got = ns["gae_advantages"](r, v, nv, term, trunc, gamma, lam)
    disc = gamma * (~term).double()          # rlkit.returns puts time on the last axis: transpose
    want = gae(r.T, v.T, nv.T, disc.T, lam * (~(term | trunc)).double().T)[0].T
    assert tuple(got.shape) == (T, N), f"gae_advantages on [T, N] returned shape {tuple(got.shape)}"
    err = (got - want).abs().max().item()
    assert err < 1e-9, f"gae_advantages on a [T, N] float64 batch with mid-rollout ends: max error {err:.3g}"


def _clip_grad(ns):
    """Gradient of the loss wrt logp_new: zero where the clip is active, -A/n * rho elsewhere."""
    g = torch.Generator().manual_seed(7_003)
    n, eps = 64, 0.15
    old = torch.randn(n, generator=g, dtype=torch.float64)
    new = (old + 0.4 * torch.randn(n, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    loss = ns["ppo_clip_loss"](new, old, adv, eps)
    assert loss.ndim == 0, f"ppo_clip_loss must return a scalar, got shape {tuple(loss.shape)}"
    loss.backward()
    rho = (new - old).exp().detach()
    active = ((adv > 0) & (rho > 1 + eps)) | ((adv < 0) & (rho < 1 - eps))
    want = torch.where(active, torch.zeros_like(rho), -adv * rho / n)
    assert new.grad is not None, "no gradient reached logp_new"
    err = (new.grad - want).abs().max().item()
    assert err < 1e-12, (f"d loss / d logp_new is off by up to {err:.3g}: it must be 0 where the clip is active "
                         "(A > 0 and rho > 1 + eps, or A < 0 and rho < 1 - eps) and -A rho / n elsewhere")


class _Chain(gym.Env):
    """A deterministic chain: obs = [position, t, 0, 0]; terminates at position 3, truncates at t = 4."""

    observation_space = gym.spaces.Box(-100.0, 100.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.t = 0, 0
        return self._obs(), {}

    def _obs(self):
        return np.array([self.pos, self.t, 0.0, 0.0], dtype=np.float32)

    def step(self, action):
        self.pos += 1 if int(action) == 1 else 0
        self.t += 1
        term = self.pos >= 3
        trunc = (not term) and self.t >= 4
        return self._obs(), 1.0 + self.pos, term, trunc, {}


def _chain_rollout(ns, num_steps=37, seed=0):
    torch.manual_seed(seed)
    env = gym.wrappers.RecordEpisodeStatistics(_Chain())
    obs, _ = env.reset(seed=seed)
    policy = nn.Linear(4, 2)
    value = nn.Linear(4, 1)
    with torch.no_grad():
        policy.weight.copy_(torch.tensor([[0.3, -0.2, 0.0, 0.0], [-0.1, 0.25, 0.0, 0.0]]))
        policy.bias.zero_()
        value.weight.copy_(torch.tensor([[1.0, 10.0, 0.0, 0.0]]))    # V = pos + 10 t + 0.5: tells states apart
        value.bias.fill_(0.5)
    out = ns["collect_rollout"](env, policy, value, obs, num_steps)
    return out, policy, value


def hidden_rollout_truncation(ns):
    """On a chain that truncates at t = 4: next_values at a truncation is V(final state), not V(reset state)."""
    out, policy, value = _chain_rollout(ns)
    obs, nv = out["obs"], out["next_values"]
    trunc, term = out["truncated"].bool(), out["terminated"].bool()
    assert trunc.any(), "the chain truncates every 4 steps without a termination; no step is marked truncated"
    # the state reached by step t: obs[t] + (action, 1) in (pos, t)
    reached = obs.clone()
    reached[:, 0] += out["actions"].to(obs.dtype)
    reached[:, 1] += 1
    want = value(reached).reshape(-1).detach()
    bad = ((nv - want).abs() > 1e-5)
    assert not bad[trunc].any(), ("at a truncation next_values must be V of the state the step reached "
                                  "(the final observation), not V of the reset state of the next episode")
    assert not bad[term].any(), "at a termination next_values must be V of the final observation"
    assert not bad.any(), "next_values[t] must be V(s_{t+1}) for every step t"
    starts = torch.zeros_like(trunc)
    starts[1:] = trunc[:-1] | term[:-1]
    assert (obs[starts][:, :2] == 0).all(), "the observation after an episode's end must be the reset observation"


def hidden_rollout_episode_returns(ns):
    """Episode returns on the chain equal the sums of the rewards between ends (every ended episode, in order)."""
    out, _, _ = _chain_rollout(ns, num_steps=53, seed=3)
    r, ends = out["rewards"], (out["terminated"] | out["truncated"]).bool()
    want, acc = [], 0.0
    for t in range(len(r)):
        acc += float(r[t])
        if ends[t]:
            want.append(acc)
            acc = 0.0
    got = [float(x) for x in out["episode_returns"]]
    assert len(got) == len(want) and all(abs(a - b) < 1e-4 for a, b in zip(got, want)), (
        f"episode_returns {got} but the rewards between episode ends sum to {want}")
    lo = torch.log_softmax(nn.functional.linear(out["obs"], torch.tensor([[0.3, -0.2, 0.0, 0.0],
                                                                          [-0.1, 0.25, 0.0, 0.0]])), -1)
    want_logp = lo.gather(-1, out["actions"].long()[:, None]).squeeze(-1)
    assert (out["logp"] - want_logp).abs().max() < 1e-5, "logp[t] must be log pi(actions[t] | obs[t])"


#: fresh seeds of the hidden learning test, its step budget and the greedy return it asks for
LEARN_SEEDS, LEARN_STEPS, LEARN_TARGET = (90_001, 90_002, 90_003), 10_000, 120.0


def _learns(ns):
    """train_ppo(seed, total_steps=10_000) on 3 fresh seeds: greedy return over 5 new episodes >= 120.

    Full credit for 2 of 3 seeds, half for 1 (the reference's margins: tests/test_problem_sets_ps1.py)."""
    got = []
    for s in LEARN_SEEDS:
        policy, _ = ns["train_ppo"](seed=s, total_steps=LEARN_STEPS)
        got.append(greedy_return(policy, seed=10 * s))
    ok = sum(g >= LEARN_TARGET for g in got)
    assert ok >= 1, (f"after {LEARN_STEPS} steps the greedy return was {[round(g) for g in got]} on seeds "
                     f"{LEARN_SEEDS}; none reached {LEARN_TARGET:g}")
    return min(1.0, ok / 2)


HIDDEN: tuple[Test, ...] = (
    Test("rtg_batch_mid_episode_ends", "reward_to_go", 3, _batch_rtg),
    Test("gae_batch_terminations_truncations", "gae_advantages", 4, hidden_gae_batch),
    Test("clip_gradient_active_set", "ppo_clip_loss", 4, _clip_grad),
    Test("rollout_truncation_bootstrap", "collect_rollout", 5, hidden_rollout_truncation),
    Test("rollout_episode_returns_and_logp", "collect_rollout", 3, hidden_rollout_episode_returns),
    Test("ppo_learns_fresh_seeds", "train_ppo", 10, _learns, timeout=300.0),
)

assert {t.task for t in HIDDEN} <= set(_visible.PS1.tasks)
