"""Tests of chapter 15's exercise checkers (rlkit/exercises/solutions/ch15.py).

The references are compared with independent computations: rlkit.returns.n_step_returns with the
per-turn discounts (and rlkit.llm.multiturn.turn_returns when n covers the conversation), a hand-worked
case, rlkit.objectives.grpo_advantages on groups where every conversation took the turn, episode_layout
and a closed-form geometric sum; every registered mistake must be caught and reported with its own
cause; the functions the chapter displays (turn_returns, turn_advantages), called as a student would,
fail the checks of the exercises that now ask for a variant.
"""
import pytest
import torch

from rlkit.exercises import check, exercises, get, self_check
from rlkit.llm.multiturn import episode_layout, turn_advantages, turn_returns
from rlkit.objectives import grpo_advantages
from rlkit.returns import n_step_returns

CH15 = ["turn_nstep_return", "model_token_mask", "turn_grpo_advantage", "retry_value"]


def test_chapter_registers_four_exercises():
    assert sorted(e.name for e in exercises(chapter=15)) == sorted(CH15)


def test_every_mistake_is_caught_with_its_cause():
    for name in CH15:
        assert self_check(name) == []
        for m in get(name).mistakes:
            result = check(m.fn, name=name, verbose=False)
            assert not result and m.cause in result.message


def test_references_against_independent_computations():
    ref = {n: get(n).reference for n in CH15}
    g = torch.Generator().manual_seed(0)
    r = torch.rand(16, 3, generator=g, dtype=torch.float64)
    n = torch.randint(1, 4, (16,), generator=g)
    m = (torch.arange(3)[None] < n[:, None]).double()
    v = torch.rand(16, 3, generator=g, dtype=torch.float64)
    for gamma in (0.0, 0.3, 1.0):
        assert torch.allclose(ref["turn_nstep_return"](r, v, m, gamma, 3), turn_returns(r, m, gamma), atol=1e-12)
        for n_ in (1, 2):                   # the library's n-step return with gamma inside, 0 after the last turn
            disc = gamma * torch.cat([m[:, 1:], torch.zeros(16, 1, dtype=m.dtype)], 1)
            next_v = torch.cat([v[:, 1:], torch.zeros(16, 1, dtype=v.dtype)], 1)
            want = n_step_returns(r * m, disc, next_v, n_) * m
            assert torch.allclose(ref["turn_nstep_return"](r, v, m, gamma, n_), want, atol=1e-12)
    # GRPO per turn: where every conversation of a group took the turn, it is grpo_advantages on that column
    full = torch.ones(8, 3, dtype=torch.float64)
    got = ref["turn_grpo_advantage"](r[:8], full, 4, 1e-6)
    for k in range(3):
        assert torch.allclose(got[:, k], grpo_advantages(r[:8, k], 4, eps=1e-6), atol=1e-12)
    # the mask of a right-padded conversation equals episode_layout's action mask (left-padded there)
    segs = [[([3, 4, 14, 5, 6, 16], -1), ([9, 4, 1], 0), ([40], -1), ([10, 4, 1], 1)],
            [([5, 5, 14, 2, 3, 16], -1), ([7, 8, 1], 0)]]
    lay = episode_layout(segs)
    rows = [sum((s for s, _ in conv), []) for conv in segs]
    width = max(map(len, rows))
    ids = torch.tensor([row + [0] * (width - len(row)) for row in rows])
    got = ref["model_token_mask"](ids, 6, 1, 1)
    for i, row in enumerate(rows):
        assert got[i, :len(row)].tolist() == lay["action_mask"][i][lay["attention_mask"][i]].tolist()
        assert (got[i, len(row):] == 0).all()
    # retry_value: the closed form gamma q (1 - x^(K-1)) / (1 - x), x = gamma (1 - q)
    for q, gamma, K in [(0.5, 0.5, 3), (0.9, 1.0, 3), (0.3, 0.9, 5), (0.2, 0.6, 2)]:
        x = gamma * (1 - q)
        closed = gamma * q * (1 - x ** (K - 1)) / (1 - x)
        assert abs(ref["retry_value"](q, gamma, K).item() - closed) < 1e-12
    assert ref["retry_value"](0.7, 0.8, 1).item() == 0.0


def test_turn_nstep_return_by_hand():
    # 3 turns, rewards (0, 0, 1), values (0.2, 0.4, 0.8), gamma = 0.5, n = 2:
    # G_1 = 0 + 0.5 * 0 + 0.25 * V(s_3) = 0.2; G_2 = 0 + 0.5 * 1 (the window ends with the conversation) = 0.5; G_3 = 1
    out = get("turn_nstep_return").reference(torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.2, 0.4, 0.8]]),
                                             torch.ones(1, 3), 0.5, 2)
    assert torch.allclose(out, torch.tensor([[0.2, 0.5, 1.0]]), atol=1e-7)


def test_turn_grpo_advantage_by_hand():
    # one group of 4; turn 1 returns (1, 0.5, 0.25, 1): mean 0.6875, sample std 0.375; turn 2 taken by rows 1, 2
    returns = torch.tensor([[1.0, 0.0], [0.5, 1.0], [0.25, 0.5], [1.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    out = get("turn_grpo_advantage").reference(returns, mask, 4, 1e-6)
    col = torch.tensor([1.0, 0.5, 0.25, 1.0], dtype=torch.float64)
    assert torch.allclose(out[:, 0], (col - col.mean()) / (col.std() + 1e-6), atol=1e-12)
    s2 = torch.tensor([1.0, 0.5], dtype=torch.float64).std()
    assert torch.allclose(out[1:3, 1], torch.tensor([0.25, -0.25], dtype=torch.float64) / (s2 + 1e-6), atol=1e-12)
    assert out[0, 1] == 0 and out[3, 1] == 0


@pytest.mark.parametrize("baseline", ["loo", "mean", "none"])
def test_the_displayed_functions_no_longer_pass(baseline):
    """A student who calls what the chapter shows gets a diagnosis, not a pass."""
    def turn_nstep_return(turn_rewards, turn_values, turn_mask, gamma, n):
        return turn_returns(turn_rewards, turn_mask, gamma)
    r = check(turn_nstep_return, verbose=False)
    assert not r and "never bootstrap" in r.message

    def turn_grpo_advantage(returns, turn_mask, group_size, eps):
        return turn_advantages(returns, turn_mask, group_size, baseline)
    r = check(turn_grpo_advantage, verbose=False)
    assert not r
    if baseline != "none":
        assert "likely cause" in r.message
