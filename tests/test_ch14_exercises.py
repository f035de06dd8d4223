"""Tests of chapter 14's exercise checkers (rlkit/exercises/solutions/ch14.py).

The references are compared with the library's independent implementations (rlkit.llm.credit,
rlkit.llm.tasks.digit_rewards) and with hand-worked values; every registered mistake must be
caught and reported with its own cause.
"""
import math

import torch

from rlkit.exercises import check, exercises, get
from rlkit.llm import Problem, digit_rewards, kl_token_rewards, value_targets

CH14 = ["kl_token_reward", "nstep_target", "digit_credit"]


def test_chapter_registers_three_exercises():
    assert sorted(e.name for e in exercises(chapter=14)) == sorted(CH14)


def test_references_against_the_library_and_hand_values():
    ref = {n: get(n).reference for n in CH14}
    g = torch.Generator().manual_seed(0)
    lp, lq = -torch.rand(4, 6, generator=g), -torch.rand(4, 6, generator=g)
    mask = (torch.arange(6)[None] < torch.tensor([[6], [3], [1], [4]])).float()
    R = torch.rand(4, generator=g)
    assert torch.allclose(ref["kl_token_reward"](lp, lq, mask, 0.2, R), kl_token_rewards(lp, lq, mask, 0.2, R))
    hand = ref["kl_token_reward"](torch.log(torch.tensor([[0.5, 0.9]])), torch.log(torch.tensor([[0.25, 0.9]])),
                                  torch.ones(1, 2), 0.5, torch.tensor([1.0]))
    assert torch.allclose(hand, torch.tensor([[-0.5 * math.log(2), 1.0]]))
    r, v = torch.randn(4, 6, generator=g) * mask, torch.randn(4, 6, generator=g)
    for n in (1, 2, 3, 7):
        assert torch.allclose(ref["nstep_target"](r, v, mask, n), value_targets(r, v, mask, "nstep", n=n), atol=1e-6)
    for text, ans in [("82\n", "82"), ("72\n", "82"), ("115\n", "125"), ("1", "125")]:
        want = torch.tensor(digit_rewards(text, Problem("", ans)), dtype=torch.float64)
        assert torch.allclose(ref["digit_credit"](text, ans), want)


def test_each_mistake_is_diagnosed_with_its_cause():
    for name in CH14:
        ex = get(name)
        assert len(ex.mistakes) >= 3, name
        for m in ex.mistakes:
            m.fn.__name__ = name
            res = check(m.fn, name=name, verbose=False)
            assert not res and m.cause in res.message, (name, m.cause, res.message)
        assert check(ex.reference, name=name, verbose=False)
