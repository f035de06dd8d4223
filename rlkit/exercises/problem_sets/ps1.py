r"""Problem set 1, "From REINFORCE to PPO on CartPole" (chapters 1, 2 and 4): the visible tests.

Skeleton: ``lessons/problem_sets/ps1_reinforce_to_ppo.ipynb``. Five tasks, each an answer cell:

* ``reward_to_go(rewards, dones, gamma)``: :math:`G_t = r_t + \gamma (1 - d_t) G_{t+1}`, time on dim 0;
* ``gae_advantages(rewards, values, next_values, terminated, truncated, gamma, lam)``: GAE with the
  bootstrap cut at terminations only and the trace cut at every episode end;
* ``ppo_clip_loss(logp_new, logp_old, advantages, eps)``: the clipped surrogate, as a loss;
* ``collect_rollout(env, policy, value, obs, num_steps)``: one gymnasium environment, one rollout;
* ``train_ppo(seed, total_steps, lam, ..., epochs)``: the PPO loop, returning ``(policy, history)``.

The expected numbers below are worked by hand (the skeleton shows the working). The instructor's
hidden tests check the same tasks on other shapes, fresh seeds and a learning budget.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from . import ProblemSet, Test, register_problem_set

__all__ = ["PS1", "greedy_return"]


def _close(got, want, tol=1e-5) -> bool:
    got = torch.as_tensor(got, dtype=torch.float64)
    want = torch.as_tensor(want, dtype=torch.float64)
    return got.shape == want.shape and bool((got - want).abs().max() <= tol)


def _fraction(cases, run) -> float | None:
    """Run each ``(label, inputs, want)`` case; a fraction of them right, or AssertionError naming the wrong ones."""
    wrong = []
    for label, inputs, want in cases:
        got = run(*inputs)
        if not _close(got, want):
            shown = [round(float(x), 4) for x in torch.as_tensor(got).reshape(-1)]
            wrong.append(f"{label}: got {shown}, expected {want}")
    if len(wrong) == len(cases):
        raise AssertionError("; ".join(wrong))
    if wrong:
        print("  wrong on: " + "; ".join(wrong))
        return 1.0 - len(wrong) / len(cases)
    return None


# --------------------------------------------------------------------------------------- reward_to_go

def _rtg_cases(ns):
    T, F = True, False
    cases = [
        ("no episode end, gamma 1", (torch.tensor([1.0, 1.0, 1.0]), torch.tensor([F, F, F]), 1.0), [3.0, 2.0, 1.0]),
        ("an episode ends at t=1, gamma 0.5", (torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([F, T, F, F]), 0.5),
         [2.0, 2.0, 5.0, 4.0]),
        ("gamma 0: each reward alone", (torch.tensor([3.0, -1.0, 2.0]), torch.tensor([F, F, T]), 0.0),
         [3.0, -1.0, 2.0]),
    ]
    return _fraction(cases, ns["reward_to_go"])


def _rtg_contract(ns):
    r = torch.tensor([[1.0, 0.0], [2.0, 1.0], [3.0, 1.0]], dtype=torch.float64)
    d = torch.tensor([[False, True], [False, False], [False, False]])
    r0 = r.clone()
    got = ns["reward_to_go"](r, d, 1.0)
    assert torch.equal(r, r0), "reward_to_go modified its rewards argument in place"
    assert isinstance(got, torch.Tensor) and got.shape == r.shape, \
        f"reward_to_go on [T, N] = [3, 2] must return [3, 2], got {getattr(got, 'shape', type(got))}"
    assert got.dtype == torch.float64, f"float64 rewards must give float64 returns, got {got.dtype}"
    assert _close(got, [[6.0, 0.0], [5.0, 2.0], [3.0, 1.0]]), \
        f"on [T, N] the columns are separate environments (time is dim 0): got {got.tolist()}"


# ------------------------------------------------------------------------------------- gae_advantages

def _gae_cases(ns):
    T, F = True, False
    one = torch.ones(3)
    cases = [
        ("no episode end, gamma 0.5, lam 0.5",
         (torch.ones(3), torch.zeros(3), torch.tensor([0.0, 0.0, 2.0]), torch.tensor([F, F, F]),
          torch.tensor([F, F, F]), 0.5, 0.5), [1.375, 1.5, 2.0]),
        ("terminated at t=1, gamma 0.5, lam 1", (one, one, one, torch.tensor([F, T, F]), torch.tensor([F, F, F]),
                                                 0.5, 1.0), [0.5, 0.0, 0.5]),
        ("truncated at t=1, gamma 0.5, lam 1", (one, one, one, torch.tensor([F, F, F]), torch.tensor([F, T, F]),
                                                0.5, 1.0), [0.75, 0.5, 0.5]),
        ("lam 0: the TD errors", (torch.tensor([1.0, 2.0]), torch.tensor([0.5, 1.0]), torch.tensor([1.0, 3.0]),
                                  torch.tensor([F, F]), torch.tensor([F, F]), 0.9, 0.0), [1.4, 3.7]),
    ]
    return _fraction(cases, ns["gae_advantages"])


# -------------------------------------------------------------------------------------- ppo_clip_loss

def _clip_value(ns):
    old = torch.zeros(5)
    new = torch.log(torch.tensor([1.5, 0.5, 1.1, 0.9, 0.5]))
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, -1.0])
    got = ns["ppo_clip_loss"](new, old, adv, 0.2)
    assert isinstance(got, torch.Tensor) and got.ndim == 0, "ppo_clip_loss must return a scalar tensor"
    # per sample min(rho A, clip(rho) A): 1.2, 0.5, -1.1, -0.9, -0.8; the loss is minus their mean
    assert abs(float(got) - 0.22) < 1e-5, (
        f"ppo_clip_loss = {float(got):.5f}, expected 0.22 = -mean(1.2, 0.5, -1.1, -0.9, -0.8); a positive "
        "objective here means you returned the objective, not the loss; 0.1 means no clip on the A < 0 side")


def _clip_grad(ns):
    old = torch.zeros(4)
    new = torch.log(torch.tensor([1.5, 0.5, 1.1, 0.5])).requires_grad_(True)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    ns["ppo_clip_loss"](new, old, adv, 0.2).backward()
    assert new.grad is not None, "no gradient reached logp_new (did you detach it, or build the loss from floats?)"
    want = [0.0, -0.125, 0.275, 0.0]   # -A rho / 4 where the clip is inactive, 0 where it is active
    assert _close(new.grad, want), (f"d loss / d logp_new = {[round(float(x), 4) for x in new.grad]}, expected "
                                    f"{want}: 0 where the clipped term is the smaller one")


# ------------------------------------------------------------------------------------ collect_rollout

def _cartpole_rollout(ns, num_steps=300, seed=0):
    torch.manual_seed(seed)
    env = gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1"))
    obs, _ = env.reset(seed=seed)
    policy = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    value = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    out = ns["collect_rollout"](env, policy, value, obs, num_steps)
    env.close()
    return out, policy, value


_KEYS = ("obs", "actions", "logp", "rewards", "values", "next_values", "terminated", "truncated", "last_obs",
         "episode_returns")


def _rollout_shapes(ns):
    out, _, _ = _cartpole_rollout(ns)
    assert isinstance(out, dict), f"collect_rollout must return a dict, got {type(out).__name__}"
    missing = [k for k in _KEYS if k not in out]
    assert not missing, f"collect_rollout's dict lacks {missing}"
    assert tuple(out["obs"].shape) == (300, 4), f"obs must be [num_steps, 4], got {tuple(out['obs'].shape)}"
    for k in ("actions", "logp", "rewards", "values", "next_values", "terminated", "truncated"):
        assert tuple(out[k].shape) == (300,), f"{k} must have shape [num_steps] = [300], got {tuple(out[k].shape)}"
    assert out["terminated"].dtype == torch.bool and out["truncated"].dtype == torch.bool, \
        "terminated and truncated must be bool tensors"
    assert not out["logp"].requires_grad and not out["values"].requires_grad, \
        "logp and values are data (collected without gradients): compute them under torch.no_grad()"


def _rollout_logp_values(ns):
    out, policy, value = _cartpole_rollout(ns)
    with torch.no_grad():
        lp = torch.log_softmax(policy(out["obs"].float()), -1).gather(-1, out["actions"].long()[:, None])[:, 0]
        v = value(out["obs"].float()).reshape(-1)
    assert (out["logp"] - lp).abs().max() < 1e-5, "logp[t] must be log pi(actions[t] | obs[t]) under the policy"
    assert (out["values"] - v).abs().max() < 1e-5, "values[t] must be V(obs[t])"
    ends = out["terminated"] | out["truncated"]
    inside = ~ends[:-1]
    assert (out["next_values"][:-1][inside] - v[1:][inside]).abs().max() < 1e-5, \
        "inside an episode next_values[t] must equal V(obs[t + 1]) = values[t + 1]"
    with torch.no_grad():
        last = value(torch.as_tensor(np.asarray(out["last_obs"]), dtype=torch.float32)[None]).reshape(-1)[0]
    if not bool(ends[-1]):
        assert abs(float(out["next_values"][-1]) - float(last)) < 1e-5, \
            "the last step's next_values must be V(last_obs), the state the next rollout starts from"


def _rollout_episodes(ns):
    out, _, _ = _cartpole_rollout(ns)
    ends = (out["terminated"] | out["truncated"]).tolist()
    assert sum(ends) >= 2, "with a random policy CartPole episodes last about 20 steps: 300 steps should end several"
    sums, acc = [], 0.0
    for r, e in zip(out["rewards"].tolist(), ends):
        acc += r
        if e:
            sums.append(acc)
            acc = 0.0
    got = [float(x) for x in out["episode_returns"]]
    assert len(got) == len(sums) and all(abs(a - b) < 1e-4 for a, b in zip(got, sums)), \
        f"episode_returns {got[:6]}... must be the returns of the episodes that ended, in order: {sums[:6]}..."
    starts = [0] + [t + 1 for t, e in enumerate(ends[:-1]) if e]
    assert all(float(out["obs"][t].abs().max()) <= 0.05 for t in starts), \
        "after an episode ends, reset the environment: the next obs must be a fresh start (all |x| <= 0.05)"


# ------------------------------------------------------------------------------------------ train_ppo

def greedy_return(policy, seed: int, episodes: int = 5) -> float:
    """Mean return of the greedy policy (argmax of its logits) over ``episodes`` CartPole-v1 episodes."""
    env = gym.make("CartPole-v1")
    total = 0.0
    for e in range(episodes):
        obs, _ = env.reset(seed=seed + e)
        done = False
        while not done:
            with torch.no_grad():
                a = int(policy(torch.as_tensor(np.asarray(obs), dtype=torch.float32)[None])[0].argmax())
            obs, r, term, trunc, _ = env.step(a)
            total += float(r)
            done = term or trunc
    env.close()
    return total / episodes


VISIBLE_STEPS, VISIBLE_TARGET = 10_000, 120.0


def _train_visible(ns):
    policy, history = ns["train_ppo"](seed=1, total_steps=VISIBLE_STEPS)
    assert isinstance(history, dict) and "episode_returns" in history, \
        "train_ppo must return (policy, history) with history['episode_returns'] (a list)"
    got = greedy_return(policy, seed=12_345)
    assert got >= VISIBLE_TARGET, (f"after {VISIBLE_STEPS} steps (seed 1) the greedy policy's mean return over 5 "
                                   f"episodes is {got:.1f}; the target is {VISIBLE_TARGET:g}")


#: Problem set 1 (REINFORCE to PPO on CartPole), with its tasks, visible tests and points, registered under ``"ps1"``.
PS1 = register_problem_set(ProblemSet(
    key="ps1",
    title="From REINFORCE to PPO on CartPole",
    chapters=(1, 2, 4),
    notebook="lessons/problem_sets/ps1_reinforce_to_ppo.ipynb",
    tasks=("reward_to_go", "gae_advantages", "ppo_clip_loss", "collect_rollout", "train_ppo"),
    visible=(
        Test("rtg_hand_cases", "reward_to_go", 2, _rtg_cases),
        Test("rtg_batch_contract", "reward_to_go", 1, _rtg_contract),
        Test("gae_hand_cases", "gae_advantages", 4, _gae_cases),
        Test("clip_loss_value", "ppo_clip_loss", 2, _clip_value),
        Test("clip_loss_gradient", "ppo_clip_loss", 1, _clip_grad),
        Test("rollout_keys_shapes", "collect_rollout", 1, _rollout_shapes),
        Test("rollout_logp_values", "collect_rollout", 2, _rollout_logp_values),
        Test("rollout_episodes_resets", "collect_rollout", 1, _rollout_episodes),
        Test("ppo_learns_seed_1", "train_ppo", 4, _train_visible, timeout=300.0),
    ),
    written_points=45.0,
))
