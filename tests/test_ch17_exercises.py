"""Tests of chapter 17's exercise checkers (rlkit/exercises/solutions/ch17.py).

The references are compared with rlkit.risk's independent implementations and with hand-worked
values; every registered mistake must be caught and reported with its own cause.
"""
import math

import torch

from rlkit.exercises import check, exercises, get
from rlkit.risk import cvar, cvar_pg_weights, pinball_loss, soft_bradley_terry_loss

CH17 = ["cvar_of_samples", "cvar_advantages", "pinball", "soft_bt_loss"]


def test_chapter_registers_four_exercises():
    assert sorted(e.name for e in exercises(chapter=17)) == sorted(CH17)


def test_references_against_the_library_and_hand_values():
    ref = {n: get(n).reference for n in CH17}
    g = torch.Generator().manual_seed(0)
    for alpha in (0.1, 0.25, 0.3, 0.5, 1.0):
        x = torch.randint(0, 4, (5, 9), generator=g).double() / 3        # many ties
        assert torch.allclose(ref["cvar_of_samples"](x, alpha), cvar(x, alpha), atol=1e-12)
        assert torch.allclose(ref["cvar_advantages"](x, alpha), cvar_pg_weights(x, alpha), atol=1e-12)
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
