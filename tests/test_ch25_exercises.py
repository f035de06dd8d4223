"""Tests of chapter 25's exercise checkers (rlkit/exercises/solutions/ch25.py).

The references are compared with independent computations: the position ids against
rlkit.llm.hf.position_ids' formula written as a slow loop; the merged stop logits against the
probabilities added by hand; TRL's aggregations against rlkit.objectives.aggregate (grpo =
seq-mean-token-mean, bnpo = token-mean, dr_grpo = seq-mean-token-sum-norm with max_len). Every
registered mistake must be caught with its own cause.
"""
import pytest
import torch

from rlkit.exercises import exercises, get, self_check
from rlkit.objectives import aggregate

torch.set_num_threads(1)
CH25 = ["mask_position_ids", "merge_stop_logits", "trl_aggregate"]
F64 = torch.float64


def test_chapter_registers_three_exercises():
    assert sorted(e.name for e in exercises(chapter=25)) == CH25


@pytest.mark.parametrize("name", CH25)
def test_every_mistake_is_caught_and_diagnosed(name):
    assert self_check(name) == []


def test_position_ids_match_a_slow_loop():
    ref = get("mask_position_ids").reference
    mask = torch.tensor([[False, False, True, True, True], [False, True, True, True, True], [True] * 5])
    want = []
    for row in mask.tolist():
        seen, out = 0, []
        for m in row:
            seen += m
            out.append(max(0, seen - 1))
        want.append(out)
    assert ref(mask).tolist() == want


def test_merged_stop_logits_add_the_probabilities():
    ref = get("merge_stop_logits").reference
    p = torch.tensor([[0.5, 0.2, 0.2, 0.1]], dtype=F64)
    q = ref(p.log(), 1, [2]).softmax(-1)
    assert torch.allclose(q, torch.tensor([[0.5, 0.4, 0.0, 0.1]], dtype=F64), atol=1e-12)


@pytest.mark.parametrize("kind,mode", [("grpo", "seq-mean-token-mean"), ("bnpo", "token-mean"),
                                       ("dr_grpo", "seq-mean-token-sum-norm")])
def test_trl_aggregations_match_rlkit_aggregate(kind, mode):
    ref = get("trl_aggregate").reference
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(5, 6, generator=g, dtype=F64)
    mask = (torch.arange(6)[None] < torch.tensor([6, 1, 3, 2, 4])[:, None]).to(F64)
    want = aggregate(loss, mask, mode, max_len=9 if mode == "seq-mean-token-sum-norm" else None)
    assert float(ref(loss, mask, kind, 9)) == pytest.approx(float(want), rel=1e-12)
