"""Exact fixed points of the off-policy operators (rlkit.tabular, chapter 16).

Independent computations: V^pi of the truncated policy by rlkit.tabular.value (a different linear
system), Q^pi by rlkit.tabular.q_value, operator iteration, explicit inverses of the trace
kernels, and Monte Carlo averages of the sampled targets of rlkit.offpolicy (vtrace, retrace,
tree_backup) on trajectories drawn from mu, which must match the expected operators.
"""
import math

import pytest
import torch

from rlkit import offpolicy
from rlkit import tabular as T

torch.set_num_threads(1)
F64 = torch.float64


def _setup(batch=6, S=5, A=3, gamma=0.9, seed=0):
    g = torch.Generator().manual_seed(seed)
    mdp = T.random_mdp(batch, S, A, gamma=gamma, generator=g)
    return mdp, T.random_policy(batch, S, A, generator=g), T.random_policy(batch, S, A, generator=g)


@pytest.mark.parametrize("rho_bar", [0.3, 1.0, 2.0, math.inf])
@pytest.mark.parametrize("c_bar,lam", [(0.2, 1.0), (1.0, 1.0), (1.0, 0.5), (3.0, 0.9)])
def test_vtrace_fixed_point_is_the_value_of_the_truncated_policy(rho_bar, c_bar, lam):
    mdp, pi, mu = _setup()
    got = T.vtrace_fixed_point(mdp, pi, mu, rho_bar, c_bar, lam)
    want = T.value(mdp, T.truncated_policy(pi, mu, rho_bar))
    assert torch.allclose(got, want, atol=1e-10)


def test_vtrace_fixed_point_is_v_pi_only_without_truncation():
    mdp, pi, mu = _setup()
    V_pi, V_mu = T.value(mdp, pi), T.value(mdp, mu)
    assert torch.allclose(T.vtrace_fixed_point(mdp, pi, mu, math.inf), V_pi, atol=1e-10)
    big = float((pi / mu).max()) + 1
    assert torch.allclose(T.vtrace_fixed_point(mdp, pi, mu, big), V_pi, atol=1e-10)
    assert (T.vtrace_fixed_point(mdp, pi, mu, 1.0) - V_pi).abs().max() > 0.05       # biased at rho-bar = 1
    assert torch.allclose(T.vtrace_fixed_point(mdp, pi, mu, 1e-9), V_mu, atol=1e-6)  # rho-bar -> 0: V^mu
    # as rho-bar grows the truncated policy approaches pi in every state (its value need not do so
    # monotonically: the sup-norm bias of the values can rise before it vanishes)
    tv = [T.tv_distance(T.truncated_policy(pi, mu, r), pi) for r in (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)]
    for a, b in zip(tv, tv[1:]):
        assert bool((b <= a + 1e-12).all())


def test_iteration_converges_at_the_exact_modulus_which_falls_with_c_bar():
    mdp, pi, mu = _setup()
    mods = []
    for c_bar in (0.25, 0.5, 1.0):
        A, b = T.vtrace_affine(mdp, pi, mu, 1.0, c_bar)
        assert bool((A >= -1e-12).all())                                   # c-bar <= rho-bar: A >= 0
        eta = A.abs().sum(-1).amax(-1)
        N = torch.linalg.inv(torch.eye(5, dtype=F64) - mdp.gamma[:, None, None] *
                             torch.einsum("...sa,...sat->...st", torch.minimum(c_bar * mu, pi), mdp.P))
        m_tot = torch.minimum(mu, pi).sum(-1)
        closed = 1 - (1 - mdp.gamma) * (N @ m_tot[..., None])[..., 0].amin(-1)
        assert torch.allclose(eta, closed, atol=1e-12)
        Vstar = T.vtrace_fixed_point(mdp, pi, mu, 1.0, c_bar)
        V = torch.zeros_like(Vstar)
        err0 = (V - Vstar).abs().amax(-1)
        for k in range(1, 1000):
            V = (A @ V[..., None])[..., 0] + b
            err = (V - Vstar).abs().amax(-1)
            assert bool((err <= eta ** k * err0 + 1e-9).all())
        assert float(err.max()) < 1e-8
        mods.append(eta)
    assert bool((mods[1] < mods[0]).all()) and bool((mods[2] < mods[1]).all())


def test_sampled_vtrace_targets_average_to_the_expected_operator():
    g = torch.Generator().manual_seed(3)
    mdp, pi, mu = _setup(batch=1, S=3, A=2, gamma=0.5, seed=3)
    mdp, pi, mu = mdp[0], pi[0], mu[0]
    V = torch.randn(3, generator=g, dtype=F64)
    A, b = T.vtrace_affine(mdp, pi, mu, 1.2, 0.8)
    want = A @ V + b
    n, H = 40_000, 30                                              # 0.5^30 ~ 1e-9: the tail is negligible
    for s0 in range(3):
        s = torch.full((n,), s0)
        lr, rw, vs, nv = [], [], [], []
        for _ in range(H):
            a = torch.multinomial(mu[s], 1, generator=g)[:, 0]
            s2 = torch.multinomial(mdp.P[s, a], 1, generator=g)[:, 0]
            lr.append(torch.log(pi[s, a]) - torch.log(mu[s, a]))
            rw.append(mdp.R[s, a])
            vs.append(V[s])
            nv.append(V[s2])
            s = s2
        stack = [torch.stack(x, -1) for x in (lr, rw, vs, nv)]
        out, _ = offpolicy.vtrace(stack[0], stack[1], stack[2], stack[3], torch.full((n, H), 0.5, dtype=F64),
                                  clip_rho=1.2, clip_c=0.8)
        est, se = out[:, 0].mean(), out[:, 0].std() / n ** 0.5
        assert abs(float(est - want[s0])) < 4 * float(se) + 1e-6, (s0, float(est), float(want[s0]), float(se))


@pytest.mark.parametrize("kind", T.TRACE_KINDS)
def test_every_trace_has_q_pi_as_fixed_point(kind):
    mdp, pi, mu = _setup()
    c = T.trace_table(kind, pi, mu, 0.9)
    assert torch.allclose(T.q_trace_fixed_point(mdp, pi, mu, c), T.q_value(mdp, pi), atol=1e-9)


@pytest.mark.parametrize("kind", ["retrace", "tree_backup"])
def test_safe_traces_contract_with_modulus_at_most_gamma(kind):
    mdp, pi, mu = _setup()
    A, b = T.q_trace_affine(mdp, pi, mu, T.trace_table(kind, pi, mu))
    assert bool((A >= -1e-12).all())
    eta = A.abs().sum(-1).amax(-1)
    assert bool((eta <= mdp.gamma + 1e-12).all())
    Qstar = T.q_value(mdp, pi).reshape(6, -1)
    Q = torch.zeros_like(Qstar)
    for _ in range(300):
        Q = (A @ Q[..., None])[..., 0] + b
    assert torch.allclose(Q, Qstar, atol=1e-6)


def test_retrace_is_faster_than_tree_backup_on_policy_and_q_lambda_need_not_contract():
    mdp, pi, _ = _setup()
    A_r, _ = T.q_trace_affine(mdp, pi, pi, T.trace_table("retrace", pi, pi))
    A_t, _ = T.q_trace_affine(mdp, pi, pi, T.trace_table("tree_backup", pi, pi))
    # on-policy Retrace's traces are 1: the Monte Carlo operator, modulus 0; Tree-Backup still cuts by pi
    assert float(A_r.abs().max()) < 1e-10
    assert bool((A_t.abs().sum(-1).amax(-1) > 0.1).all())
    # Q(lambda) with a far behaviour policy and lambda = 1: no longer a sup-norm contraction
    g = torch.Generator().manual_seed(5)
    mdp2 = T.random_mdp(1, 4, 2, gamma=0.95, generator=g)
    pi2 = torch.tensor([[0.99, 0.01]] * 4, dtype=F64)[None]
    mu2 = torch.tensor([[0.01, 0.99]] * 4, dtype=F64)[None]
    A_q, _ = T.q_trace_affine(mdp2, pi2, mu2, T.trace_table("q_lambda", pi2, mu2))
    assert float(A_q.abs().sum(-1).amax()) > 1.0
    A_r2, _ = T.q_trace_affine(mdp2, pi2, mu2, T.trace_table("retrace", pi2, mu2))
    assert float(A_r2.abs().sum(-1).amax()) <= 0.95 + 1e-9


@pytest.mark.parametrize("kind", ["retrace", "tree_backup"])
def test_sampled_q_targets_average_to_the_expected_operator(kind):
    g = torch.Generator().manual_seed(7)
    mdp, pi, mu = _setup(batch=1, S=3, A=2, gamma=0.5, seed=7)
    mdp, pi, mu = mdp[0], pi[0], mu[0]
    Q = torch.randn(3, 2, generator=g, dtype=F64)
    A, b = T.q_trace_affine(mdp, pi, mu, T.trace_table(kind, pi, mu))
    want = (A @ Q.reshape(-1) + b).reshape(3, 2)
    n, H = 40_000, 30
    for s0, a0 in [(0, 0), (1, 1), (2, 0)]:
        s, a = torch.full((n,), s0), torch.full((n,), a0)
        lr, lp, rw, qt, nv = [], [], [], [], []
        for _ in range(H):
            s2 = torch.multinomial(mdp.P[s, a], 1, generator=g)[:, 0]
            lr.append(torch.log(pi[s, a]) - torch.log(mu[s, a]))
            lp.append(torch.log(pi[s, a]))
            rw.append(mdp.R[s, a])
            qt.append(Q[s, a])
            nv.append((pi[s2] * Q[s2]).sum(-1))
            s, a = s2, torch.multinomial(mu[s2], 1, generator=g)[:, 0]
        lr, lp, rw, qt, nv = (torch.stack(x, -1) for x in (lr, lp, rw, qt, nv))
        d = torch.full((n, H), 0.5, dtype=F64)
        out = offpolicy.retrace(lr, rw, qt, nv, d) if kind == "retrace" else offpolicy.tree_backup(lp, rw, qt, nv, d)
        est, se = out[:, 0].mean(), out[:, 0].std() / n ** 0.5
        assert abs(float(est - want[s0, a0])) < 4 * float(se) + 1e-6, (kind, s0, a0, float(est), float(want[s0, a0]))


def test_trace_table_agrees_with_trace_coefficients_on_sampled_actions():
    _, pi, mu = _setup(batch=1)
    pi, mu = pi[0], mu[0]
    s = torch.tensor([0, 1, 2, 3, 4, 0])
    a = torch.tensor([0, 1, 2, 1, 0, 2])
    lr = torch.log(pi[s, a]) - torch.log(mu[s, a])
    for kind in T.TRACE_KINDS:
        tab = T.trace_table(kind, pi, mu, 0.7)[s, a]
        lib = 0.7 * offpolicy.trace_coefficients(kind, log_rhos=lr, logp_target=torch.log(pi[s, a]))
        assert torch.allclose(tab, lib, atol=1e-12), kind


def test_truncated_policy_interpolates_and_checks_its_inputs():
    pi = torch.tensor([[0.7, 0.2, 0.1]], dtype=F64)
    mu = torch.tensor([[0.2, 0.3, 0.5]], dtype=F64)
    assert torch.allclose(T.truncated_policy(pi, mu, 1.0), torch.tensor([[0.4, 0.4, 0.2]], dtype=F64))
    assert torch.allclose(T.truncated_policy(pi, mu, math.inf), pi)
    assert torch.allclose(T.truncated_policy(pi, mu, 1e-8), mu, atol=1e-7)
    with pytest.raises(ValueError, match="share no action"):
        T.truncated_policy(torch.tensor([[1.0, 0.0]], dtype=F64), torch.tensor([[0.0, 1.0]], dtype=F64), 1.0)
    with pytest.raises(ValueError, match="rho_bar"):
        T.truncated_policy(pi, mu, -1.0)
    with pytest.raises(ValueError, match="mu"):
        T.truncated_policy(pi, torch.tensor([[0.5, 0.6, 0.1]], dtype=F64), 1.0)
    with pytest.raises(ValueError, match="kind"):
        T.trace_table("vtrace", pi, mu)
    mdp, pi6, mu6 = _setup()
    with pytest.raises(ValueError, match="traces"):
        T.q_trace_affine(mdp, pi6, mu6, -T.trace_table("retrace", pi6, mu6) - 1)
