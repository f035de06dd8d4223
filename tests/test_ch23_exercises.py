"""Tests of chapter 23's exercise checkers (rlkit/exercises/solutions/ch23.py).

The references are compared with independent computations: rlkit.llm.hierarchy.retry_success (the
closed form), a direct sum over attempts, and the carry correlation enumerated digit by digit with
plain Python; every registered mistake must be caught and reported with its own cause.
"""
import itertools

import torch

from rlkit.exercises import check, exercises, get, self_check
from rlkit.llm.hierarchy import retry_success

CH23 = ["retry_rate", "fooled_retry", "two_step_success"]


def test_chapter_registers_three_exercises():
    assert sorted(e.name for e in exercises(chapter=23)) == sorted(CH23)


def test_every_mistake_is_caught_with_its_cause():
    for name in CH23:
        assert self_check(name) == []
        for m in get(name).mistakes:
            result = check(m.fn, name=name, verbose=False)
            assert not result and m.cause in result.message


def test_references_against_independent_computations():
    ref = {n: get(n).reference for n in CH23}
    g = torch.Generator().manual_seed(0)
    p = torch.rand(10, generator=g, dtype=torch.float64) * 0.6
    f = torch.rand(10, generator=g, dtype=torch.float64) * 0.4
    for n in (1, 3, 7):
        assert torch.allclose(ref["retry_rate"](p, n), retry_success(p, n).mean(), atol=1e-12)
        assert torch.allclose(ref["fooled_retry"](p, f, n), retry_success(p, n, f), atol=1e-12)
        direct = torch.tensor([sum((1 - a - b) ** (i - 1) * a for i in range(1, n + 1))
                               for a, b in zip(p.tolist(), f.tolist())], dtype=torch.float64)
        assert torch.allclose(ref["fooled_retry"](p, f, n), direct, atol=1e-12)
    for qc, qf in [(0.0, 1.0), (0.3, 0.9), (0.5, 0.5)]:
        total = 0.0
        for ua, ub, uc in itertools.product(range(10), repeat=3):
            c1 = ua + ub >= 10
            c2 = (ua + ub) % 10 + uc >= 10
            total += (qc if c1 else qf) * (qc if c2 else qf)
        assert abs(ref["two_step_success"](qc, qf).item() - total / 1000) < 1e-12
    assert abs(ref["two_step_success"](0.0, 1.0).item() - 0.22) < 1e-12
