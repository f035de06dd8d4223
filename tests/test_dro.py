"""Tests of rlkit.dro (chapter 19): every worst case against brute-force optimisation on small cases.

Brute force: a fine grid over the 2-simplex (n = 3) and random points of higher simplices for the
KL and chi-square balls, exact vertex enumeration of the linear programs (CVaR, TV, Wasserstein).
"""
import itertools
import math

import numpy as np
import pytest
import torch

from rlkit.dro import chi2_dro, cvar, group_dro_step, kl_dro, kl_dual, tv_dro, wasserstein_dro

D = torch.float64


def simplex_grid(k=300):
    i, j = np.meshgrid(np.arange(k + 1), np.arange(k + 1), indexing="ij")
    keep = i + j <= k
    a, b = i[keep] / k, j[keep] / k
    return np.stack([a, b, 1 - a - b], 1)


GRID = simplex_grid()
CASES = [([0.2, 0.9, 0.5], [1 / 3, 1 / 3, 1 / 3]), ([0.0, 1.0, 0.6], [0.5, 0.3, 0.2]),
         ([1.0, 0.1, 0.4], [0.1, 0.1, 0.8])]


def kl(q, p):
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(q > 0, q * np.log(q / p), 0.0)
    return t.sum(-1)


def chi2(q, p):
    return 0.5 * (p * (q / p - 1) ** 2).sum(-1)


@pytest.mark.parametrize("v,p", CASES)
@pytest.mark.parametrize("eps", [0.02, 0.1, 0.3, 0.8])
def test_kl_matches_grid_and_dual(v, p, eps):
    v, p = np.array(v), np.array(p)
    res = kl_dro(torch.tensor(v, dtype=D), eps, torch.tensor(p, dtype=D))
    feas = kl(GRID, p) <= eps
    brute = (GRID[feas] @ v).min()
    assert res.value <= brute + 1e-9 and res.value >= brute - 0.01      # grid resolution 1/300
    q = res.weights.numpy()
    assert kl(q, p) <= eps + 1e-8 and abs(q.sum() - 1) < 1e-12
    if 0 < res.param < math.inf:       # strong duality; the dual is lower at other tau
        g = kl_dual(torch.tensor(v, dtype=D), res.param, eps, torch.tensor(p, dtype=D))
        assert abs(g - res.value) < 1e-8
        for t in (0.5 * res.param, 2 * res.param):
            assert kl_dual(torch.tensor(v, dtype=D), t, eps, torch.tensor(p, dtype=D)) <= res.value + 1e-12
        w = p * np.exp(-v / res.param)
        assert np.allclose(q, w / w.sum())
    assert v.min() - 1e-12 <= res.value <= (p * v).sum() + 1e-12


def test_kl_random_higher_dimension_and_limits():
    g = np.random.default_rng(0)
    v = g.random(5)
    p = g.dirichlet(np.ones(5))
    res = kl_dro(torch.tensor(v, dtype=D), 0.2, torch.tensor(p, dtype=D))
    Q = g.dirichlet(np.ones(5) * 0.3, size=400_000)
    feas = kl(Q, p) <= 0.2
    assert res.value <= (Q[feas] @ v).min() + 1e-9
    big = kl_dro(torch.tensor(v, dtype=D), 50.0, torch.tensor(p, dtype=D))
    assert big.value == pytest.approx(v.min()) and big.param == 0.0
    assert kl_dro(torch.tensor(v, dtype=D), 0.0).value == pytest.approx(v.mean())
    flat = kl_dro(torch.full((4,), 0.3, dtype=D), 1.0)
    assert flat.value == pytest.approx(0.3) and torch.allclose(flat.weights, torch.full((4,), 0.25, dtype=D))


@pytest.mark.parametrize("v,p", CASES)
@pytest.mark.parametrize("rho", [0.01, 0.1, 0.4, 1.5])
def test_chi2_matches_grid_and_closed_form(v, p, rho):
    v, p = np.array(v), np.array(p)
    res = chi2_dro(torch.tensor(v, dtype=D), rho, torch.tensor(p, dtype=D))
    feas = chi2(GRID, p) <= rho
    brute = (GRID[feas] @ v).min()
    assert brute - 0.01 <= res.value <= brute + 1e-9
    q = res.weights.numpy()
    assert chi2(q, p) <= rho + 1e-8
    mean, var = (p * v).sum(), (p * (v - (p * v).sum()) ** 2).sum()
    closed = mean - math.sqrt(2 * rho * var)
    if (q > 0).all():                   # no weight clipped: the closed form holds exactly
        assert res.value == pytest.approx(closed, abs=1e-9)
    else:                               # clipped: the closed form is too pessimistic
        assert res.value >= closed - 1e-12


def _lp_vertices_box(v, p, ub):
    """min q.v subject to sum q = 1, 0 <= q <= ub: enumerate vertices (all but one q at a bound)."""
    n, best = len(v), math.inf
    for free in range(n):
        for bounds in itertools.product([0, 1], repeat=n - 1):
            q = np.zeros(n)
            others = [i for i in range(n) if i != free]
            for i, b in zip(others, bounds):
                q[i] = ub[i] * b
            q[free] = 1 - q.sum()
            if -1e-12 <= q[free] <= ub[free] + 1e-12:
                best = min(best, q @ v)
    return best


@pytest.mark.parametrize("alpha", [1.0, 0.7, 0.35, 0.1, 0.01])
def test_cvar_against_lp_vertices_and_rockafellar_uryasev(alpha):
    g = np.random.default_rng(1)
    v, p = g.random(5), g.dirichlet(np.ones(5))
    res = cvar(torch.tensor(v, dtype=D), alpha, torch.tensor(p, dtype=D))
    assert res.value == pytest.approx(_lp_vertices_box(v, p, p / alpha), abs=1e-12)
    ru = lambda eta: eta - np.maximum(eta - v, 0) @ p / alpha
    grid = np.linspace(-1, 2, 30001)
    assert res.value == pytest.approx(max(ru(e) for e in grid), abs=1e-4)
    assert ru(res.param) == pytest.approx(res.value, abs=1e-12)
    assert (res.weights.numpy() <= p / alpha + 1e-12).all()


def _tv_brute(v, p, eps):
    """min q.v over TV(q, p) <= eps: grid over the simplex (n = 3)."""
    feas = 0.5 * np.abs(GRID - p).sum(1) <= eps + 1e-12
    return (GRID[feas] @ v).min()


@pytest.mark.parametrize("v,p", CASES + [([0.5, 0.9, 0.0], [0.5, 0.5, 0.0])])
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.35, 1.0])
def test_tv_against_grid_and_cvar_identity(v, p, eps):
    v, p = np.array(v), np.array(p)
    res = tv_dro(torch.tensor(v, dtype=D), eps, torch.tensor(p, dtype=D))
    assert res.value == pytest.approx(_tv_brute(v, p, eps), abs=1e-9)
    if eps < 1:
        c = cvar(torch.tensor(v, dtype=D), 1 - eps, torch.tensor(p, dtype=D)).value if eps > 0 else (p * v).sum()
        assert res.value == pytest.approx((1 - eps) * c + eps * v.min(), abs=1e-12)


def test_zero_mass_points_get_no_weight_from_kl_chi2_cvar_but_tv_uses_them():
    v = torch.tensor([0.9, 0.7, float("nan")], dtype=D)        # an unseen group with no measurement
    p = torch.tensor([0.5, 0.5, 0.0], dtype=D)
    for res in (kl_dro(v, 5.0, p), chi2_dro(v, 5.0, p), cvar(v, 0.01, p)):
        assert res.weights[2] == 0 and res.value == pytest.approx(0.7)
    v2 = torch.tensor([0.9, 0.7, 0.0], dtype=D)
    assert kl_dro(v2, 5.0, p).weights[2] == 0
    tv = tv_dro(v2, 0.2, p)
    assert tv.weights[2] == pytest.approx(0.2) and tv.value == pytest.approx(0.5 * 0.7 + 0.3 * 0.9 - 0.0)


def test_pinsker_tv_ball_contains_kl_ball():
    g = np.random.default_rng(3)
    for _ in range(20):
        v = torch.tensor(g.random(6), dtype=D)
        p = torch.tensor(g.dirichlet(np.ones(6)), dtype=D)
        eps = float(g.random()) * 0.5
        assert tv_dro(v, min(1.0, math.sqrt(eps / 2)), p).value <= kl_dro(v, eps, p).value + 1e-12


def _w_brute(v, C, p, eps):
    """Exact LP by vertex enumeration: every row pure except at most one row split between two targets."""
    n, m = C.shape
    best = math.inf
    for js in itertools.product(range(m), repeat=n):
        cost = sum(p[i] * C[i, j] for i, j in enumerate(js))
        val = sum(p[i] * v[j] for i, j in enumerate(js))
        if cost <= eps + 1e-12:
            best = min(best, val)
        for i in range(n):
            for j2 in range(m):
                dc = p[i] * (C[i, j2] - C[i, js[i]])
                if dc == 0:
                    continue
                th = (eps - cost) / dc
                if 0 <= th <= 1:
                    best = min(best, val + th * p[i] * (v[j2] - v[js[i]]))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_wasserstein_against_exact_lp(seed):
    g = np.random.default_rng(seed)
    n, m = 3, 4
    v = g.random(m)
    C = g.random((n, m)) * 2
    C[np.arange(n), np.arange(n)] = 0.0                 # sources are targets 0..n-1, staying is free
    p = g.dirichlet(np.ones(n))
    for eps in (0.0, 0.05, 0.2, 0.6, 3.0):
        res = wasserstein_dro(torch.tensor(v, dtype=D), torch.tensor(C, dtype=D), eps, torch.tensor(p, dtype=D))
        assert res.value == pytest.approx(_w_brute(v, C, p, eps), abs=1e-9)
        plan = res.plan.numpy()
        assert np.allclose(plan.sum(1), p) and (plan >= -1e-15).all() and (plan * C).sum() <= eps + 1e-9
        lam = res.param
        dual = -lam * eps + (p * (v[None] + lam * C).min(1)).sum()
        assert dual == pytest.approx(res.value, abs=1e-7)


def test_wasserstein_with_the_zero_one_cost_is_the_tv_ball():
    v = torch.tensor([0.3, 0.8, 0.6, 0.1], dtype=D)
    p = torch.tensor([0.4, 0.3, 0.3, 0.0], dtype=D)
    C = 1.0 - torch.eye(4, dtype=D)
    for eps in (0.0, 0.1, 0.5, 1.0):
        assert wasserstein_dro(v, C, eps, p).value == pytest.approx(tv_dro(v, eps, p).value, abs=1e-12)


def test_group_dro_step_is_a_kl_tilt_and_finds_the_worst_group():
    q = torch.tensor([0.5, 0.3, 0.2], dtype=D)
    v = torch.tensor([0.9, 0.4, 0.6], dtype=D)
    new = group_dro_step(q, v, 2.0)
    want = q * torch.exp(-2.0 * v)
    assert torch.allclose(new, want / want.sum())
    qt = torch.full((3,), 1 / 3, dtype=D)
    for _ in range(200):
        qt = group_dro_step(qt, v, 0.5)
    assert qt.argmax() == 1 and qt[1] > 0.99
    part = group_dro_step(q, torch.tensor([0.9, float("nan"), 0.6], dtype=D), 2.0)
    assert part[1] == q[1] and part.sum() == pytest.approx(1.0)
    adj = group_dro_step(q, v, 1.0, counts=torch.tensor([100.0, 100.0, 1.0], dtype=D), adj=0.5)
    assert adj[2] / adj[1] > new[2] / new[1] or adj[2] > q[2]


def test_input_checks_name_the_argument():
    v = torch.tensor([0.1, 0.2])
    with pytest.raises(ValueError, match="eps"):
        kl_dro(v, -1.0)
    with pytest.raises(ValueError, match="empty"):
        kl_dro(torch.zeros(0), 0.1)
    with pytest.raises(ValueError, match="p"):
        kl_dro(v, 0.1, torch.tensor([0.7, 0.7]))
    with pytest.raises(ValueError, match="alpha"):
        cvar(v, 0.0)
    with pytest.raises(ValueError, match="finite"):
        tv_dro(torch.tensor([0.1, float("nan")]), 0.1, torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="finite"):
        kl_dro(torch.tensor([0.1, float("nan")]), 0.1)
    with pytest.raises(ValueError, match="cost"):
        wasserstein_dro(v, torch.zeros(2, 3), 0.1, torch.tensor([0.5, 0.5]))
    with pytest.raises(ValueError, match="cheapest"):
        wasserstein_dro(v, torch.ones(2, 2), 0.1, torch.tensor([0.5, 0.5]))
    with pytest.raises(TypeError):
        chi2_dro([0.1, 0.2], 0.1)
    assert kl_dro(v, 0.1).weights.dtype == torch.float32
