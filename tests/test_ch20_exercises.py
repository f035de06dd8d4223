"""Tests of chapter 20's exercise checkers (rlkit/exercises/solutions/ch20.py).

The references are compared with the library's independent implementations (rlkit.llm.guided's tree
recursion, guided logits and exact best-of-n) and with hand-worked values; every registered mistake must be
caught and reported with its own cause.
"""
import math

import torch

from rlkit.exercises import check, exercises, get, self_check
from rlkit.llm.guided import best_of_n_binary

CH20 = ["guided_kl", "filter_then_guide", "best_of_n_exact"]


def test_chapter_registers_three_exercises():
    assert sorted(e.name for e in exercises(chapter=20)) == sorted(CH20)


def test_references_against_the_library_and_hand_values():
    ref = {n: get(n).reference for n in CH20}
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


def _guided_kl_loop(logits, values, eta):
    out = []
    for z, v in zip(logits.tolist(), values.tolist()):
        top = max(z)
        pi = [math.exp(a - top) for a in z]
        pi = [x / sum(pi) for x in pi]
        w = [p * math.exp(eta * b) if p > 0 and b != float("-inf") else 0.0 for p, b in zip(pi, v)]
        q = [x / sum(w) for x in w]
        out.append(sum(qi * math.log(qi / p) for qi, p in zip(q, pi) if qi > 0))
    return torch.tensor(out, dtype=torch.float64)


def test_guided_kl_against_a_loop_the_hand_case_and_the_second_order_term():
    ref = get("guided_kl").reference
    g = torch.Generator().manual_seed(200)
    z = torch.randn(5, 7, generator=g, dtype=torch.float64) * 2
    v = torch.log(torch.rand(5, 7, generator=g, dtype=torch.float64))
    v[0, 2] = v[3, 5] = float("-inf")
    z[1, 4] = float("-inf")
    for eta in (0.5, 1.0, 3.0):
        assert torch.allclose(ref(z, v, eta), _guided_kl_loop(z, v, eta), atol=1e-12)
    hand = ref(torch.zeros(1, 2, dtype=torch.float64), torch.tensor([[0.0, math.log(2.0)]], dtype=torch.float64), 1.0)
    assert math.isclose(float(hand), math.log(2 / 3) / 3 + 2 * math.log(4 / 3) / 3, rel_tol=1e-12)
    vv = torch.rand(5, 7, generator=g, dtype=torch.float64)
    pi = torch.softmax(z.nan_to_num(neginf=-1e9), -1)
    var = (pi * vv ** 2).sum(-1) - (pi * vv).sum(-1) ** 2
    eta = 1e-3                                              # KL = eta^2 Var_pi(V) / 2 + O(eta^3)
    assert torch.allclose(ref(z, vv, eta) / (eta ** 2 * var / 2), torch.ones(5, dtype=torch.float64), atol=1e-2)
    assert (ref(z, vv, 2.0) >= 0).all()
    assert torch.allclose(ref(z, vv, 0.0), torch.zeros(5, dtype=torch.float64), atol=1e-12)


def test_the_displayed_log_normaliser_no_longer_solves_the_exercise():
    """The chapter shows log_normaliser; beta * log_normaliser(logits, child_values, 0, 1 / beta) was the
    old exercise (the soft backup). A student's use of it here (KL = eta E_q[V] - log Z) fails where V = -inf."""
    import torch.nn.functional as F

    from rlkit.llm.guided import log_normaliser

    def guided_kl(logits, next_values, eta):
        q = F.softmax(F.log_softmax(logits, -1) + eta * next_values, -1)
        zero = torch.zeros(logits.shape[:-1], dtype=logits.dtype)
        return eta * (q * next_values).sum(-1) - log_normaliser(logits, next_values, zero, eta)
    assert not check(guided_kl, verbose=False)

    def guided_kl(logits, next_values, eta):                 # noqa: F811  (the old exercise's adapter)
        zero = torch.zeros(logits.shape[:-1], dtype=logits.dtype)
        return log_normaliser(logits, next_values, zero, eta)
    assert not check(guided_kl, verbose=False)


def test_guided_kl_is_sound():
    assert self_check("guided_kl") == []
