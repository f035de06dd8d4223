"""Tests of chapter 16's exercise checkers (rlkit/exercises/solutions/ch16.py).

The references are compared with independent computations: the V-trace target against
rlkit.offpolicy.vtrace and against the unrolled sum written out by hand; the truncated policy
against rlkit.tabular.truncated_policy and a hand-worked case; the Retrace traces against
rlkit.offpolicy.trace_coefficients. Every registered mistake must be caught with its own cause.
"""
import math

import pytest
import torch

from rlkit import offpolicy, tabular
from rlkit.exercises import check, exercises, get, self_check

torch.set_num_threads(1)
CH16 = ["retrace_traces", "truncated_target_policy", "vtrace_target"]
F64 = torch.float64


def test_chapter_registers_three_exercises():
    assert sorted(e.name for e in exercises(chapter=16)) == CH16


@pytest.mark.parametrize("name", CH16)
def test_every_mistake_is_caught_and_diagnosed(name):
    assert self_check(name) == []


def test_vtrace_target_matches_the_library_and_the_unrolled_sum():
    ref = get("vtrace_target").reference
    g = torch.Generator().manual_seed(0)
    B, T = 3, 7
    lr, r, v = (torch.randn(B, T, generator=g, dtype=F64) for _ in range(3))
    nv = torch.cat([v[:, 1:], torch.randn(B, 1, generator=g, dtype=F64)], 1)
    d = torch.full((B, T), 0.8, dtype=F64)
    got = ref(lr, r, v, nv, d, 1.5, 0.7)
    want, _ = offpolicy.vtrace(lr, r, v, nv, d, clip_rho=1.5, clip_c=0.7)
    assert torch.allclose(got, want, atol=1e-12)
    rho = lr.exp()
    for b in range(B):
        for s in range(T):                       # v_s = V_s + sum_t gamma^(t-s) (prod_{i<t} c_i) rho_t delta_t
            tot, w = v[b, s].item(), 1.0
            for t in range(s, T):
                delta = r[b, t] + d[b, t] * nv[b, t] - v[b, t]
                tot += w * min(1.5, rho[b, t].item()) * delta.item()
                w *= d[b, t].item() * min(0.7, rho[b, t].item())
            assert math.isclose(got[b, s].item(), tot, abs_tol=1e-12)


def test_vtrace_target_by_hand():
    # ratios 2, 0.5, 3 clipped at 1: rho-bar = c = (1, 0.5, 1); V = (.2, .4, .5), reward 1 at the end
    ref = get("vtrace_target").reference
    out = ref(torch.log(torch.tensor([[2.0, 0.5, 3.0]], dtype=F64)), torch.tensor([[0.0, 0.0, 1.0]], dtype=F64),
              torch.tensor([[0.2, 0.4, 0.5]], dtype=F64), torch.tensor([[0.4, 0.5, 0.0]], dtype=F64),
              torch.tensor([[1.0, 1.0, 0.0]], dtype=F64), 1.0, 1.0)
    v2 = 0.5 + 1.0 * (1.0 - 0.5)                  # 1.0
    v1 = 0.4 + 0.5 * (0.5 - 0.4) + 0.5 * (v2 - 0.5)   # 0.7
    v0 = 0.2 + 1.0 * (0.4 - 0.2) + 1.0 * (v1 - 0.4)   # 0.7
    assert torch.allclose(out, torch.tensor([[v0, v1, v2]], dtype=F64), atol=1e-12)


def test_truncated_target_policy_matches_the_library_and_a_hand_case():
    ref = get("truncated_target_policy").reference
    pi, mu = torch.tensor([0.7, 0.2, 0.1], dtype=F64), torch.tensor([0.2, 0.3, 0.5], dtype=F64)
    # min(mu, pi) = (0.2, 0.2, 0.1), total 0.5
    assert torch.allclose(ref(pi, mu, 1.0), torch.tensor([0.4, 0.4, 0.2], dtype=F64), atol=1e-12)
    g = torch.Generator().manual_seed(1)
    P = torch.softmax(torch.randn(4, 5, generator=g, dtype=F64), -1)
    M = torch.softmax(torch.randn(4, 5, generator=g, dtype=F64), -1)
    assert torch.allclose(ref(P, M, 1.7), tabular.truncated_policy(P, M, 1.7), atol=1e-12)


def test_retrace_traces_match_the_library():
    ref = get("retrace_traces").reference
    lr = 2 * torch.randn(5, 9, generator=torch.Generator().manual_seed(2), dtype=F64)
    assert torch.allclose(ref(lr, 0.8), 0.8 * offpolicy.trace_coefficients("retrace", log_rhos=lr), atol=1e-12)


def test_a_correct_student_passes_and_a_stub_is_reported():
    def retrace_traces(log_rhos, lam):
        return lam * torch.minimum(torch.ones_like(log_rhos), torch.exp(log_rhos))
    assert check(retrace_traces, verbose=False)

    def truncated_target_policy(pi, mu, rho_bar):
        raise NotImplementedError
    r = check(truncated_target_policy, verbose=False)
    assert not r and "not implemented" in r.message
