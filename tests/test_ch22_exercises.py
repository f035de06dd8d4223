"""Tests of chapter 22's exercise checkers (rlkit/exercises/solutions/ch22.py).

The references are compared with the library (rlkit.llm.explore) and with brute-force enumeration
and hand values; every registered mistake must be caught and reported with its own cause.
"""
import itertools
import math

import torch

from rlkit.exercises import check, exercises, get, self_check
from rlkit.llm.explore import RunningMeanStd, group_diversity_bonus, pass_at_k

CH22 = ["best_of_k_estimate", "near_duplicate_bonus", "normalize_intrinsic"]


def test_chapter_registers_three_exercises():
    assert sorted(e.name for e in exercises(chapter=22)) == sorted(CH22)


def test_best_of_k_reference_against_enumeration_pass_at_k_and_the_limits():
    ref = get("best_of_k_estimate").reference
    g = torch.Generator().manual_seed(22)
    x = torch.randint(0, 4, (3, 7), generator=g).double() / 3
    x = x + 0.01 * torch.randn(3, 7, generator=g, dtype=torch.float64)
    x[0, :3] = x[0, 3]                                                    # ties
    for k in range(1, 8):
        brute = torch.tensor([sum(max(float(row[i]) for i in s) for s in itertools.combinations(range(7), k))
                              / math.comb(7, k) for row in x], dtype=torch.float64)
        assert torch.allclose(ref(x, k), brute, atol=1e-12)
    assert torch.allclose(ref(x, 1), x.mean(-1), atol=1e-12)
    assert torch.allclose(ref(x, 7), x.max(-1).values, atol=1e-12)
    n, c = torch.tensor([6, 6, 6, 9, 12]), torch.tensor([0, 2, 5, 4, 12])
    for k in (1, 2, 4, 6):                                               # 0/1 rewards: pass@k
        for a, b, p in zip(n.tolist(), c.tolist(), pass_at_k(n, c, k).tolist()):
            row = torch.tensor([[1.0] * b + [0.0] * (a - b)], dtype=torch.float64)
            assert math.isclose(float(ref(row, k)[0]), p, abs_tol=1e-12)
    hand = ref(torch.tensor([[0.0, 0.5, 1.0]], dtype=torch.float64), 2)
    assert math.isclose(float(hand[0]), 5 / 6, rel_tol=1e-12)


def test_the_displayed_pass_at_k_no_longer_solves_the_exercise():
    """The chapter shows rlkit.llm.explore.pass_at_k; the exercise used to be exactly that function."""
    def best_of_k_estimate(rewards, k):
        n = rewards.shape[-1]
        return pass_at_k(torch.full((rewards.shape[0],), n), (rewards > 0.5).sum(-1), k).to(rewards.dtype)
    assert not check(best_of_k_estimate, verbose=False)


def test_best_of_k_is_sound():
    assert self_check("best_of_k_estimate") == []


def test_near_duplicate_bonus_reduces_to_the_chapter_s_bonus_and_matches_a_hand_case():
    ref = get("near_duplicate_bonus").reference
    resp = ["ab", "ab", "cd", "ef", "xyz", "xyz", "xyz", "pq"]       # identical or without a common bigram
    corr = torch.tensor([1, 1, 1, 0, 1, 0, 1, 1])
    assert torch.allclose(ref(resp, corr, 4), group_diversity_bonus(resp, corr, 4))
    assert torch.allclose(ref(resp, corr, 2), group_diversity_bonus(resp, corr, 2))
    out = ref(["10=370", "10=370.", "20=740", "11=5"], torch.tensor([1, 1, 1, 0]), 4)
    # bigrams: '10=370' has 5, '10=370.' those and '0.', '20=740' shares only '0=' with each; '11=5' none
    hand = [1 - (5 / 6 + 1 / 9) / 3, 1 - (5 / 6 + 1 / 10) / 3, 1 - (1 / 9 + 1 / 10) / 3, 0.0]
    assert torch.allclose(out, torch.tensor(hand), atol=1e-6)


def test_the_displayed_group_diversity_bonus_no_longer_solves_the_exercise():
    """The chapter shows rlkit.llm.explore.group_diversity_bonus; the exercise used to be exactly that function."""
    def near_duplicate_bonus(responses, correct, group_size):
        return group_diversity_bonus(responses, correct, group_size)
    result = check(near_duplicate_bonus, verbose=False)
    assert not result and "exact copies only" in result.message


def test_near_duplicate_bonus_is_sound():
    assert self_check("near_duplicate_bonus") == []


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
