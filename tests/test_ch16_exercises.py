"""Tests of chapter 16's exercise checkers (rlkit/exercises/solutions/ch16.py).

The references are compared with independent computations: the n-step V-trace target against
rlkit.offpolicy.vtrace run on each window (and equal to it when n covers the row), against a backward
recursion that restarts every window, and against a hand-worked case; the two-sided clipped policy
against rlkit.tabular.truncated_policy (rho_lo = 0) and a hand-worked case; the Retrace traces against
rlkit.offpolicy.trace_coefficients. Every registered mistake must be caught with its own cause, and the
functions the chapter displays (rlkit.offpolicy.vtrace, rlkit.tabular.truncated_policy), called as a
student would call them, must fail the checks of the exercises that now ask for a variant.
"""
import math

import pytest
import torch

from rlkit import offpolicy, tabular
from rlkit.exercises import check, exercises, get, self_check

torch.set_num_threads(1)
CH16 = ["clipped_target_policy", "retrace_traces", "vtrace_nstep_target"]
F64 = torch.float64


def test_chapter_registers_three_exercises():
    assert sorted(e.name for e in exercises(chapter=16)) == CH16


@pytest.mark.parametrize("name", CH16)
def test_every_mistake_is_caught_and_diagnosed(name):
    assert self_check(name) == []


def _traj(B, T, seed):
    g = torch.Generator().manual_seed(seed)
    lr, r, v = (torch.randn(B, T, generator=g, dtype=F64) for _ in range(3))
    nv = torch.cat([v[:, 1:], torch.randn(B, 1, generator=g, dtype=F64)], 1)
    d = torch.full((B, T), 0.8, dtype=F64)
    d[:, 3] = 0.0                                     # an episode boundary inside the row
    return lr, r, v, nv, d


@pytest.mark.parametrize("n", [1, 2, 3, 7, 20])
def test_vtrace_nstep_target_is_the_library_on_each_window(n):
    ref = get("vtrace_nstep_target").reference
    lr, r, v, nv, d = _traj(3, 7, 0)
    got = ref(lr, r, v, nv, d, 1.5, 0.7, n)
    for s in range(7):                                # the full-length target of the window s .. s+n-1
        w = [x[:, s:s + n] for x in (lr, r, v, nv, d)]
        want, _ = offpolicy.vtrace(*w, clip_rho=1.5, clip_c=0.7)
        assert torch.allclose(got[:, s], want[:, 0], atol=1e-12)
    if n >= 7:                                        # a window that covers the row is the full target
        assert torch.allclose(got, offpolicy.vtrace(lr, r, v, nv, d, clip_rho=1.5, clip_c=0.7)[0], atol=1e-12)


def test_vtrace_nstep_target_by_a_restarted_backward_recursion():
    ref = get("vtrace_nstep_target").reference
    lr, r, v, nv, d = _traj(2, 6, 1)
    rho = lr.exp()
    n = 3
    got = ref(lr, r, v, nv, d, 1.2, 0.9, n)
    for b in range(2):
        for s in range(6):                            # backward recursion over the window only
            acc = 0.0
            for t in reversed(range(s, min(s + n, 6))):
                delta = (r[b, t] + d[b, t] * nv[b, t] - v[b, t]).item()
                acc = min(1.2, rho[b, t].item()) * delta + d[b, t].item() * min(0.9, rho[b, t].item()) * acc
            assert math.isclose(got[b, s].item(), v[b, s].item() + acc, abs_tol=1e-12)


def test_vtrace_nstep_target_by_hand():
    # ratios 2, 0.5, 3 clipped at 1: rho-bar = c = (1, 0.5, 1); V = (.2, .4, .5), reward 1 at the end;
    # TD errors (0.2, 0.1, 0.5); with n = 2 step 0 stops after step 1's TD error
    ref = get("vtrace_nstep_target").reference
    out = ref(torch.log(torch.tensor([[2.0, 0.5, 3.0]], dtype=F64)), torch.tensor([[0.0, 0.0, 1.0]], dtype=F64),
              torch.tensor([[0.2, 0.4, 0.5]], dtype=F64), torch.tensor([[0.4, 0.5, 0.0]], dtype=F64),
              torch.tensor([[1.0, 1.0, 0.0]], dtype=F64), 1.0, 1.0, 2)
    v0 = 0.2 + 1.0 * 0.2 + 1.0 * 0.5 * 0.1            # 0.45 (the full-length target is 0.7)
    v1 = 0.4 + 0.5 * 0.1 + 0.5 * 1.0 * 0.5            # 0.7
    v2 = 0.5 + 1.0 * 0.5                              # 1.0
    assert torch.allclose(out, torch.tensor([[v0, v1, v2]], dtype=F64), atol=1e-12)


def test_the_displayed_functions_no_longer_pass():
    """A student who calls what the chapter shows gets a diagnosis, not a pass."""
    def vtrace_nstep_target(log_rhos, rewards, values, next_values, discounts, clip_rho, clip_c, n):
        return offpolicy.vtrace(log_rhos, rewards, values, next_values, discounts, clip_rho, clip_c)[0]
    r = check(vtrace_nstep_target, verbose=False)
    assert not r and "your window never stops" in r.message

    def clipped_target_policy(pi, mu, rho_lo, rho_bar):
        return tabular.truncated_policy(pi.reshape(-1, pi.shape[-1]), mu.reshape(-1, mu.shape[-1]),
                                        rho_bar).reshape(pi.shape)
    r = check(clipped_target_policy, verbose=False)
    assert not r and "the lower clip is missing" in r.message


def test_clipped_target_policy_matches_the_library_and_a_hand_case():
    ref = get("clipped_target_policy").reference
    pi, mu = torch.tensor([0.7, 0.2, 0.1], dtype=F64), torch.tensor([0.2, 0.3, 0.5], dtype=F64)
    # clip(pi, 0.5 mu, mu) = (0.2, 0.2, 0.25), total 0.65
    assert torch.allclose(ref(pi, mu, 0.5, 1.0), torch.tensor([0.2, 0.2, 0.25], dtype=F64) / 0.65, atol=1e-12)
    g = torch.Generator().manual_seed(1)
    P = torch.softmax(torch.randn(4, 5, generator=g, dtype=F64), -1)
    M = torch.softmax(torch.randn(4, 5, generator=g, dtype=F64), -1)
    assert torch.allclose(ref(P, M, 0.0, 1.7), tabular.truncated_policy(P, M, 1.7), atol=1e-12)
    assert torch.allclose(ref(P, M, 1.0, 1.0), M, atol=1e-12)     # both clips at 1: every weight is 1


def test_retrace_traces_match_the_library():
    ref = get("retrace_traces").reference
    lr = 2 * torch.randn(5, 9, generator=torch.Generator().manual_seed(2), dtype=F64)
    assert torch.allclose(ref(lr, 0.8), 0.8 * offpolicy.trace_coefficients("retrace", log_rhos=lr), atol=1e-12)


def test_a_correct_student_passes_and_a_stub_is_reported():
    def retrace_traces(log_rhos, lam):
        return lam * torch.minimum(torch.ones_like(log_rhos), torch.exp(log_rhos))
    assert check(retrace_traces, verbose=False)

    def clipped_target_policy(pi, mu, rho_lo, rho_bar):
        raise NotImplementedError
    r = check(clipped_target_policy, verbose=False)
    assert not r and "not implemented" in r.message
