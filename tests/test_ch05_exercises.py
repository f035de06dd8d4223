"""Tests of chapter 5's exercise checkers (rlkit/exercises/solutions/ch05.py).

Every reference is compared with an independent computation: autograd through a PPO-clip loss
written here, a brute-force search over couplings, the Gibbs variational identity and a random
search, and a slow loop over tokens. Every registered mistake must be caught and diagnosed with
its own cause. The two exercises that the chapter displays (its code cell ``w1`` and
``rlkit.reward_models.kl_regularised_optimum``) were changed into extensions (issue 23): samples of
different sizes, and the (reward, KL) point that pi_beta reaches; the displayed functions, called as a
student would, no longer pass.
"""
import itertools
import math

import pytest
import torch

from rlkit.exercises import check, exercises, get

torch.set_num_threads(1)
CH05 = ["active_clip_fraction", "wasserstein_1d_unequal", "kl_regularised_frontier", "kl_shaped_rewards"]
F64 = torch.float64


def test_chapter_registers_four_exercises():
    assert sorted(e.name for e in exercises(chapter=5)) == sorted(CH05)


def test_a_not_implemented_stub_is_reported():
    def wasserstein_1d_unequal(x, y):
        raise NotImplementedError
    r = check(wasserstein_1d_unequal, verbose=False)
    assert not r and "not implemented" in r.message


# --------------------------------------------------------------- independent checks of references

def test_active_clip_fraction_is_where_the_clip_loss_has_zero_gradient():
    ref = get("active_clip_fraction").reference
    g = torch.Generator().manual_seed(0)
    logp_old = -torch.rand(300, generator=g, dtype=F64) * 3
    logp_new = (logp_old + 0.4 * torch.randn(300, generator=g, dtype=F64)).requires_grad_(True)
    adv = torch.randn(300, generator=g, dtype=F64)
    eps = 0.2
    ratio = torch.exp(logp_new - logp_old)
    loss = -torch.min(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv).sum()
    (grad,) = torch.autograd.grad(loss, logp_new)
    want = (grad == 0).double().mean()
    assert ref(logp_new.detach(), logp_old, adv, eps).item() == pytest.approx(want.item())
    assert 0.05 < want.item() < 0.5


def test_wasserstein_1d_unequal_equals_the_best_coupling_by_brute_force_for_equal_sizes():
    ref = get("wasserstein_1d_unequal").reference
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        x = torch.randn(6, generator=g, dtype=F64)
        y = 2 * torch.randn(6, generator=g, dtype=F64) + 1
        best = min(sum(abs(x[i] - y[p[i]]).item() for i in range(6)) / 6 for p in itertools.permutations(range(6)))
        assert ref(x, y).item() == pytest.approx(best, rel=1e-12)


def _slow_quantile_w1(x, y):
    """W1 as the area between the quantile functions, on the common refinement of the grids k/n and k/m."""
    xs, ys = sorted(x.tolist()), sorted(y.tolist())
    n, m = len(xs), len(ys)
    grid = sorted({i / n for i in range(n + 1)} | {j / m for j in range(m + 1)})
    total = 0.0
    for lo, hi in zip(grid, grid[1:]):
        u = (lo + hi) / 2                                   # the quantile functions are constant on (lo, hi)
        total += (hi - lo) * abs(xs[math.ceil(u * n) - 1] - ys[math.ceil(u * m) - 1])
    return total


def test_wasserstein_1d_unequal_against_the_quantile_integral_and_a_hand_case():
    ref = get("wasserstein_1d_unequal").reference
    g = torch.Generator().manual_seed(2)
    for n, m in [(1, 4), (3, 7), (10, 4), (25, 40)]:
        x, y = torch.randn(n, generator=g, dtype=F64), 1.5 * torch.randn(m, generator=g, dtype=F64) + 0.3
        assert ref(x, y).item() == pytest.approx(_slow_quantile_w1(x, y), rel=1e-12, abs=1e-14)
    assert ref(torch.tensor([0.0, 1.0], dtype=F64), torch.tensor([0.0, 0.5, 1.0], dtype=F64)).item() == \
        pytest.approx(1 / 6, rel=1e-12)
    x = torch.randn(100, generator=g, dtype=F64)
    assert ref(x, torch.cat([x, x]) + 0.7).item() == pytest.approx(0.7, rel=1e-12)   # a shift, sizes 100 and 200


def test_kl_regularised_frontier_against_sums_and_the_maximiser():
    front = get("kl_regularised_frontier").reference
    g = torch.Generator().manual_seed(3)
    ref = torch.log_softmax(torch.randn(6, generator=g, dtype=F64), -1)
    r = torch.randn(6, generator=g, dtype=F64)
    beta = 0.7
    z = sum(math.exp(ref[i].item() + r[i].item() / beta) for i in range(6))
    p = [math.exp(ref[i].item() + r[i].item() / beta) / z for i in range(6)]
    mean_r = sum(p[i] * r[i].item() for i in range(6))
    kl = sum(p[i] * (math.log(p[i]) - ref[i].item()) for i in range(6))
    got_r, got_kl = front(ref, r, beta)
    assert got_r.item() == pytest.approx(mean_r, rel=1e-12) and got_kl.item() == pytest.approx(kl, rel=1e-10)
    # the optimum's objective E[r] - beta KL equals beta log Z (Gibbs), and no other policy beats it
    assert (got_r - beta * got_kl).item() == pytest.approx(beta * math.log(z), rel=1e-10)
    for _ in range(200):
        other = torch.softmax(torch.randn(6, generator=g, dtype=F64) * 2, -1)
        value = (other * r).sum() - beta * (other * (other.log() - ref)).sum()
        assert value.item() <= (got_r - beta * got_kl).item() + 1e-12
    # a response with pi_ref = 0 adds nothing: the same point as without it
    banned = torch.cat([ref, torch.tensor([-math.inf], dtype=F64)])
    out = front(banned, torch.cat([r, torch.tensor([50.0], dtype=F64)]), beta)
    assert all(torch.isfinite(v) for v in out)
    assert torch.allclose(torch.stack(out), torch.stack(front(ref, r, beta)), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["wasserstein_1d_unequal", "kl_regularised_frontier"])
def test_changed_exercises_diagnose_each_mistake_with_its_own_cause(name):
    from rlkit.exercises import self_check
    assert self_check(name) == []
    causes = [m.cause for m in get(name).mistakes]
    assert len(causes) >= 3 and len(set(causes)) == len(causes)


def test_the_displayed_functions_do_not_pass_the_changed_exercises():
    """The chapter's code cell w1 (numpy, per column: transposed as a student would call it) and the displayed
    rlkit.reward_models.kl_regularised_optimum (the same arguments) both fail the new checks."""
    import numpy as np

    from rlkit.reward_models import kl_regularised_optimum

    def w1(x, y):   # chapter 5's code cell, verbatim
        return np.abs(np.sort(x, 0) - np.sort(y, 0)).mean(0)

    def wasserstein_1d_unequal(x, y):
        return torch.as_tensor(w1(x.numpy().T, y.numpy().T)).to(x.dtype)

    def kl_regularised_frontier(ref_logprobs, reward, beta):
        return kl_regularised_optimum(ref_logprobs, reward, beta)

    assert not check(wasserstein_1d_unequal, verbose=False)
    assert not check(kl_regularised_frontier, verbose=False)


def test_kl_shaped_rewards_by_a_slow_loop():
    ref = get("kl_shaped_rewards").reference
    g = torch.Generator().manual_seed(4)
    B, T, beta = 5, 7, 0.2
    logp = -torch.rand(B, T, generator=g, dtype=F64)
    logp_ref = -torch.rand(B, T, generator=g, dtype=F64)
    lengths = [7, 1, 4, 0, 6]
    mask = torch.tensor([[t < n for t in range(T)] for n in lengths])
    score = torch.randn(B, generator=g, dtype=F64)
    got = ref(score, logp, logp_ref, mask, beta)
    for i in range(B):
        for t in range(T):
            want = 0.0
            if t < lengths[i]:
                want = -beta * (logp[i, t] - logp_ref[i, t]).item()
                if t == lengths[i] - 1:
                    want += score[i].item()
            assert got[i, t].item() == pytest.approx(want, abs=1e-12)
    # summed over a response: score - beta * (sequence log-ratio), the sequence-level KL-shaped reward
    total = got.sum(1)
    for i in range(B):
        n = lengths[i]
        want = (score[i] if n else 0.0) - beta * (logp[i, :n] - logp_ref[i, :n]).sum()
        assert total[i].item() == pytest.approx(float(want), abs=1e-12)


# The generic checks (each reference passes its checker, each registered mistake is
# caught with its cause) run for every chapter in tests/test_exercises_framework.py.
