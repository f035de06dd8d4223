"""rlkit.llm.dro.noisy_groups: the mislabelled share, the fixed subset, the pairing with the clean task."""
import random

import pytest

from rlkit.llm.dro import ADDITION_GROUPS, group_mixture, noisy_groups
from rlkit.llm.tasks import Task

NAMES = ["carry", "no carry"]


def _mix():
    return group_mixture(ADDITION_GROUPS, {"carry": 0.1, "no carry": 0.9})


def test_same_prompts_as_the_clean_task_and_true_label_kept():
    clean, noisy = _mix(), noisy_groups(_mix(), 0.3, NAMES, seed=4)
    a, b = clean.problems(500, seed=11), noisy.problems(500, seed=11)
    assert [p.prompt for p in a] == [q.prompt for q in b]          # paired prompt for prompt
    assert all(p.info["group"] == q.info["true_group"] for p, q in zip(a, b))


def test_mislabelled_share_matches_rate_and_is_a_fixed_subset():
    noisy = noisy_groups(_mix(), 0.2, NAMES, seed=0)
    probs = noisy.problems(4000, seed=3, split="all")
    flipped = [p.info["group"] != p.info["true_group"] for p in probs]
    share = sum(flipped) / len(flipped)
    assert abs(share - 0.2) < 0.03, share                          # binomial s.e. 0.006 on distinct prompts
    # the same prompt drawn twice gets the same label (a fixed subset of prompts, not fresh noise)
    again = {p.prompt: p.info["group"] for p in noisy.problems(4000, seed=99, split="all")}
    common = [p for p in probs if p.prompt in again]
    assert len(common) > 100 and all(again[p.prompt] == p.info["group"] for p in common)
    # a flipped two-group label is the other group
    assert all(p.info["group"] in NAMES for p in probs)


def test_rates_zero_and_one_and_seed_changes_subset():
    zero = noisy_groups(_mix(), 0.0, NAMES).problems(300, seed=1)
    assert all(p.info["group"] == p.info["true_group"] for p in zero)
    one = noisy_groups(_mix(), 1.0, NAMES).problems(300, seed=1)
    assert all(p.info["group"] != p.info["true_group"] for p in one)
    a = noisy_groups(_mix(), 0.5, NAMES, seed=0).problems(300, seed=1)
    b = noisy_groups(_mix(), 0.5, NAMES, seed=1).problems(300, seed=1)
    assert [p.info["group"] for p in a] != [p.info["group"] for p in b]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="rate"):
        noisy_groups(_mix(), 1.5, NAMES)
    with pytest.raises(ValueError, match="groups"):
        noisy_groups(_mix(), 0.1, ["carry"])
    with pytest.raises(TypeError, match="task"):
        noisy_groups("addition", 0.1, NAMES)
    plain = Task("plain", lambda rng: ("1+1=", "2"))
    with pytest.raises(ValueError, match="info\\['group'\\]"):
        noisy_groups(plain, 0.1, NAMES).generate(random.Random(0))
    with pytest.raises(ValueError, match="not one of groups"):
        noisy_groups(_mix(), 0.1, ["a", "b"]).generate(random.Random(0))
