"""Tests for rlkit.trust_region against dense linear algebra and the Fisher's definition."""
import math

import pytest
import torch

from rlkit.trust_region import backtracking_line_search, conjugate_gradient, fisher_vector_product, flat_grad

torch.set_num_threads(1)
D64 = torch.float64


def spd(n, seed, cond=10.0):
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=D64))
    eig = torch.logspace(0, math.log10(cond), n, dtype=D64)
    return Q @ torch.diag(eig) @ Q.T


def test_cg_solves_spd_system_exactly_in_n_steps():
    A = spd(8, 0)
    b = torch.randn(8, dtype=D64, generator=torch.Generator().manual_seed(1))
    x = conjugate_gradient(lambda v: A @ v, b, iters=8, tol=0.0)
    assert torch.allclose(x, torch.linalg.solve(A, b), atol=1e-8)


def test_cg_few_iterations_reduce_residual_and_stop_early():
    A = spd(30, 2, cond=5.0)
    b = torch.randn(30, dtype=D64, generator=torch.Generator().manual_seed(3))
    res = [torch.linalg.norm(A @ conjugate_gradient(lambda v: A @ v, b, iters=k) - b).item()
           for k in (1, 3, 10)]
    assert res[0] > res[1] > res[2]
    calls = []
    conjugate_gradient(lambda v: (calls.append(1), A @ v)[1], b, iters=50, tol=1e-20)
    assert len(calls) < 50          # converged and stopped
    # identity matrix: one step
    calls.clear()
    x = conjugate_gradient(lambda v: (calls.append(1), v)[1], b, iters=10)
    assert torch.allclose(x, b) and len(calls) == 1


def test_cg_errors():
    b = torch.ones(3)
    with pytest.raises(ValueError, match="positive definite"):
        conjugate_gradient(lambda v: -v, b)
    with pytest.raises(ValueError, match="Avp"):
        conjugate_gradient(lambda v: v[:2], b)
    with pytest.raises(TypeError, match="b"):
        conjugate_gradient(lambda v: v, torch.ones(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="iters"):
        conjugate_gradient(lambda v: v, b, iters=0)


class LinearSoftmax(torch.nn.Module):
    def __init__(self, d=3, A=4, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.W = torch.nn.Parameter(torch.randn(A, d, generator=g, dtype=D64) * 0.5)
        self.b = torch.nn.Parameter(torch.randn(A, generator=g, dtype=D64) * 0.5)

    def forward(self, x):
        return torch.log_softmax(x @ self.W.T + self.b, -1)


def test_fisher_vector_product_matches_fisher_definition():
    pol = LinearSoftmax()
    params = list(pol.parameters())
    X = torch.randn(5, 3, dtype=D64, generator=torch.Generator().manual_seed(1))
    old = pol(X).detach()

    def kl_fn():
        new = pol(X)
        return (old.exp() * (old - new)).sum(-1).mean()

    # Fisher by definition: E_s E_{a~pi} [grad log pi(a|s) grad log pi(a|s)^T]
    n = sum(p.numel() for p in params)
    F = torch.zeros(n, n, dtype=D64)
    logp = pol(X)
    for s in range(X.shape[0]):
        for a in range(logp.shape[1]):
            gvec = flat_grad(logp[s, a], params, retain_graph=True)
            F += logp[s, a].exp().item() * torch.outer(gvec, gvec) / X.shape[0]
    v = torch.randn(n, dtype=D64, generator=torch.Generator().manual_seed(2))
    for damping in (0.0, 0.1):
        fv = fisher_vector_product(kl_fn, params, v, damping)
        assert torch.allclose(fv, F @ v + damping * v, atol=1e-10)
    # and CG with these products solves (F + damping I) x = g
    g = torch.randn(n, dtype=D64, generator=torch.Generator().manual_seed(3))
    x = conjugate_gradient(lambda u: fisher_vector_product(kl_fn, params, u, 0.1), g,
                           iters=n, tol=0.0)
    assert torch.allclose((F + 0.1 * torch.eye(n, dtype=D64)) @ x, g, atol=1e-6)


def test_fisher_vector_product_validation():
    pol = LinearSoftmax()
    params = list(pol.parameters())
    with pytest.raises(ValueError, match="v"):
        fisher_vector_product(lambda: pol(torch.ones(1, 3, dtype=D64)).sum(), params,
                              torch.ones(3, dtype=D64))
    with pytest.raises(ValueError, match="damping"):
        fisher_vector_product(lambda: pol(torch.ones(1, 3, dtype=D64)).sum(), params,
                              torch.ones(16, dtype=D64), damping=-1.0)
    with pytest.raises(TypeError, match="kl_fn"):
        fisher_vector_product(3.0, params, torch.ones(16, dtype=D64))


def test_line_search_backtracks_to_feasible_improving_step():
    # loss(x) = (x - 1)^2 from x0 = 0, constraint x^2 <= 0.3; full step 4 overshoots
    def evaluate(step):
        x = step.item()
        return (x - 1.0) ** 2, x * x

    ok, frac, info = backtracking_line_search(evaluate, torch.tensor([4.0]), max_constraint=0.3)
    # fractions 1, .5, .25, .125: x = 4 (bad), 2 (loss 1, not < 1), 1 (c = 1 > .3), .5 (ok)
    assert ok and frac == 0.125
    assert info["n_evals"] == 5 and math.isclose(info["improvement"], 0.75)
    assert [h[0] for h in info["history"]] == [1.0, 0.5, 0.25, 0.125]
    # the expected-improvement test: demand at least 90% of the linear prediction 2 * frac * 4
    ok, frac, _ = backtracking_line_search(evaluate, torch.tensor([4.0]), 10.0,
                                           expected_improvement=8.0, accept_ratio=0.9)
    # frac 1/8: imp .75 < .9; 1/16: x=.25, imp .4375 < .45; 1/32: x=.125, imp .234 >= .225
    assert ok and frac == 1 / 32


def test_line_search_rejects_when_nothing_works():
    ok, frac, info = backtracking_line_search(lambda s: (float(s.sum()), 0.0),
                                              torch.ones(3), 0.1, max_backtracks=4)
    assert not ok and frac == 0.0 and info["n_evals"] == 5
    nan_ok, _, _ = backtracking_line_search(lambda s: (float("nan"), 0.0), torch.ones(2), 0.1)
    assert not nan_ok
    with pytest.raises(ValueError, match="backtrack_ratio"):
        backtracking_line_search(lambda s: (0.0, 0.0), torch.ones(2), 0.1, backtrack_ratio=1.0)
    with pytest.raises(ValueError, match="max_constraint"):
        backtracking_line_search(lambda s: (0.0, 0.0), torch.ones(2), -0.1)


def test_trpo_step_on_a_tiny_policy_respects_the_kl_bound():
    pol = LinearSoftmax(seed=4)
    params = list(pol.parameters())
    g = torch.Generator().manual_seed(5)
    X = torch.randn(16, 3, dtype=D64, generator=g)
    acts = torch.randint(0, 4, (16,), generator=g)
    adv = torch.randn(16, dtype=D64, generator=g)
    old = pol(X).detach()

    def surrogate_loss():
        lp = pol(X).gather(1, acts[:, None])[:, 0]
        return -(torch.exp(lp - old.gather(1, acts[:, None])[:, 0]) * adv).mean()

    def kl_fn():
        return (old.exp() * (old - pol(X))).sum(-1).mean()

    gvec = -flat_grad(surrogate_loss(), params)
    s = conjugate_gradient(lambda v: fisher_vector_product(kl_fn, params, v, 1e-3), gvec)
    sFs = s @ fisher_vector_product(kl_fn, params, s, 1e-3)
    delta = 0.01
    full = torch.sqrt(2 * delta / sFs) * s
    theta0 = torch.nn.utils.parameters_to_vector(params).detach().clone()

    def evaluate(step):
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(theta0 + step, params)
            out = surrogate_loss().item(), kl_fn().item()
            torch.nn.utils.vector_to_parameters(theta0, params)
        return out

    ok, frac, info = backtracking_line_search(evaluate, full, delta,
                                              expected_improvement=float(gvec @ full))
    assert ok and info["constraint"] <= delta and info["improvement"] > 0


def test_cg_empty_and_zero_right_hand_side():
    calls = []
    avp = lambda v: (calls.append(1), 2 * v)[1]
    x = conjugate_gradient(avp, torch.zeros(0), tol=0.0)
    assert x.shape == (0,)
    x = conjugate_gradient(avp, torch.zeros(3), tol=0.0)
    assert torch.equal(x, torch.zeros(3)) and not calls
