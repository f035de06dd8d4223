"""Tests of chapter 7's exercise checkers (rlkit/exercises/ch07.py).

The references are compared with independent computations (hand-worked values, rlkit.llm's
sampler, rlkit.objectives.grpo_advantages); every registered mistake must be caught and reported
with its own cause.
"""
import math

import torch

from rlkit.exercises import exercises, get
from rlkit.llm import sampling_logprobs
from rlkit.objectives import grpo_advantages

CH07 = ["response_logprob", "top_p_logprobs", "group_advantages", "sequence_ratio"]


def test_chapter_registers_four_exercises():
    assert sorted(e.name for e in exercises(chapter=7)) == sorted(CH07)


def test_references_against_independent_computations():
    ref = {n: get(n).reference for n in CH07}
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]]]))
    got = ref["response_logprob"](logits, torch.tensor([[0, 2, 1]]), torch.tensor([[1.0, 1.0, 0.0]]))
    assert torch.allclose(got, torch.tensor([math.log(0.5) + math.log(0.8)]))
    z = torch.randn(5, 12, generator=torch.Generator().manual_seed(0)) * 2
    for p in (0.3, 0.8, 0.95):
        assert torch.allclose(ref["top_p_logprobs"](z, p).exp(), sampling_logprobs(z, top_p=p).exp(), atol=1e-6)
    r = torch.rand(32, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(ref["group_advantages"](r, 8), grpo_advantages(r, 8, eps=1e-6), atol=1e-5)
    k, m = 1, 8                                          # one success in eight: (1 - k/m) / sample std
    rb = torch.tensor([1.0] + [0.0] * 7)
    sd = math.sqrt(m / (m - 1) * (k / m) * (1 - k / m))
    assert abs(ref["group_advantages"](rb, 8)[0].item() - (1 - k / m) / sd) < 1e-4
    # the std normalisation is symmetric in k <-> m - k (rewards r -> 1 - r): one failure among seven
    # successes gets minus the advantage of one success among seven failures, by the same hand formula
    rf = 1.0 - rb
    assert abs(ref["group_advantages"](rf, 8)[0].item() + (1 - k / m) / sd) < 1e-4
    for kk in range(m + 1):
        rk = torch.tensor([1.0] * kk + [0.0] * (m - kk), dtype=torch.float64)
        assert torch.allclose(ref["group_advantages"](rk, m), -ref["group_advantages"](1 - rk, m), rtol=0, atol=1e-12)
    old = torch.tensor([[-1.0, -2.0, 0.0]])
    new = torch.tensor([[-0.8, -1.6, 9.0]])
    got = ref["sequence_ratio"](new, old, torch.tensor([[1.0, 1.0, 0.0]]))
    assert torch.allclose(got, torch.tensor([math.exp(0.3)]))


# The generic checks (each reference passes its checker, each registered mistake is
# caught with its cause) run for every chapter in tests/test_exercises_framework.py.
