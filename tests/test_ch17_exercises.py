"""Tests of chapter 17's exercise checkers (rlkit/exercises/solutions/ch17.py).

The references are compared with rlkit.risk's independent implementations and with hand-worked
values; every registered mistake must be caught and reported with its own cause.
"""
import math

import torch

from rlkit.exercises import check, exercises, get, self_check
from rlkit.risk import cvar, cvar_pg_weights, pinball_loss, soft_bradley_terry_loss

CH17 = ["cvar_of_samples", "entropic_advantages", "pinball", "bt_pair_grads"]


def test_chapter_registers_four_exercises():
    assert sorted(e.name for e in exercises(chapter=17)) == sorted(CH17)


def test_references_against_the_library_and_hand_values():
    ref = {n: get(n).reference for n in CH17}
    g = torch.Generator().manual_seed(0)
    for alpha in (0.1, 0.25, 0.3, 0.5, 1.0):
        x = torch.randint(0, 4, (5, 9), generator=g).double() / 3        # many ties
        assert torch.allclose(ref["cvar_of_samples"](x, alpha), cvar(x, alpha), atol=1e-12)
    hand = ref["cvar_of_samples"](torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=torch.float64), 0.5)
    assert torch.allclose(hand, torch.tensor([1.5], dtype=torch.float64))
    q, y = torch.randn(6, 4, generator=g, dtype=torch.float64), torch.randn(6, generator=g, dtype=torch.float64)
    taus = torch.tensor([0.1, 0.3, 0.6, 0.9], dtype=torch.float64)
    assert torch.allclose(ref["pinball"](q, y, taus), pinball_loss(q, y, taus))


def test_each_mistake_is_diagnosed_with_its_cause():
    for name in CH17:
        ex = get(name)
        assert len(ex.mistakes) >= 3, name
        for m in ex.mistakes:
            m.fn.__name__ = name
            res = check(m.fn, name=name, verbose=False)
            assert not res and m.cause in res.message, (name, m.cause, res.message)
        assert check(ex.reference, name=name, verbose=False)


def _entropic_loop(rewards, tau):
    """tau (1 - e^(-R/tau) / Z) by a plain loop in Python floats, the row's minimum factored out."""
    out = torch.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        row = [float(r) for r in rewards[b]]
        lo = min(row)
        e = [math.exp(-(r - lo) / tau) for r in row]
        z = sum(e) / len(e)
        for i, ei in enumerate(e):
            out[b, i] = tau * (1 - ei / z)
    return out


def test_entropic_advantages_against_a_loop_a_hand_case_and_the_limits():
    ref = get("entropic_advantages").reference
    g = torch.Generator().manual_seed(5)
    for tau in (0.01, 0.3, 1.0, 7.0):
        x = torch.randint(0, 4, (4, 9), generator=g).double() / 3
        x = x + 2.0 * torch.rand(4, 1, generator=g, dtype=torch.float64)
        assert torch.allclose(ref(x, tau), _entropic_loop(x, tau), atol=1e-12)
    hand = ref(torch.tensor([[0.0, 1.0]], dtype=torch.float64), 1.0)
    a = (1 - math.exp(-1)) / (1 + math.exp(-1))
    assert torch.allclose(hand, torch.tensor([[-a, a]], dtype=torch.float64), atol=1e-12)
    x = torch.rand(3, 6, generator=g, dtype=torch.float64)
    assert torch.allclose(ref(x, 1e4), x - x.mean(-1, keepdim=True), atol=1e-4)   # tau -> infinity: R - mean R
    assert torch.allclose(ref(x, 0.5).mean(-1), torch.zeros(3, dtype=torch.float64), atol=1e-12)
    tiny = ref(2.0 + x, 1e-3)                                                        # e^(-R/tau) underflows
    assert torch.isfinite(tiny).all()
    # the CVaR gradient is flat on a binary prompt that fails half the time (eq-ch17-cvar-binary); this is not
    half = torch.tensor([[0.0, 0.0, 1.0, 1.0]], dtype=torch.float64)
    assert torch.equal(cvar_pg_weights(half, 0.25), torch.zeros_like(half))
    assert (ref(half, 1.0).abs() > 0.4).all()


def test_the_displayed_cvar_gradient_no_longer_solves_the_exercise():
    """The chapter shows rlkit.risk.cvar_pg_weights; the exercise used to be exactly that function."""
    def entropic_advantages(rewards, tau):
        return cvar_pg_weights(rewards, tau)
    assert not check(entropic_advantages, verbose=False)

    def entropic_advantages(rewards, tau):                    # noqa: F811  (the softmin of ensemble_aggregate)
        from rlkit.risk import ensemble_aggregate
        return rewards - ensemble_aggregate(rewards, "softmin", tau=tau, dim=-1)[..., None]
    assert not check(entropic_advantages, verbose=False)


def test_entropic_advantages_is_sound():
    assert self_check("entropic_advantages") == []


def test_bt_pair_grads_against_autograd_of_each_reading():
    ref = get("bt_pair_grads").reference
    g = torch.Generator().manual_seed(17)
    d0 = torch.randn(9, generator=g, dtype=torch.float64) * 3
    p = torch.tensor([0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 0.6, 0.2, 1.0], dtype=torch.float64)
    y = (p > 0.5).double()
    sp = torch.nn.functional.softplus

    def grad(loss_of_d):
        d = d0.clone().requires_grad_()
        return torch.autograd.grad(loss_of_d(d).sum(), d)[0]

    soft = grad(lambda d: p * sp(-d) + (1 - p) * sp(d))
    assert torch.allclose(ref(d0, p, "soft"), soft, atol=1e-12)
    lib = len(d0) * grad(lambda d: soft_bradley_terry_loss(d, torch.zeros_like(d), p))
    assert torch.allclose(ref(d0, p, "soft"), lib, atol=1e-12)
    wm = grad(lambda d: (2 * p - 1).abs() * (y * sp(-d) + (1 - y) * sp(d)))
    assert torch.allclose(ref(d0, p, "weighted_majority"), wm, atol=1e-12)
    mc = grad(lambda d: (torch.sigmoid(d) - 0.5).abs().detach() * (y * sp(-d) + (1 - y) * sp(d)))
    assert torch.allclose(ref(d0, p, "model_confidence"), mc, atol=1e-12)
    # the model's own confidence pushes a confidently WRONG pair hardest and a near-tie not at all
    m = ref(torch.tensor([-6.0, 0.0, 6.0], dtype=torch.float64), torch.ones(3, dtype=torch.float64), "model_confidence")
    assert m[0] < -0.49 and m[1] == 0 and abs(float(m[2])) < 0.002
    one = ref(torch.tensor([1.0], dtype=torch.float64), torch.tensor([0.6], dtype=torch.float64), "soft")
    assert math.isclose(float(one), 1 / (1 + math.exp(-1)) - 0.6, rel_tol=1e-12)


def test_the_displayed_soft_bradley_terry_loss_no_longer_solves_the_exercise():
    """The chapter shows rlkit.risk.soft_bradley_terry_loss; the exercise used to be exactly that function."""
    def bt_pair_grads(margins, p_a, rule):
        d = margins.clone().requires_grad_()
        loss = soft_bradley_terry_loss(d, torch.zeros_like(d), p_a)
        return torch.autograd.grad(loss, d)[0] * len(margins)
    assert not check(bt_pair_grads, verbose=False)


def test_bt_pair_grads_is_sound():
    assert self_check("bt_pair_grads") == []
