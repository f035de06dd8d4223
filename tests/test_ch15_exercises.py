"""Tests of chapter 15's exercise checkers (rlkit/exercises/solutions/ch15.py).

The references are compared with independent computations: rlkit.llm.multiturn's vectorised
functions (turn_returns, turn_advantages, episode_layout) and a closed-form geometric sum; every
registered mistake must be caught and reported with its own cause.
"""
import torch

from rlkit.exercises import check, exercises, get, self_check
from rlkit.llm.multiturn import episode_layout, turn_advantages, turn_returns

CH15 = ["turn_return", "model_token_mask", "turn_advantage", "retry_value"]


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
    for gamma in (0.0, 0.3, 1.0):
        assert torch.allclose(ref["turn_return"](r, m, gamma), turn_returns(r, m, gamma), atol=1e-12)
    G = turn_returns(r, m, 0.7)
    assert torch.allclose(ref["turn_advantage"](G, m, 4), turn_advantages(G, m, 4, "loo"), atol=1e-12)
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
