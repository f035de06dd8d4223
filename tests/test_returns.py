"""Tests for rlkit.returns against independent computations.

References here are slow per-element Python loops written from the textbook definitions (sums of
discounted rewards, weighted averages of n-step returns, episode-by-episode GAE), hand-worked
numbers, and identities between the functions. None of them calls the code under test.
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit import returns as R
from rlkit.returns import discounted_returns, from_gymnasium, gae, lambda_returns, n_step_returns, td_errors

torch.set_num_threads(1)
SET = settings(max_examples=40, deadline=None)
D64 = torch.float64


# ----------------------------------------------------------------------------------------------
# independent slow references (one row = a Python list)
# ----------------------------------------------------------------------------------------------

def ref_discounted(r, d, boot):
    T = len(r)
    out = []
    for t in range(T):
        g, w = 0.0, 1.0
        for k in range(t, T):
            g += w * r[k]
            w *= d[k]
        out.append(g + w * boot)
    return out


def ref_nstep(r, d, nv, n):
    T = len(r)
    out = []
    for t in range(T):
        m = min(n, T - t)
        g, w = 0.0, 1.0
        for k in range(m):
            g += w * r[t + k]
            w *= d[t + k]
        out.append(g + w * nv[t + m - 1])
    return out


def ref_lambda_by_average(r, d, nv, lam):
    """Lambda-return as the (1-lam) lam^(n-1) weighted average of n-step returns (scalar lam)."""
    T = len(r)
    out = []
    for t in range(T):
        N = T - t
        g = 0.0
        for n in range(1, N):
            g += (1 - lam) * lam ** (n - 1) * ref_nstep(r, d, nv, n)[t]
        g += lam ** (N - 1) * ref_nstep(r, d, nv, N)[t]
        out.append(g)
    return out


def ref_gae_sum(r, v, nv, d, lam):
    """A_t = sum_l prod_{j<l}(d lam)_{t+j} delta_{t+l}; lam may be a list."""
    T = len(r)
    lam = [lam] * T if not isinstance(lam, list) else lam
    delta = [r[t] + d[t] * nv[t] - v[t] for t in range(T)]
    adv = []
    for t in range(T):
        a, w = 0.0, 1.0
        for k in range(t, T):
            a += w * delta[k]
            w *= d[k] * lam[k]
        adv.append(a)
    return adv


def ref_gae_episodes(r, v, next_obs_v, term, trunc, gamma, lam):
    """GAE computed episode by episode from gymnasium-style flags, the way one would do it by
    hand: split the row at every end, then run the textbook recursion inside each piece."""
    T = len(r)
    adv = [0.0] * T
    start = 0
    for t in range(T):
        if term[t] or trunc[t] or t == T - 1:
            # one piece [start, t]
            nxt = 0.0
            for k in range(t, start - 1, -1):
                if k == t:
                    boot = 0.0 if term[k] else next_obs_v[k]
                    delta = r[k] + gamma * boot - v[k]
                    nxt = delta
                else:
                    delta = r[k] + gamma * next_obs_v[k] - v[k]
                    nxt = delta + gamma * lam * nxt
                adv[k] = nxt
            start = t + 1
    return adv


def rows(x):
    return x.reshape(-1, x.shape[-1]).tolist()


# ----------------------------------------------------------------------------------------------
# hand-worked cases
# ----------------------------------------------------------------------------------------------

def test_discounted_hand_worked():
    r = torch.tensor([1.0, 2.0, 3.0])
    d = torch.full((3,), 0.5)
    g = discounted_returns(r, d, 4.0)
    # G2 = 3 + .5*4 = 5; G1 = 2 + .5*5 = 4.5; G0 = 1 + .5*4.5 = 3.25
    assert torch.allclose(g, torch.tensor([3.25, 4.5, 5.0]))


def test_discounted_termination_in_middle():
    r = torch.ones(4)
    d = torch.tensor([0.9, 0.0, 0.9, 0.9])
    g = discounted_returns(r, d, torch.tensor(10.0).reshape(()).expand(()) * 1.0)
    assert torch.allclose(g, torch.tensor([1.9, 1.0, 10.0, 10.0]))


def test_gae_hand_worked():
    # gamma = 1, lam = .5, two steps, V = 0 except V(s2) = 2
    r = torch.tensor([[1.0, 0.0]])
    v = torch.tensor([[0.0, 1.0]])
    nv = torch.tensor([[1.0, 2.0]])
    d = torch.ones(1, 2)
    adv, ret = gae(r, v, nv, d, 0.5)
    # delta1 = 0 + 2 - 1 = 1, A1 = 1; delta0 = 1 + 1 - 0 = 2, A0 = 2 + .5*1 = 2.5
    assert torch.allclose(adv, torch.tensor([[2.5, 1.0]]))
    assert torch.allclose(ret, torch.tensor([[2.5, 2.0]]))


def test_nstep_hand_worked_window_cut_at_end():
    r = torch.tensor([1.0, 1.0, 1.0])
    d = torch.full((3,), 0.5)
    nv = torch.tensor([10.0, 20.0, 40.0])
    g = n_step_returns(r, d, nv, 2)
    # t0: 1 + .5 + .25*20 = 6.5; t1: 1 + .5 + .25*40 = 11.5; t2 (cut): 1 + .5*40 = 21
    assert torch.allclose(g, torch.tensor([6.5, 11.5, 21.0]))


def test_lambda_returns_hand_worked():
    r = torch.tensor([0.0, 1.0])
    d = torch.ones(2)
    nv = torch.tensor([4.0, 2.0])
    g = lambda_returns(r, d, nv, 0.25)
    # G1 = 1 + 2 = 3; G0 = 0 + (.75*4 + .25*3) = 3.75
    assert torch.allclose(g, torch.tensor([3.75, 3.0]))


def test_from_gymnasium_flags():
    term = np.array([[False, True, False, False]])
    trunc = torch.tensor([[False, False, True, False]])
    d, lm = from_gymnasium(term, trunc, 0.9)
    assert torch.allclose(d, torch.tensor([[0.9, 0.0, 0.9, 0.9]]))
    assert torch.allclose(lm, torch.tensor([[1.0, 1.0, 0.0, 1.0]]))
    assert d.dtype == torch.get_default_dtype()
    d64, _ = from_gymnasium(term, trunc, 0.9, dtype=D64)
    assert d64.dtype == D64


# ----------------------------------------------------------------------------------------------
# against slow references, random data
# ----------------------------------------------------------------------------------------------

def _rand(shape, seed, p_term=0.2):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(shape, generator=g, dtype=D64)
    v = torch.randn(shape, generator=g, dtype=D64)
    nv = torch.randn(shape, generator=g, dtype=D64)
    term = torch.rand(shape, generator=g) < p_term
    d = torch.where(term, torch.zeros((), dtype=D64), torch.rand(shape, generator=g, dtype=D64))
    return r, v, nv, d


@pytest.mark.parametrize("shape", [(1,), (5,), (3, 7), (2, 3, 9)])
def test_discounted_vs_reference(shape):
    r, v, nv, d = _rand(shape, 1)
    boot = torch.randn(shape[:-1], dtype=D64)
    got = discounted_returns(r, d, boot)
    bl = boot.reshape(-1).tolist()
    for i, (rr, dd) in enumerate(zip(rows(r), rows(d))):
        assert np.allclose(rows(got)[i], ref_discounted(rr, dd, bl[i]))


@pytest.mark.parametrize("n", [1, 2, 3, 8, 100])
def test_nstep_vs_reference(n):
    r, v, nv, d = _rand((4, 9), 2)
    got = n_step_returns(r, d, nv, n)
    for i in range(4):
        assert np.allclose(got[i].tolist(), ref_nstep(r[i].tolist(), d[i].tolist(),
                                                      nv[i].tolist(), n))


@pytest.mark.parametrize("lam", [0.0, 0.3, 0.9, 1.0])
def test_lambda_returns_is_weighted_average_of_nstep(lam):
    r, v, nv, d = _rand((3, 8), 3)
    got = lambda_returns(r, d, nv, lam)
    for i in range(3):
        want = ref_lambda_by_average(r[i].tolist(), d[i].tolist(), nv[i].tolist(), lam)
        assert np.allclose(got[i].tolist(), want)


def test_gae_vs_reference_sum_with_per_step_lam():
    r, v, nv, d = _rand((5, 12), 4)
    lam = torch.rand(5, 12, dtype=D64)
    lam[:, 5] = 0.0
    adv, ret = gae(r, v, nv, d, lam)
    for i in range(5):
        want = ref_gae_sum(r[i].tolist(), v[i].tolist(), nv[i].tolist(), d[i].tolist(),
                           lam[i].tolist())
        assert np.allclose(adv[i].tolist(), want)
    assert torch.allclose(ret, adv + v)


# ----------------------------------------------------------------------------------------------
# identities
# ----------------------------------------------------------------------------------------------

def _shifted(v, last):
    return torch.cat([v[..., 1:], last[..., None]], dim=-1)


@given(B=st.integers(1, 4), T=st.integers(1, 30), seed=st.integers(0, 10_000))
@SET
def test_gae_lam1_is_discounted_return_minus_values(B, T, seed):
    r, v, _, d = _rand((B, T), seed)
    last = torch.randn(B, dtype=D64)
    nv = _shifted(v, last)
    adv, _ = gae(r, v, nv, d, 1.0)
    want = discounted_returns(r, d, last) - v
    assert torch.allclose(adv, want, atol=1e-10)


@given(B=st.integers(1, 4), T=st.integers(1, 30), seed=st.integers(0, 10_000))
@SET
def test_gae_lam0_is_td_error(B, T, seed):
    r, v, nv, d = _rand((B, T), seed)
    adv, ret = gae(r, v, nv, d, 0.0)
    assert torch.allclose(adv, r + d * nv - v, atol=1e-12)
    assert torch.allclose(adv, td_errors(r, v, nv, d))


@given(B=st.integers(1, 4), T=st.integers(1, 30), lam=st.floats(0, 1),
       seed=st.integers(0, 10_000))
@SET
def test_gae_returns_equal_lambda_returns(B, T, lam, seed):
    r, v, _, d = _rand((B, T), seed)
    nv = _shifted(v, torch.randn(B, dtype=D64))
    _, ret = gae(r, v, nv, d, lam)
    assert torch.allclose(ret, lambda_returns(r, d, nv, lam), atol=1e-9)


@given(B=st.integers(1, 4), T=st.integers(1, 20), extra=st.integers(0, 5),
       seed=st.integers(0, 10_000))
@SET
def test_nstep_long_window_is_monte_carlo(B, T, extra, seed):
    r, _, nv, d = _rand((B, T), seed)
    got = n_step_returns(r, d, nv, T + extra)
    assert torch.allclose(got, discounted_returns(r, d, nv[..., -1]), atol=1e-10)


def test_nstep_n1_is_td_target():
    r, _, nv, d = _rand((3, 6), 5)
    assert torch.allclose(n_step_returns(r, d, nv, 1), r + d * nv)


def test_lambda_endpoints():
    r, _, nv, d = _rand((3, 6), 6)
    assert torch.allclose(lambda_returns(r, d, nv, 0.0), r + d * nv)
    assert torch.allclose(lambda_returns(r, d, nv, 1.0), discounted_returns(r, d, nv[..., -1]))


# ----------------------------------------------------------------------------------------------
# gymnasium flags: terminations and truncations in the middle of a batch
# ----------------------------------------------------------------------------------------------

@given(B=st.integers(1, 3), T=st.integers(1, 25), gamma=st.floats(0.5, 1.0),
       lam=st.floats(0.0, 1.0), seed=st.integers(0, 10_000))
@SET
def test_gae_with_gymnasium_flags_matches_episode_by_episode(B, T, gamma, lam, seed):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(B, T, generator=g, dtype=D64)
    v = torch.randn(B, T, generator=g, dtype=D64)
    next_obs_v = torch.randn(B, T, generator=g, dtype=D64)  # V(s_{t+1}) or V(final obs)
    term = torch.rand(B, T, generator=g) < 0.15
    trunc = (torch.rand(B, T, generator=g) < 0.15) & ~term
    d, lam_mask = from_gymnasium(term, trunc, gamma, dtype=D64)
    adv, ret = gae(r, v, next_obs_v, d, lam * lam_mask)
    for i in range(B):
        want = ref_gae_episodes(r[i].tolist(), v[i].tolist(), next_obs_v[i].tolist(),
                                term[i].tolist(), trunc[i].tolist(), gamma, lam)
        assert np.allclose(adv[i].tolist(), want, atol=1e-9)


def test_truncation_bootstraps_from_final_observation():
    # one truncated episode of 2 steps, then a new episode of 1 step
    r = torch.tensor([[1.0, 1.0, 5.0]])
    nv = torch.tensor([[0.0, 100.0, 7.0]])  # V(s1), V(final obs), V(s3) (bootstrap at end)
    d, lm = from_gymnasium(torch.tensor([[False, False, False]]),
                           torch.tensor([[False, True, False]]), 0.5)
    g = lambda_returns(r, d, nv, 1.0 * lm)
    # G1 = 1 + .5*100 = 51 (stops, ignores 5); G0 = 1 + .5*51 = 26.5; G2 = 5 + .5*7 = 8.5
    assert torch.allclose(g, torch.tensor([[26.5, 51.0, 8.5]]))


# ----------------------------------------------------------------------------------------------
# fast path == reference path; layout; dtype
# ----------------------------------------------------------------------------------------------

def loop_recurrence(a, b, init):
    """y_t = b_t + a_t y_{t+1}, y_T = init, one row at a time on Python floats."""
    out = []
    for ar, br, y in zip(a.tolist(), b.tolist(), init.tolist()):
        row = [0.0] * len(br)
        for t in range(len(br) - 1, -1, -1):
            y = br[t] + ar[t] * y
            row[t] = y
        out.append(row)
    return torch.tensor(out, dtype=b.dtype).reshape(b.shape)


@pytest.mark.parametrize("N,T", [(1, 1), (3, 2), (4, 17), (2, 64), (5, 100), (1, 1000), (3, 257)])
def test_blocked_scan_matches_loop(N, T):
    g = torch.Generator().manual_seed(N * 1000 + T)
    a = torch.rand(N, T, generator=g, dtype=D64)
    a[torch.rand(N, T, generator=g) < 0.1] = 0.0
    b = torch.randn(N, T, generator=g, dtype=D64)
    init = torch.randn(N, generator=g, dtype=D64)
    ref = loop_recurrence(a, b, init)
    for block in (0, 1, 3, 8, 33):
        fast = R._scan_blocked(a, b, init, block=block)
        assert torch.allclose(fast, ref, atol=1e-10), block
    assert torch.allclose(R.reverse_scan(a, b, init, a_scale=0.5), loop_recurrence(0.5 * a, b, init),
                          atol=1e-10)


def test_blocked_scan_float32_long():
    g = torch.Generator().manual_seed(0)
    a = 0.99 * torch.ones(8, 3000)
    b = torch.randn(8, 3000, generator=g)
    ref = loop_recurrence(a.double(), b.double(), torch.zeros(8, dtype=D64))
    fast = R._scan_blocked(a, b, torch.zeros(8))
    assert torch.allclose(fast.double(), ref, atol=1e-4)


def _fast_and_loop(fn, monkeypatch):
    fast = fn()
    monkeypatch.setattr(R, "_LOOP_MAX_T", 10 ** 9)
    loop = fn()
    monkeypatch.undo()
    return fast, loop


@pytest.mark.parametrize("T", [9, 64, 300])
@pytest.mark.parametrize("per_step_lam", [False, True])
def test_fast_path_equals_readable_loop(T, per_step_lam, monkeypatch):
    """The blocked scan the functions use without autograd gives the loops' numbers."""
    r, v, nv, d = _rand((3, T), T)
    lam = torch.rand(3, T, dtype=D64) if per_step_lam else 0.9
    assert R.blocked_scan_pays(r, v, nv, d, lam)
    for fn in (lambda: gae(r, v, nv, d, lam), lambda: (lambda_returns(r, d, nv, lam),),
               lambda: (discounted_returns(r, d, nv[..., -1]),)):
        fast, loop = _fast_and_loop(fn, monkeypatch)
        for x, y in zip(fast, loop):
            assert torch.allclose(x, y, atol=1e-10)


def test_loop_is_used_with_autograd_and_short_segments():
    r, v, nv, d = _rand((3, 50), 1)
    assert R.blocked_scan_pays(r, v, nv, d, 0.9)
    assert not R.blocked_scan_pays(r, v.requires_grad_(), nv, d, 0.9)
    assert not R.blocked_scan_pays(r[:, :R._LOOP_MAX_T], d[:, :R._LOOP_MAX_T])
    assert not R.blocked_scan_pays(r[:0], d[:0])
    with torch.no_grad():
        assert R.blocked_scan_pays(r, v, nv, d, 0.9)


def test_results_identical_whatever_the_batch_layout():
    """Bitwise: a row gives the same numbers alone, in a batch, permuted, or reshaped."""
    r, v, nv, d = _rand((6, 300), 7)
    r, v, nv, d = (x.float() for x in (r, v, nv, d))
    adv, _ = gae(r, v, nv, d, 0.9)
    for i in range(6):
        a1, _ = gae(r[i:i + 1], v[i:i + 1], nv[i:i + 1], d[i:i + 1], 0.9)
        a0, _ = gae(r[i], v[i], nv[i], d[i], 0.9)
        assert torch.equal(a1[0], adv[i]) and torch.equal(a0, adv[i])
    perm = torch.randperm(6, generator=torch.Generator().manual_seed(0))
    ap, _ = gae(r[perm], v[perm], nv[perm], d[perm], 0.9)
    assert torch.equal(ap, adv[perm])
    a3, _ = gae(*(x.reshape(2, 3, 300) for x in (r, v, nv, d)), 0.9)
    assert torch.equal(a3.reshape(6, 300), adv)
    # non-contiguous input (a transposed view) gives the same numbers
    rt = r.t().contiguous().t()
    at, _ = gae(rt, v, nv, d, 0.9)
    assert torch.equal(at, adv)


def test_fast_path_leaves_inputs_alone_and_outputs_independent():
    r, v, nv, d = (x.float() for x in _rand((4, 300), 10))
    lam = torch.full((4, 300), 0.9)
    copies = [x.clone() for x in (r, v, nv, d, lam)]
    adv1, ret1 = gae(r, v, nv, d, 0.9)
    keep = adv1.clone(), ret1.clone()
    lr1 = lambda_returns(r, d, nv, lam)
    keep_lr = lr1.clone()
    # more calls reuse the scan's scratch memory; earlier results must not change
    gae(r * 2, v, nv, d, lam)
    lambda_returns(r * 3, d, nv, 0.5)
    discounted_returns(r, d, 1.0)
    assert torch.equal(adv1, keep[0]) and torch.equal(ret1, keep[1])
    assert torch.equal(lr1, keep_lr)
    for x, c in zip((r, v, nv, d, lam), copies):
        assert torch.equal(x, c)
    R.release_workspace()
    adv2, _ = gae(r, v, nv, d, 0.9)
    assert torch.equal(adv2, adv1)


def test_odd_layouts_3d_and_strided():
    r, v, nv, d = _rand((2, 3, 50), 11)
    want, _ = gae(r, v, nv, d, 0.8)
    # a permuted (non-contiguous) 3-D layout holding the same values
    p = lambda x: x.permute(1, 0, 2).contiguous().permute(1, 0, 2)
    got, _ = gae(p(r), p(v), p(nv), p(d), 0.8)
    assert torch.allclose(got, want, atol=1e-12)
    got = lambda_returns(p(r), p(d), p(nv), p(d) * 0 + 0.8)
    assert torch.allclose(got, lambda_returns(r, d, nv, 0.8), atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtype_preserved(dtype):
    r, v, nv, d = (x.to(dtype) for x in _rand((2, 50), 8))
    adv, ret = gae(r, v, nv, d, 0.95)
    assert adv.dtype == dtype and ret.dtype == dtype
    assert lambda_returns(r, d, nv, 0.5).dtype == dtype
    assert n_step_returns(r, d, nv, 3).dtype == dtype
    assert discounted_returns(r, d, 0.0).dtype == dtype


def test_gradients_flow_and_gradcheck():
    r, v, nv, d = _rand((2, 5), 9)
    v.requires_grad_(True)
    nv.requires_grad_(True)
    f = lambda v, nv: gae(r, v, nv, d, 0.7)[0]
    assert torch.autograd.gradcheck(f, (v, nv))
    f2 = lambda nv: lambda_returns(r, d, nv, 0.7)
    assert torch.autograd.gradcheck(f2, (nv,))
    f3 = lambda r: discounted_returns(r, d, 1.5)
    assert torch.autograd.gradcheck(f3, (r.clone().requires_grad_(),))


def test_gradient_matches_closed_form_on_long_segments():
    """d A_0 / d V(s_{t+1}) = (gamma lam)^t gamma (the weight of delta_t), through the loop."""
    T, gamma, lam = 40, 0.9, 0.8
    r, v = torch.zeros(1, T, dtype=D64), torch.zeros(1, T, dtype=D64)
    nv = torch.zeros(1, T, dtype=D64, requires_grad=True)
    adv, _ = gae(r, v, nv, torch.full((1, T), gamma, dtype=D64), lam)
    (g,) = torch.autograd.grad(adv[0, 0], nv)
    want = torch.tensor([[(gamma * lam) ** t * gamma for t in range(T)]], dtype=D64)
    assert torch.allclose(g, want, atol=1e-14)


def test_large_values_stay_finite():
    r = torch.full((3, 200), 1e30)
    d = torch.ones(3, 200)
    v = torch.zeros(3, 200)
    adv, _ = gae(r, v, v, d, 1.0)
    assert torch.isfinite(adv).all()
    assert not torch.isnan(lambda_returns(r * 0, d, v, 0.5)).any()


# ----------------------------------------------------------------------------------------------
# input validation: errors name the argument
# ----------------------------------------------------------------------------------------------

def _ok():
    return torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.full((2, 3), 0.9)


def test_shape_mismatch_names_argument():
    r, v, nv, d = _ok()
    with pytest.raises(ValueError, match="next_values"):
        gae(r, v, nv[:, :2], d, 0.9)
    with pytest.raises(ValueError, match="values"):
        gae(r, v[None], nv, d, 0.9)
    with pytest.raises(ValueError, match="discounts"):
        lambda_returns(r, d[:1], nv, 0.9)
    with pytest.raises(ValueError, match="bootstrap"):
        discounted_returns(r, d, torch.zeros(3))
    with pytest.raises(ValueError, match="lam"):
        gae(r, v, nv, d, torch.ones(3))


def test_ranges_checked():
    r, v, nv, d = _ok()
    with pytest.raises(ValueError, match="discounts"):
        gae(r, v, nv, d + 0.2, 0.9)
    with pytest.raises(ValueError, match="discounts"):
        discounted_returns(r, -d, 0.0)
    with pytest.raises(ValueError, match="discounts"):
        discounted_returns(r, d * float("nan"), 0.0)
    with pytest.raises(ValueError, match="lam"):
        gae(r, v, nv, d, 1.5)
    with pytest.raises(ValueError, match="lam"):
        lambda_returns(r, d, nv, torch.full((2, 3), -0.1))
    with pytest.raises(ValueError, match="gamma"):
        from_gymnasium(torch.zeros(3, dtype=torch.bool), torch.zeros(3, dtype=torch.bool), 1.1)
    with pytest.raises(ValueError, match="n"):
        n_step_returns(r, d, nv, 0)


def test_types_checked():
    r, v, nv, d = _ok()
    with pytest.raises(TypeError, match="rewards"):
        gae(r.long(), v, nv, d, 0.9)
    with pytest.raises(TypeError, match="values"):
        gae(r, [0.0, 0.0], nv, d, 0.9)
    with pytest.raises(ValueError, match="dtype"):
        gae(r, v.double(), nv, d, 0.9)
    with pytest.raises(TypeError, match="n"):
        n_step_returns(r, d, nv, 2.0)
    with pytest.raises(TypeError, match="terminated"):
        from_gymnasium(torch.zeros(3), torch.zeros(3, dtype=torch.bool), 0.9)
    with pytest.raises(ValueError, match="truncated"):
        from_gymnasium(torch.zeros(3, dtype=torch.bool), torch.zeros(4, dtype=torch.bool), 0.9)
    with pytest.raises(TypeError, match="lam"):
        gae(r, v, nv, d, torch.ones(2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="rewards"):
        gae(torch.tensor(1.0), torch.tensor(1.0), torch.tensor(1.0), torch.tensor(1.0), 0.9)


# ----------------------------------------------------------------------------------------------
# edges: empty batches and sequences, non-finite bootstraps
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (0, 0), (0,), (2, 0, 4)])
def test_empty_batches_and_sequences_give_empty_results(shape):
    z = torch.zeros(shape)
    d = torch.full(shape, 0.9)
    adv, ret = gae(z, z, z, d, 0.9)
    assert adv.shape == shape and ret.shape == shape
    assert gae(z, z, z, d, d)[0].shape == shape
    assert lambda_returns(z, d, z, 0.5).shape == shape
    assert discounted_returns(z, d, 0.0).shape == shape
    assert n_step_returns(z, d, z, 3).shape == shape
    assert td_errors(z, z, z, d).shape == shape
    dd, lm = from_gymnasium(torch.zeros(shape, dtype=torch.bool),
                            torch.zeros(shape, dtype=torch.bool), 0.9)
    assert dd.shape == shape and lm.shape == shape


@pytest.mark.parametrize("bad", [float("inf"), -float("inf"), float("nan")])
def test_non_finite_bootstrap_refused(bad):
    r, _, _, d = _ok()
    with pytest.raises(ValueError, match="bootstrap"):
        discounted_returns(r, d, bad)
    with pytest.raises(ValueError, match="bootstrap"):
        discounted_returns(r, d, torch.tensor([0.0, bad]))
