"""Tests of rlkit.estimators against independent computations: hand-worked cases, closed forms,
slow loops over autograd, and plain numpy formulas written here."""
import math

import numpy as np
import pytest
import torch
from torch import nn

from rlkit.estimators import (
    effective_sample_size,
    gradient_bias_variance,
    importance_weight_variance,
    score_sums,
    trace_covariance,
)
from rlkit.nets import CategoricalPolicy

# ------------------------------------------------------------------------- effective sample size

def test_ess_hand_cases():
    assert math.isclose(float(effective_sample_size(weights=torch.ones(7))), 7.0, rel_tol=1e-6)
    assert math.isclose(float(effective_sample_size(weights=torch.tensor([0.0, 0.0, 3.0]))), 1.0, rel_tol=1e-6)
    # weights (1, 2, 3): (6)^2 / 14
    assert math.isclose(float(effective_sample_size(weights=torch.tensor([1.0, 2.0, 3.0]))), 36 / 14, rel_tol=1e-6)
    # two equal weights and two zeros: 2
    lw = torch.tensor([0.0, -float("inf"), 0.0, -float("inf")])
    assert math.isclose(float(effective_sample_size(lw)), 2.0, rel_tol=1e-6)


def test_ess_log_space_matches_plain_formula_and_is_scale_free():
    g = torch.Generator().manual_seed(0)
    lw = torch.randn(5, 40, generator=g, dtype=torch.float64) * 2
    w = lw.exp().numpy()
    expected = w.sum(1) ** 2 / (w ** 2).sum(1)
    got = effective_sample_size(lw)
    assert np.allclose(got.numpy(), expected, rtol=1e-10)
    # multiplying all weights by e^1000 (adding 1000 to log-weights) changes nothing and stays finite
    assert torch.allclose(effective_sample_size(lw + 1000.0), got, rtol=1e-10)
    assert torch.allclose(effective_sample_size(lw - 1000.0), got, rtol=1e-10)
    # weights= and log_weights= agree
    assert torch.allclose(effective_sample_size(weights=lw.exp()), got, rtol=1e-10)


def test_ess_dim_and_edge_cases():
    g = torch.Generator().manual_seed(1)
    lw = torch.randn(3, 6, 4, generator=g)
    a = effective_sample_size(lw, dim=1)
    assert a.shape == (3, 4)
    assert torch.allclose(a, effective_sample_size(lw.transpose(1, 2)), rtol=1e-5)
    assert float(effective_sample_size(weights=torch.zeros(4))) == 0.0
    assert float(effective_sample_size(torch.full((4,), -float("inf")))) == 0.0
    # +-50 log-weights: finite, and the dominating weight gives ESS 1
    out = effective_sample_size(torch.tensor([50.0, -50.0, -50.0]))
    assert torch.isfinite(out) and math.isclose(float(out), 1.0, rel_tol=1e-6)



def test_ess_count_and_share_masks_and_no_samples():
    lw = torch.log(torch.tensor([[1.0, 3.0, 7.0], [2.0, 2.0, 5.0]], dtype=torch.float64))
    m = torch.tensor([[True, True, False], [True, True, True]])
    lw_pad = lw.clone()
    lw_pad[0, 2] = float("nan")                      # padding is never read
    got = effective_sample_size(lw_pad, mask=m)
    # by hand: (1 + 3)^2 / (1 + 9) = 1.6 and (2 + 2 + 5)^2 / (4 + 4 + 25) = 81 / 33
    assert torch.allclose(got, torch.tensor([1.6, 81 / 33], dtype=torch.float64))
    share = effective_sample_size(lw_pad, mask=m, share=True)
    assert torch.allclose(share, torch.tensor([1.6 / 2, 81 / 33 / 3], dtype=torch.float64))
    flat = effective_sample_size(lw_pad, mask=m, dim=None)
    w = [1.0, 3.0, 2.0, 2.0, 5.0]
    assert math.isclose(float(flat), sum(w) ** 2 / sum(x * x for x in w), rel_tol=1e-12)
    # no sample: 0, count and share alike
    assert effective_sample_size(torch.zeros(2, 0)).tolist() == [0.0, 0.0]
    assert effective_sample_size(torch.zeros(2, 0), share=True).tolist() == [0.0, 0.0]
    assert float(effective_sample_size(lw, mask=torch.zeros_like(m), dim=None, share=True)) == 0.0


@pytest.mark.parametrize("kwargs,err", [
    (dict(), ValueError),
    (dict(log_weights=torch.zeros(3), weights=torch.ones(3)), ValueError),
    (dict(weights=torch.tensor([1.0, -1.0])), ValueError),
    (dict(weights=torch.tensor([1.0, float("inf")])), ValueError),
    (dict(log_weights=torch.tensor([0.0, float("nan")])), ValueError),
    (dict(log_weights=torch.tensor([0.0, float("inf")])), ValueError),
    (dict(log_weights=torch.zeros(3, dtype=torch.int64)), TypeError),
    (dict(log_weights=torch.zeros(3), dim=1), ValueError),
])
def test_ess_validation(kwargs, err):
    log_weights = kwargs.pop("log_weights", None)
    with pytest.raises(err):
        effective_sample_size(log_weights, **kwargs)


# ------------------------------------------------------------------ importance weight variance

def test_importance_weight_variance_hand_case_and_product():
    # p = (1/2, 1/2), q = (1/4, 3/4): E_q[w^2] = (1/4)/(1/4) + (1/4)/(3/4) = 4/3
    lp = torch.log(torch.tensor([0.5, 0.5], dtype=torch.float64))
    lq = torch.log(torch.tensor([0.25, 0.75], dtype=torch.float64))
    assert math.isclose(float(importance_weight_variance(lp, lq)), 1 / 3, rel_tol=1e-12)
    assert math.isclose(float(importance_weight_variance(lp, lq, horizon=5)), (4 / 3) ** 5 - 1, rel_tol=1e-12)
    # the same distributions give 0; logits need not be normalised
    assert float(importance_weight_variance(lq + 3.0, lq)) == pytest.approx(0.0, abs=1e-12)


def test_importance_weight_variance_matches_enumeration():
    # T = 3 tokens over 3 symbols: enumerate all 27 sequences, Var_q(prod w) exactly
    g = torch.Generator().manual_seed(2)
    zp, zq = torch.randn(3, generator=g, dtype=torch.float64), torch.randn(3, generator=g, dtype=torch.float64)
    p, q = torch.softmax(zp, -1).numpy(), torch.softmax(zq, -1).numpy()
    m1 = m2 = 0.0
    for i in range(3):
        for j in range(3):
            for k in range(3):
                qq = q[i] * q[j] * q[k]
                w = p[i] * p[j] * p[k] / qq
                m1 += qq * w
                m2 += qq * w * w
    assert math.isclose(m1, 1.0, rel_tol=1e-12)
    assert math.isclose(float(importance_weight_variance(zp, zq, horizon=3)), m2 - 1.0, rel_tol=1e-10)


def test_importance_weight_variance_support_and_overflow():
    # q misses a category p uses: infinite variance; p missing a category q has: fine
    inf = float("inf")
    assert float(importance_weight_variance(torch.tensor([0.0, 0.0]), torch.tensor([0.0, -inf]))) == inf
    v = importance_weight_variance(torch.tensor([0.0, -inf]), torch.tensor([0.0, 0.0]))
    assert math.isclose(float(v), 1.0, rel_tol=1e-6)   # p=(1,0), q=(1/2,1/2): E_q w^2 = 2
    big = importance_weight_variance(torch.tensor([5.0, 0.0]), torch.tensor([0.0, 5.0]), horizon=10_000)
    assert float(big) == inf and not torch.isnan(big)
    with pytest.raises(ValueError):
        importance_weight_variance(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError):
        importance_weight_variance(torch.zeros(3), torch.zeros(3), horizon=0)


# ------------------------------------------------------------------------------ score sums

def _slow_score_sums(policy, obs, actions, weights, mask):
    B, T, K = weights.shape
    params = list(policy.parameters())
    out = torch.zeros(B, K, sum(p.numel() for p in params), dtype=obs.dtype)
    for b in range(B):
        for k in range(K):
            terms = [weights[b, t, k] * torch.log_softmax(policy(obs[b, t]), -1)[actions[b, t]]
                     for t in range(T) if mask[b, t]]
            if not terms:
                continue
            g = torch.autograd.grad(sum(terms), params)
            out[b, k] = torch.cat([x.reshape(-1) for x in g])
    return out


def test_score_sums_match_autograd_loop():
    torch.manual_seed(0)
    pol = CategoricalPolicy(3, 4, hidden=5).double()
    g = torch.Generator().manual_seed(3)
    B, T, K = 3, 4, 2
    obs = torch.randn(B, T, 3, generator=g, dtype=torch.float64)
    actions = torch.randint(0, 4, (B, T), generator=g)
    weights = torch.randn(B, T, K, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    got = score_sums(pol, obs, actions, weights, mask)
    assert got.shape == (B, K, sum(p.numel() for p in pol.parameters()))
    assert torch.allclose(got, _slow_score_sums(pol, obs, actions, weights, mask), atol=1e-10)
    # without a mask every step counts
    got2 = score_sums(pol, obs, actions, weights)
    assert torch.allclose(got2, _slow_score_sums(pol, obs, actions, weights, torch.ones(B, T, dtype=torch.bool)),
                          atol=1e-10)
    # the parameters' .grad fields are left alone
    assert all(p.grad is None for p in pol.parameters())


def test_score_sums_validation():
    pol = CategoricalPolicy(3, 2, hidden=4)
    obs, act, w = torch.zeros(2, 3, 3), torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 3, 1)
    with pytest.raises(ValueError):
        score_sums(pol, obs[0], act, w)
    with pytest.raises(TypeError):
        score_sums(pol, obs, act.float(), w)
    with pytest.raises(ValueError):
        score_sums(pol, obs, act[:, :2], w)
    with pytest.raises(ValueError):
        score_sums(pol, obs, act, w[..., 0])
    with pytest.raises(ValueError):
        score_sums(pol, obs, act, w, mask=torch.ones(2, 2))

    class WithScale(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 2)
            self.scale = nn.Parameter(torch.ones(()))

        def forward(self, x):
            return self.lin(x) * self.scale

    with pytest.raises(TypeError):
        score_sums(WithScale(), obs, act, w)


# ------------------------------------------------------------------- bias and variance

def test_trace_covariance_equals_numpy():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(50, 7, generator=g, dtype=torch.float64)
    assert math.isclose(trace_covariance(x), float(np.trace(np.cov(x.numpy(), rowvar=False))), rel_tol=1e-10)
    with pytest.raises(ValueError):
        trace_covariance(torch.zeros(1, 3))


def test_gradient_bias_variance_hand_case():
    est = torch.tensor([[1.0, 0.0], [3.0, 0.0]])   # mean (2, 0); variance 2 (divisor M-1)
    ref = torch.tensor([1.0, 0.0])
    r = gradient_bias_variance(est, ref)
    assert math.isclose(r.variance, 2.0)
    assert math.isclose(r.bias2_raw, 1.0)
    assert math.isclose(r.noise_floor, 1.0)           # variance / M
    assert math.isclose(r.bias2, 0.0, abs_tol=1e-12)
    assert math.isclose(r.rel_bias, 1.0)              # mean is twice the reference along it
    assert math.isclose(r.rel_std, math.sqrt(2.0))
    assert math.isclose(r.cosine, 1.0)
    assert r.n == 2
    # a separately computed mean with its own noise
    r2 = gradient_bias_variance(est, ref, mean=torch.tensor([1.0, 1.0]), mean_noise=0.25)
    assert math.isclose(r2.bias2, 0.75) and math.isclose(r2.mse, 2.75)
    assert math.isclose(r2.cosine, 1 / math.sqrt(2))


def test_gradient_bias_variance_is_unbiased_on_gaussians():
    # estimates ~ N(mu, diag(s^2)); known bias^2 = |mu - g|^2 and variance = sum s^2
    g = torch.Generator().manual_seed(5)
    P, M = 20, 400
    mu = torch.linspace(-1, 1, P, dtype=torch.float64)
    truth = mu + 0.05
    s = torch.linspace(0.5, 2.0, P, dtype=torch.float64)
    b2, var = [], []
    for _ in range(200):
        est = mu + s * torch.randn(M, P, generator=g, dtype=torch.float64)
        r = gradient_bias_variance(est, truth)
        b2.append(r.bias2)
        var.append(r.variance)
    assert abs(np.mean(var) - float((s ** 2).sum())) < 0.02 * float((s ** 2).sum())
    assert abs(np.mean(b2) - P * 0.05 ** 2) < 0.01   # raw |mean - ref|^2 would be ~0.2 too large


@pytest.mark.parametrize("args,kwargs,err", [
    ((torch.zeros(1, 3), torch.ones(3)), {}, ValueError),
    ((torch.zeros(4, 3), torch.ones(2)), {}, ValueError),
    ((torch.zeros(4, 3), torch.zeros(3)), {}, ValueError),
    ((torch.zeros(4, 3), torch.ones(3)), dict(mean=torch.zeros(3)), ValueError),
    ((torch.zeros(4, 3), torch.ones(3)), dict(mean_noise=0.1), ValueError),
    ((torch.zeros(4, 3), torch.ones(3)), dict(mean=torch.zeros(3), mean_noise=-1.0), ValueError),
    ((torch.zeros(4, 3, dtype=torch.int64), torch.ones(3)), {}, TypeError),
])
def test_gradient_bias_variance_validation(args, kwargs, err):
    with pytest.raises(err):
        gradient_bias_variance(*args, **kwargs)
