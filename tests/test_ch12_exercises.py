"""Tests of chapter 12's exercise checkers (rlkit/exercises/solutions/ch12.py).

The chapter displays rlkit.staleness.staleness_filter, rlkit.staleness.geppo_clip_radius and
rlkit.objectives.clipped_policy_loss, which solved the exercises they replaced; each exercise now asks
for a variant. The references are compared with independent computations (the filter itself, the
library radius on renormalised shares, a per-sample loop and hand-worked numbers), every registered
mistake is caught with its own cause, and the displayed functions, called as a student would call
them, fail the new checks.
"""
import math

import pytest
import torch

from rlkit.exercises import check, exercises, get, self_check
from rlkit.objectives import clipped_policy_loss
from rlkit.staleness import geppo_clip_radius, staleness_filter

torch.set_num_threads(1)
CH12 = ["adaptive_dual_clip_loss", "stale_threshold_for_share", "windowed_geppo_radius"]
F64 = torch.float64


def test_chapter_registers_three_exercises():
    assert sorted(e.name for e in exercises(chapter=12)) == CH12


@pytest.mark.parametrize("name", CH12)
def test_every_mistake_is_caught_and_diagnosed(name):
    assert self_check(name) == []


@pytest.mark.parametrize("q", [0.1, 0.4, 0.5, 0.755, 0.9, 1.0])
def test_the_threshold_keeps_the_share_and_no_smaller_one_does(q):
    ref = get("stale_threshold_for_share").reference
    g = torch.Generator().manual_seed(7)
    lk, lb = 1.5 * torch.randn(4, 25, generator=g, dtype=F64), torch.zeros(4, 25, dtype=F64)
    eps = ref(lk, lb, q)
    kept = staleness_filter(lk, lb, float(eps)).double().mean().item()
    assert kept >= q - 1e-12
    smaller = float(eps) * (1 - 1e-9)
    if smaller > 0:
        assert staleness_filter(lk, lb, smaller).double().mean().item() < q


def test_the_threshold_by_hand():
    # ratios 1.1, 1.5, 0.2, 1, 2/3, 2: |rho - 1| sorted = 0, 0.1, 1/3, 0.5, 0.8, 1
    lb = torch.log(torch.tensor([0.5, 0.2, 0.1, 0.4, 0.3, 0.25], dtype=F64))
    lk = torch.log(torch.tensor([0.55, 0.3, 0.02, 0.4, 0.2, 0.5], dtype=F64))
    ref = get("stale_threshold_for_share").reference
    assert math.isclose(ref(lk, lb, 0.5).item(), 1 / 3, rel_tol=1e-12)     # 3 of 6
    assert math.isclose(ref(lk, lb, 0.4).item(), 1 / 3, rel_tol=1e-12)     # 2.4 -> 3
    assert math.isclose(ref(lk, lb, 1.0).item(), 1.0, rel_tol=1e-12)
    assert ref(lk, lb, 0.1).item() == 0.0                                   # at least one sample


def test_windowed_radius_against_the_library_and_by_hand():
    ref = get("windowed_geppo_radius").reference
    w = [0.1, 0.2, 0.3, 0.4]
    for W in (1, 2, 3, 4):
        kept = torch.tensor(w[:W], dtype=F64)
        assert math.isclose(ref(0.2, w, W).item(), geppo_clip_radius(0.2, (kept / kept.sum()).tolist()), rel_tol=1e-12)
    # the chapter's ablation: ages uniform on 0-8, window 3 keeps ages 0-2, mean age + 1 = 2
    assert math.isclose(ref(0.2, [1 / 9] * 9, 3).item(), 0.1, rel_tol=1e-12)
    assert math.isclose(ref(0.2, [0.25] * 4, 4).item(), 2 * 0.2 / 5, rel_tol=1e-12)


def test_dual_clip_loss_by_a_per_sample_loop():
    ref = get("adaptive_dual_clip_loss").reference
    g = torch.Generator().manual_seed(3)
    lb = -torch.rand(50, generator=g, dtype=F64) - 0.1
    lk = lb + 0.7 * torch.randn(50, generator=g, dtype=F64)
    ln = lk + 0.8 * torch.randn(50, generator=g, dtype=F64)
    adv = torch.randn(50, generator=g, dtype=F64)
    eps, c = 0.2, 2.0
    total = 0.0
    for i in range(50):
        rn, rk, a = math.exp(ln[i] - lb[i]), math.exp(lk[i] - lb[i]), adv[i].item()
        o = min(rn * a, min(max(rn, rk - eps), rk + eps) * a)
        if a < 0:
            o = max(o, c * rk * a)
        total += o
    assert math.isclose(ref(ln, lk, lb, adv, eps, c).item(), -total / 50, rel_tol=1e-12)
    # the hand case: rho_k = 1.2, rho_new = 5, A = -1: min(-5, -1.4) = -5, raised to -c rho_k = -3.6
    z = torch.log(torch.tensor([0.5], dtype=F64))
    one = ref(z + math.log(5.0), z + math.log(1.2), z, torch.tensor([-1.0], dtype=F64), 0.2, 3.0)
    assert math.isclose(one.item(), 3.6, rel_tol=1e-12)


def test_the_displayed_functions_no_longer_pass():
    """A student who calls what the chapter shows gets a diagnosis, not a pass."""
    def windowed_geppo_radius(eps, lag_probs, window):
        return torch.tensor(geppo_clip_radius(eps, lag_probs), dtype=F64)
    r = check(windowed_geppo_radius, verbose=False)
    assert not r and "the window is ignored" in r.message

    def adaptive_dual_clip_loss(logp_new, logp_prox, logp_behav, adv, eps, dual_clip):
        return clipped_policy_loss("adaptive", logp_new, logp_prox, logp_behav, adv, eps)[0]
    r = check(adaptive_dual_clip_loss, verbose=False)
    assert not r and "the dual clip is missing" in r.message

    def stale_threshold_for_share(logp_prox, logp_behav, keep_share):     # the obvious library one-liner
        return torch.quantile(torch.expm1(logp_prox - logp_behav).abs().reshape(-1), keep_share)
    r = check(stale_threshold_for_share, verbose=False)
    assert not r and "interpolated quantile" in r.message
