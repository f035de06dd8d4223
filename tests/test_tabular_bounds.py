"""Tests of the current-advantage bound of chapter 11 (rlkit.tabular.current_advantage_terms,
prop-ch11-current-advantage).

The references are independent of the function under test: the augmented MDP built by explicit
Python loops, values and visitations by truncated series (value iteration and a sum over time
steps), the surrogate in its importance-weighted form, the single-policy bound of chapter 9 in the
fresh-data case, a contextual bandit (where the surrogate is exact), and chapter 9's tight example.
"""
from __future__ import annotations

import pytest
import torch

from rlkit import tabular as T

torch.set_num_threads(1)
F64 = torch.float64


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _instance(seed, B=3, S=3, A=2, M=2, step_level=True, gamma=0.8):
    g = _gen(seed)
    mdp = T.random_mdp(B, S, A, gamma, generator=g)
    pols = T.random_policy((B, M), S, A, generator=g)
    alpha = torch.softmax(torch.randn(B, M, generator=g, dtype=F64), -1)
    if step_level:
        kernel = T.step_kernel(torch.rand(B, M, generator=g, dtype=F64),
                               torch.softmax(torch.randn(B, M, M, generator=g, dtype=F64), -1))
    else:
        kernel = T.trajectory_kernel(M)
    pi_k = T.random_policy(B, S, A, generator=g)
    pi_new = T.perturb_policy(pi_k, 0.5, generator=g)
    return mdp, pols, alpha, kernel, pi_k, pi_new


def _slow_terms(mdp, pols, alpha, kernel, pi_k, pi_new, b, n_iter=600):
    """Every term for batch element b by loops and truncated series (gamma = 0.8: 0.8**600 ~ 1e-58)."""
    P, R, rho0, g = mdp.P[b].tolist(), mdp.R[b].tolist(), mdp.rho0[b].tolist(), float(mdp.gamma[b])
    S, A, M = len(R), len(R[0]), pols.shape[1]
    beh = pols[b].tolist()
    al = (alpha[b] if alpha.dim() == 2 else alpha).tolist()
    q = (kernel[b] if kernel.dim() == 3 else kernel).tolist()
    pk, pn = pi_k[b].tolist(), pi_new[b].tolist()

    # V^{pi_k}, Q^{pi_k} by value iteration on the original MDP
    Vk = [0.0] * S
    for _ in range(n_iter):
        Vk = [sum(pk[s][a] * (R[s][a] + g * sum(P[s][a][t] * Vk[t] for t in range(S))) for a in range(A))
              for s in range(S)]
    Qk = [[R[s][a] + g * sum(P[s][a][t] * Vk[t] for t in range(S)) for a in range(A)] for s in range(S)]
    Ak = [[Qk[s][a] - Vk[s] for a in range(A)] for s in range(S)]
    # J(pi_new) by value iteration
    Vn = [0.0] * S
    for _ in range(n_iter):
        Vn = [sum(pn[s][a] * (R[s][a] + g * sum(P[s][a][t] * Vn[t] for t in range(S))) for a in range(A))
              for s in range(S)]
    J_old = sum(rho0[s] * Vk[s] for s in range(S))
    J_new = sum(rho0[s] * Vn[s] for s in range(S))
    # d_beta on S x I: (1 - g) sum_t g^t Pr(s_t = s, i_t = i), the index redrawn from q after each step
    mu = [[rho0[s] * al[i] for i in range(M)] for s in range(S)]
    d = [[0.0] * M for _ in range(S)]
    for t in range(n_iter):
        for s in range(S):
            for i in range(M):
                d[s][i] += (1 - g) * g ** t * mu[s][i]
        nxt = [[0.0] * M for _ in range(S)]
        for s in range(S):
            for i in range(M):
                for a in range(A):
                    w = mu[s][i] * beh[i][s][a]
                    for s2 in range(S):
                        for i2 in range(M):
                            nxt[s2][i2] += w * P[s][a][s2] * q[i][i2]
        mu = nxt

    def tv(p, r):
        return 0.5 * sum(abs(x - y) for x, y in zip(p, r))

    # the surrogate in its importance-weighted form
    L = sum(d[s][i] * beh[i][s][a] * (pn[s][a] / beh[i][s][a]) * Ak[s][a]
            for s in range(S) for i in range(M) for a in range(A)) / (1 - g)
    eps = max(abs(sum(pn[s][a] * Ak[s][a] for a in range(A))) for s in range(S))
    tv_nb = sum(d[s][i] * tv(pn[s], beh[i][s]) for s in range(S) for i in range(M))
    U = sum(d[s][i] * tv(pn[s], pk[s]) for s in range(S) for i in range(M))
    Sk = sum(d[s][i] * tv(pk[s], beh[i][s]) for s in range(S) for i in range(M))
    c = 2 * g * eps / (1 - g) ** 2
    return dict(J_old=J_old, J_new=J_new, improvement=J_new - J_old, surrogate=L, eps=eps, tv_new_behaviour=tv_nb,
                U=U, S=Sk, penalty=c * tv_nb, bound=L - c * tv_nb, bound_split=L - c * (U + Sk), d_beta=d)


@pytest.mark.parametrize("step_level", [False, True])
def test_current_advantage_terms_against_slow_loops(step_level):
    mdp, pols, alpha, kernel, pi_k, pi_new = _instance(1, step_level=step_level)
    t = T.current_advantage_terms(mdp, pols, alpha, kernel, pi_k, pi_new)
    for b in range(mdp.batch_shape[0]):
        ref = _slow_terms(mdp, pols, alpha, kernel, pi_k, pi_new, b)
        for name, val in ref.items():
            got = getattr(t, name)[b]
            assert torch.allclose(got, torch.tensor(val, dtype=F64), atol=1e-10, rtol=0), (name, b)


@pytest.mark.parametrize("step_level", [False, True])
def test_bound_is_two_sided_and_holds_on_random_stale_mixtures(step_level):
    g = _gen(2)
    B, S, A, M = 400, 4, 3, 3
    gamma = 0.3 + 0.65 * torch.rand(B, generator=g, dtype=F64)
    mdp = T.random_mdp(B, S, A, gamma, peakiness=3.0, generator=g)
    pols = T.random_policy((B, M), S, A, temperature=0.5, generator=g)
    alpha = torch.softmax(torch.randn(B, M, generator=g, dtype=F64), -1)
    kernel = T.step_kernel(torch.rand(B, M, generator=g, dtype=F64),
                           torch.softmax(torch.randn(B, M, M, generator=g, dtype=F64), -1)) if step_level \
        else T.trajectory_kernel(M)
    pi_k = T.random_policy(B, S, A, temperature=0.5, generator=g)        # far from every version
    pi_new = T.perturb_policy(pi_k, 2 * torch.rand(B, generator=g, dtype=F64), generator=g)
    t = T.current_advantage_terms(mdp, pols, alpha, kernel, pi_k, pi_new)
    err = (t.improvement - t.surrogate).abs()
    assert (err <= t.penalty + 1e-10).all()                  # |J_{k+1} - J_k - L| <= penalty
    assert (t.bound_split <= t.bound + 1e-12).all()          # the triangle inequality
    assert (t.improvement >= t.bound_split - 1e-10).all()
    # epsilon_k <= 2 ||A^{pi_k}||_inf max_s TV(pi_{k+1}, pi_k; s)
    A_k = T.advantage(mdp, pi_k)
    assert (t.eps <= 2 * A_k.abs().amax((-1, -2)) * T.tv_distance(pi_new, pi_k).amax(-1) + 1e-12).all()


def test_no_update_gives_zero_surrogate_and_penalty_whatever_the_staleness():
    mdp, pols, alpha, kernel, pi_k, _ = _instance(3)
    t = T.current_advantage_terms(mdp, pols, alpha, kernel, pi_k, pi_k)
    assert t.S.min() > 0.01                                   # the data are stale
    for name in ("improvement", "surrogate", "eps", "penalty", "bound", "bound_split", "U"):
        assert getattr(t, name).abs().max() < 1e-12, name


def test_fresh_data_reduce_to_the_single_policy_bound():
    g = _gen(4)
    mdp = T.random_mdp(5, 4, 3, 0.7, generator=g)
    pi_k = T.random_policy(5, 4, 3, generator=g)
    pi_new = T.perturb_policy(pi_k, 0.7, generator=g)
    sp = T.single_policy_terms(mdp, pi_k, pi_new)
    # one version equal to pi_k, any kernel; or several copies of pi_k with a step-level kernel
    step = T.step_kernel(torch.full((3,), 0.5, dtype=F64), torch.full((3, 3), 1 / 3, dtype=F64))
    for pols, alpha, kernel in [(pi_k[:, None], torch.ones(1, dtype=F64), T.trajectory_kernel(1)),
                                (pi_k[:, None].expand(5, 3, 4, 3), torch.tensor([0.2, 0.3, 0.5], dtype=F64), step)]:
        t = T.current_advantage_terms(mdp, pols, alpha, kernel, pi_k, pi_new)
        assert torch.allclose(t.surrogate, sp.surrogate, atol=1e-12)
        assert torch.allclose(t.penalty, sp.penalty, atol=1e-12)
        assert torch.allclose(t.S, torch.zeros_like(t.S), atol=1e-15)
        assert torch.allclose(t.U, sp.expected_tv, atol=1e-12)


def test_constant_is_attained_on_the_tight_example():
    # fresh data on chapter 9's tight example: tau -> 1 as eta -> 0, tau = p / (p + gamma eta / (1 - gamma))
    etas = torch.tensor([1e-2, 1e-4, 1e-6], dtype=F64)
    mdp, pi_k, pi_new = T.tight_example(0.9, 0.3, etas)
    t = T.current_advantage_terms(mdp, pi_k[:, None], torch.ones(1, dtype=F64), T.trajectory_kernel(1), pi_k, pi_new)
    closed = 0.3 / (0.3 + 0.9 * etas / 0.1)
    assert torch.allclose(t.tightness, closed, atol=1e-9)
    assert t.tightness[-1] > 1 - 1e-4


def test_contextual_bandit_surrogate_is_exact_for_any_mixture():
    # d_beta's state marginal is rho0 whatever the versions and the kernel, so L equals the improvement
    g = _gen(5)
    rho0 = torch.softmax(torch.randn(2, 4, generator=g, dtype=F64), -1)
    mdp = T.contextual_bandit(rho0, torch.randn(2, 4, 3, generator=g, dtype=F64), 0.6)
    pols = T.random_policy((2, 3), 4, 3, generator=g)
    kernel = T.step_kernel(torch.rand(2, 3, generator=g, dtype=F64),
                           torch.softmax(torch.randn(2, 3, 3, generator=g, dtype=F64), -1))
    pi_k, pi_new = T.random_policy((2,), 4, 3, generator=g), T.random_policy((2,), 4, 3, generator=g)
    t = T.current_advantage_terms(mdp, pols, torch.tensor([0.5, 0.25, 0.25], dtype=F64), kernel, pi_k, pi_new)
    assert torch.allclose(t.surrogate, t.improvement, atol=1e-12)
    assert torch.allclose(t.d_beta.sum(-1), rho0, atol=1e-12)


def test_trajectory_level_surrogate_is_the_average_over_versions():
    # with q = I, d_beta(s, i) = alpha_i d_{pi^(i)}(s): L = sum_i alpha_i / (1 - g) E_{d_{pi^(i)}}[abar_k]
    mdp, pols, alpha, kernel, pi_k, pi_new = _instance(6, B=2, S=4, A=3, M=3, step_level=False)
    t = T.current_advantage_terms(mdp, pols, alpha, kernel, pi_k, pi_new)
    abar = T.expected_advantage(pi_new, T.advantage(mdp, pi_k))
    per = torch.stack([(T.visitation(mdp, pols[:, i]) * abar).sum(-1) for i in range(3)], -1) / (1 - mdp.gamma[:, None])
    assert torch.allclose(t.surrogate, (alpha * per).sum(-1), atol=1e-12)


def test_validation_errors():
    mdp, pols, alpha, kernel, pi_k, pi_new = _instance(7)
    with pytest.raises(ValueError):
        T.current_advantage_terms(mdp, pols, alpha, kernel, pi_k, 2 * pi_new)
    with pytest.raises(ValueError):
        T.current_advantage_terms(mdp, pols, alpha, kernel, pi_k[:, :2], pi_new)
