"""Tests of chapter 24's exercise checkers (rlkit/exercises/solutions/ch24.py).

The references are compared with independent computations: the multiplier steps against
rlkit.safety.LagrangeMultiplier (projected SGD) and a hand-worked case; the pessimistic reward against
a slow loop over judges; the Lagrangian advantage against rlkit.safety.lagrangian_advantages.
Every registered mistake must be caught with its own cause.
"""
import math

import pytest
import torch

from rlkit.exercises import exercises, get, self_check
from rlkit.safety import LagrangeMultiplier, lagrangian_advantages

torch.set_num_threads(1)
CH24 = ["lagrange_update", "lagrangian_advantage", "pessimistic_reward"]
F64 = torch.float64


def test_chapter_registers_three_exercises():
    assert sorted(e.name for e in exercises(chapter=24)) == CH24


@pytest.mark.parametrize("name", CH24)
def test_every_mistake_is_caught_and_diagnosed(name):
    assert self_check(name) == []


def test_lagrange_update_by_hand_and_against_the_library():
    ref = get("lagrange_update").reference
    out = ref(0.0, torch.tensor([0.2, 0.2, 0.0, 0.0, 0.0], dtype=F64), 0.1, 2.0)
    assert torch.allclose(out, torch.tensor([0.2, 0.4, 0.2, 0.0, 0.0], dtype=F64), atol=1e-12)
    costs = torch.tensor([0.3, 0.01, 0.5, 0.0, 0.0, 0.2], dtype=F64)
    m = LagrangeMultiplier(budget=0.1, lr=1.5, init=0.25)
    want = [m.update(float(c)) for c in costs]
    assert torch.allclose(ref(0.25, costs, 0.1, 1.5), torch.tensor(want, dtype=F64), atol=1e-12)


def test_pessimistic_reward_against_a_loop():
    ref = get("pessimistic_reward").reference
    g = torch.Generator().manual_seed(0)
    s = torch.rand(4, 6, generator=g, dtype=F64)
    got = ref(s, 0.7)
    for n in range(6):
        col = [float(s[k, n]) for k in range(4)]
        mu = sum(col) / 4
        sd = math.sqrt(sum((x - mu) ** 2 for x in col) / 4)
        assert math.isclose(float(got[n]), mu - 0.7 * sd, abs_tol=1e-12)
    # the empty answer of pitfall 3: only one of three judges accepts it
    assert math.isclose(float(ref(torch.tensor([[1.0], [0.0], [0.0]], dtype=F64), 1.0)[0]),
                        1 / 3 - math.sqrt(2) / 3, abs_tol=1e-12)


def test_lagrangian_advantage_matches_the_library():
    ref = get("lagrangian_advantage").reference
    g = torch.Generator().manual_seed(1)
    a, c = torch.randn(3, 5, generator=g, dtype=F64), torch.randn(3, 5, generator=g, dtype=F64)
    assert torch.allclose(ref(a, c, 2.5), lagrangian_advantages(a, c, 2.5), atol=1e-12)
