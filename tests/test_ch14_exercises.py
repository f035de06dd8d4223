"""Tests of chapter 14's exercise checkers (rlkit/exercises/solutions/ch14.py).

The chapter displays kl_token_rewards, value_targets and digit_rewards, which solved the exercises these
replace; each exercise now asks for a variant. The references are compared with independent computations
(an explicit sum over the vocabulary, the library's lambda- and n-step targets at the limits lambda = 0, 1
and h past every response, and hand-worked values); every registered mistake must be caught and reported
with its own cause; the displayed functions, called as a student would, fail the new checks.
"""
import math

import torch

from rlkit.exercises import check, exercises, get
from rlkit.llm import Problem, digit_rewards, kl_token_rewards, value_targets

CH14 = ["exact_kl_token_reward", "truncated_lambda_target", "shaped_digit_reward"]


def test_chapter_registers_three_exercises():
    assert sorted(e.name for e in exercises(chapter=14)) == sorted(CH14)


def test_exact_kl_reward_against_an_explicit_sum_and_by_hand():
    ref = get("exact_kl_token_reward").reference
    g = torch.Generator().manual_seed(0)
    z = torch.randn(4, 6, 5, generator=g, dtype=torch.float64)
    zr = torch.randn(4, 6, 5, generator=g, dtype=torch.float64)
    mask = (torch.arange(6)[None] < torch.tensor([[6], [3], [1], [4]])).double()
    R = torch.rand(4, generator=g, dtype=torch.float64)
    got = ref(z, zr, mask, 0.2, R)
    for i in range(4):
        L = int(mask[i].sum())
        for t in range(6):
            p, q = torch.softmax(z[i, t], -1), torch.softmax(zr[i, t], -1)
            kl = sum(p[v].item() * math.log(p[v].item() / q[v].item()) for v in range(5))
            want = (-0.2 * kl if t < L else 0.0) + (R[i].item() if t == L - 1 else 0.0)
            assert math.isclose(got[i, t].item(), want, abs_tol=1e-12)
    # the displayed function gives the same reward once it is fed the exact KL as its log-ratio
    lp, lq = torch.log_softmax(z, -1), torch.log_softmax(zr, -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    assert torch.allclose(got, kl_token_rewards(kl, torch.zeros_like(kl), mask, 0.2, R), atol=1e-12)
    hand = ref(torch.log(torch.tensor([[[0.5, 0.5], [0.9, 0.1]]])),
               torch.log(torch.tensor([[[0.25, 0.75], [0.9, 0.1]]])), torch.ones(1, 2), 1.0, torch.tensor([1.0]))
    kl0 = 0.5 * math.log(2) + 0.5 * math.log(0.5 / 0.75)
    assert torch.allclose(hand, torch.tensor([[-kl0, 1.0]]), atol=1e-6)


def test_truncated_lambda_target_at_its_limits_and_by_hand():
    ref = get("truncated_lambda_target").reference
    g = torch.Generator().manual_seed(1)
    mask = (torch.arange(6)[None] < torch.tensor([[6], [3], [1], [4]])).double()
    r = torch.randn(4, 6, generator=g, dtype=torch.float64) * mask
    v = torch.randn(4, 6, generator=g, dtype=torch.float64)
    for lam in (0.3, 0.9):                      # a horizon past every response: the full lambda-return
        assert torch.allclose(ref(r, v, mask, lam, 7), value_targets(r, v, mask, "lambda", lam=lam), atol=1e-10)
    for h in (1, 2, 4):                         # lambda = 1: the h-step target; lambda = 0: TD(0)
        assert torch.allclose(ref(r, v, mask, 1.0, h), value_targets(r, v, mask, "nstep", n=h), atol=1e-10)
        assert torch.allclose(ref(r, v, mask, 0.0, h), value_targets(r, v, mask, "nstep", n=1), atol=1e-10)
    # reward 1 at the last of 3 tokens, V = 0.5, lambda = 0.5, h = 2: t = 1 mixes G1 = 0.5 and G2 = 1 -> 0.75
    hand = ref(torch.tensor([[0., 0., 1., 0.]]), torch.full((1, 4), 0.5), torch.tensor([[1., 1., 1., 0.]]), 0.5, 2)
    assert torch.allclose(hand, torch.tensor([[0.5, 0.75, 1.0, 0.0]]))


def test_shaped_reward_sums_to_exact_match_and_by_hand():
    ref = get("shaped_digit_reward").reference
    for text, ans in [("82\n", "82"), ("72\n", "82"), ("821\n", "82"), ("8\n", "82"), ("115\n", "125"),
                      ("12", "125"), ("125\n", "125"), ("\n", "7")]:
        assert math.isclose(ref(text, ans).sum().item(), float(text == ans + "\n"), abs_tol=1e-12)
    assert torch.allclose(ref("82\n", "82"), torch.full((3,), 1 / 3, dtype=torch.float64))
    assert torch.allclose(ref("821\n", "82"), torch.tensor([1 / 3, 1 / 3, -2 / 3, 0.0], dtype=torch.float64))


def test_the_displayed_functions_no_longer_pass():
    def truncated_lambda_target(rewards, values, mask, lam, h):
        return value_targets(rewards, values, mask, "lambda", lam=lam)
    r = check(truncated_lambda_target, verbose=False)
    assert not r and "your horizon never stops" in r.message

    def shaped_digit_reward(tokens, answer):
        return torch.tensor(digit_rewards(tokens, Problem("", answer)), dtype=torch.float64)
    r = check(shaped_digit_reward, verbose=False)
    assert not r and "dense per-digit reward" in r.message

    def exact_kl_token_reward(logits, logits_ref, mask, beta, reward):   # the sampled log-ratio of the greedy token
        lp, lq = torch.log_softmax(logits, -1), torch.log_softmax(logits_ref, -1)
        a = lp.argmax(-1, keepdim=True)
        return kl_token_rewards(lp.gather(-1, a)[..., 0], lq.gather(-1, a)[..., 0], mask, beta, reward)
    assert not check(exact_kl_token_reward, verbose=False)


def test_each_mistake_is_diagnosed_with_its_cause():
    for name in CH14:
        ex = get(name)
        assert len(ex.mistakes) >= 3, name
        for m in ex.mistakes:
            m.fn.__name__ = name
            res = check(m.fn, name=name, verbose=False)
            assert not res and m.cause in res.message, (name, m.cause, res.message)
        assert check(ex.reference, name=name, verbose=False)
