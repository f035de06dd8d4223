"""Tests of chapter 23's exercise checkers (rlkit/exercises/solutions/ch23.py).

The references are compared with independent computations: rlkit.llm.hierarchy.retry_success (the
closed form), a direct sum over attempts, and the carry correlation enumerated digit by digit with
plain Python; every registered mistake must be caught and reported with its own cause.
"""
import itertools

import torch

from rlkit.exercises import check, exercises, get, self_check
from rlkit.llm.hierarchy import retry_success

CH23 = ["expected_calls", "beta_retry_rate", "two_step_success"]


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
        # a call i + 1 happens when the first i were all rejected: probability (1 - p - f)^i
        direct = torch.tensor([sum((1 - a - b) ** i for i in range(n)) for a, b in zip(p.tolist(), f.tolist())],
                              dtype=torch.float64)
        assert torch.allclose(ref["expected_calls"](p, f, n), direct, atol=1e-12)
        # calls and success are tied: P_n = p E[calls] (each call is right and accepted with probability p)
        assert torch.allclose(p * ref["expected_calls"](p, f, n), retry_success(p, n, f), atol=1e-12)
    for a, b in [(1.0, 1.0), (2.0, 3.0), (0.7, 1.5)]:       # against a quadrature of 1 - (1 - p)^n over Beta(a, b)
        x = torch.linspace(0, 1, 400001, dtype=torch.float64)[1:-1]
        dens = torch.exp((a - 1) * torch.log(x) + (b - 1) * torch.log1p(-x) - (torch.lgamma(torch.tensor(a))
                         + torch.lgamma(torch.tensor(b)) - torch.lgamma(torch.tensor(a + b))).double())
        for n in (1, 4, 9):
            quad = torch.trapezoid((1 - (1 - x) ** n) * dens, x) / torch.trapezoid(dens, x)
            ta, tb = torch.tensor([a], dtype=torch.float64), torch.tensor([b], dtype=torch.float64)
            got = ref["beta_retry_rate"](ta, tb, n)
            assert abs(float(got) - float(quad)) < (2e-3 if a < 1 else 1e-5)
    one = torch.ones(1, dtype=torch.float64)
    for n in (1, 5, 99):                                     # uniform p: n / (n + 1)
        assert abs(float(ref["beta_retry_rate"](one, one, n)) - n / (n + 1)) < 1e-12
    for qc, qf in [(0.0, 1.0), (0.3, 0.9), (0.5, 0.5)]:
        total = 0.0
        for ua, ub, uc in itertools.product(range(10), repeat=3):
            c1 = ua + ub >= 10
            c2 = (ua + ub) % 10 + uc >= 10
            total += (qc if c1 else qf) * (qc if c2 else qf)
        assert abs(ref["two_step_success"](qc, qf).item() - total / 1000) < 1e-12
    assert abs(ref["two_step_success"](0.0, 1.0).item() - 0.22) < 1e-12


def test_the_displayed_retry_success_no_longer_solves_the_exercises():
    """The chapter calls retry_success(p, n, f) in a code cell; retry_rate and fooled_retry were that call."""
    def expected_calls(p, f, n):
        return retry_success(p, n, f) / p                    # P_n = p E[calls], but not where p = 0
    assert not check(expected_calls, verbose=False)

    def beta_retry_rate(a, b, n):
        return retry_success(a / (a + b), n)                 # the pooled formula on the mean problem
    result = check(beta_retry_rate, verbose=False)
    assert not result and "pooled the problems first" in result.message
