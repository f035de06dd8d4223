"""Tests of rlkit.offline (chapter 21): expectile, AWR and CQL terms against slow loops and hand
cases, and the OPE estimators against exact enumeration on a small contextual bandit."""
import itertools
import math

import pytest
import torch

from rlkit.offline import awr_weights, cql_penalty, expectile_loss, ope_dm, ope_dr, ope_is, ope_wis, sequence_log_ratios

F64 = torch.float64


def test_expectile_loss_hand_case_and_slow_loop():
    assert math.isclose(float(expectile_loss(torch.tensor([1.0, -2.0]), 0.7)), (0.7 * 1 + 0.3 * 4) / 2, rel_tol=1e-6)
    g = torch.Generator().manual_seed(0)
    u = torch.randn(5, 7, generator=g, dtype=F64)
    m = torch.rand(5, 7, generator=g) < 0.6
    slow = [abs(0.9 - (x < 0)) * x * x for x, k in zip(u.flatten().tolist(), m.flatten().tolist()) if k]
    assert math.isclose(float(expectile_loss(u, 0.9, m)), sum(slow) / len(slow), rel_tol=1e-12)
    u[~m] = float("nan")
    assert torch.isfinite(expectile_loss(u, 0.9, m))
    assert float(expectile_loss(u, 0.9, torch.zeros_like(m))) == 0.0
    assert float(expectile_loss(torch.zeros(0), 0.7)) == 0.0


def test_expectile_minimiser_is_the_expectile():
    x = torch.tensor([0.0, 0.0, 1.0, 3.0], dtype=F64)
    v = torch.zeros((), dtype=F64, requires_grad=True)
    opt = torch.optim.LBFGS([v], max_iter=200, tolerance_grad=1e-14, tolerance_change=1e-16)

    def closure():
        opt.zero_grad()
        loss = expectile_loss(x - v, 0.8)
        loss.backward()
        return loss
    opt.step(closure)
    # the 0.8-expectile solves 0.8 E(x - v)_+ = 0.2 E(v - x)_+; for v in [1, 3]: 0.8 (3 - v) = 0.2 (3v - 1)
    assert abs(float(v) - 2.6 / 1.4) < 1e-6 and float(v) > float(x.mean())


def test_awr_weights_clip_mask_and_limits():
    a = torch.tensor([-1.0, 0.0, 1.0, 50.0])
    w = awr_weights(a, beta=0.5)
    assert torch.allclose(w[:3], torch.exp(a[:3] / 0.5)) and float(w[3]) == pytest.approx(100.0)
    assert float(awr_weights(a, beta=1.0, max_weight=math.inf)[3]) == pytest.approx(math.exp(50.0), rel=1e-5)
    assert torch.allclose(awr_weights(a, beta=1e6), torch.ones(4), atol=1e-4)          # beta -> inf: BC
    m = torch.tensor([True, True, False, False])
    assert awr_weights(torch.tensor([0.0, 0.0, float("nan"), 1.0]), mask=m).tolist() == [1.0, 1.0, 0.0, 0.0]
    x = torch.tensor([1.0], requires_grad=True)
    assert not awr_weights(x).requires_grad
    with pytest.raises(ValueError, match="beta"):
        awr_weights(a, beta=0.0)
    with pytest.raises(ValueError, match="finite"):
        awr_weights(torch.tensor([float("nan")]))


def test_cql_penalty_slow_loop_hand_case_and_bc_identity():
    q = torch.log(torch.tensor([[1.0, 2.0, 1.0]]))
    assert math.isclose(float(cql_penalty(q, torch.tensor([1]))), math.log(2), rel_tol=1e-6)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(3, 4, 6, generator=g, dtype=F64)
    a = torch.randint(0, 6, (3, 4), generator=g)
    m = torch.rand(3, 4, generator=g) < 0.7
    vals = []
    for i, t in itertools.product(range(3), range(4)):
        if m[i, t]:
            vals.append(math.log(sum(math.exp(v) for v in q[i, t].tolist())) - float(q[i, t, a[i, t]]))
    assert math.isclose(float(cql_penalty(q, a, m)), sum(vals) / len(vals), rel_tol=1e-12)
    # with T = 1 the penalty is the cross-entropy of softmax(Q) on the logged action
    ce = torch.nn.functional.cross_entropy(q.reshape(-1, 6), a.reshape(-1), reduction="none").reshape(3, 4)
    assert math.isclose(float(cql_penalty(q, a, m)), float(ce[m].mean()), rel_tol=1e-12)
    assert float(cql_penalty(q, a, m)) >= 0
    # temperature: T logsumexp(Q / T) -> max as T -> 0
    assert math.isclose(float(cql_penalty(q, a, temperature=1e-4)), float((q.max(-1).values -
                        q.gather(-1, a[..., None]).squeeze(-1)).mean()), abs_tol=1e-3)
    q2 = q.clone()
    q2[~m] = float("nan")
    assert torch.isfinite(cql_penalty(q2, a, m))
    assert float(cql_penalty(q, a, torch.zeros_like(m))) == 0.0
    with pytest.raises(ValueError, match="actions"):
        cql_penalty(q, a[:, :2])


def test_sequence_log_ratios():
    lp = torch.log(torch.tensor([[0.5, 0.5, 0.3], [0.2, 0.9, 0.9]]))
    lq = torch.log(torch.tensor([[0.25, 1.0, 0.3], [0.4, 0.9, 0.1]]))
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    out = sequence_log_ratios(lp, lq, m)
    assert torch.allclose(out, torch.log(torch.tensor([0.5 / 0.25 * 0.5, 0.2 / 0.4 * 9.0])))
    bad = lp.clone()
    bad[0, 2] = float("nan")                    # padding may hold anything
    assert torch.allclose(sequence_log_ratios(bad, lq, m), out)
    with pytest.raises(ValueError):
        sequence_log_ratios(lp, lq[:, :2], m)


# ------------------------------------------------------------- OPE on an enumerable bandit

def _bandit():
    # 2 contexts (uniform), 3 actions; deterministic rewards r(x, a); behaviour mu, target pi
    r = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.2]], dtype=F64)
    mu = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.5, 0.3]], dtype=F64)
    pi = torch.tensor([[0.8, 0.1, 0.1], [0.1, 0.2, 0.7]], dtype=F64)
    rhat = torch.tensor([[0.6, 0.2, 0.2], [0.3, 0.6, 0.1]], dtype=F64)      # a wrong reward model
    return r, mu, pi, rhat


def _enumerate(n, estimator):
    """Exact expectation and variance of an estimator over every log of n draws (x uniform, a ~ mu)."""
    r, mu, pi, rhat = _bandit()
    cells = [(x, a) for x in range(2) for a in range(3)]
    mean = var2 = 0.0
    for log in itertools.product(cells, repeat=n):
        p = math.prod(0.5 * float(mu[x, a]) for x, a in log)
        xs = torch.tensor([x for x, _ in log])
        as_ = torch.tensor([a for _, a in log])
        lr = torch.log(pi[xs, as_] / mu[xs, as_])
        v = float(estimator(lr, r[xs, as_], rhat[xs, as_], (pi[xs] * rhat[xs]).sum(-1)))
        mean += p * v
        var2 += p * v * v
    return mean, var2 - mean * mean


def test_ope_estimators_exact_expectations_on_a_bandit():
    r, mu, pi, rhat = _bandit()
    truth = float(0.5 * (pi * r).sum())
    dm_value = float(0.5 * (pi * rhat).sum())
    m_is, v_is = _enumerate(2, lambda lr, rr, rh, tv: ope_is(lr, rr))
    m_wis, _ = _enumerate(2, lambda lr, rr, rh, tv: ope_wis(lr, rr))
    m_dm, v_dm = _enumerate(2, lambda lr, rr, rh, tv: ope_dm(tv))
    m_dr, v_dr = _enumerate(2, lambda lr, rr, rh, tv: ope_dr(lr, rr, rh, tv))
    assert abs(m_is - truth) < 1e-12                       # IS: unbiased
    assert abs(m_dr - truth) < 1e-12                       # DR: unbiased with a WRONG reward model
    assert abs(m_dm - dm_value) < 1e-12 and abs(m_dm - truth) > 0.05   # DM: biased by the model's error
    assert abs(m_wis - truth) > 1e-4                       # WIS: biased at finite n
    assert v_dr < v_is                                     # the residual is smaller than the reward here


def test_dr_with_exact_model_has_zero_variance():
    r, mu, pi, _ = _bandit()
    truth = float(0.5 * (pi * r).sum())

    def est(lr, rr, rh, tv):
        return ope_dr(lr, rr, rr, torch.full_like(rr, truth))
    m, v = _enumerate(2, est)
    assert abs(m - truth) < 1e-12 and v < 1e-20


def test_wis_and_sndr_are_scale_free_and_finite():
    lr = torch.tensor([500.0, 499.0, -math.inf])
    rr = torch.tensor([1.0, 0.0, 1.0])
    assert math.isclose(float(ope_wis(lr, rr)), 1 / (1 + math.exp(-1)), rel_tol=1e-6)
    assert float(ope_wis(torch.full((2,), -math.inf), rr[:2])) == 0.0
    out = ope_dr(lr, rr, torch.zeros(3), torch.zeros(3), self_normalise=True)
    assert math.isclose(float(out), 1 / (1 + math.exp(-1)), rel_tol=1e-6)
    for f in (lambda: ope_is(torch.zeros(0), torch.zeros(0)), lambda: ope_wis(torch.zeros(0), torch.zeros(0)),
              lambda: ope_dm(torch.zeros(0)),
              lambda: ope_dr(torch.zeros(0), torch.zeros(0), torch.zeros(0), torch.zeros(0))):
        assert float(f()) == 0.0
    with pytest.raises(ValueError, match="log_ratios"):
        ope_is(torch.tensor([float("nan")]), torch.tensor([1.0]))
    with pytest.raises(ValueError):
        ope_dr(lr, rr, torch.zeros(2), torch.zeros(3))
