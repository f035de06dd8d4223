"""Tests of chapter 17's exercise checkers (rlkit/exercises/solutions/ch17.py).

The references are compared with rlkit.risk's independent implementations and with hand-worked
values; every registered mistake must be caught and reported with its own cause.
"""
import math

import torch

from rlkit.exercises import check, exercises, get, self_check
from rlkit.risk import cvar, cvar_pg_weights, pinball_loss, soft_bradley_terry_loss

CH17 = ["cvar_of_samples", "entropic_advantages", "pinball", "soft_bt_loss"]


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
    ra, rb = torch.randn(7, generator=g, dtype=torch.float64), torch.randn(7, generator=g, dtype=torch.float64)
    p = torch.rand(7, generator=g, dtype=torch.float64)
    assert torch.allclose(ref["soft_bt_loss"](ra, rb, p), soft_bradley_terry_loss(ra, rb, p))
    one = ref["soft_bt_loss"](torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([0.6]))
    assert math.isclose(float(one), 0.6 * math.log1p(math.exp(-1)) + 0.4 * math.log1p(math.e), rel_tol=1e-6)


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
        x = torch.randint(0, 4, (4, 9), generator=g).double() / 3 + 2.0 * torch.rand(4, 1, generator=g, dtype=torch.float64)
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
