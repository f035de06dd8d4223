"""Where the KL sits decides what A/(1+alpha sigma) does (chapter 17, prop-ch17-downweight).

Independent computations: a two-response problem whose fixed point solves one scalar equation
(bisection written here, not the library's), the converged natural-gradient iteration, the
identity w = 1 (both KL placements are the same update), and a hand-made check that the fixed
point with a separate KL moves with the weights while the one with the KL in the reward does not.
"""
import math

import pytest
import torch

from rlkit.reward_models import downweighted_fixed_point, kl_regularised_optimum, natural_policy_ascent

D = torch.float64
torch.set_num_threads(1)


def _problem(n=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    ref = torch.log_softmax(torch.randn(n, generator=g, dtype=D), -1)
    r = 2 * torch.randn(n, generator=g, dtype=D)
    w = torch.rand(n, generator=g, dtype=D) + 0.05
    return ref, r, w


def test_two_responses_match_a_scalar_equation():
    # r = (1, 0), pi_ref uniform: p = pi*(1) solves p = sigmoid((w1 (1 - p) + w2 p) / beta), since b* = p
    w1, w2, beta = 0.3, 1.0, 0.4
    f = lambda p: p - 1 / (1 + math.exp(-(w1 * (1 - p) + w2 * p) / beta))
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    ref = torch.log(torch.tensor([0.5, 0.5], dtype=D))
    lp, b = downweighted_fixed_point(ref, torch.tensor([1.0, 0.0], dtype=D), torch.tensor([w1, w2], dtype=D), beta)
    assert abs(lp.exp()[0].item() - lo) < 1e-10
    assert abs(b.item() - lo) < 1e-10


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_separate_kl_fixed_point_is_where_the_iteration_converges(seed):
    ref, r, w = _problem(seed=seed)
    lp, b = downweighted_fixed_point(ref, r, w, beta=0.7)
    it, _ = natural_policy_ascent(ref, r, w, beta=0.7, steps=4000, lr=0.7, kl="separate", record_every=4000)
    assert (lp - it).abs().max() < 1e-9
    assert abs(b - (lp.exp() * r).sum()) < 1e-10        # b* is the policy's own mean reward
    # the fixed-point equation itself: w (r - b) - beta log(pi/pi_ref) is constant
    c = w * (r - b) - 0.7 * (lp - ref)
    assert (c - c.mean()).abs().max() < 1e-10


def test_the_separate_fixed_point_moves_with_the_weights_and_the_folded_one_does_not():
    ref, r, w = _problem(seed=3)
    beta = 0.5
    pi_beta = kl_regularised_optimum(ref, r, beta)
    folded, _ = downweighted_fixed_point(ref, r, w, beta, kl="reward")
    assert torch.allclose(folded, pi_beta, atol=1e-12)
    it_folded, _ = natural_policy_ascent(ref, r, w, beta=beta, steps=3000, lr=1.0, record_every=3000)
    assert (it_folded - pi_beta).abs().max() < 1e-9
    sep, _ = downweighted_fixed_point(ref, r, w, beta)
    assert (sep.exp() - pi_beta.exp()).abs().max() > 1e-2           # it moved
    ones, _ = downweighted_fixed_point(ref, r, None, beta)           # w = 1: the two placements agree
    assert torch.allclose(ones, pi_beta, atol=1e-10)


def test_shrinking_an_uncertain_overrated_answer_lowers_its_mass():
    # three answers; the third is overrated by the proxy and uncertain (small w): the separate KL
    # fixed point puts less mass on it than pi_beta does, and less the smaller its weight
    ref = torch.log(torch.tensor([0.45, 0.45, 0.10], dtype=D))
    r = torch.tensor([0.0, 0.5, 2.0], dtype=D)
    masses = [downweighted_fixed_point(ref, r, torch.tensor([1.0, 1.0, w3], dtype=D), 0.5)[0].exp()[2].item()
              for w3 in (1.0, 0.5, 0.1)]
    assert masses[0] > masses[1] > masses[2]
    assert abs(masses[0] - kl_regularised_optimum(ref, r, 0.5).exp()[2].item()) < 1e-10


def test_w_equal_one_makes_both_placements_the_same_path():
    ref, r, _ = _problem(seed=4)
    a, ha = natural_policy_ascent(ref, r, beta=0.3, steps=50, lr=0.2)
    b, hb = natural_policy_ascent(ref, r, beta=0.3, steps=50, lr=0.2, kl="separate")
    assert (a - b).abs().max() < 1e-12
    assert max(abs(x - y) for x, y in zip(ha["kl"], hb["kl"])) < 1e-12


def test_batched_rows_equal_single_rows():
    rows = [_problem(seed=s) for s in (5, 6)]
    ref = torch.stack([x[0] for x in rows])
    r = torch.stack([x[1] for x in rows])
    w = torch.stack([x[2] for x in rows])
    lp, b = downweighted_fixed_point(ref, r, w, 0.4)
    for i, (ref_i, r_i, w_i) in enumerate(rows):
        lp_i, b_i = downweighted_fixed_point(ref_i, r_i, w_i, 0.4)
        assert torch.allclose(lp[i], lp_i, atol=1e-12) and abs(b[i] - b_i) < 1e-12


def test_bad_input_is_named():
    ref, r, w = _problem()
    with pytest.raises(ValueError, match="kl"):
        downweighted_fixed_point(ref, r, w, 0.5, kl="inside")
    with pytest.raises(ValueError, match="kl"):
        natural_policy_ascent(ref, r, w, beta=0.5, steps=1, kl="both")
    with pytest.raises(ValueError, match="beta"):
        downweighted_fixed_point(ref, r, w, 0.0)
    with pytest.raises(ValueError, match="weights"):
        downweighted_fixed_point(ref, r, torch.zeros_like(w), 0.5)
    with pytest.raises(ValueError, match="reward"):
        downweighted_fixed_point(ref, r[:3], w, 0.5)
    with pytest.raises(ValueError, match="tol"):
        downweighted_fixed_point(ref, r, w, 0.5, tol=0.0)
