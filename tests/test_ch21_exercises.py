"""Tests of chapter 21's exercise checkers (rlkit/exercises/solutions/ch21.py).

The references are compared with the library's independent implementations (rlkit.offline) and
hand-worked values; every registered mistake must be caught and reported with its own cause.
"""
import math

import torch

from rlkit.exercises import check, exercises, get
from rlkit.offline import cql_penalty, expectile_loss, ope_dr

CH21 = ["expectile_loss", "cql_term", "doubly_robust"]


def test_chapter_registers_three_exercises():
    assert sorted(e.name for e in exercises(chapter=21)) == sorted(CH21)


def test_references_against_the_library_and_hand_values():
    ref = {n: get(n).reference for n in CH21}
    g = torch.Generator().manual_seed(0)
    u = torch.randn(3, 5, generator=g, dtype=torch.float64)
    m = torch.rand(3, 5, generator=g) < 0.6
    assert torch.allclose(ref["expectile_loss"](u, 0.8, m), expectile_loss(u, 0.8, m))
    assert math.isclose(float(ref["expectile_loss"](torch.tensor([1.0, -2.0]), 0.7, torch.tensor([True, True]))),
                        0.95, rel_tol=1e-6)
    q = torch.randn(3, 5, 7, generator=g, dtype=torch.float64)
    a = torch.randint(0, 7, (3, 5), generator=g)
    assert torch.allclose(ref["cql_term"](q, a, m), cql_penalty(q, a, m))
    lr, r = torch.randn(9, generator=g, dtype=torch.float64), torch.rand(9, generator=g, dtype=torch.float64)
    rh, v = torch.rand(9, generator=g, dtype=torch.float64), torch.rand(9, generator=g, dtype=torch.float64)
    assert torch.allclose(ref["doubly_robust"](lr, r, rh, v), ope_dr(lr, r, rh, v))
    hand = ref["doubly_robust"](torch.log(torch.tensor([2.0, 0.5])), torch.tensor([1.0, 0.0]),
                                torch.tensor([0.5, 0.5]), torch.tensor([0.6, 0.4]))
    assert math.isclose(float(hand), 0.875, rel_tol=1e-6)


def test_each_mistake_is_diagnosed_with_its_cause():
    for name in CH21:
        ex = get(name)
        assert len(ex.mistakes) >= 3, name
        for m in ex.mistakes:
            m.fn.__name__ = name
            res = check(m.fn, name=name, verbose=False)
            assert not res and m.cause in res.message, (name, m.cause, res.message)
        assert check(ex.reference, name=name, verbose=False)
