"""``StalePPOConfig.advantages="vtrace"``: the current policy's advantage from stale trajectories.

:func:`rlkit.algos.stale_ppo.vtrace_advantages` is checked against independent computations:

* a slow double loop over the explicit sums (truncated ratios, traces, cuts) written from the
  definitions, without :func:`rlkit.offpolicy.vtrace`;
* on-policy data (all log-ratios 0), where it must be GAE (:func:`rlkit.returns.gae`);
* a hand-computed two-step case;
* an exact expectation by enumeration on a three-step chain: with :math:`\\lambda = 1` and no
  truncation, :math:`\\mathbb E_\\mu[\\hat A_0 \\mid a_0] = Q^\\pi(s_0, a_0) - V(s_0)` for ANY critic
  :math:`V`, and with the exact critic :math:`V^\\pi` the same holds for every :math:`\\lambda`.

And the trainer option: validated, recorded in the history, equal to GAE on fresh data, and fed
the log-ratios :math:`\\log\\pi_k - \\log\\mu` of the stale rows (0 for the fresh ones).
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from rlkit.algos import StalePPOConfig
from rlkit.algos import stale_ppo as sp
from rlkit.algos.stale_ppo import train_stale_ppo, vtrace_advantages
from rlkit.returns import gae
from rlkit.staleness import StaleTrainingConfig

F64 = torch.float64


def _slow(log_rhos, rewards, values, next_values, discounts, lam, clip):
    """The explicit sums, one (row, t) at a time: A_t = delta_t + sum_j gamma-products * lam_t *
    prod c * rho_bar * delta, and v_t = V_t + sum_k prod(gamma c) rho_bar delta."""
    N, T = rewards.shape
    lam = torch.full_like(rewards, lam) if not isinstance(lam, torch.Tensor) else lam
    adv, vs = torch.zeros(N, T, dtype=F64), torch.zeros(N, T, dtype=F64)
    for n in range(N):
        rho = [math.exp(float(x)) for x in log_rhos[n]]
        rho_bar = [min(clip, x) for x in rho]
        c = [float(lam[n, t]) * min(clip, rho[t]) for t in range(T)]
        delta = [float(rewards[n, t] + discounts[n, t] * next_values[n, t] - values[n, t]) for t in range(T)]
        g = [float(discounts[n, t]) for t in range(T)]
        for t in range(T):
            v = float(values[n, t])
            for k in range(t, T):
                w = 1.0
                for i in range(t, k):
                    w *= g[i] * c[i]
                v += w * rho_bar[k] * delta[k]
            vs[n, t] = v
            a = delta[t]
            for j in range(1, T - t):
                w = float(lam[n, t])
                for i in range(j):
                    w *= g[t + i]
                for i in range(1, j):
                    w *= c[t + i]
                a += w * rho_bar[t + j] * delta[t + j]
            adv[n, t] = a
    return adv, vs


def _segment(N=5, T=9, seed=0, cuts=True):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(N, T, generator=g, dtype=F64)
    values = torch.randn(N, T, generator=g, dtype=F64)
    next_values = torch.roll(values, -1, dims=1)
    next_values[:, -1] = torch.randn(N, generator=g, dtype=F64)
    terminated = torch.rand(N, T, generator=g) < 0.15
    discounts = 0.97 * (~terminated).to(F64)
    lam = torch.full((N, T), 0.9, dtype=F64)
    if cuts:                                  # truncations: the trace stops, V of the final obs differs
        cut = torch.rand(N, T, generator=g) < 0.15
        lam[cut] = 0.0
        next_values[cut] = torch.randn(int(cut.sum()), generator=g, dtype=F64)
    log_rhos = 0.8 * torch.randn(N, T, generator=g, dtype=F64)
    return log_rhos, rewards, values, next_values, discounts, lam


@pytest.mark.parametrize("clip", [1.0, 2.0, 1e6])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_the_explicit_sums(clip, seed):
    args = _segment(seed=seed)
    adv, vs = vtrace_advantages(*args, clip=clip)
    adv_slow, vs_slow = _slow(*args, clip=clip)
    torch.testing.assert_close(adv, adv_slow, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(vs, vs_slow, rtol=1e-10, atol=1e-10)
    assert not adv.requires_grad and not vs.requires_grad


def test_scalar_lambda_is_the_constant_tensor():
    log_rhos, rewards, values, next_values, discounts, _ = _segment(seed=3, cuts=False)
    a1, v1 = vtrace_advantages(log_rhos, rewards, values, next_values, discounts, 0.7, clip=1.5)
    a2, v2 = _slow(log_rhos, rewards, values, next_values, discounts, 0.7, clip=1.5)
    torch.testing.assert_close(a1, a2, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(v1, v2, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("clip", [1.0, 3.0])
def test_on_policy_it_is_gae(clip):
    _, rewards, values, next_values, discounts, lam = _segment(seed=4)
    adv, vs = vtrace_advantages(torch.zeros_like(rewards), rewards, values, next_values, discounts, lam, clip=clip)
    adv_gae, ret_gae = gae(rewards, values, next_values, discounts, lam)
    torch.testing.assert_close(adv, adv_gae, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(vs, ret_gae, rtol=1e-12, atol=1e-12)


def test_hand_case_two_steps():
    # rho = (2, 0.5), clip 1: rho_bar = (1, 0.5), c = lam * (1, 0.5); gamma 0.9, lam 0.5
    log_rhos = torch.log(torch.tensor([[2.0, 0.5]], dtype=F64))
    rewards = torch.tensor([[1.0, 2.0]], dtype=F64)
    values = torch.tensor([[0.5, 1.0]], dtype=F64)
    next_values = torch.tensor([[1.0, 3.0]], dtype=F64)
    discounts = torch.full((1, 2), 0.9, dtype=F64)
    adv, vs = vtrace_advantages(log_rhos, rewards, values, next_values, discounts, 0.5, clip=1.0)
    d0, d1 = 1.0 + 0.9 * 1.0 - 0.5, 2.0 + 0.9 * 3.0 - 1.0          # 1.4, 3.7
    v1 = 1.0 + 0.5 * d1                                             # rho_bar_1 = 0.5
    v0 = 0.5 + 1.0 * d0 + 0.9 * (0.5 * 1.0) * 0.5 * d1              # gamma c_0 rho_bar_1 delta_1
    a0 = d0 + 0.9 * 0.5 * (v1 - 1.0)                                # delta_0 + gamma lam (v_1 - V_1)
    a1 = d1                                                          # end of the segment
    torch.testing.assert_close(adv, torch.tensor([[a0, a1]], dtype=F64))
    torch.testing.assert_close(vs, torch.tensor([[v0, v1]], dtype=F64))


# ------------------------------------------- exact expectation on a three-step chain, by enumeration

PI1, MU1, GAMMA, T3 = 0.8, 0.4, 0.9, 3          # P(action 1) under the target and the behaviour


def _chain_expectation(a0: int, critic, lam: float, clip: float) -> float:
    """E_mu[A_hat_0 | a_0] over the 4 continuations (a_1, a_2) ~ mu; reward r_t = a_t + 0.5 t; the
    episode ends after step 3 (discount 0 at the last step)."""
    total = 0.0
    for rest in itertools.product((0, 1), repeat=T3 - 1):
        acts = (a0, *rest)
        p = math.prod(MU1 if a else 1 - MU1 for a in rest)
        log_rhos = torch.tensor([[math.log((PI1 if a else 1 - PI1) / (MU1 if a else 1 - MU1)) for a in acts]],
                                dtype=F64)
        rewards = torch.tensor([[a + 0.5 * t for t, a in enumerate(acts)]], dtype=F64)
        values = torch.tensor([critic], dtype=F64)
        next_values = torch.tensor([[*critic[1:], 0.0]], dtype=F64)
        discounts = torch.tensor([[GAMMA, GAMMA, 0.0]], dtype=F64)
        adv, _ = vtrace_advantages(log_rhos, rewards, values, next_values, discounts, lam, clip=clip)
        total += p * float(adv[0, 0])
    return total


def _v_pi():
    return _v(PI1)


@pytest.mark.parametrize("a0", [0, 1])
def test_lambda_one_unclipped_is_unbiased_for_the_target_q_with_any_critic(a0):
    v_pi = _v_pi()
    q_pi = a0 + GAMMA * v_pi[1]                                 # Q^pi(s_0, a_0)
    wrong = [0.3, -1.0, 2.0]                                    # any critic
    assert _chain_expectation(a0, wrong, lam=1.0, clip=1e6) == pytest.approx(q_pi - wrong[0], abs=1e-12)
    # the uncorrected estimator (GAE on the behaviour's trajectory) is biased towards Q^mu
    q_mu = a0 + GAMMA * (MU1 + 0.5 + GAMMA * (MU1 + 1.0))
    assert abs(q_mu - q_pi) > 0.5


@pytest.mark.parametrize("lam", [0.0, 0.5, 0.95])
@pytest.mark.parametrize("a0", [0, 1])
def test_with_the_exact_critic_every_lambda_is_unbiased(a0, lam):
    v_pi = _v_pi()
    assert _chain_expectation(a0, v_pi, lam=lam, clip=1e6) == pytest.approx(a0 + GAMMA * v_pi[1] - v_pi[0], abs=1e-12)


def _v(p1):
    v = [0.0] * (T3 + 1)
    for t in reversed(range(T3)):
        v[t] = p1 + 0.5 * t + (GAMMA * v[t + 1] if t < T3 - 1 else 0.0)
    return v[:T3]


@pytest.mark.parametrize("a0", [0, 1])
def test_with_clip_one_the_target_is_the_normalised_min_of_mu_and_pi(a0):
    # clip 1 truncates the action-1 ratio 2: V-trace's target is pi~ proportional to min(mu, pi), here
    # P(1) = 0.4 / (0.4 + 0.2) = 2/3; with its exact critic the estimate is unbiased for Q^pi~ - V^pi~,
    # which lies strictly between the behaviour's and the target's advantage
    p_tilde = min(MU1, PI1) / (min(MU1, PI1) + min(1 - MU1, 1 - PI1))
    v_t = _v(p_tilde)
    est = _chain_expectation(a0, v_t, lam=0.8, clip=1.0)
    assert est == pytest.approx(a0 + GAMMA * v_t[1] - v_t[0], abs=1e-12)
    q = {p: a0 + GAMMA * _v(p)[1] for p in (MU1, p_tilde, PI1)}
    assert q[MU1] < q[p_tilde] < q[PI1]


# ------------------------------------------------------------------------------ the trainer option

def test_config_validates_the_option():
    assert StalePPOConfig().advantages == "gae" and StalePPOConfig().vtrace_clip == 1.0
    with pytest.raises(ValueError, match=r"StalePPOConfig\.advantages"):
        StalePPOConfig(advantages="retrace")
    with pytest.raises(ValueError, match=r"StalePPOConfig\.vtrace_clip"):
        StalePPOConfig(advantages="vtrace", vtrace_clip=0.0)


SMALL = dict(total_steps=4 * 64, num_envs=4, num_steps=16, epochs=2, seed=5)


def test_on_fresh_data_vtrace_is_gae():
    # one update: the same batch, the same advantages up to rounding, so the same loss
    cfg = dict(SMALL, total_steps=64)
    h_gae = train_stale_ppo("CartPole-v1", StalePPOConfig(**cfg), StaleTrainingConfig(lag=0), progress=False)[1]
    h_vt = train_stale_ppo("CartPole-v1", StalePPOConfig(**cfg, advantages="vtrace"), StaleTrainingConfig(lag=0),
                           progress=False)[1]
    assert len(h_gae["loss"]) == len(h_vt["loss"]) == 1
    assert h_vt["loss"][0] == pytest.approx(h_gae["loss"][0], rel=1e-5, abs=1e-6)
    assert h_vt.config["advantages"] == "vtrace" and h_gae.config["advantages"] == "gae"


def test_stale_rows_get_the_log_ratio_of_pi_k_over_mu(monkeypatch):
    seen = []

    def spy(log_rhos, *args, **kw):
        seen.append(log_rhos.clone())
        return vtrace_advantages(log_rhos, *args, **kw)

    monkeypatch.setattr(sp, "vtrace_advantages", spy)
    _, h = train_stale_ppo("CartPole-v1", StalePPOConfig(**SMALL, advantages="vtrace", vtrace_clip=2.0),
                           StaleTrainingConfig(method="adaptive", lag=2), progress=False)
    assert len(seen) == len(h["loss"]) == 4
    # update 0: only version 0 exists, the data are fresh; later updates sample with version k - 2 (or 0)
    assert torch.all(seen[0] == 0)
    assert all(torch.all(torch.isfinite(x)) for x in seen)
    assert any(float(x.abs().max()) > 1e-4 for x in seen[1:])
    # the staleness the trainer measures is 1/2 mean |exp(log_rho) - 1| of the same samples
    for x, s in zip(seen, h["staleness"]):
        assert 0.5 * float(torch.expm1(x).abs().mean()) == pytest.approx(s, rel=1e-4, abs=1e-6)
