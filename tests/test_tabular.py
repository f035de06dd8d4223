"""Tests of rlkit.tabular: exact finite-MDP solutions and the bounds of Chapters 9-11.

References are independent of the functions under test: a two-state MDP solved by hand (the
derivation is in the comments), slow Python loops (truncated series, explicit augmented kernels,
enumeration of trajectories), closed forms of the hand-built examples, and identities.
"""
from __future__ import annotations

import math

import pytest
import torch

from rlkit import tabular as T
from rlkit.staleness import half_abs_ratio_diff

torch.set_num_threads(1)
F64 = torch.float64


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------------------------
# a two-state, two-action MDP solved on paper
# ----------------------------------------------------------------------------------------------
# States {0, 1}; action 0 = stay, action 1 = move to the other state (deterministic).
# Reward R(s, a) = s: one unit per step spent in state 1. rho0 = (1, 0), gamma = 0.9.
# The policy switches with probability p in both states: pi(1|s) = p.
#
# P_pi = [[1-p, p], [p, 1-p]], r_pi = (0, 1). Bellman: V0 = g((1-p) V0 + p V1),
# V1 = 1 + g(p V0 + (1-p) V1). Sum: V0 + V1 = 1 + g (V0 + V1) -> V0 + V1 = 1/(1-g) = 10.
# Difference: V1 - V0 = 1 + g (1 - 2p)(V1 - V0) -> V1 - V0 = 1/(1 - g(1-2p)).
# p = 1/4: V1 - V0 = 1/0.55 = 20/11, so V0 = (10 - 20/11)/2 = 45/11, V1 = 65/11, J = V0 = 45/11.
# Q(s, a) = R(s, a) + g V(next): Q(0,0) = .9*45/11 = 81/22, Q(0,1) = .9*65/11 = 117/22,
#                                 Q(1,0) = 1 + 117/22 = 139/22, Q(1,1) = 1 + 81/22 = 103/22.
# A = Q - V: A(0,.) = (-9/22, 27/22), A(1,.) = (9/22, -27/22)   [check: .75*(-9) + .25*27 = 0].
# Visitation: Pr(s_t = 0) = 1/2 + (1-2p)^t / 2, so
# d(0) = (1-g) sum_t g^t Pr(s_t = 0) = 1/2 + (1-g)/(2 (1 - g(1-2p))) = 1/2 + 1/11 = 13/22, d(1) = 9/22.
#
# A second policy switches with p' = 1/2: V1 - V0 = 1, V0 = 9/2, J' = 9/2, so J' - J = 9/22.
# Its visitation: d'(0) = 1/2 + 0.1/2 = 11/20, d'(1) = 9/20.
# abar(s) = sum_a pi'(a|s) A(s, a) = (9/22, -9/22); PDL: 10 * (11/20 - 9/20) * 9/22 = 9/22. (= J' - J)
# Surrogate L = 10 * (13/22 - 9/22) * 9/22 = 90/121. TV(s) = (|.75-.5| + |.25-.5|)/2 = 1/4 in both
# states, E_d[TV] = 1/4, eps = 9/22, penalty = 2*.9*(9/22)/.01 * 1/4 = 405/22.
# ||d' - d||_1 = 2 * |11/20 - 13/22| = 2 * 9/220 = 9/110; Lemma 2.1 bound = 2*.9/.1 * 1/4 = 9/2.

def _two_state(p_values=(0.25, 0.5)):
    P = torch.zeros(2, 2, 2, dtype=F64)
    P[0, 0, 0] = P[1, 0, 1] = 1.0   # stay
    P[0, 1, 1] = P[1, 1, 0] = 1.0   # move
    R = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=F64)
    mdp = T.FiniteMDP(P, R, torch.tensor([1.0, 0.0], dtype=F64), 0.9)
    pols = [torch.tensor([[1 - p, p], [1 - p, p]], dtype=F64) for p in p_values]
    return mdp, pols


def test_two_state_values_by_hand():
    mdp, (pi, _) = _two_state()
    V = T.value(mdp, pi)
    Q = T.q_value(mdp, pi)
    A = T.advantage(mdp, pi)
    assert torch.allclose(V, torch.tensor([45 / 11, 65 / 11], dtype=F64), atol=1e-12)
    assert torch.allclose(Q, torch.tensor([[81, 117], [139, 103]], dtype=F64) / 22, atol=1e-12)
    assert torch.allclose(A, torch.tensor([[-9, 27], [9, -27]], dtype=F64) / 22, atol=1e-12)
    assert abs(T.performance(mdp, pi).item() - 45 / 11) < 1e-12
    assert torch.allclose(T.visitation(mdp, pi), torch.tensor([13 / 22, 9 / 22], dtype=F64), atol=1e-12)


def test_two_state_bound_terms_by_hand():
    mdp, (pi, pi2) = _two_state()
    t = T.single_policy_terms(mdp, pi, pi2)
    assert abs(t.improvement.item() - 9 / 22) < 1e-12
    assert torch.allclose(t.d_new, torch.tensor([11 / 20, 9 / 20], dtype=F64), atol=1e-12)
    assert torch.allclose(t.abar, torch.tensor([9 / 22, -9 / 22], dtype=F64), atol=1e-12)
    assert abs(t.surrogate.item() - 90 / 121) < 1e-12
    assert abs(t.expected_tv.item() - 0.25) < 1e-12
    assert abs(t.eps.item() - 9 / 22) < 1e-12
    assert abs(t.penalty.item() - 405 / 22) < 1e-10
    assert abs(t.state_shift.item() - 9 / 110) < 1e-12
    assert abs(t.lemma_bound.item() - 4.5) < 1e-12
    assert abs(T.performance_difference(mdp, pi, pi2).item() - 9 / 22) < 1e-12


# ----------------------------------------------------------------------------------------------
# identities on random batches, and slow independent references
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def batch():
    g = _gen(1)
    mdp = T.random_mdp(64, 5, 3, torch.rand(64, generator=g, dtype=F64) * 0.98, peakiness=3.0, generator=g)
    pi = T.random_policy(64, 5, 3, generator=g)
    pi2 = T.perturb_policy(pi, torch.rand(64, generator=g, dtype=F64) * 3, generator=g)
    return mdp, pi, pi2


def test_bellman_equations_and_identities(batch):
    mdp, pi, _ = batch
    V, Q, A = T.value(mdp, pi), T.q_value(mdp, pi), T.advantage(mdp, pi)
    g = mdp.gamma[:, None]
    r_pi = (pi * mdp.R).sum(-1)
    P_pi = (pi[..., None] * mdp.P).sum(-2)
    assert torch.allclose(V, r_pi + g * (P_pi @ V[..., None])[..., 0], atol=1e-10)       # V = r + g P V
    assert torch.allclose(V, (pi * Q).sum(-1), atol=1e-10)                                 # V = sum_a pi Q
    assert torch.allclose((pi * A).sum(-1), torch.zeros_like(V), atol=1e-10)               # E_pi A = 0
    d = T.visitation(mdp, pi)
    assert torch.allclose(d.sum(-1), torch.ones(64, dtype=F64), atol=1e-12)                # sum d = 1
    assert (d >= -1e-12).all()
    # d = (1-g) rho0 + g P_pi^T d
    assert torch.allclose(d, (1 - g) * mdp.rho0 + g * (P_pi.transpose(-1, -2) @ d[..., None])[..., 0], atol=1e-10)
    # J = rho0 . V = E_{d, pi}[R] / (1 - g)
    J = T.performance(mdp, pi)
    assert torch.allclose(J, (d * r_pi).sum(-1) / (1 - mdp.gamma), atol=1e-9)


def test_performance_difference_lemma_to_1e10(batch):
    mdp, pi, pi2 = batch
    lhs = T.performance(mdp, pi2) - T.performance(mdp, pi)
    assert (T.performance_difference(mdp, pi, pi2) - lhs).abs().max().item() < 1e-10


def test_value_and_visitation_against_truncated_series():
    # slow reference: V = sum_t g^t P_pi^t r_pi and d = (1-g) sum_t g^t rho0 P_pi^t, by loops
    g = _gen(2)
    mdp = T.random_mdp(3, 4, 2, 0.7, generator=g)
    pi = T.random_policy(3, 4, 2, generator=g)
    V, d = T.value(mdp, pi), T.visitation(mdp, pi)
    for b in range(3):
        P_pi = torch.zeros(4, 4, dtype=F64)
        r_pi = torch.zeros(4, dtype=F64)
        for s in range(4):
            for a in range(2):
                r_pi[s] += pi[b, s, a] * mdp.R[b, s, a]
                for s2 in range(4):
                    P_pi[s, s2] += pi[b, s, a] * mdp.P[b, s, a, s2]
        v_ref = torch.zeros(4, dtype=F64)
        d_ref = torch.zeros(4, dtype=F64)
        mu, term = mdp.rho0[b].clone(), r_pi.clone()
        for t in range(200):  # 0.7^200 ~ 1e-31
            v_ref += 0.7 ** t * term
            d_ref += 0.3 * 0.7 ** t * mu
            term, mu = P_pi @ term, mu @ P_pi
        assert torch.allclose(V[b], v_ref, atol=1e-12)
        assert torch.allclose(d[b], d_ref, atol=1e-12)


def test_tv_distance_hand_case():
    p = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]], dtype=F64)
    q = torch.tensor([[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]], dtype=F64)
    assert torch.allclose(T.tv_distance(p, q), torch.tensor([0.5, 0.0], dtype=F64))


def test_surrogate_equals_importance_weighted_form(batch):
    mdp, pi, pi2 = batch
    A, d = T.advantage(mdp, pi), T.visitation(mdp, pi)
    ratio_form = (d * (pi * (pi2 / pi) * A).sum(-1)).sum(-1) / (1 - mdp.gamma)
    assert torch.allclose(T.surrogate(d, pi2, A, mdp.gamma), ratio_form, atol=1e-10)
    # the surrogate of the old policy itself is 0 (E_pi A_pi = 0)
    assert T.surrogate(d, pi, A, mdp.gamma).abs().max().item() < 1e-10


# ----------------------------------------------------------------------------------------------
# Chapter 9's statements
# ----------------------------------------------------------------------------------------------
def test_lemma21_and_theorem22_hold_on_random_pairs():
    g = _gen(3)
    B = 2000
    mdp = T.random_mdp(B, 5, 3, 0.9, peakiness=5.0, generator=g)
    pi = T.random_policy(B, 5, 3, temperature=0.4, generator=g)
    pi2 = T.perturb_policy(pi, torch.rand(B, generator=g, dtype=F64) * 3, generator=g)
    t = T.single_policy_terms(mdp, pi, pi2)
    assert (t.state_shift <= t.lemma_bound + 1e-12).all()
    # Lemma 2.1 also holds with the NEW policy's visitation (the proof is symmetric)
    assert (t.state_shift <= 2 * t.gamma / (1 - t.gamma) * t.expected_tv_new + 1e-12).all()
    assert (t.slack >= -1e-10).all()
    assert (t.improvement <= t.surrogate + t.penalty + 1e-10).all()   # the upper bound too


def test_tight_example_closed_form_and_limit():
    gam, sw, c = 0.9, 0.3, 2.0
    etas = torch.tensor([1e-1, 1e-3, 1e-6], dtype=F64)
    mdp, pi, pi2 = T.tight_example(torch.full((3,), gam, dtype=F64), sw, etas, c)
    t = T.single_policy_terms(mdp, pi, pi2)
    assert torch.allclose(t.surrogate, torch.full((3,), gam * c / (1 - gam), dtype=F64), rtol=1e-9)
    assert torch.allclose(t.improvement, torch.full((3,), gam * c * (1 - 2 * sw) / (1 - gam), dtype=F64), rtol=1e-9)
    pen = 2 * gam * c * (sw + gam * etas / (1 - gam)) / (1 - gam)
    assert torch.allclose(t.penalty, pen, rtol=1e-9)
    assert torch.allclose(t.eps, torch.full((3,), c, dtype=F64), rtol=1e-9)
    assert t.tightness[-1] > 0.9999 and (t.slack >= -1e-9).all()
    # with half the constant the theorem fails on this example once eta is small
    assert (t.improvement[1:] < t.surrogate[1:] - t.penalty[1:] / 2).all()


def test_tight_example_state_shift_and_expected_advantages_closed_form():
    # the docstring's claims: abar(X) = -c, abar(Y) = +c; ||d_new - d_old||_1 = 2 g p while the
    # state-shift bound is 2 g p + 2 g^2 eta / (1 - g). By hand: d_old = (1-g, 0, g),
    # d_new = (1-g, g p, g (1-p)); TV = p at the start, eta in Y (X has no old mass).
    gam, sw, c = 0.8, 0.25, 1.5
    etas = torch.tensor([1e-2, 1e-5], dtype=F64)
    mdp, pi, pi2 = T.tight_example(torch.full((2,), gam, dtype=F64), sw, etas, c)
    t = T.single_policy_terms(mdp, pi, pi2)
    assert torch.allclose(t.d_old, torch.tensor([1 - gam, 0.0, gam], dtype=F64).expand(2, 3), atol=1e-12)
    assert torch.allclose(t.d_new, torch.tensor([1 - gam, gam * sw, gam * (1 - sw)], dtype=F64).expand(2, 3),
                          atol=1e-12)
    assert torch.allclose(t.abar[:, 1:], torch.tensor([-c, c], dtype=F64).expand(2, 2), rtol=1e-9)
    assert torch.allclose(t.state_shift, torch.full((2,), 2 * gam * sw, dtype=F64), atol=1e-12)
    assert torch.allclose(t.lemma_bound, 2 * gam * sw + 2 * gam ** 2 * etas / (1 - gam), rtol=1e-9)


def test_contextual_bandit_surrogate_is_exact():
    g = _gen(4)
    rho0 = torch.softmax(torch.randn(10, 6, generator=g, dtype=F64), -1)
    R = torch.randn(10, 6, 4, generator=g, dtype=F64)
    mdp = T.contextual_bandit(rho0, R, 0.8)
    pi = T.random_policy(10, 6, 4, generator=g)
    pi2 = T.random_policy(10, 6, 4, generator=g)
    t = T.single_policy_terms(mdp, pi, pi2)
    assert torch.allclose(t.d_old, rho0, atol=1e-12) and torch.allclose(t.d_new, rho0, atol=1e-12)
    assert torch.allclose(t.improvement, t.surrogate, atol=1e-10)
    assert (t.penalty > 0).all()


def test_softmax_step_improves_for_small_steps(batch):
    mdp, pi, _ = batch
    new = T.softmax_step(pi, T.advantage(mdp, pi), 0.05)
    assert torch.allclose(new.sum(-1), torch.ones_like(new[..., 0]))
    # a mirror-ascent step is a policy-improvement step: J does not decrease
    assert (T.performance(mdp, new) >= T.performance(mdp, pi) - 1e-12).all()


def test_softmax_step_raises_the_surrogate_by_step_times_expected_variance(batch):
    # the docstring's first-order claim: L_pi(pi') ~ step * E_{d_pi}[Var_pi A_pi] / (1 - gamma),
    # the variance computed here directly, E_pi[A^2] - (E_pi A)^2
    mdp, pi, _ = batch
    A, d = T.advantage(mdp, pi), T.visitation(mdp, pi)
    var = (pi * A ** 2).sum(-1) - (pi * A).sum(-1) ** 2
    slope = (d * var).sum(-1) / (1 - mdp.gamma)
    h = 1e-6
    L = T.surrogate(d, T.softmax_step(pi, A, h), A, mdp.gamma)
    assert torch.allclose(L / h, slope, rtol=1e-4, atol=1e-8)


# ----------------------------------------------------------------------------------------------
# mixtures (Chapters 10-11)
# ----------------------------------------------------------------------------------------------
def test_step_kernel_hand_case():
    sigma = torch.tensor([0.0, 0.5], dtype=F64)
    kappa = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=F64)
    q = T.step_kernel(sigma, kappa)
    # version 0 never switches; version 1 stays w.p. 1/2 and otherwise moves to version 0
    assert torch.allclose(q, torch.tensor([[1.0, 0.0], [0.5, 0.5]], dtype=F64))
    assert torch.equal(T.trajectory_kernel(3), torch.eye(3, dtype=F64))


def _mixture(seed, B=4, S=3, A=2, M=2, step_level=True):
    g = _gen(seed)
    mdp = T.random_mdp(B, S, A, 0.8, generator=g)
    pols = T.random_policy((B, M), S, A, generator=g)
    alpha = torch.softmax(torch.randn(B, M, generator=g, dtype=F64), -1)
    if step_level:
        kernel = T.step_kernel(torch.rand(B, M, generator=g, dtype=F64),
                               torch.softmax(torch.randn(B, M, M, generator=g, dtype=F64), -1))
    else:
        kernel = T.trajectory_kernel(M)
    return g, mdp, pols, alpha, kernel


def test_augment_against_explicit_loops():
    g, mdp, pols, alpha, kernel = _mixture(5)
    aug, beta = T.augment(mdp, pols, alpha, kernel)
    B, M, S, A = pols.shape
    for b in range(B):
        for s in range(S):
            for i in range(M):
                x = s * M + i
                assert abs(aug.rho0[b, x].item() - (mdp.rho0[b, s] * alpha[b, i]).item()) < 1e-15
                for a in range(A):
                    assert beta[b, x, a] == pols[b, i, s, a]
                    assert aug.R[b, x, a] == mdp.R[b, s, a]
                    for s2 in range(S):
                        for i2 in range(M):
                            want = mdp.P[b, s, a, s2] * kernel[b, i, i2]
                            assert abs(aug.P[b, x, a, s2 * M + i2].item() - want.item()) < 1e-15


def test_augmented_return_by_enumerating_trajectories():
    # J(beta) for a step-level mixture, by summing over every (s, i, a) path of length H
    g, mdp, pols, alpha, kernel = _mixture(6, B=1, S=2, A=2, M=2)
    aug, beta = T.augment(mdp, pols, alpha, kernel)
    gam, H = 0.8, 40
    # forward recursion on joint probabilities of (s, i): exact, no sampling
    mu = (mdp.rho0[0][:, None] * alpha[0][None, :])             # [S, M]
    J = 0.0
    for t in range(H):
        r = sum(mu[s, i] * pols[0, i, s, a] * mdp.R[0, s, a] for s in range(2) for i in range(2) for a in range(2))
        J += gam ** t * r.item()
        nxt = torch.zeros(2, 2, dtype=F64)
        for s in range(2):
            for i in range(2):
                for a in range(2):
                    for s2 in range(2):
                        for i2 in range(2):
                            nxt[s2, i2] += mu[s, i] * pols[0, i, s, a] * mdp.P[0, s, a, s2] * kernel[0, i, i2]
        mu = nxt
    tail = gam ** H * mdp.R.abs().max().item() / (1 - gam)
    assert abs(T.performance(aug, beta)[0].item() - J) < tail + 1e-12


def test_index_blind_policy_has_the_same_return_in_the_augmented_mdp():
    g, mdp, pols, alpha, kernel = _mixture(7)
    aug, _ = T.augment(mdp, pols, alpha, kernel)
    pi = T.random_policy(4, 3, 2, generator=g)
    assert torch.allclose(T.performance(aug, T.lift_policy(pi, 2)), T.performance(mdp, pi), atol=1e-12)
    # and its augmented visitation marginalises to d_pi
    d_aug = T.visitation(aug, T.lift_policy(pi, 2)).reshape(4, 3, 2).sum(-1)
    assert torch.allclose(d_aug, T.visitation(mdp, pi), atol=1e-12)


def test_trajectory_level_factorisation():
    g, mdp, pols, alpha, kernel = _mixture(8, B=16, S=4, A=3, M=3, step_level=False)
    aug, beta = T.augment(mdp, pols, alpha, kernel)
    d = T.visitation(aug, beta).reshape(16, 4, 3)
    A = T.advantage(aug, beta).reshape(16, 4, 3, 3)
    for i in range(3):
        assert torch.allclose(d[:, :, i], alpha[:, i, None] * T.visitation(mdp, pols[:, i]), atol=1e-12)
        assert torch.allclose(A[:, :, i], T.advantage(mdp, pols[:, i]), atol=1e-10)
    Js = torch.stack([T.performance(mdp, pols[:, i]) for i in range(3)], -1)
    assert torch.allclose(T.performance(aug, beta), (alpha * Js).sum(-1), atol=1e-10)


def test_static_mixture_terms_equal_theorem22_on_augmented_mdp():
    g, mdp, pols, alpha, kernel = _mixture(9, B=200, S=4, A=3, M=3, step_level=False)
    pi = T.perturb_policy(pols[:, -1], 1.0, generator=g)
    st = T.static_mixture_terms(mdp, pols, alpha, pi)
    aug, beta = T.augment(mdp, pols, alpha, kernel)
    t = T.single_policy_terms(aug, beta, T.lift_policy(pi, 3))
    assert torch.allclose(st.bound, t.bound, atol=1e-9)
    assert torch.allclose(st.improvement, t.improvement, atol=1e-9)
    assert (st.slack >= -1e-10).all()
    assert (st.bound_per_version >= st.bound - 1e-12).all()
    assert (st.improvement >= st.bound_per_version - 1e-10).all()


@pytest.mark.parametrize("step_level", [False, True])
def test_dynamic_mixture_bounds_and_slow_U_S(step_level):
    g, mdp, pols, alpha, kernel = _mixture(10 + step_level, B=300, S=4, A=3, M=3, step_level=step_level)
    pi_k = pols[:, -1]
    pi_new = T.perturb_policy(pi_k, 0.5, generator=g)
    dt = T.dynamic_mixture_terms(mdp, pols, alpha, kernel, pi_k, pi_new)
    assert torch.allclose(dt.improvement, (dt.J_new - dt.J_mix) + dt.mixture_gap, atol=1e-10)
    assert (dt.mixture_gap >= -dt.mixture_gap_bound - 1e-10).all()
    assert (dt.mixture_gap <= dt.mixture_gap_bound + 1e-10).all()   # the proof's bound is two-sided
    assert (dt.improvement >= dt.bound_thm41 - 1e-10).all()
    assert (dt.bound_thm41 >= dt.bound_cor42 - 1e-10).all()
    # U and S by loops over (s, i) for two batch elements
    for b in range(2):
        U = S_ = 0.0
        for s in range(4):
            for i in range(3):
                w = dt.d_beta[b, s, i].item()
                U += w * 0.5 * (pi_new[b, s] - pi_k[b, s]).abs().sum().item()
                S_ += w * 0.5 * (pi_k[b, s] - pols[b, i, s]).abs().sum().item()
        assert abs(dt.U[b].item() - U) < 1e-12 and abs(dt.S[b].item() - S_) < 1e-12


def test_mixture_of_identical_versions_is_the_single_policy_case():
    g = _gen(12)
    mdp = T.random_mdp(8, 4, 2, 0.9, generator=g)
    pi = T.random_policy(8, 4, 2, generator=g)
    pols = pi[:, None].expand(8, 3, 4, 2).clone()
    kernel = T.step_kernel(torch.full((3,), 0.5, dtype=F64), torch.full((3, 3), 1 / 3, dtype=F64))
    pi2 = T.perturb_policy(pi, 1.0, generator=g)
    dt = T.dynamic_mixture_terms(mdp, pols, torch.full((3,), 1 / 3, dtype=F64), kernel, pi, pi2)
    t = T.single_policy_terms(mdp, pi, pi2)
    assert dt.S.abs().max() < 1e-14
    assert torch.allclose(dt.surrogate, t.surrogate, atol=1e-10)
    assert torch.allclose(dt.bound_cor42, t.bound, atol=1e-9)


# ----------------------------------------------------------------------------------------------
# the ratio lemma (lem-ch11-ratio) and the sample estimators
# ----------------------------------------------------------------------------------------------
def test_half_abs_ratio_diff_hand_case_and_exact_identity():
    # behaviour (1/2, 1/2); pi_a = (1, 0), pi_b = (0, 1): TV = 1.
    # ratios at action 0: (2, 0), at action 1: (0, 2): 1/2 |2 - 0| = 1 for both actions.
    lb = torch.log(torch.tensor([0.5, 0.5], dtype=F64))
    la = torch.log(torch.tensor([1.0, 1e-300], dtype=F64))
    lbb = torch.log(torch.tensor([1e-300, 1.0], dtype=F64))
    assert torch.allclose(half_abs_ratio_diff(la, lbb, lb), torch.tensor(1.0, dtype=F64))
    # exact: weighting every action by the behaviour probability gives the TV exactly
    g = _gen(13)
    p1, pa, pb = (torch.softmax(torch.randn(5, 4, generator=g, dtype=F64), -1) for _ in range(3))
    exact = (p1 * 0.5 * (pa / p1 - pb / p1).abs()).sum(-1)
    assert torch.allclose(exact, T.tv_distance(pa, pb), atol=1e-12)


def test_half_abs_ratio_diff_extreme_logs_and_mask():
    la = torch.tensor([50.0, -50.0, 0.0])
    lb = torch.tensor([-50.0, 50.0, 0.0])
    l1 = torch.zeros(3)
    out = half_abs_ratio_diff(la, lb, l1)
    assert torch.isfinite(out)
    mask = torch.tensor([0.0, 0.0, 1.0])
    assert half_abs_ratio_diff(la, lb, l1, mask=mask).item() == 0.0
    # NaN / inf in masked-out entries never reach the estimate
    pad = torch.tensor([float("nan"), float("inf"), 0.0])
    assert half_abs_ratio_diff(pad, pad, l1, mask=mask).item() == 0.0
    # a batch of MDPs: one estimate per row with dim=-1; an all-false row gives 0, not NaN
    two = torch.stack([la, la])
    rows = half_abs_ratio_diff(two, torch.stack([lb, lb]), torch.stack([l1, l1]),
                               mask=torch.stack([mask, torch.zeros(3)]), dim=-1)
    assert rows.tolist() == [0.0, 0.0]


def test_sampled_U_S_converge_to_exact():
    g, mdp, pols, alpha, kernel = _mixture(14, B=3, S=4, A=3, M=3)
    pi_k = pols[:, -1]
    pi_new = T.perturb_policy(pi_k, 1.0, generator=g)
    dt = T.dynamic_mixture_terms(mdp, pols, alpha, kernel, pi_k, pi_new)
    U_hat, S_hat = T.estimate_update_and_staleness(mdp, pols, alpha, kernel, pi_k, pi_new, 200_000, generator=g)
    # per-sample values lie in [0, max ratio]; a crude 6-sigma band from the ratios' range
    aug, beta = T.augment(mdp, pols, alpha, kernel)
    rmax = torch.maximum((T.lift_policy(pi_new, 3) / beta).amax((-1, -2)),
                         (T.lift_policy(pi_k, 3) / beta).amax((-1, -2)))
    tol = 6 * 0.5 * (rmax + 1) / math.sqrt(200_000)
    assert ((U_hat - dt.U).abs() < tol).all() and ((S_hat - dt.S).abs() < tol).all()


def test_sample_state_actions_frequencies():
    d = torch.tensor([[0.2, 0.8]], dtype=F64)
    beh = torch.tensor([[[1.0, 0.0], [0.25, 0.75]]], dtype=F64)
    s, a = T.sample_state_actions(d, beh, 40_000, generator=_gen(15))
    assert s.shape == (1, 40_000) and a.dtype == torch.long
    assert abs((s == 1).double().mean().item() - 0.8) < 0.01
    assert (a[s == 0] == 0).all()
    assert abs((a[s == 1] == 1).double().mean().item() - 0.75) < 0.01


# ----------------------------------------------------------------------------------------------
# input validation
# ----------------------------------------------------------------------------------------------
def test_validation_errors():
    mdp, (pi, _) = _two_state()
    with pytest.raises(ValueError, match="P"):
        T.FiniteMDP(mdp.P * 2, mdp.R, mdp.rho0, 0.9)
    with pytest.raises(ValueError, match="gamma"):
        T.FiniteMDP(mdp.P, mdp.R, mdp.rho0, 1.0)
    with pytest.raises(ValueError, match=r"R has shape \(2, 1\), which does not fit \[\.\.\., S, A\]"):
        T.FiniteMDP(mdp.P, mdp.R[:, :1], mdp.rho0, 0.9)
    with pytest.raises(TypeError, match="P"):
        T.FiniteMDP(mdp.P.numpy(), mdp.R, mdp.rho0, 0.9)
    with pytest.raises(ValueError, match="pi must have shape"):
        T.value(mdp, pi[None])  # no silent broadcasting of a batched policy
    with pytest.raises(ValueError, match="pi"):
        T.value(mdp, pi * 0.5)
    with pytest.raises(ValueError, match=r"q has shape \(1, 2\) but the shape of p"):
        T.tv_distance(pi, pi[:1])
    with pytest.raises(ValueError, match="sigma"):
        T.step_kernel(torch.tensor([1.5, 0.0], dtype=F64), torch.eye(2, dtype=F64))
    with pytest.raises(ValueError, match="kernel"):
        T.augment(mdp, torch.stack([pi, pi]), torch.tensor([0.5, 0.5], dtype=F64), torch.eye(3, dtype=F64))
    with pytest.raises(ValueError, match="alpha"):
        T.augment(mdp, torch.stack([pi, pi]), torch.tensor([0.7, 0.7], dtype=F64), torch.eye(2, dtype=F64))
    with pytest.raises(ValueError, match="logp_a"):
        half_abs_ratio_diff(torch.zeros(3), torch.zeros(2), torch.zeros(3))
    with pytest.raises(ValueError, match="n must be"):
        T.sample_state_actions(torch.tensor([1.0]), torch.tensor([[1.0]]), 0)


# ----------------------------------------------------------------------------------------------
# the exercise checkers of Chapters 9-11 (rlkit/exercises/solutions/ch09.py, ch10.py, ch11.py)
# ----------------------------------------------------------------------------------------------
from rlkit.exercises import check, exercises, get  # noqa: E402

PART2_EXERCISES = {9: ["horizon_state_distributions", "surrogate_objective", "tv_penalty"],
                   10: ["gated_augmented_transition", "mixture_visitation", "corollary31_bound"],
                   11: ["version_shares", "update_shift_by_version", "corollary42_bound"]}
ALL_EX = [n for names in PART2_EXERCISES.values() for n in names]


@pytest.mark.parametrize("chapter", [9, 10, 11])
def test_each_chapter_registers_its_exercises(chapter):
    assert sorted(e.name for e in exercises(chapter=chapter)) == sorted(PART2_EXERCISES[chapter])


@pytest.mark.parametrize("name", ALL_EX)
def test_exercise_reference_passes(name):
    assert check(get(name).reference, name=name, verbose=False)


def test_exercise_references_agree_with_rlkit_tabular():
    g = _gen(20)
    mdp = T.random_mdp(3, 4, 3, 0.8, generator=g)
    pi = T.random_policy(3, 4, 3, generator=g)
    pi2 = T.perturb_policy(pi, 1.0, generator=g)
    t = T.single_policy_terms(mdp, pi, pi2)
    A = T.advantage(mdp, pi)
    assert torch.allclose(get("surrogate_objective").reference(t.d_old, pi, pi2, A, 0.8), t.surrogate)
    assert torch.allclose(get("tv_penalty").reference(t.d_old, pi, pi2, A, 0.8), t.penalty)
    # chapter 9's per-step distributions against finite_horizon_state_distributions
    fh = T.random_finite_horizon_mdp(2, 5, 4, 3, generator=g)
    fpi = torch.softmax(torch.randn(2, 5, 4, 3, generator=g, dtype=F64), -1)
    P_pi = torch.einsum("bhsa,bhsat->bhst", fpi, fh.P)[:, :-1]           # the kernels of steps 0 .. H-2
    want = T.finite_horizon_state_distributions(fh, fpi)
    assert torch.allclose(get("horizon_state_distributions").reference(P_pi, fh.rho0), want, atol=1e-12)
    # chapter 10 against augment (gates all 1) and the identity kernel (gates all 0) / static_mixture_terms
    pols = T.random_policy((1, 3), 4, 3, generator=g)
    alpha = torch.tensor([0.2, 0.3, 0.5], dtype=F64)
    kern = T.step_kernel(torch.tensor([0.1, 0.2, 0.3], dtype=F64), torch.full((3, 3), 1 / 3, dtype=F64))
    aug, beta = T.augment(mdp[:1], pols, alpha, kern)
    gated = get("gated_augmented_transition").reference
    assert torch.allclose(gated(mdp.P[0], kern, torch.ones(4, dtype=F64)), aug.P[0])
    aug_id, _ = T.augment(mdp[:1], pols, alpha, T.trajectory_kernel(3))
    assert torch.allclose(gated(mdp.P[0], kern, torch.zeros(4, dtype=F64)), aug_id.P[0])
    gate = torch.rand(4, generator=g, dtype=F64)
    got = gated(mdp.P[0], kern, gate)
    for s_ in range(4):                                   # a slow loop over every entry
        for i in range(3):
            for a_ in range(3):
                for s2 in range(4):
                    for i2 in range(3):
                        q = gate[s2] * kern[i, i2] + (1 - gate[s2]) * float(i == i2)
                        assert math.isclose(got[s_ * 3 + i, a_, s2 * 3 + i2].item(),
                                            (mdp.P[0, s_, a_, s2] * q).item(), abs_tol=1e-14)
    aug_t, beta_t = T.augment(mdp[:1], pols, alpha, T.trajectory_kernel(3))
    d_b = T.visitation(aug_t, beta_t)[0].reshape(4, 3)
    assert torch.allclose(get("mixture_visitation").reference(mdp.P[0], mdp.rho0[0], pols[0], alpha, 0.8), d_b)
    st = T.static_mixture_terms(mdp[:1], pols, alpha, pi2[:1])
    b31 = get("corollary31_bound").reference(st.alpha, st.surrogates, st.eps, st.expected_tv, 0.8)
    assert torch.allclose(b31, st.bound)
    # chapter 11: the version shares are the index marginal of d_beta on the augmented MDP
    sig, kap = torch.tensor([0.1, 0.4, 0.9], dtype=F64), torch.softmax(torch.randn(3, 3, generator=g, dtype=F64), -1)
    aug_s, beta_s = T.augment(mdp[:1], pols, alpha, T.step_kernel(sig, kap))
    shares = T.visitation(aug_s, beta_s)[0].reshape(4, 3).sum(0)
    assert torch.allclose(get("version_shares").reference(alpha, sig, kap, 0.8), shares, atol=1e-12)
    # the hand-over of the chapter: version 1 acts only at the first step of half the trajectories
    ho = get("version_shares").reference(torch.tensor([0.5, 0.5], dtype=F64), torch.tensor([1.0, 0.0], dtype=F64),
                                         torch.tensor([[0.0, 1.0], [0.0, 1.0]], dtype=F64), 0.9)
    assert torch.allclose(ho, torch.tensor([0.05, 0.95], dtype=F64))
    dt = T.dynamic_mixture_terms(mdp[:1], pols, alpha, kern, pols[:, -1], pi2[:1])
    b42 = get("corollary42_bound").reference(dt.surrogate, dt.eps, dt.adv_old_max, dt.U, dt.S, 0.8)
    assert torch.allclose(b42, dt.bound_cor42)
    la, lb, l1 = torch.randn(3, 60, generator=g, dtype=F64).unbind(0)
    ver = torch.arange(60) % 4
    by_v = get("update_shift_by_version").reference(la, lb, l1, ver, 5)
    for v in range(4):
        assert torch.allclose(by_v[v], half_abs_ratio_diff(la[ver == v], lb[ver == v], l1[ver == v]))
    assert torch.isnan(by_v[4])
    assert torch.allclose((by_v[:4] * 15).sum() / 60, half_abs_ratio_diff(la, lb, l1))   # count-weighted average


def test_the_displayed_functions_no_longer_pass():
    """Chapters 9-11 display visitation, augment, step_kernel and half_abs_ratio_diff, which solved the exercises
    these replace; called as a student would call them, they now fail the checks."""
    def horizon_state_distributions(P_pi, rho0):            # the discounted visitation of the first kernel
        mdp = T.FiniteMDP(P_pi[..., 0, :, None, :], torch.zeros(*P_pi.shape[:-3], P_pi.shape[-1], 1, dtype=F64),
                          rho0, 0.9)
        d = T.visitation(mdp, torch.ones(*P_pi.shape[:-3], P_pi.shape[-1], 1, dtype=F64))
        return d[..., None, :].expand(*P_pi.shape[:-3], P_pi.shape[-3] + 1, P_pi.shape[-1])
    assert not check(horizon_state_distributions, verbose=False)

    def gated_augmented_transition(P, kernel, gate):
        S, A, _ = P.shape
        M = kernel.shape[0]
        mdp = T.FiniteMDP(P, torch.zeros(S, A, dtype=F64), torch.full((S,), 1 / S, dtype=F64), 0.9)
        return T.augment(mdp, torch.full((M, S, A), 1 / A, dtype=F64), torch.full((M,), 1 / M, dtype=F64), kernel)[0].P
    r = check(gated_augmented_transition, verbose=False)
    assert not r and "the gate is ignored" in r.message

    def version_shares(alpha, sigma, kappa, gamma):
        return T.step_kernel(sigma, kappa)[..., 0, :]
    assert not check(version_shares, verbose=False)

    def update_shift_by_version(logp_new, logp_old, logp_behaviour, versions, n_versions):
        return half_abs_ratio_diff(logp_new, logp_old, logp_behaviour).expand(n_versions)
    r = check(update_shift_by_version, verbose=False)
    assert not r


# The generic checks (each reference passes its checker, each registered mistake is
# caught with its cause) run for every chapter in tests/test_exercises_framework.py.
