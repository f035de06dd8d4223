"""Tests of chapter 5's exercise checkers (rlkit/exercises/solutions/ch05.py).

Every reference is compared with an independent computation: autograd through a PPO-clip loss
written here, a brute-force search over couplings, the Gibbs variational identity and a random
search, and a slow loop over tokens. Every registered mistake must be caught and diagnosed with
its own cause.
"""
import itertools
import math

import pytest
import torch

from rlkit.exercises import check, exercises, get

torch.set_num_threads(1)
CH05 = ["active_clip_fraction", "wasserstein_1d", "kl_regularised_optimum", "kl_shaped_rewards"]
F64 = torch.float64


def test_chapter_registers_four_exercises():
    assert sorted(e.name for e in exercises(chapter=5)) == sorted(CH05)


def test_a_not_implemented_stub_is_reported():
    def wasserstein_1d(x, y):
        raise NotImplementedError
    r = check(wasserstein_1d, verbose=False)
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


def test_wasserstein_1d_equals_the_best_coupling_by_brute_force():
    ref = get("wasserstein_1d").reference
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        x = torch.randn(6, generator=g, dtype=F64)
        y = 2 * torch.randn(6, generator=g, dtype=F64) + 1
        best = min(sum(abs(x[i] - y[p[i]]).item() for i in range(6)) / 6 for p in itertools.permutations(range(6)))
        assert ref(x, y).item() == pytest.approx(best, rel=1e-12)


def test_wasserstein_1d_of_a_shift_is_the_shift():
    ref = get("wasserstein_1d").reference
    x = torch.randn(100, generator=torch.Generator().manual_seed(2), dtype=F64)
    assert ref(x, x + 0.7).item() == pytest.approx(0.7, rel=1e-12)


def test_kl_regularised_optimum_is_the_maximiser():
    ref_fn = get("kl_regularised_optimum").reference
    g = torch.Generator().manual_seed(3)
    ref = torch.log_softmax(torch.randn(6, generator=g, dtype=F64), -1)
    r = torch.randn(6, generator=g, dtype=F64)
    beta = 0.7

    def J(logp):
        p = logp.exp()
        return ((p * r).sum() - beta * (p * (logp - ref)).sum()).item()

    opt = ref_fn(ref, r, beta)
    assert opt.exp().sum().item() == pytest.approx(1.0, rel=1e-12)
    best_value = beta * math.log(sum(math.exp(ref[i].item() + r[i].item() / beta) for i in range(6)))
    assert J(opt) == pytest.approx(best_value, rel=1e-10)
    for _ in range(200):
        other = torch.log_softmax(torch.randn(6, generator=g, dtype=F64) * 2, -1)
        assert J(other) <= J(opt) + 1e-12


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
