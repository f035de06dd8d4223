"""Tests of rlkit.risk and of chapter 17's additions to rlkit.reward_models.

Every function is compared with an independent computation: hand-worked values, brute force
(the Rockafellar-Uryasev supremum on a grid, a grid search for the pinball minimiser),
autograd (the CVaR gradient, the Laplace Hessian), closed forms (a Bernoulli's CVaR, the
natural-gradient path as the KL-regularised family) and separately trained networks.
"""
import math

import numpy as np
import pytest
import torch

from rlkit.reward_models import (
    RewardEnsemble,
    RewardNet,
    bradley_terry_loss,
    ensemble_data,
    ensemble_disagreement,
    fit_bradley_terry,
    fit_ensemble_preferences,
    fit_reward_ensemble,
    flattery_bandit,
    kl_regularised_optimum,
    natural_policy_ascent,
    simulate_annotators,
    simulate_preferences,
    standardise_on_reference,
)
from rlkit.risk import (
    ENSEMBLE_RULES,
    cvar,
    cvar_from_quantiles,
    cvar_pg_weights,
    cvar_weights,
    downweighted_advantages,
    ensemble_aggregate,
    laplace_bt_covariance,
    linear_predictive_std,
    pinball_loss,
    quantile_levels,
    soft_bradley_terry_loss,
    value_at_risk,
)

D = torch.float64


# ----------------------------------------------------------------------------- ensemble rules

def test_ensemble_rules_hand_case_and_numpy():
    s = torch.tensor([[1.0, 0.0], [3.0, 0.0]], dtype=D)                # 2 members, 2 responses
    assert torch.allclose(ensemble_aggregate(s, "mean"), torch.tensor([2.0, 0.0], dtype=D))
    assert torch.allclose(ensemble_aggregate(s, "lcb", k=2.0), torch.tensor([0.0, 0.0], dtype=D))
    assert torch.allclose(ensemble_aggregate(s, "uwo", k=0.5), torch.tensor([1.5, 0.0], dtype=D))
    assert torch.allclose(ensemble_aggregate(s, "min"), torch.tensor([1.0, 0.0], dtype=D))
    soft = -math.log((math.exp(-1) + math.exp(-3)) / 2)
    assert torch.allclose(ensemble_aggregate(s, "softmin", tau=1.0), torch.tensor([soft, 0.0], dtype=D))
    x = torch.randn(5, 7, 3, dtype=D)
    a = x.numpy()
    assert np.allclose(ensemble_aggregate(x, "lcb", k=1.5, dim=1).numpy(), a.mean(1) - 1.5 * a.std(1))
    assert np.allclose(ensemble_aggregate(x, "uwo", k=0.3, dim=-2).numpy(), a.mean(1) - 0.3 * a.var(1))


def test_softmin_limits_and_bounds():
    x = torch.randn(6, 50, dtype=D)
    mean, mn, var = x.mean(0), x.amin(0), x.var(0, unbiased=False)
    big = ensemble_aggregate(x, "softmin", tau=1e3)
    assert torch.allclose(big, mean - var / 2e3, atol=1e-6)                 # uwo with k = 1 / (2 tau)
    assert torch.allclose(ensemble_aggregate(x, "softmin", tau=1e-4), mn, atol=1e-3)
    for tau in (0.1, 1.0, 10.0):
        s = ensemble_aggregate(x, "softmin", tau=tau)
        assert torch.all(s <= mean + 1e-12) and torch.all(s >= mn - 1e-12)
    # min >= mean - sqrt(K - 1) * sigma (population sigma)
    assert torch.all(mn >= ensemble_aggregate(x, "lcb", k=math.sqrt(5)) - 1e-12)


def test_single_member_and_checks():
    x = torch.randn(1, 4)
    for rule in ENSEMBLE_RULES:
        assert torch.allclose(ensemble_aggregate(x, rule), x[0], atol=1e-6)
    with pytest.raises(ValueError, match="rule"):
        ensemble_aggregate(x, "median")
    with pytest.raises(ValueError, match="scores"):
        ensemble_aggregate(torch.tensor([[float("nan")]]))
    with pytest.raises(ValueError, match="members"):
        ensemble_aggregate(torch.zeros(0, 3))
    assert ensemble_aggregate(torch.zeros(3, 0)).shape == (0,)


def test_downweighting_keeps_the_sign():
    a = torch.randn(100, dtype=D)
    s = torch.rand(100, dtype=D) * 5
    out = downweighted_advantages(a, s, 2.0)
    assert torch.equal(torch.sign(out), torch.sign(a)) and torch.all(out.abs() <= a.abs())
    assert torch.allclose(out, a / (1 + 2 * s))
    with pytest.raises(ValueError, match="sigma"):
        downweighted_advantages(a, -s, 1.0)
    with pytest.raises(ValueError, match="sigma"):
        downweighted_advantages(a, s[:5], 1.0)


# ----------------------------------------------------------------------------- quantiles

def test_quantile_levels():
    assert torch.allclose(quantile_levels(4), torch.tensor([0.125, 0.375, 0.625, 0.875]))


def test_pinball_minimiser_is_the_quantile():
    g = torch.Generator().manual_seed(0)
    y = torch.randn(401, generator=g, dtype=D)
    grid = torch.linspace(-3, 3, 1201, dtype=D)
    for tau in (0.1, 0.5, 0.8):
        losses = torch.stack([pinball_loss(torch.full((401, 1), float(c), dtype=D), y, torch.tensor([tau], dtype=D))
                              for c in grid])
        best = grid[losses.argmin()]
        assert abs(float(best) - float(torch.quantile(y, tau))) < 0.02, tau


def test_pinball_hand_huber_and_mask():
    q = torch.tensor([[0.0, 1.0]], dtype=D)
    y = torch.tensor([0.5], dtype=D)
    assert math.isclose(float(pinball_loss(q, y, torch.tensor([0.25, 0.75], dtype=D))), 0.125)
    # Huber version with kappa far beyond |u|: |tau - 1[u<0]| u^2 / (2 kappa)
    hub = pinball_loss(q, y, torch.tensor([0.25, 0.75], dtype=D), kappa=10.0)
    assert math.isclose(float(hub), (0.25 * 0.125 / 10 + 0.25 * 0.125 / 10) / 2)
    qq = torch.randn(4, 3, dtype=D)
    yy = torch.randn(4, dtype=D)
    yy[2] = float("nan")                                             # padding holds NaN
    m = torch.tensor([True, True, False, True])
    assert torch.allclose(pinball_loss(qq, yy, mask=m), pinball_loss(qq[m], yy[m]))
    assert float(pinball_loss(qq, yy, mask=torch.zeros(4, dtype=torch.bool))) == 0.0
    assert float(pinball_loss(torch.zeros(0, 3), torch.zeros(0))) == 0.0
    with pytest.raises(ValueError, match="taus"):
        pinball_loss(qq, yy, torch.tensor([0.0, 0.5, 1.0], dtype=D))


# ----------------------------------------------------------------------------- CVaR

def _ru_brute(x, w, alpha):
    # Rockafellar-Uryasev: sup over eta, attained at one of the values
    return max(float(e - (w * (e - x).clamp(min=0)).sum() / alpha) for e in x)


def test_cvar_against_rockafellar_uryasev_and_sorting():
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        n = int(torch.randint(1, 12, (1,), generator=g))
        x = torch.randint(0, 4, (n,), generator=g).to(D)              # ties
        w = torch.rand(n, generator=g, dtype=D) + 0.01
        w = w / w.sum()
        for alpha in (0.05, 0.2, 0.5, 0.9, 1.0):
            assert math.isclose(float(cvar(x, alpha, weights=w)), _ru_brute(x, w, alpha), abs_tol=1e-10)
            c = cvar_weights(x, alpha, weights=w)
            assert math.isclose(float(c.sum()), 1.0, abs_tol=1e-12) and torch.all(c <= w / alpha + 1e-12)
    y = torch.randn(10, dtype=D)
    assert math.isclose(float(cvar(y, 0.3)), float(y.sort().values[:3].mean()), abs_tol=1e-12)
    assert math.isclose(float(cvar(y, 1.0)), float(y.mean()), abs_tol=1e-12)


def test_cvar_of_a_bernoulli_and_weights_as_repeats():
    for p in (0.1, 0.5, 0.85, 0.95):
        x = torch.tensor([0.0, 1.0], dtype=D)
        w = torch.tensor([1 - p, p], dtype=D)
        for alpha in (0.1, 0.25):
            assert math.isclose(float(cvar(x, alpha, weights=w)), max(0.0, p - (1 - alpha)) / alpha, abs_tol=1e-12)
            assert float(value_at_risk(x, alpha, weights=w)) == (0.0 if 1 - p >= alpha else 1.0)
    x = torch.tensor([3.0, 1.0, 2.0], dtype=D)
    w = torch.tensor([2.0, 1.0, 1.0], dtype=D)                    # = samples [3, 3, 1, 2]
    rep = torch.tensor([3.0, 3.0, 1.0, 2.0], dtype=D)
    for alpha in (0.1, 0.4, 0.6, 1.0):
        assert math.isclose(float(cvar(x, alpha, weights=w)), float(cvar(rep, alpha)), abs_tol=1e-12)
        assert float(value_at_risk(x, alpha, weights=w)) == float(value_at_risk(rep, alpha))


def test_cvar_dims_and_checks():
    x = torch.randn(4, 6, 3, dtype=D)
    assert torch.allclose(cvar(x, 0.3, dim=1), torch.stack([cvar(x[:, :, j], 0.3) for j in range(3)], -1))
    assert cvar(torch.zeros(0, 5), 0.5).shape == (0,)
    with pytest.raises(ValueError, match="alpha"):
        cvar(x, 0.0)
    with pytest.raises(ValueError, match="values"):
        cvar(torch.tensor([1.0, float("nan")]), 0.5)
    with pytest.raises(ValueError, match="weights"):
        cvar(torch.ones(3), 0.5, weights=torch.zeros(3))


def test_cvar_from_quantiles_matches_atoms():
    q = torch.randn(5, 8, dtype=D)
    for alpha in (0.1, 0.25, 0.3, 1.0):
        assert torch.allclose(cvar_from_quantiles(q, alpha), cvar(q, alpha), atol=1e-12)


def test_cvar_gradient_is_exact_and_only_the_tail():
    g = torch.Generator().manual_seed(2)
    r = torch.randn(9, generator=g, dtype=D)
    theta = torch.randn(9, generator=g, dtype=D, requires_grad=True)
    for alpha in (0.1, 0.3, 0.7):
        theta.grad = None
        cvar(r, alpha, weights=torch.softmax(theta, -1)).backward()
        p = torch.softmax(theta, -1).detach()
        adv = cvar_pg_weights(r, alpha, weights=p)
        assert torch.allclose(theta.grad, p * (adv - (p * adv).sum()), atol=1e-12)
        q = value_at_risk(r, alpha, weights=p)
        assert torch.all(adv[r > q] == 0) and torch.all(adv <= 0)
        # finite differences of the exact CVaR
        eps = 1e-6
        fd = torch.stack([(cvar(r, alpha, weights=torch.softmax(theta.detach() + eps * e, -1))
                           - cvar(r, alpha, weights=torch.softmax(theta.detach() - eps * e, -1))) / (2 * eps)
                          for e in torch.eye(9, dtype=D)])
        assert torch.allclose(fd, theta.grad, atol=1e-6)


def test_cvar_pg_binary_has_no_gradient_and_given_var():
    x = torch.tensor([[0.0, 0.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0, 0.0]], dtype=D)
    adv = cvar_pg_weights(x, 0.25)
    assert torch.all(adv[0] == 0)                                      # fails 40% >= alpha: flat
    assert torch.allclose(adv[1], torch.tensor([0, 0, 0, 0, -4.0], dtype=D))
    given = cvar_pg_weights(x, 0.5, var=torch.tensor([0.5, 0.5], dtype=D))
    assert torch.allclose(given, torch.where(x <= 0.5, (x - 0.5) / 0.5, torch.zeros_like(x)))
    with pytest.raises(ValueError, match="var"):
        cvar_pg_weights(x, 0.5, var=torch.zeros(3, dtype=D))


# ----------------------------------------------------------------------------- preferences

def test_soft_bt_loss():
    g = torch.Generator().manual_seed(3)
    ra, rb = torch.randn(20, generator=g), torch.randn(20, generator=g)
    assert torch.allclose(soft_bradley_terry_loss(ra, rb, torch.ones(20)), bradley_terry_loss(ra, rb))
    assert torch.allclose(soft_bradley_terry_loss(ra, rb, torch.zeros(20)), bradley_terry_loss(rb, ra))
    p = torch.rand(20, generator=g)
    w = torch.rand(20, generator=g)
    per = torch.stack([soft_bradley_terry_loss(ra[i:i + 1], rb[i:i + 1], p[i:i + 1]) for i in range(20)])
    assert torch.allclose(soft_bradley_terry_loss(ra, rb, p, w), (w * per).sum() / w.sum())
    assert float(soft_bradley_terry_loss(ra, rb, p, torch.zeros(20))) == 0.0
    # minimum at d = logit(p), where the loss is the entropy of p
    d = torch.logit(p.double()).requires_grad_(True)
    loss = soft_bradley_terry_loss(d, torch.zeros_like(d), p.double())
    loss.backward()
    assert d.grad.abs().max() < 1e-12
    ent = -(p * p.log() + (1 - p) * (1 - p).log()).double().mean()
    assert math.isclose(float(loss.detach()), float(ent), rel_tol=1e-6)
    assert torch.isfinite(soft_bradley_terry_loss(ra * 100, rb * 100, p))
    with pytest.raises(ValueError, match="p_a"):
        soft_bradley_terry_loss(ra, rb, p + 1)


# ----------------------------------------------------------------------------- Laplace

def test_laplace_covariance_is_the_inverse_hessian():
    g = torch.Generator().manual_seed(4)
    pa, pb = torch.randn(30, 5, generator=g, dtype=D), torch.randn(30, 5, generator=g, dtype=D)
    w = torch.randn(5, generator=g, dtype=D)
    lab = torch.rand(30, generator=g, dtype=D)

    def nll(v):
        return 30 * soft_bradley_terry_loss(pa @ v, pb @ v, lab) + 0.5 * 2.0 * (v ** 2).sum()

    hess = torch.autograd.functional.hessian(nll, w)
    cov = laplace_bt_covariance(pa, pb, w, prior_precision=2.0, p_a=lab)
    assert torch.allclose(cov, torch.linalg.inv(hess), atol=1e-10)
    phi, c = torch.randn(7, 5, dtype=D), torch.randn(5, dtype=D)
    sd = linear_predictive_std(phi, cov, c)
    want = torch.stack([((phi[i] - c) @ cov @ (phi[i] - c)).sqrt() for i in range(7)])
    assert torch.allclose(sd, want)
    with pytest.raises(ValueError, match="p_a"):
        laplace_bt_covariance(pa, pb, w, p_a=lab[:3])


# ----------------------------------------------------------------------------- ensembles

def test_ensemble_members_are_reward_nets():
    ens = RewardEnsemble(5, 3, hidden=8, layers=2, seeds=[1, 2, 3])
    x = torch.rand(4, 6, 5)
    out = ens(x)
    assert out.shape == (3, 4, 6)
    for i, s in enumerate([1, 2, 3]):
        torch.manual_seed(s)
        net = RewardNet(5, hidden=8, layers=2)
        assert torch.allclose(out[i], net(x), atol=1e-6)
        assert torch.allclose(ens.member(i)(x), net(x), atol=1e-6)
    again = RewardEnsemble.from_nets([ens.member(2), ens.member(0)])
    assert torch.allclose(again(x), out[[2, 0]], atol=1e-6)
    assert ens.hidden_features(x).shape == (3, 4, 6, 8)
    with pytest.raises(ValueError, match="seeds"):
        RewardEnsemble(5, 3, seeds=[1, 2])


def test_fit_ensemble_equals_separate_fits():
    task = flattery_bandit(length=3)
    g = torch.Generator().manual_seed(5)
    a, b = task.sample(60, generator=g), task.sample(60, generator=g)
    win = simulate_preferences(task.true_reward[a], task.true_reward[b], 0.1, generator=g)
    c, r = torch.where(win, a, b), torch.where(win, b, a)
    torch.manual_seed(11)
    net = RewardNet(task.features.shape[-1], hidden=8)
    ens = RewardEnsemble.from_nets([net, net])
    fit_bradley_terry(net, task.features[c], task.features[r], epochs=25, lr=1e-2)
    perm = torch.randperm(60, generator=g)
    fit_ensemble_preferences(ens, task.features, torch.stack([c, c[perm]]), torch.stack([r, r[perm]]), epochs=25)
    # Bradley-Terry leaves the last bias unidentified (its gradient is rounding noise, which Adam amplifies to
    # steps of size lr), so compare the scores up to a constant
    def centred(x):
        return x - x.mean()

    want = centred(net(task.features))
    assert torch.allclose(centred(ens(task.features)[0]), want, atol=1e-4)
    assert torch.allclose(centred(ens(task.features)[1]), want, atol=1e-4)   # the order of the pairs is irrelevant


def test_soft_labels_and_weights_in_the_fit():
    task = flattery_bandit(length=3)
    g = torch.Generator().manual_seed(6)
    a, b = task.sample(40, generator=g), task.sample(40, generator=g)
    ens = RewardEnsemble(task.features.shape[-1], 2, hidden=8, seeds=[0, 0])
    p = torch.rand(40, generator=g)
    w = torch.ones(40)
    w[20:] = 0.0
    losses = fit_ensemble_preferences(ens, task.features, torch.stack([a, a[:20].repeat(2)]),
                                      torch.stack([b, b[:20].repeat(2)]), torch.stack([p, p[:20].repeat(2)]),
                                      torch.stack([w, torch.ones(40)]), epochs=2)
    # same start, so the first loss must agree: a zero weight removes the pair, a repeated pair counts twice
    want = soft_bradley_terry_loss(*RewardEnsemble(task.features.shape[-1], 1, hidden=8, seeds=[0])(
        task.features)[0][torch.stack([a[:20], b[:20]])], p[:20])
    assert torch.allclose(losses[0], torch.stack([want, want]).detach(), atol=1e-6)


def test_annotators_and_ensemble_data():
    r_a, r_b = torch.zeros(20000), torch.full((20000,), -1.0)
    v = simulate_annotators(r_a, r_b, 4, scale=1.0, generator=torch.Generator().manual_seed(0))
    assert v.dtype == torch.int64 and int(v.min()) >= 0 and int(v.max()) <= 4
    assert abs(float(v.float().mean()) / 4 - 1 / (1 + math.exp(-1))) < 0.01
    one = simulate_annotators(r_a[:50], r_b[:50], 1, generator=torch.Generator().manual_seed(1))
    ref = simulate_preferences(r_a[:50], r_b[:50], generator=torch.Generator().manual_seed(1))
    assert torch.equal(one, ref.long())
    task = flattery_bandit(length=3)
    for mode in ("init", "bootstrap", "both", "independent"):
        c, r, s = ensemble_data(task, 3, mode, n_pairs=50, generator=torch.Generator().manual_seed(2))
        assert c.shape == r.shape == (3, 50) and len(s) == 3
        same_rows = bool(torch.equal(c[0], c[1]))
        assert same_rows == (mode == "init"), mode
        assert (len(set(s)) == 1) == (mode == "bootstrap"), mode
    with pytest.raises(ValueError, match="diversity"):
        ensemble_data(task, 2, "dropout")


def test_fit_reward_ensemble_is_standardised():
    task = flattery_bandit(length=3)
    ens, px = fit_reward_ensemble(task, k=3, n_pairs=100, epochs=20, generator=torch.Generator().manual_seed(3))
    p = task.ref_logprobs.exp()
    assert px.shape == (3, task.true_reward.numel())
    assert torch.allclose((p * px).sum(-1), torch.zeros(3), atol=1e-5)
    assert torch.allclose((p * px ** 2).sum(-1), torch.ones(3), atol=1e-4)
    assert torch.allclose(standardise_on_reference(2 * px + 3, task.ref_logprobs), px, atol=1e-5)
    assert ens.pairs[0].shape == (3, 100)


def test_disagreement_is_population_std():
    x = torch.randn(4, 9, dtype=D)
    assert np.allclose(ensemble_disagreement(x).numpy(), x.numpy().std(0))
    assert torch.all(ensemble_disagreement(x[:1]) == 0)
    with pytest.raises(ValueError, match="scores"):
        ensemble_disagreement(torch.tensor([[float("inf")]]))


# ----------------------------------------------------------------------------- natural policy ascent

def test_natural_path_is_the_kl_family_and_weights_keep_the_fixed_point():
    task = flattery_bandit(length=3)
    ref = task.ref_logprobs.double()
    r = torch.randn(ref.numel(), generator=torch.Generator().manual_seed(7), dtype=D)
    lp, hist = natural_policy_ascent(ref, r, steps=20, lr=0.1)
    assert torch.allclose(lp, kl_regularised_optimum(ref, r, 1 / (0.1 * 20)), atol=1e-10)
    lp2, _ = natural_policy_ascent(ref, r, steps=20, lr=[0.1] * 20)
    assert torch.allclose(lp, lp2)
    w = torch.rand(ref.numel(), generator=torch.Generator().manual_seed(8), dtype=D) + 0.05
    fixed, _ = natural_policy_ascent(ref, r, w, beta=0.5, steps=2000, lr=1.0)
    assert torch.allclose(fixed.exp(), kl_regularised_optimum(ref, r, 0.5).exp(), atol=1e-8)
    assert hist["step"][-1] == 20 and len(hist["kl"]) == 21
    with pytest.raises(ValueError, match="weights"):
        natural_policy_ascent(ref, r, torch.zeros_like(r))
    with pytest.raises(ValueError, match="lr"):
        natural_policy_ascent(ref, r, steps=3, lr=[0.1, 0.1])
