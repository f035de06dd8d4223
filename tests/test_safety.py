"""Tests of rlkit.safety against independent computations.

Multipliers: hand-worked steps, torch.optim.Adam on a scalar parameter, the PID recursion written
out by hand, and the pure-integral PID against projected dual ascent. The exact optimum: a
brute-force grid over the simplex, the dual's minimum by a grid over lambda, and the envelope
theorem (the slope of the optimal value in the budget is lambda*) by finite differences.
"""
from __future__ import annotations

import math

import pytest
import torch

from rlkit.safety import (
    LagrangeMultiplier,
    PIDLagrangian,
    constrained_optimum,
    dual_function,
    lagrangian_advantages,
    lagrangian_dynamics,
    policy_values,
    tilted_policy,
)


def test_projected_dual_ascent_by_hand():
    m = LagrangeMultiplier(budget=0.1, lr=2.0, init=0.5)
    assert m.update(0.3) == pytest.approx(0.5 + 2.0 * 0.2)
    assert m.update(0.0) == pytest.approx(0.9 - 0.2)
    assert m.update(-1.0) == 0.0                      # projected onto lambda >= 0
    assert m.history[-1]["step"] == pytest.approx(-0.7)
    capped = LagrangeMultiplier(budget=0.0, lr=10.0, max_value=3.0)
    assert capped.update(1.0) == 3.0


def test_sgd_step_is_proportional_to_the_violation_and_adam_is_not():
    for v in (0.01, 1.0):
        sgd = LagrangeMultiplier(budget=0.0, lr=0.1, init=1.0)
        adam = LagrangeMultiplier(budget=0.0, lr=0.1, init=1.0, optimizer="adam")
        assert sgd.update(v) - 1.0 == pytest.approx(0.1 * v)
        assert adam.update(v) - 1.0 == pytest.approx(0.1, rel=1e-5)   # ~lr whatever the violation


def test_adam_matches_torch_adam_on_a_scalar():
    costs = [0.3, 0.25, 0.05, -0.2, 0.4, 0.0, 0.1]
    m = LagrangeMultiplier(budget=0.1, lr=0.05, init=0.2, optimizer="adam")
    lam = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([lam], lr=0.05, betas=(0.9, 0.999), eps=1e-8)
    for c in costs:
        ours = m.update(c)
        opt.zero_grad()
        (-lam * (c - 0.1)).backward()
        opt.step()
        with torch.no_grad():
            lam.clamp_(min=0.0)
        assert ours == pytest.approx(lam.item(), abs=1e-12)


def test_pid_pure_integral_is_projected_dual_ascent():
    costs = [0.5, 0.4, 0.0, 0.0, 0.0, 0.0, 0.3, -0.5, 0.2]
    a = LagrangeMultiplier(budget=0.1, lr=0.7, init=0.3)
    b = PIDLagrangian(budget=0.1, ki=0.7, init=0.3)
    for c in costs:
        assert a.update(c) == pytest.approx(b.update(c), abs=1e-12)


def test_pid_recursion_by_hand():
    kp, ki, kd, a, tau = 2.0, 0.5, 3.0, 0.5, 0.1
    pid = PIDLagrangian(budget=tau, kp=kp, ki=ki, kd=kd, ema=a)
    costs = [0.4, 0.2, 0.5, 0.0]
    integral, d_bar, c_bar = 0.0, None, None
    for c in costs:
        delta = c - tau
        integral = max(integral + delta, 0.0)
        d_bar = delta if d_bar is None else a * d_bar + (1 - a) * delta
        prev = c_bar
        c_bar = c if prev is None else a * prev + (1 - a) * c
        deriv = 0.0 if prev is None else max(c_bar - prev, 0.0)
        want = max(kp * d_bar + ki * integral + kd * deriv, 0.0)
        assert pid.update(c) == pytest.approx(want)


def test_multiplier_input_checks():
    with pytest.raises(ValueError, match="lr"):
        LagrangeMultiplier(0.1, lr=0.0)
    with pytest.raises(ValueError, match="optimizer"):
        LagrangeMultiplier(0.1, lr=0.1, optimizer="rmsprop")
    with pytest.raises(ValueError, match="init"):
        LagrangeMultiplier(0.1, lr=0.1, init=-1.0)
    with pytest.raises(ValueError, match="cost"):
        LagrangeMultiplier(0.1, lr=0.1).update(float("nan"))
    with pytest.raises(ValueError, match="at least one"):
        PIDLagrangian(0.1)
    with pytest.raises(ValueError, match="ki"):
        PIDLagrangian(0.1, kp=1.0, init=1.0)


def test_lagrangian_advantages():
    ar, ac = torch.tensor([[1.0, -2.0, float("nan")]]), torch.tensor([[0.5, 1.0, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    out = lagrangian_advantages(ar, ac, 2.0, mask)
    assert torch.allclose(out, torch.tensor([[0.0, -4.0 / 3.0, 0.0]]))
    assert torch.allclose(lagrangian_advantages(ar[:, :2], ac[:, :2], 2.0, scale="none"), torch.tensor([[0.0, -4.0]]))
    with pytest.raises(ValueError, match="adv_cost"):
        lagrangian_advantages(ar, ac[:, :2], 1.0)
    with pytest.raises(ValueError, match="lam"):
        lagrangian_advantages(ar, ac, -0.1)
    empty = torch.zeros(0, 3)
    assert lagrangian_advantages(empty, empty, 1.0).shape == (0, 3)


def _bandit():
    ref = torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.2, 0.3]], dtype=torch.float64)
    r = torch.tensor([[1.0, 0.0, 0.2], [1.0, 0.0, 0.5]], dtype=torch.float64)
    c = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 1.0]], dtype=torch.float64)
    w = torch.tensor([0.7, 0.3], dtype=torch.float64)
    return ref, r, c, w


def test_tilted_policy_by_hand_and_zero_support():
    ref, r, c, _ = _bandit()
    p = tilted_policy(ref, r, c, 0.5, 0.25)
    want = ref * torch.exp((r - 0.5 * c) / 0.25)
    assert torch.allclose(p, want / want.sum(-1, keepdim=True))
    ref0 = torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float64)
    p0 = tilted_policy(ref0, r[:1], c[:1], 0.0, 0.1)
    assert p0[0, 2] == 0.0 and torch.isfinite(p0).all()


def _brute_force(ref, r, c, w, tau, beta, n=80):
    """The best J_R - beta KL over a grid of the two 3-simplices, subject to J_C <= tau."""
    g = torch.linspace(0, 1, n + 1, dtype=torch.float64)
    a, b = torch.meshgrid(g, g, indexing="ij")
    keep = a + b <= 1
    pts = torch.stack([a[keep], b[keep], (1 - a - b)[keep].clamp_min(0)], -1)       # [M, 3]

    def parts(i):
        lp = torch.where(pts > 0, pts * (pts.clamp_min(1e-300).log() - ref[i].log()), torch.zeros_like(pts))
        return (pts * r[i]).sum(-1) - beta * lp.sum(-1), (pts * c[i]).sum(-1)

    (o0, c0), (o1, c1) = parts(0), parts(1)
    obj = w[0] * o0[:, None] + w[1] * o1[None, :]
    cost = w[0] * c0[:, None] + w[1] * c1[None, :]
    return float(obj.masked_fill(cost > tau, -math.inf).max())


@pytest.mark.parametrize("tau", [0.08, 0.2, 0.3])
def test_constrained_optimum_against_brute_force_and_the_dual(tau):
    ref, r, c, w = _bandit()
    beta = 0.2
    sol = constrained_optimum(ref, r, c, tau, beta, w)
    brute = _brute_force(ref, r, c, w, tau, beta)
    assert sol.cost <= tau + 1e-8
    assert sol.objective >= brute - 1e-9                      # no grid point beats it
    assert sol.objective - brute < 1e-2                       # and the grid gets close
    lams = torch.linspace(0, 10, 2001, dtype=torch.float64)
    duals = torch.tensor([dual_function(float(x), ref, r, c, tau, beta, w) for x in lams], dtype=torch.float64)
    assert sol.dual == pytest.approx(sol.objective, abs=1e-8)  # strong duality
    assert float(duals.min()) >= sol.objective - 1e-9         # weak duality everywhere
    assert abs(float(lams[duals.argmin()]) - sol.lam) < 1e-2


def test_slack_budget_gives_lambda_zero_and_envelope_slope():
    ref, r, c, w = _bandit()
    beta = 0.2
    free = constrained_optimum(ref, r, c, 1.0, beta, w)
    assert free.lam == 0.0
    p0 = tilted_policy(ref, r, c, 0.0, beta)
    assert torch.allclose(free.probs, p0)
    for tau in (0.1, 0.2):
        e = 1e-6
        lo, hi = constrained_optimum(ref, r, c, tau - e, beta, w), constrained_optimum(ref, r, c, tau + e, beta, w)
        mid = constrained_optimum(ref, r, c, tau, beta, w)
        assert (hi.objective - lo.objective) / (2 * e) == pytest.approx(mid.lam, rel=1e-4)


def test_infeasible_budget_and_bad_inputs():
    ref, r, c, w = _bandit()
    edge = constrained_optimum(ref, r, c, 0.0, 0.2, w)         # the least reachable cost: lambda* = inf
    assert edge.lam == math.inf and edge.cost == 0.0
    assert edge.objective == pytest.approx(_brute_force(ref, r, c, w, 1e-12, 0.2), abs=1e-2)
    near = constrained_optimum(ref, r, c, 1e-4, 0.2, w).objective        # continuous at the edge
    assert edge.objective <= near < edge.objective + 1e-3
    with pytest.raises(ValueError, match="infeasible"):
        constrained_optimum(ref, r, c.clamp_min(0.1), 0.05, 0.2, w)   # every response costs >= 0.1
    with pytest.raises(ValueError, match="ref_probs"):
        constrained_optimum(ref * 2, r, c, 0.2, 0.2, w)
    with pytest.raises(ValueError, match="weights"):
        constrained_optimum(ref, r, c, 0.2, 0.2, torch.tensor([0.5, 0.6], dtype=torch.float64))
    with pytest.raises(ValueError, match="beta"):
        tilted_policy(ref, r, c, 1.0, 0.0)


def test_policy_values_by_hand():
    ref, r, c, w = _bandit()
    v = policy_values(ref, ref, r, c, w)
    assert v["kl"] == pytest.approx(0.0, abs=1e-12)
    assert v["reward"] == pytest.approx(0.7 * (0.6 + 0.02) + 0.3 * (0.5 + 0.15))
    assert v["cost"] == pytest.approx(0.7 * 0.1 + 0.3 * 0.8)
    point = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    assert policy_values(point, ref, r, c, w)["kl"] == pytest.approx(0.7 * math.log(10) + 0.3 * math.log(2))


def test_dynamics_fixed_lambda_converges_to_the_tilted_policy_and_dual_ascent_to_lambda_star():
    ref, r, c, w = _bandit()
    beta, tau = 0.2, 0.2
    fixed = LagrangeMultiplier(budget=tau, lr=1e-12, init=0.7)          # lambda stays at 0.7
    out = lagrangian_dynamics(ref, r, c, fixed, beta, 2000, policy_lr=10.0, weights=w)
    want = policy_values(tilted_policy(ref, r, c, 0.7, beta), ref, r, c, w)
    assert out["cost"][-1].item() == pytest.approx(want["cost"], abs=2e-4)
    assert out["reward"][-1].item() == pytest.approx(want["reward"], abs=2e-4)
    sol = constrained_optimum(ref, r, c, tau, beta, w)
    pid = PIDLagrangian(budget=tau, kp=2.0, ki=0.5)
    out = lagrangian_dynamics(ref, r, c, pid, beta, 2000, policy_lr=5.0, weights=w)
    assert out["lam"][-1].item() == pytest.approx(sol.lam, abs=1e-3)
    assert out["cost"][-1].item() == pytest.approx(tau, abs=1e-5)
    with pytest.raises(TypeError, match="update"):
        lagrangian_dynamics(ref, r, c, 1.0, beta, 3, policy_lr=1.0)
