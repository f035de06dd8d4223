"""Tests of chapter 19's exercise checkers (rlkit/exercises/solutions/ch19.py).

The references are compared with rlkit.dro's independent implementations (kl_dro, cvar,
group_dro_step, tv_dro); every registered mistake must be caught and reported with its own cause.
"""
import math

import torch

from rlkit.dro import cvar, group_dro_step, kl_dro, tv_dro
from rlkit.exercises import check, exercises, get, self_check

CH19 = ["kl_radius", "cvar_prompts", "group_dro_update", "tv_worst_case"]
D = torch.float64


def test_chapter_registers_its_exercises():
    assert sorted(e.name for e in exercises(chapter=19)) == sorted(CH19)


def test_references_against_the_library():
    ref = {n: get(n).reference for n in CH19}
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        v = torch.rand(6, generator=g, dtype=D)
        target = float(v.min() + 0.3 * (v.mean() - v.min()))
        delta, q = ref["kl_radius"](v, target)
        lib = kl_dro(v, float(delta))                      # the library's worst case at that radius is the target
        assert abs(lib.value - target) < 1e-7 and torch.allclose(q, lib.weights, atol=1e-6)
        for a in (0.1, 0.25, 0.5, 1.0):
            assert abs(float(ref["cvar_prompts"](v, a)) - cvar(v, a).value) < 1e-12
        q0 = torch.rand(6, generator=g, dtype=D)
        q0 = q0 / q0.sum()
        assert torch.allclose(ref["group_dro_update"](q0, v, 0.7), group_dro_step(q0, v, 0.7))
        p = torch.rand(6, generator=g, dtype=D)
        p[2] = 0.0
        p = p / p.sum()
        value, q = ref["tv_worst_case"](v, 0.3, p)
        assert abs(float(value) - tv_dro(v, 0.3, p).value) < 1e-12


def test_each_mistake_is_diagnosed_with_its_cause():
    for name in CH19:
        ex = get(name)
        assert len(ex.mistakes) >= 2, name
        for m in ex.mistakes:
            m.fn.__name__ = name
            res = check(m.fn, name=name, verbose=False)
            assert not res and m.cause in res.message, (name, m.cause, res.message)
        assert check(ex.reference, name=name, verbose=False)


def test_kl_radius_hand_cases_and_edges():
    ref = get("kl_radius").reference
    delta, q = ref(torch.tensor([0.0, 1.0], dtype=D), 0.25)
    assert math.isclose(float(delta), 0.75 * math.log(1.5) + 0.25 * math.log(0.5), rel_tol=1e-9)
    assert torch.allclose(q, torch.tensor([0.75, 0.25], dtype=D), atol=1e-9)
    v = torch.tensor([0.2, 0.9, 0.2, 0.7, 0.5, 0.2], dtype=D)
    delta, q = ref(v, 0.2)                                 # three minimisers: log(6 / 3)
    assert math.isclose(float(delta), math.log(2.0), rel_tol=1e-12) and float(q[[0, 2, 5]].sum()) == 1.0
    delta, q = ref(v, float(v.mean()) + 0.01)             # at or above the mean: no shift needed
    assert float(delta) == 0.0 and torch.allclose(q, torch.full_like(v, 1 / 6))
    radii = [float(ref(v, t)[0]) for t in (0.45, 0.4, 0.3, 0.25, 0.21)]
    assert all(a < b for a, b in zip(radii, radii[1:]))   # a lower target needs a larger ball
    assert radii[-1] < math.log(2.0)


def test_the_displayed_kl_dro_no_longer_solves_the_exercise():
    """The chapter shows rlkit.dro.kl_dro; the exercise used to be exactly that function through an adapter."""
    def kl_radius(values, target):
        r = kl_dro(values, target)
        return torch.tensor(r.value, dtype=values.dtype), r.weights
    assert not check(kl_radius, verbose=False)


def test_kl_radius_is_sound():
    assert self_check("kl_radius") == []
