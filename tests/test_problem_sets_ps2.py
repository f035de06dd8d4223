"""Problem set 2 (GRPO from scratch on the tiny language model): skeleton, visible and hidden tests, reference.

The checks every problem set shares (the skeleton, its points, clean failures, the reference pasted
into the skeleton) are in tests/test_problem_sets.py. Here:

* the instructor's reference passes every visible and hidden test with full points;
* a known slip (the attention mask forgotten on left-padded prompts) loses the points of the tests
  that check padding, visible and hidden.
"""
from __future__ import annotations

import pytest
import torch

from rlkit.exercises.problem_sets import get_problem_set, run_tests
from rlkit.exercises.solutions import ps2 as SOL

PS = get_problem_set("ps2")
pytestmark = pytest.mark.usefixtures("one_torch_thread")     # the learning tests run on one thread


def test_reference_passes_all():
    ns = SOL.reference_namespace()
    results = run_tests(ns, PS.visible + SOL.HIDDEN)
    bad = [r.message for r in results if not r.passed or r.points != r.max_points]
    assert not bad, bad


def test_a_forgotten_attention_mask_loses_the_padding_points():
    def no_mask(model, prompt_ids, prompt_mask, response_ids, mask):
        return SOL.response_logprobs(model, prompt_ids, torch.ones_like(prompt_mask), response_ids, mask)

    ns = dict(SOL.reference_namespace(), response_logprobs=no_mask)
    tests = [t for t in PS.visible + SOL.HIDDEN if t.task == "response_logprobs"]
    got = {r.name: r for r in run_tests(ns, tests)}
    assert not got["logprobs_left_padded"].passed and "attention mask" in got["logprobs_left_padded"].message
    assert not got["hidden_logprobs_padding"].passed
    assert got["logprobs_unpadded"].passed            # without padding the slip is invisible
