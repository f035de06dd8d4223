"""Tests of chapter 20's exercise checkers (rlkit/exercises/solutions/ch20.py).

The references are compared with the library's independent implementations (rlkit.llm.guided's tree
recursion, guided logits and exact best-of-n) and with hand-worked values; every registered mistake must be
caught and reported with its own cause.
"""
import math

import torch

from rlkit.exercises import check, exercises, get
from rlkit.llm.guided import best_of_n_binary, random_token_tree, tree_values

CH20 = ["soft_value_backup", "filter_then_guide", "best_of_n_exact"]


def test_chapter_registers_three_exercises():
    assert sorted(e.name for e in exercises(chapter=20)) == sorted(CH20)


def test_references_against_the_library_and_hand_values():
    ref = {n: get(n).reference for n in CH20}
    logits, reward = random_token_tree(3, 3, generator=torch.Generator().manual_seed(0))
    for beta in (0.2, 1.0):
        v = tree_values(logits, reward, "soft", beta)
        for d in range(3):
            back = ref["soft_value_backup"](logits[d], v[d + 1].view(3 ** d, 3), beta)
            assert torch.allclose(back, v[d], atol=1e-12)
    hand = ref["soft_value_backup"](torch.zeros(1, 2, dtype=torch.float64),
                                    torch.tensor([[0.0, 1.0]], dtype=torch.float64), 1.0)
    assert math.isclose(float(hand), math.log((1 + math.e) / 2), rel_tol=1e-12)
    base = torch.log(torch.tensor([[0.6, 0.3, 0.07, 0.03]], dtype=torch.float64))
    vals = torch.log(torch.tensor([[0.2, 0.5, 0.1, 0.99]], dtype=torch.float64))
    q = ref["filter_then_guide"](base, vals, 1.0, 0.85).exp()
    want = torch.tensor([[0.6 * 0.2, 0.3 * 0.5, 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(q, want / want.sum(), atol=1e-12)            # Bayes on the truncated base, by hand
    p = torch.tensor([0.05, 0.5, 0.9], dtype=torch.float64)
    a, kl = ref["best_of_n_exact"](p, 4)
    a2, kl2 = best_of_n_binary(p, 4)
    assert torch.allclose(a, a2) and torch.allclose(kl, kl2)
    a, kl = ref["best_of_n_exact"](torch.tensor([0.5], dtype=torch.float64), 2)
    assert math.isclose(float(kl), 0.75 * math.log(1.5) + 0.25 * math.log(0.5), rel_tol=1e-12)


def test_each_mistake_is_diagnosed_with_its_cause():
    for name in CH20:
        ex = get(name)
        assert len(ex.mistakes) >= 3, name
        for m in ex.mistakes:
            m.fn.__name__ = name
            res = check(m.fn, name=name, verbose=False)
            assert not res and m.cause in res.message, (name, m.cause, res.message)
        assert check(ex.reference, name=name, verbose=False)
