r"""Problem set 5, "Bug hunt" (instructor side): the three bugs, the fixed trainer, reference diagnostics and
hidden tests.

The shipped trainer (:data:`rlkit.exercises.problem_sets.ps5.SHIPPED_SOURCE`) has three silent bugs:

1. ``collect_rollout`` stores the observation *after* the step (``obs_l.append`` follows ``env.step``,
   which rebinds ``obs``), so ``obs[t]`` is :math:`s_{t+1}` while ``actions[t]``, ``logp[t]`` and
   ``values[t]`` belong to :math:`s_t`. The update then fits the policy and the value to the wrong states,
   and the ratio at the first epoch is not 1.
2. ``gae_advantages`` swaps its two masks: it drops the bootstrap at truncations and keeps it at
   terminations (so falling costs nothing: every step looks like ``1 + gamma V - V``), and it cuts the
   trace at terminations only (so a truncated episode's advantages leak into the next episode's).
3. ``ppo_update`` recomputes the "old" log-probabilities from the current policy at every epoch instead
   of using the rollout's ``batch["logp"]``: the ratio is exactly 1 at every step, the clip never acts,
   the reported clip fraction is 0, and 20 epochs become 20 unconstrained policy-gradient steps.

The reference below is the trainer with the three fixes (nothing else changed); the rubric is
``book/instructor/ps5_rubric.md``.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlkit.exercises.problem_sets import Test
from rlkit.exercises.problem_sets import ps5 as _visible
from rlkit.exercises.problem_sets.ps1 import greedy_return
from rlkit.exercises.solutions import ps1 as _ps1

__all__: list[str] = []   # instructor data (the reference and the hidden tests), not library API


# ------------------------------------------------------------------------------- the fixed trainer

def _as_obs(x):
    return torch.as_tensor(np.asarray(x), dtype=torch.float32)


def collect_rollout(env, policy, value, obs, num_steps):
    """The shipped collector with bug 1 fixed: ``obs[t]`` is the observation the action was chosen from."""
    obs_l, act_l, logp_l, rew_l, val_l, term_l, trunc_l = [], [], [], [], [], [], []
    final_values = {}
    episode_returns = []
    with torch.no_grad():
        for t in range(num_steps):
            o = _as_obs(obs)
            obs_l.append(o)                                   # fix 1: record s_t, before the step
            logp_all = torch.log_softmax(policy(o[None])[0], dim=-1)
            a = int(torch.multinomial(logp_all.exp(), 1))
            logp_l.append(float(logp_all[a]))
            val_l.append(float(value(o[None]).reshape(-1)[0]))
            act_l.append(a)
            obs, r, term, trunc, info = env.step(a)
            rew_l.append(float(r))
            term_l.append(bool(term))
            trunc_l.append(bool(trunc))
            if term or trunc:
                final_values[t] = float(value(_as_obs(obs)[None]).reshape(-1)[0])
                episode_returns.append(float(np.asarray(info["episode"]["r"]).reshape(-1)[0]))
                obs, _ = env.reset()
        last_value = float(value(_as_obs(obs)[None]).reshape(-1)[0])
    next_values = [final_values.get(t, val_l[t + 1] if t + 1 < num_steps else last_value) for t in range(num_steps)]
    return {"obs": torch.stack(obs_l), "actions": torch.tensor(act_l), "logp": torch.tensor(logp_l),
            "rewards": torch.tensor(rew_l), "values": torch.tensor(val_l), "next_values": torch.tensor(next_values),
            "terminated": torch.tensor(term_l), "truncated": torch.tensor(trunc_l), "last_obs": obs,
            "episode_returns": episode_returns}


def gae_advantages(rewards, values, next_values, terminated, truncated, gamma, lam):
    """Fix 2: no bootstrap after a termination; the trace cut at every episode end."""
    bootstrap = 1.0 - terminated.to(rewards.dtype)
    carry = 1.0 - (terminated | truncated).to(rewards.dtype)
    delta = rewards + gamma * bootstrap * next_values - values
    adv = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        running = delta[t] + gamma * lam * carry[t] * running
        adv[t] = running
    return adv


def ppo_update(policy, value, optimizer, batch, advantages, returns, epochs=20, eps=0.2, vf_coef=0.5,
               max_grad_norm=0.5):
    """Fix 3: the ratio is against the rollout's log-probabilities ``batch["logp"]``, fixed for all epochs."""
    obs, actions, logp_old = batch["obs"], batch["actions"], batch["logp"]
    adv = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    stats = {"policy_loss": 0.0, "value_loss": 0.0, "clip_frac": 0.0}
    for _ in range(epochs):
        logp = torch.log_softmax(policy(obs), dim=-1).gather(-1, actions[:, None]).squeeze(-1)
        ratio = torch.exp(logp - logp_old)
        clipped = torch.clamp(ratio, 1.0 - eps, 1.0 + eps)
        policy_loss = -torch.min(ratio * adv, clipped * adv).mean()
        value_loss = ((value(obs).reshape(-1) - returns) ** 2).mean()
        optimizer.zero_grad()
        (policy_loss + vf_coef * value_loss).backward()
        nn.utils.clip_grad_norm_(params, max_grad_norm)
        optimizer.step()
        stats["policy_loss"] += policy_loss.item() / epochs
        stats["value_loss"] += value_loss.item() / epochs
        stats["clip_frac"] += ((ratio.detach() - 1.0).abs() > eps).float().mean().item() / epochs
    return stats


# ------------------------------------------------------------------------- reference diagnostics

def diagnose_rollout(collect_rollout):
    """logp[t] and values[t] must be the policy's and the critic's outputs on obs[t] (the stored state)."""
    torch.manual_seed(0)
    env = gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1"))
    obs, _ = env.reset(seed=0)
    policy, value = nn.Linear(4, 2), nn.Linear(4, 1)
    out = collect_rollout(env, policy, value, obs, 100)
    with torch.no_grad():
        logp = torch.log_softmax(policy(out["obs"]), -1).gather(-1, out["actions"][:, None]).squeeze(-1)
        v = value(out["obs"]).reshape(-1)
    assert torch.allclose(out["logp"], logp, atol=1e-5), "logp[t] is not log pi(actions[t] | obs[t])"
    assert torch.allclose(out["values"], v, atol=1e-5), "values[t] is not V(obs[t])"


def diagnose_gae(gae_advantages):
    """Hand-worked cases: a termination (no bootstrap, trace cut) and a truncation (bootstrap, trace cut)."""
    one, no = torch.ones(3), torch.zeros(3, dtype=torch.bool)
    at1 = torch.tensor([False, True, False])
    got = gae_advantages(one, one, one, at1, no, 0.5, 1.0)
    assert torch.allclose(got, torch.tensor([0.5, 0.0, 0.5])), f"terminated at t=1: {got.tolist()}"
    got = gae_advantages(one, one, one, no, at1, 0.5, 1.0)
    assert torch.allclose(got, torch.tensor([0.75, 0.5, 0.5])), f"truncated at t=1: {got.tolist()}"


def diagnose_update(ppo_update):
    """Every sample's ratio against the rollout's logp is outside the clip on the side its advantage favours:
    the policy gradient is 0 and the policy must not move (only the critic learns)."""
    torch.manual_seed(0)
    policy, value = nn.Linear(4, 2), nn.Linear(4, 1)
    obs, actions = torch.randn(64, 4), torch.randint(0, 2, (64,))
    with torch.no_grad():
        logp_now = torch.log_softmax(policy(obs), -1).gather(-1, actions[:, None]).squeeze(-1)
    adv = torch.cat([torch.ones(32), -torch.ones(32)])
    logp_old = logp_now - torch.cat([torch.ones(32), -torch.ones(32)])     # rho = e for A > 0, 1/e for A < 0
    batch = {"obs": obs, "actions": actions, "logp": logp_old}
    before = [p.detach().clone() for p in policy.parameters()]
    opt = torch.optim.Adam([*policy.parameters(), *value.parameters()], lr=1e-2)
    ppo_update(policy, value, opt, batch, adv, torch.zeros(64), epochs=5, eps=0.2)
    moved = max((p - b).abs().max().item() for p, b in zip(policy.parameters(), before))
    assert moved == 0.0, f"the policy moved by {moved:.3g} although every sample is clipped against batch['logp']"


def reference_namespace() -> dict:
    """Task name -> the reference object."""
    return {"collect_rollout": collect_rollout, "gae_advantages": gae_advantages, "ppo_update": ppo_update,
            "diagnose_rollout": diagnose_rollout, "diagnose_gae": diagnose_gae, "diagnose_update": diagnose_update}


#: which task each bug lives in, and the hidden test that its fix moves
BUGS = {"collect_rollout": "rollout_obs_alignment", "gae_advantages": "gae_masks_batch",
        "ppo_update": "update_clips_against_rollout_logp"}


# --------------------------------------------------------------------------------- hidden tests

def _rollout_alignment(ns):
    """The chain env of problem set 1: next_values at truncations, obs/logp alignment, episode returns."""
    _ps1.hidden_rollout_episode_returns(ns)      # logp[t] against obs[t] first: it names the misalignment
    _ps1.hidden_rollout_truncation(ns)


def _update_clips(ns):
    """Against batch['logp']: a fully clipped batch leaves the policy still, an unclipped one moves it up."""
    torch.manual_seed(5)
    policy, value = nn.Linear(3, 3), nn.Linear(3, 1)
    n, eps = 48, 0.1
    obs, actions = torch.randn(n, 3), torch.randint(0, 3, (n,))
    with torch.no_grad():
        now = torch.log_softmax(policy(obs), -1).gather(-1, actions[:, None]).squeeze(-1)
    sign = torch.cat([torch.ones(n // 2), -torch.ones(n // 2)])
    adv = 2.0 * sign + 0.1 * torch.randn(n).abs() * sign
    before = [p.detach().clone() for p in policy.parameters()]
    opt = torch.optim.Adam([*policy.parameters(), *value.parameters()], lr=1e-2)
    stats = ns["ppo_update"](policy, value, opt, {"obs": obs, "actions": actions, "logp": now - 0.3 * sign},
                             adv, torch.zeros(n), epochs=3, eps=eps)
    moved = max((p - b).abs().max().item() for p, b in zip(policy.parameters(), before))
    assert moved == 0.0, ("the policy moved although every sample's ratio to batch['logp'] is outside the clip "
                          f"on the side its advantage favours (moved by {moved:.3g})")
    assert isinstance(stats, dict) and stats.get("clip_frac", 0.0) > 0.99, \
        f"every sample is clipped, so the reported clip_frac must be 1, got {stats.get('clip_frac') if stats else None}"
    # inside the clip range (ratio 1 against batch['logp']): one epoch raises the advantage-weighted log-likelihood
    opt = torch.optim.Adam([*policy.parameters(), *value.parameters()], lr=1e-2)
    ns["ppo_update"](policy, value, opt, {"obs": obs, "actions": actions, "logp": now}, adv, torch.zeros(n),
                     epochs=1, eps=eps)
    with torch.no_grad():
        after = torch.log_softmax(policy(obs), -1).gather(-1, actions[:, None]).squeeze(-1)
    assert float(((after - now) * adv).sum()) > 0, "an unclipped step must raise sum_i A_i log pi(a_i | s_i)"


def _diag_passes_reference(diag: str, fn: str):
    def test(ns):
        try:
            ns[diag](reference_namespace()[fn])
        except AssertionError as err:
            raise AssertionError(f"{diag} fails on a correct {fn} ({err}): it flags correct code") from None
    return test


def _train_with(ns):
    """The notebook's (correct) training loop, bound to the student's three functions."""
    env = {"__name__": "ps5_train"}
    exec(compile(_visible.ANSWER_PREAMBLE + _visible.TRAIN_SOURCE, "<ps5 train>", "exec"), env)
    for k in ("collect_rollout", "gae_advantages", "ppo_update"):
        env[k] = ns[k]
    return env["train"]


#: fresh seeds of the hidden learning test, its step budget and the greedy return it asks for
LEARN_SEEDS, LEARN_STEPS, LEARN_TARGET = (91_001, 91_002, 91_003), 10_000, 120.0


def _learns(ns):
    """The notebook's trainer with the three fixed functions learns CartPole on 3 fresh seeds (2 of 3 for full
    credit): greedy return over 5 new episodes >= 120 after 10,000 steps."""
    for k in ("collect_rollout", "gae_advantages"):
        if k not in ns:
            raise AssertionError(f"{k} is not defined")
    train = _train_with(ns)
    got = []
    for s in LEARN_SEEDS:
        policy, _ = train(seed=s, total_steps=LEARN_STEPS)
        got.append(greedy_return(policy, seed=10 * s))
    ok = sum(g >= LEARN_TARGET for g in got)
    assert ok >= 1, f"after {LEARN_STEPS} steps the greedy return was {[round(g) for g in got]}; none reached 120"
    return min(1.0, ok / 2)


HIDDEN: tuple[Test, ...] = (
    Test("rollout_obs_alignment", "collect_rollout", 5, _rollout_alignment),
    Test("gae_masks_batch", "gae_advantages", 5, _ps1.hidden_gae_batch),
    Test("update_clips_against_rollout_logp", "ppo_update", 5, _update_clips),
    Test("trainer_learns_fresh_seeds", "ppo_update", 6, _learns, timeout=300.0),
    Test("diagnose_rollout_accepts_correct", "diagnose_rollout", 2,
         _diag_passes_reference("diagnose_rollout", "collect_rollout")),
    Test("diagnose_gae_accepts_correct", "diagnose_gae", 2, _diag_passes_reference("diagnose_gae", "gae_advantages")),
    Test("diagnose_update_accepts_correct", "diagnose_update", 2,
         _diag_passes_reference("diagnose_update", "ppo_update")),
)

assert {t.task for t in HIDDEN} == set(_visible.PS5.tasks)
