"""Problem set 1 (From REINFORCE to PPO on CartPole): the reference passes every test with full points, agrees
with rlkit.returns, and the hidden tests catch the slips they are there for. The checks every problem set
shares (the skeleton, its points, clean failures) are in tests/test_problem_sets.py.

The learning tests (visible: seed 1, 10,000 steps; hidden: 3 fresh seeds, 10,000 steps, greedy return
>= 120, full credit for 2 of 3) dominate the time. The reference's margins over other seeds, native and
with emulated kernels, are in ``book/instructor/ps1_rubric.md``.
"""
from __future__ import annotations

import pytest
import torch

from rlkit.exercises.problem_sets import get_problem_set, run_tests
from rlkit.exercises.solutions import ps1 as ref

PS = get_problem_set("ps1")
pytestmark = pytest.mark.usefixtures("one_torch_thread")     # the learning tests run on one thread


def _full_marks(results):
    bad = [r.message for r in results if not (r.passed and r.points == r.max_points)]
    assert not bad, bad


def test_reference_passes_visible_tests():
    _full_marks(run_tests(ref.reference_namespace(), PS.visible))


def test_reference_passes_hidden_tests():
    _full_marks(run_tests(ref.reference_namespace(), ref.HIDDEN))


def test_reference_agrees_with_rlkit_returns():
    from rlkit.returns import discounted_returns, gae
    g = torch.Generator().manual_seed(11)
    r = torch.randn(40, 6, generator=g, dtype=torch.float64)
    v, nv = torch.randn(40, 6, generator=g, dtype=torch.float64), torch.randn(40, 6, generator=g, dtype=torch.float64)
    term = torch.rand(40, 6, generator=g) < 0.1
    trunc = (torch.rand(40, 6, generator=g) < 0.1) & ~term
    want = gae(r.T, v.T, nv.T, 0.95 * (~term).double().T, 0.7 * (~(term | trunc)).double().T)[0].T  # time last
    assert torch.allclose(ref.gae_advantages(r, v, nv, term, trunc, 0.95, 0.7), want, atol=1e-12)
    d = term | trunc
    G = discounted_returns(r.T, 0.9 * (~d.T).double(), 0.0).T      # rlkit's time axis is the last one
    assert torch.allclose(ref.reward_to_go(r, d, 0.9), G, atol=1e-12)


def _with(name, fn):
    ns = dict(ref.reference_namespace())
    ns[name] = fn
    return ns


def _hidden(name):
    return [t for t in ref.HIDDEN if t.name == name]


def test_hidden_tests_catch_known_slips():
    # GAE whose trace runs across episode ends (only the bootstrap is masked)
    assert not run_tests(_with("gae_advantages", _gae_trace_uncut), _hidden("gae_batch_terminations_truncations"))[0]

    # a collector that bootstraps a truncation from the reset observation
    def reset_bootstrap(env, policy, value, obs, num_steps):
        out = ref.collect_rollout(env, policy, value, obs, num_steps)
        nv = out["next_values"].clone()
        ends = out["terminated"] | out["truncated"]
        with torch.no_grad():
            v_next = value(out["obs"]).reshape(-1)
        nv[:-1][ends[:-1]] = v_next[1:][ends[:-1]]
        out["next_values"] = nv
        return out
    assert not run_tests(_with("collect_rollout", reset_bootstrap), _hidden("rollout_truncation_bootstrap"))[0]

    # the clip applied to both sides without the min (clip(rho) A only)
    def clip_only(logp_new, logp_old, advantages, eps=0.2):
        return -(torch.clamp((logp_new - logp_old).exp(), 1 - eps, 1 + eps) * advantages).mean()
    assert not run_tests(_with("ppo_clip_loss", clip_only), _hidden("clip_gradient_active_set"))[0]

    # reward-to-go that ignores episode ends in a [T, N] batch
    def rtg_no_ends(rewards, dones, gamma):
        return ref.reward_to_go(rewards, torch.zeros_like(dones), gamma)
    assert not run_tests(_with("reward_to_go", rtg_no_ends), _hidden("rtg_batch_mid_episode_ends"))[0]


def _gae_trace_uncut(rewards, values, next_values, terminated, gamma, lam):
    delta = rewards + gamma * (1.0 - terminated.to(rewards.dtype)) * next_values - values
    adv, running = torch.zeros_like(rewards), torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        running = delta[t] + gamma * lam * running
        adv[t] = running
    return adv
