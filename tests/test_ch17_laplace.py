"""rlkit.risk.laplace_bt_map: the expansion point of chapter 17's last-layer Laplace approximation.

Independent checks: a one-dimensional case solved by bisection written here, the gradient of the
objective by autograd at the returned point, and the Laplace covariance there against the inverse
of the autograd Hessian.
"""
import math

import pytest
import torch

from rlkit.risk import laplace_bt_covariance, laplace_bt_map

D = torch.float64
torch.set_num_threads(1)


def _objective(w, delta, p, nu):
    d = delta @ w
    return (p * torch.nn.functional.softplus(-d) + (1 - p) * torch.nn.functional.softplus(d)).sum() + 0.5 * nu * w @ w


def test_one_pair_one_weight_by_bisection():
    # minimise softplus(-w) + nu w^2 / 2: the root of sigmoid(-w) = nu w
    nu = 0.7
    lo, hi = 0.0, 10.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 1 / (1 + math.exp(mid)) > nu * mid else (lo, mid)
    w = laplace_bt_map(torch.ones(1, 1, dtype=D), torch.zeros(1, 1, dtype=D), torch.zeros(1, dtype=D), nu)
    assert abs(w.item() - lo) < 1e-10
    s = 1 / (1 + math.exp(-lo))
    cov = laplace_bt_covariance(torch.ones(1, 1, dtype=D), torch.zeros(1, 1, dtype=D), w, nu)
    assert abs(cov.item() - 1 / (s * (1 - s) + nu)) < 1e-12


@pytest.mark.parametrize("soft", [False, True])
def test_the_gradient_vanishes_and_the_covariance_is_the_inverse_hessian(soft):
    g = torch.Generator().manual_seed(0)
    pa, pb = torch.randn(60, 4, generator=g, dtype=D), torch.randn(60, 4, generator=g, dtype=D)
    p = torch.rand(60, generator=g, dtype=D) if soft else None
    start = 5 * torch.randn(4, generator=g, dtype=D)          # far from the optimum
    w = laplace_bt_map(pa, pb, start, prior_precision=0.5, p_a=p)
    x = w.clone().requires_grad_(True)
    pp = torch.ones(60, dtype=D) if p is None else p
    (grad,) = torch.autograd.grad(_objective(x, pa - pb, pp, 0.5), x)
    assert grad.norm() < 1e-9
    hess = torch.autograd.functional.hessian(lambda v: _objective(v, pa - pb, pp, 0.5), w)
    assert torch.allclose(laplace_bt_covariance(pa, pb, w, 0.5), torch.linalg.inv(hess), atol=1e-10)


def test_too_few_steps_raise_and_bad_input_is_named():
    g = torch.Generator().manual_seed(1)
    pa, pb = torch.randn(30, 3, generator=g, dtype=D), torch.randn(30, 3, generator=g, dtype=D)
    with pytest.raises(RuntimeError, match="max_steps"):
        laplace_bt_map(pa, pb, 50 * torch.ones(3, dtype=D), max_steps=1, tol=1e-14)
    with pytest.raises(ValueError, match="prior_precision"):
        laplace_bt_map(pa, pb, torch.zeros(3, dtype=D), prior_precision=0.0)
    with pytest.raises(ValueError, match="p_a"):
        laplace_bt_map(pa, pb, torch.zeros(3, dtype=D), p_a=torch.full((30,), 2.0, dtype=D))
    with pytest.raises(ValueError, match="w"):
        laplace_bt_map(pa, pb, torch.zeros(4, dtype=D))
    with pytest.raises(ValueError, match="phi_b"):
        laplace_bt_map(pa, pb[:5], torch.zeros(3, dtype=D))
