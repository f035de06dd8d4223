"""Tests of chapter 22's exercise checkers (rlkit/exercises/solutions/ch22.py).

The references are compared with the library (rlkit.llm.explore) and with brute-force enumeration
and hand values; every registered mistake must be caught and reported with its own cause.
"""
import itertools
import math

import torch

from rlkit.exercises import check, exercises, get
from rlkit.llm.explore import RunningMeanStd, group_diversity_bonus, pass_at_k

CH22 = ["pass_at_k_estimate", "diversity_bonus", "normalize_intrinsic"]


def test_chapter_registers_three_exercises():
    assert sorted(e.name for e in exercises(chapter=22)) == sorted(CH22)


def test_pass_at_k_reference_against_library_and_enumeration():
    ref = get("pass_at_k_estimate").reference
    n = torch.tensor([6, 6, 6, 9, 12])
    c = torch.tensor([0, 2, 5, 4, 12])
    for k in (1, 2, 4, 6):
        assert torch.allclose(ref(n, c, k), pass_at_k(n, c, k), atol=1e-12)
    flags = [1, 0, 0, 1, 0, 0]
    subsets = list(itertools.combinations(range(6), 3))
    brute = sum(any(flags[i] for i in s) for s in subsets) / len(subsets)
    assert math.isclose(float(ref(torch.tensor([6]), torch.tensor([2]), 3)[0]), brute)


def test_diversity_reference_against_library():
    ref = get("diversity_bonus").reference
    resp = ["a", "a", "b", "c", "x", "x", "x", "y"]
    corr = torch.tensor([1, 1, 1, 0, 1, 0, 1, 1])
    assert torch.allclose(ref(resp, corr, 4), group_diversity_bonus(resp, corr, 4))
    assert torch.allclose(ref(resp, corr, 2), group_diversity_bonus(resp, corr, 2))


def test_normalize_reference_against_running_mean_std():
    ref = get("normalize_intrinsic").reference
    g = torch.Generator().manual_seed(0)
    raw = torch.rand(5, 7, generator=g, dtype=torch.float64) * 3
    rms = RunningMeanStd()
    want = []
    for s in range(5):
        rms.update(raw[s])
        want.append(raw[s] / rms.std)
    assert torch.allclose(ref(raw), torch.stack(want), atol=1e-12)
    hand = ref(torch.tensor([[1.0, 3.0], [2.0, 2.0]], dtype=torch.float64))
    assert torch.allclose(hand, torch.tensor([[1.0, 3.0], [2 / math.sqrt(0.5)] * 2], dtype=torch.float64), atol=1e-6)


def test_each_mistake_is_diagnosed_with_its_cause():
    for name in CH22:
        ex = get(name)
        assert len(ex.mistakes) >= 3, name
        for m in ex.mistakes:
            m.fn.__name__ = name
            res = check(m.fn, name=name, verbose=False)
            assert not res and m.cause in res.message, (name, m.cause, res.message)
        assert check(ex.reference, name=name, verbose=False)
