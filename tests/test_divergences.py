"""Tests for rlkit.divergences: hand-worked values, Monte Carlo against exact KL, identities."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.divergences import entropy_categorical, kl_categorical, kl_k1, kl_k2, kl_k3, tv_categorical

torch.set_num_threads(1)
SET = settings(max_examples=40, deadline=None)
D64 = torch.float64


def np_probs(logits):
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


def loop_kl(p, q):
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q) if pi > 0)


def test_estimators_hand_worked():
    logp = torch.tensor([math.log(0.5)])
    logq = torch.tensor([math.log(0.25)])
    assert torch.allclose(kl_k1(logp, logq), torch.tensor([math.log(2.0)]))
    assert torch.allclose(kl_k2(logp, logq), torch.tensor([0.5 * math.log(2.0) ** 2]))
    # k3 = q/p - 1 - log(q/p) = 0.5 - 1 + log 2
    assert torch.allclose(kl_k3(logp, logq), torch.tensor([-0.5 + math.log(2.0)]))


@given(lp=st.floats(-50, 50), lq=st.floats(-50, 50))
@SET
def test_k3_nonnegative_and_finite(lp, lq):
    k3 = kl_k3(torch.tensor([lp], dtype=D64), torch.tensor([lq], dtype=D64))
    assert torch.isfinite(k3).all() and (k3 >= 0).all()
    k3f = kl_k3(torch.tensor([lp]), torch.tensor([lq]))
    assert torch.isfinite(k3f).all() and (k3f >= 0).all()


def test_monte_carlo_means_match_exact_kl():
    g = torch.Generator().manual_seed(0)
    lp_logits = torch.randn(6, generator=g, dtype=D64)
    lq_logits = lp_logits + 0.5 * torch.randn(6, generator=g, dtype=D64)
    p, q = np_probs(lp_logits.numpy()), np_probs(lq_logits.numpy())
    exact = loop_kl(p, q)
    n = 200_000
    x = torch.multinomial(torch.tensor(p), n, replacement=True, generator=g)
    logp = torch.log(torch.tensor(p))[x]
    logq = torch.log(torch.tensor(q))[x]
    for est in (kl_k1, kl_k3):
        vals = est(logp, logq)
        se = vals.std().item() / math.sqrt(n)
        assert abs(vals.mean().item() - exact) < 5 * se + 1e-12, est.__name__
    # exact function agrees with the loop
    assert abs(kl_categorical(lp_logits, lq_logits).item() - exact) < 1e-12
    # k3 has lower variance than k1 when q is close to p (the reason it is used)
    assert kl_k3(logp, logq).var() < kl_k1(logp, logq).var()


def test_k2_gradient_is_kl_gradient_in_expectation():
    # policy p_theta = softmax(theta); samples held fixed; mean of grad k2 -> grad KL exactly
    # when the sample average is replaced by the exact expectation under p.
    g = torch.Generator().manual_seed(1)
    theta = torch.randn(5, generator=g, dtype=D64, requires_grad=True)
    lq = torch.log_softmax(torch.randn(5, generator=g, dtype=D64), -1)
    lp = torch.log_softmax(theta, -1)
    p = lp.exp().detach()
    surrogate = (p * kl_k2(lp, lq)).sum()          # E_p[k2] with p's weights frozen
    (g_k2,) = torch.autograd.grad(surrogate, theta)
    (g_kl,) = torch.autograd.grad(kl_categorical(theta, lq), theta)
    assert torch.allclose(g_k2, g_kl, atol=1e-12)


@given(A=st.integers(1, 8), seed=st.integers(0, 10_000))
@SET
def test_categorical_vs_loops(A, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(3, A, generator=g, dtype=D64) * 3
    b = torch.randn(3, A, generator=g, dtype=D64) * 3
    kl = kl_categorical(a, b)
    tv = tv_categorical(a, b)
    h = entropy_categorical(a)
    for i in range(3):
        p, q = np_probs(a[i].numpy()), np_probs(b[i].numpy())
        assert abs(kl[i].item() - loop_kl(p, q)) < 1e-9
        assert abs(tv[i].item() - 0.5 * sum(abs(x - y) for x, y in zip(p, q))) < 1e-12
        assert abs(h[i].item() + sum(x * math.log(x) for x in p if x > 0)) < 1e-9
    # identities: KL >= 0, KL(p,p) = 0, 0 <= TV <= 1, Pinsker TV <= sqrt(KL/2)
    assert (kl >= -1e-12).all()
    assert torch.allclose(kl_categorical(a, a), torch.zeros(3, dtype=D64), atol=1e-12)
    assert ((tv >= 0) & (tv <= 1)).all()
    assert (tv <= torch.sqrt(kl / 2) + 1e-9).all()
    assert (h <= math.log(A) + 1e-9).all()


def test_masked_vocabulary_no_nan():
    ninf = float("-inf")
    a = torch.tensor([[0.0, 1.0, ninf], [ninf, 0.0, 0.0]], dtype=D64, requires_grad=True)
    b = torch.tensor([[0.5, 0.0, ninf], [0.0, 0.0, 0.0]], dtype=D64, requires_grad=True)
    kl = kl_categorical(a, b)
    h = entropy_categorical(a)
    tv = tv_categorical(a, b)
    assert torch.isfinite(kl).all() and torch.isfinite(h).all() and torch.isfinite(tv).all()
    (kl.sum() + h.sum() + tv.sum()).backward()
    assert not torch.isnan(a.grad).any() and not torch.isnan(b.grad).any()
    p = np_probs([0.0, 1.0, ninf])
    assert abs(h[0].item() + sum(x * math.log(x) for x in p if x > 0)) < 1e-12
    assert abs(entropy_categorical(torch.zeros(4)).item() - math.log(4)) < 1e-6
    # q assigns zero mass where p does not: KL is +inf, not NaN
    inf_kl = kl_categorical(torch.tensor([0.0, 0.0]), torch.tensor([0.0, ninf]))
    assert torch.isinf(inf_kl) and inf_kl > 0


def test_extreme_log_ratios_finite_with_grads():
    lp = torch.tensor([50.0, -50.0, 0.0, 3.0], requires_grad=True)
    lq = torch.tensor([-50.0 + 50.0, 0.0, 50.0, -50.0], requires_grad=True)
    for est in (kl_k1, kl_k2, kl_k3):
        v = est(lp, lq)
        assert torch.isfinite(v).all()
        (gp, gq) = torch.autograd.grad(v.sum(), (lp, lq))
        assert torch.isfinite(gp).all() and torch.isfinite(gq).all()


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(3)
    lp = torch.randn(4, generator=g, dtype=D64, requires_grad=True)
    lq = torch.randn(4, generator=g, dtype=D64, requires_grad=True)
    for est in (kl_k1, kl_k2, kl_k3):
        assert torch.autograd.gradcheck(est, (lp, lq))
    a = torch.randn(2, 5, generator=g, dtype=D64, requires_grad=True)
    b = torch.randn(2, 5, generator=g, dtype=D64, requires_grad=True)
    assert torch.autograd.gradcheck(kl_categorical, (a, b))
    assert torch.autograd.gradcheck(entropy_categorical, (a,))


def test_validation_names_arguments():
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="logq"):
        kl_k3(x, torch.zeros(4))
    with pytest.raises(TypeError, match="logp"):
        kl_k1(torch.zeros(3, dtype=torch.int64), x)
    with pytest.raises(TypeError, match="logq"):
        kl_k2(x, [0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="logits_q"):
        kl_categorical(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="logits_q"):
        tv_categorical(torch.zeros(2, 3), torch.zeros(2, 3, dtype=D64))
    with pytest.raises(ValueError, match="logits"):
        entropy_categorical(torch.tensor(1.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_estimators_finite_at_plus_minus_50_values_and_gradients(dtype):
    lp = torch.tensor([-50.0, 50.0, 0.0, -50.0, 39.0], dtype=dtype, requires_grad=True)
    lq = torch.tensor([50.0, -50.0, 0.0, 39.0, -50.0], dtype=dtype, requires_grad=True)
    for est in (kl_k1, kl_k2, kl_k3):
        v = est(lp, lq)
        assert torch.isfinite(v).all() and v.dtype == dtype, est.__name__
        gp, gq = torch.autograd.grad(v.float().sum(), (lp, lq))
        assert torch.isfinite(gp).all() and torch.isfinite(gq).all(), est.__name__
    assert (kl_k3(lp, lq) >= 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_k3_saturates_above_the_dtype_range_and_is_exact_below(dtype):
    lim = math.log(torch.finfo(dtype).max) - 1.0
    ells = [0.5 * lim, lim, lim + 1.0, 2 * lim]
    got = kl_k3(torch.zeros(4, dtype=dtype), torch.tensor(ells, dtype=dtype))
    want = [math.expm1(min(x, lim)) - min(x, lim) for x in ells]
    assert torch.allclose(got.double(), torch.tensor(want, dtype=D64), rtol=1e-2)
    assert got[2] == got[1] and got[3] == got[1]


def test_categorical_edges():
    with pytest.raises(ValueError, match="logits_p"):
        kl_categorical(torch.zeros(3, 0), torch.zeros(3, 0))
    with pytest.raises(ValueError, match="logits_p"):
        tv_categorical(torch.zeros(0), torch.zeros(0))
    with pytest.raises(ValueError, match="logits"):
        entropy_categorical(torch.zeros(2, 0))
    for fn in (kl_categorical, tv_categorical):
        assert fn(torch.zeros(0, 4), torch.zeros(0, 4)).shape == (0,)
    assert entropy_categorical(torch.zeros(0, 3, 4)).shape == (0, 3)
    assert kl_k3(torch.zeros(0, 3), torch.zeros(0, 3)).shape == (0, 3)
