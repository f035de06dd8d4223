"""Tests of chapter 19's exercise checkers (rlkit/exercises/solutions/ch19.py).

The references are compared with rlkit.dro's independent implementations (kl_dro, cvar,
group_dro_step, tv_dro); every registered mistake must be caught and reported with its own cause.
"""
import torch

from rlkit.dro import cvar, group_dro_step, kl_dro, tv_dro
from rlkit.exercises import check, exercises, get

CH19 = ["kl_worst_case", "cvar_prompts", "group_dro_update", "tv_worst_case"]
D = torch.float64


def test_chapter_registers_its_exercises():
    assert sorted(e.name for e in exercises(chapter=19)) == sorted(CH19)


def test_references_against_the_library():
    ref = {n: get(n).reference for n in CH19}
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        v = torch.rand(6, generator=g, dtype=D)
        value, q = ref["kl_worst_case"](v, 0.2)
        lib = kl_dro(v, 0.2)
        assert abs(float(value) - lib.value) < 1e-8 and torch.allclose(q, lib.weights, atol=1e-8)
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
