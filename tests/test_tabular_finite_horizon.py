"""Tests of the finite-horizon, undiscounted part of rlkit.tabular (chapter 9, prop-ch09-finite-horizon).

References are independent of the functions under test: returns and state distributions by
enumerating every trajectory in plain Python, token sequences enumerated as tuples of tokens, and
the closed forms of the hand-built tight example (derived in its docstring and in chapter 9).
"""
from __future__ import annotations

import itertools

import pytest
import torch

from rlkit import tabular as T

torch.set_num_threads(1)
F64 = torch.float64


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _random_policy(shape, gen, temperature=1.0):
    return torch.softmax(torch.randn(*shape, generator=gen, dtype=F64) / temperature, -1)


def _enumerate(mdp, pi):
    """J and Pr(s_t = s) by summing over every trajectory (s_0, a_0, ..., s_{H-1}, a_{H-1})."""
    H, S, A = mdp.horizon, mdp.n_states, mdp.n_actions
    P, R, rho0, pi = mdp.P.tolist(), mdp.R.tolist(), mdp.rho0.tolist(), pi.tolist()
    J, mu = 0.0, [[0.0] * S for _ in range(H)]
    for states in itertools.product(range(S), repeat=H):
        for actions in itertools.product(range(A), repeat=H):
            prob, ret = rho0[states[0]], 0.0
            for t in range(H):
                s, a = states[t], actions[t]
                prob *= pi[t][s][a]
                ret += R[t][s][a]
                if t + 1 < H:
                    prob *= P[t][s][a][states[t + 1]]
            J += prob * ret
            for t in range(H):
                mu[t][states[t]] += prob
    return J, torch.tensor(mu, dtype=F64)


@pytest.mark.parametrize("H,S,A", [(1, 3, 2), (3, 2, 2), (4, 2, 2), (3, 3, 2)])
def test_returns_and_state_distributions_match_enumeration(H, S, A):
    gen = _gen(H * 100 + S * 10 + A)
    mdp = T.random_finite_horizon_mdp(2, H, S, A, peakiness=1.5, generator=gen)
    pi = _random_policy((2, H, S, A), gen)
    J = T.finite_horizon_performance(mdp, pi)
    mu = T.finite_horizon_state_distributions(mdp, pi)
    for b in range(2):
        J_ref, mu_ref = _enumerate(mdp[b], pi[b])
        assert J[b].item() == pytest.approx(J_ref, abs=1e-12)
        assert torch.allclose(mu[b], mu_ref, atol=1e-12)


def test_values_are_expected_reward_to_go():
    # V_t(s) from a hand loop: start the MDP in s at step t, i.e. the MDP restricted to steps t..H-1
    gen = _gen(5)
    H, S, A = 4, 3, 2
    mdp = T.random_finite_horizon_mdp(1, H, S, A, generator=gen)[0]
    pi = _random_policy((H, S, A), gen)
    Vt, Q = T.finite_horizon_values(mdp, pi)
    assert torch.all(Vt[H] == 0)
    for t in range(H):
        for s in range(S):
            sub = T.FiniteHorizonMDP(mdp.P[t:], mdp.R[t:], torch.eye(S, dtype=F64)[s])
            J_ref, _ = _enumerate(sub, pi[t:])
            assert Vt[t, s].item() == pytest.approx(J_ref, abs=1e-12)
    # Q = R + P V_{t+1}, and V = E_pi Q
    assert torch.allclose((pi * Q).sum(-1), Vt[:H], atol=1e-12)


def _pairs(n, H, S, A, seed, step=1.0):
    gen = _gen(seed)
    mdp = T.random_finite_horizon_mdp(n, H, S, A, peakiness=3.0, generator=gen)
    old = _random_policy((n, H, S, A), gen, temperature=0.5)
    size = step * torch.rand(n, 1, 1, 1, generator=gen, dtype=F64)
    new = torch.softmax(torch.log(old) + size * torch.randn(old.shape, generator=gen, dtype=F64), -1)
    return mdp, old, new


def test_performance_difference_identity_against_enumerated_returns():
    mdp, old, new = _pairs(4, 3, 3, 2, seed=11)
    t = T.finite_horizon_terms(mdp, old, new)
    V_old, Q_old = T.finite_horizon_values(mdp, old)
    A_old = Q_old - V_old[:, :3, :, None]
    pdl = (t.mu_new * (new * A_old).sum(-1)).sum((-1, -2))
    for b in range(4):
        J_new, _ = _enumerate(mdp[b], new[b])
        J_old, _ = _enumerate(mdp[b], old[b])
        assert pdl[b].item() == pytest.approx(J_new - J_old, abs=1e-12)
        assert t.improvement[b].item() == pytest.approx(J_new - J_old, abs=1e-12)


@pytest.mark.parametrize("H", [2, 5, 8])
def test_lemma_and_bound_hold_on_random_pairs(H):
    mdp, old, new = _pairs(400, H, 4, 3, seed=H, step=2.0)
    t = T.finite_horizon_terms(mdp, old, new)
    tol = 1e-10
    assert (t.state_shift_t <= t.lemma_bound_t + tol).all()
    # the lemma's second form: the TV expectation under the NEW policy's state distributions
    second = 2 * (torch.cumsum(t.expected_tv_new_t, -1) - t.expected_tv_new_t)
    assert (t.state_shift_t <= second + tol).all()
    err = (t.improvement - t.surrogate).abs()
    assert (err <= t.penalty_per_step + tol).all()
    assert (t.penalty_per_step <= t.penalty + tol).all() and (t.penalty <= t.penalty_mean + tol).all()
    assert (t.slack >= -tol).all()
    assert t.state_shift_t[:, 0].abs().max().item() < 1e-12      # s_0 ~ d_0 for every policy


def test_one_step_is_a_bandit_and_the_surrogate_is_exact():
    mdp, old, new = _pairs(50, 1, 4, 3, seed=3)
    t = T.finite_horizon_terms(mdp, old, new)
    assert torch.allclose(t.improvement, t.surrogate, atol=1e-12)
    assert torch.all(t.penalty == 0)


@pytest.mark.parametrize("H,u", [(2, 0), (6, 0), (6, 3), (10, 4)])
def test_tight_example_closed_forms(H, u):
    p = torch.tensor([0.1, 0.3, 0.7], dtype=F64)
    eta, c = 1e-3, 1.7
    t = T.finite_horizon_terms(*T.finite_horizon_tight_example(H, p, eta, c, switch_time=u))
    n = H - 1 - u
    assert torch.allclose(t.surrogate, torch.full_like(p, n * c), atol=1e-9)
    assert torch.allclose(t.improvement, n * c * (1 - 2 * p), atol=1e-9)
    assert torch.allclose(t.penalty, 2 * c * (n * p + eta * n * (n - 1) / 2), atol=1e-9)
    assert torch.allclose(t.tightness, p / (p + eta * (n - 1) / 2), atol=1e-12)
    assert torch.allclose(t.eps, torch.full_like(p, c), atol=1e-12)
    steps = torch.arange(H, dtype=F64)
    after = steps > u
    assert torch.allclose(t.state_shift_t, torch.where(after, 2 * p[:, None], 0.0), atol=1e-12)
    assert torch.allclose(t.lemma_bound_t, torch.where(after, 2 * p[:, None] + 2 * (steps - 1 - u) * eta, 0.0),
                          atol=1e-12)


def test_tight_example_attains_the_constant_as_eta_vanishes():
    eta = torch.logspace(-2, -8, 4, dtype=F64)
    t = T.finite_horizon_terms(*T.finite_horizon_tight_example(12, 0.25, eta, 1.0))
    assert (t.tightness <= 1).all() and t.tightness[-1].item() > 1 - 1e-6
    assert (t.tightness[1:] > t.tightness[:-1]).all()


def test_token_mdp_matches_sequence_enumeration():
    gen = _gen(7)
    X, Vocab, H = 2, 2, 3
    S = X * Vocab ** (H - 1)
    probs = torch.tensor([0.3, 0.7], dtype=F64)
    R = torch.randn(H, S, Vocab, generator=gen, dtype=F64)
    pi = _random_policy((H, S, Vocab), gen)
    mdp = T.token_mdp(probs, R)
    assert (mdp.n_states, mdp.n_actions, mdp.horizon) == (S, Vocab, H)

    def index(x, prefix):                      # prefix as a base-V number after the prompt
        return int("".join(map(str, (x, *prefix))), Vocab) if prefix else x

    J_ref = 0.0
    for x in range(X):
        for ys in itertools.product(range(Vocab), repeat=H):
            prob, ret = probs[x].item(), 0.0
            for t in range(H):
                s = index(x, ys[:t])
                prob *= pi[t, s, ys[t]].item()
                ret += R[t, s, ys[t]].item()
            J_ref += prob * ret
    assert T.finite_horizon_performance(mdp, pi).item() == pytest.approx(J_ref, abs=1e-12)
    # transitions are deterministic and append the token
    assert torch.all((mdp.P == 0) | (mdp.P == 1))
    for x in range(X):
        for t in range(H - 1):
            for prefix in itertools.product(range(Vocab), repeat=t):
                for a in range(Vocab):
                    assert mdp.P[t, index(x, prefix), a, index(x, (*prefix, a))].item() == 1.0


def test_token_mdp_batched_and_bound_holds():
    gen = _gen(8)
    B, X, Vocab, H = 64, 2, 3, 3
    S = X * Vocab ** (H - 1)
    probs = torch.softmax(torch.randn(B, X, generator=gen, dtype=F64), -1)
    R = torch.zeros(B, H, S, Vocab, dtype=F64)
    R[:, -1] = torch.randn(B, S, Vocab, generator=gen, dtype=F64)      # a reward on the whole response
    mdp = T.token_mdp(probs, R)
    old = _random_policy((B, H, S, Vocab), gen)
    new = torch.softmax(torch.log(old) + torch.randn(old.shape, generator=gen, dtype=F64), -1)
    t = T.finite_horizon_terms(mdp, old, new)
    assert (t.slack >= -1e-10).all() and (t.improvement <= t.surrogate + t.penalty + 1e-10).all()
    assert (t.state_shift_t[:, 1:] > 1e-3).all()        # prefixes depend on the policy: the shift is real


def test_input_validation():
    mdp = T.random_finite_horizon_mdp(2, 3, 2, 2, generator=_gen())
    with pytest.raises(ValueError, match="pi"):
        T.finite_horizon_values(mdp, torch.full((2, 3, 2, 3), 1 / 3, dtype=F64))
    with pytest.raises(ValueError, match="distribution"):
        T.finite_horizon_state_distributions(mdp, torch.full((2, 3, 2, 2), 0.7, dtype=F64))
    with pytest.raises(ValueError, match="X \\* V"):
        T.token_mdp(torch.tensor([1.0], dtype=F64), torch.zeros(3, 5, 2, dtype=F64))
    with pytest.raises(ValueError, match="switch_time"):
        T.finite_horizon_tight_example(4, switch_time=3)
    with pytest.raises(ValueError, match="P"):
        T.FiniteHorizonMDP(torch.ones(3, 2, 2, 2, dtype=F64), torch.zeros(3, 2, 2, dtype=F64),
                           torch.tensor([1.0, 0.0], dtype=F64))
    with pytest.raises(IndexError):
        T.finite_horizon_tight_example(3)[0][0]


# ----------------------------------------------------------------------------------------------
# chapter 10: the instance on which the static-mixture bound is tight (closed forms)
# ----------------------------------------------------------------------------------------------
def test_tight_mixture_example_closed_forms():
    g = torch.tensor([0.5, 0.9, 0.99], dtype=F64)
    p, eta, c = 0.4, 1e-4, 1.3
    q = torch.tensor([0.0, 0.1, 0.4], dtype=F64)
    mdp, pols, new = T.tight_mixture_example(g, p, q, eta, c)
    alpha = torch.tensor([0.5, 0.3, 0.2], dtype=F64)
    st = T.static_mixture_terms(mdp, pols, alpha, new)
    G = g[:, None]
    assert torch.allclose(st.eps, torch.full_like(st.eps, c), atol=1e-9)
    assert torch.allclose(st.surrogates - (st.J_new[:, None] - st.J_versions), 2 * G * c * (p - q) / (1 - G), atol=1e-8)
    assert torch.allclose(st.expected_tv, (1 - G) * (p - q) + G * eta, atol=1e-12)
    tau = (st.surrogate - st.improvement) / st.penalty
    qbar = (alpha * q).sum()
    ref = (p - qbar) / ((p - qbar) + g * eta / (1 - g))
    assert torch.allclose(tau, ref, atol=1e-9)
    # a hand loop over the versions gives the same improvement over the mixture
    J_i = torch.stack([T.performance(mdp, pols[:, i]) for i in range(3)], -1)
    assert torch.allclose(st.improvement, T.performance(mdp, new) - (alpha * J_i).sum(-1), atol=1e-10)


def test_tight_mixture_example_rejects_versions_beyond_the_switch():
    with pytest.raises(ValueError, match="old_switches"):
        T.tight_mixture_example(0.9, 0.3, torch.tensor([0.1, 0.5], dtype=F64))
