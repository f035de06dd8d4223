"""Tests for rlkit.offpolicy: ratios, V-trace, Retrace / Tree-Backup, against independent sums."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.offpolicy import importance_ratio, off_policy_q_returns, retrace, trace_coefficients, tree_backup, vtrace
from rlkit.returns import discounted_returns, from_gymnasium, lambda_returns

torch.set_num_threads(1)
SET = settings(max_examples=30, deadline=None)
D64 = torch.float64


def rand_steps(B, T, seed, p_term=0.15):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(B, T, generator=g, dtype=D64)
    v = torch.randn(B, T, generator=g, dtype=D64)
    last = torch.randn(B, 1, generator=g, dtype=D64)
    nv = torch.cat([v[:, 1:], last], dim=1)      # V(s_{t+1}) = values shifted inside the row
    term = torch.rand(B, T, generator=g) < p_term
    d = torch.where(term, torch.zeros((), dtype=D64), 0.5 + 0.5 * torch.rand(B, T, generator=g,
                                                                             dtype=D64))
    log_rhos = torch.randn(B, T, generator=g, dtype=D64)
    return r, v, nv, d, log_rhos


# ----------------------------------------------------------------------------------------------
# importance ratios
# ----------------------------------------------------------------------------------------------

def test_importance_ratio_levels_vs_loops():
    g = torch.Generator().manual_seed(0)
    new = torch.randn(3, 5, generator=g, dtype=D64) * 0.3
    old = torch.randn(3, 5, generator=g, dtype=D64) * 0.3
    m = torch.rand(3, 5, generator=g) < 0.6
    m[2] = False
    tok = importance_ratio(new, old, m, "token")
    seq = importance_ratio(new, old, m, "sequence")
    geo = importance_ratio(new, old, m, "geometric")
    for i in range(3):
        prod, n = 1.0, 0
        for t in range(5):
            rt = math.exp(new[i, t].item() - old[i, t].item())
            if m[i, t]:
                prod *= rt
                n += 1
                assert abs(tok[i, t].item() - rt) < 1e-12
            else:
                assert tok[i, t].item() == 1.0
        assert abs(seq[i].item() - prod) < 1e-12
        assert abs(geo[i].item() - (prod ** (1 / n) if n else 1.0)) < 1e-12
    assert torch.allclose(importance_ratio(new, old, m, "sequence", log=True), seq.log())
    # no mask: all tokens count
    assert torch.allclose(importance_ratio(new, old, level="sequence"), (new - old).sum(-1).exp())


def test_importance_ratio_extremes():
    new = torch.tensor([[50.0, -50.0, 0.0]], requires_grad=True)
    old = torch.zeros(1, 3)
    r = importance_ratio(new, old)
    assert torch.isfinite(r).all()
    (g,) = torch.autograd.grad(r.sum(), new)
    assert torch.isfinite(g).all()
    long_new = torch.full((1, 200), 0.5)
    assert torch.isfinite(importance_ratio(long_new, torch.zeros(1, 200), level="sequence",
                                           log=True)).all()
    assert torch.isfinite(importance_ratio(long_new, torch.zeros(1, 200), level="geometric")).all()


# ----------------------------------------------------------------------------------------------
# V-trace
# ----------------------------------------------------------------------------------------------

def ref_vtrace_row(lr, r, v, nv, d, rho_bar, c_bar, lam):
    T = len(r)
    rho = [math.exp(x) for x in lr]
    rb = [min(rho_bar, x) for x in rho]
    c = [lam * min(c_bar, x) for x in rho]
    delta = [rb[t] * (r[t] + d[t] * nv[t] - v[t]) for t in range(T)]
    vs = []
    for s in range(T):
        tot, w = 0.0, 1.0
        for t in range(s, T):
            tot += w * delta[t]
            w *= d[t] * c[t]
        vs.append(v[s] + tot)
    vs_next = [vs[s + 1] if s + 1 < T else nv[T - 1] for s in range(T)]
    pg = [rb[s] * (r[s] + d[s] * vs_next[s] - v[s]) for s in range(T)]
    return vs, pg


@given(B=st.integers(1, 3), T=st.integers(1, 20), rho_bar=st.floats(0.5, 2.0),
       c_bar=st.floats(0.5, 2.0), lam=st.floats(0.0, 1.0), seed=st.integers(0, 10_000))
@SET
def test_vtrace_vs_impala_definition(B, T, rho_bar, c_bar, lam, seed):
    r, v, nv, d, lr = rand_steps(B, T, seed)
    vs, pg = vtrace(lr, r, v, nv, d, clip_rho=rho_bar, clip_c=c_bar, lam=lam)
    for i in range(B):
        wvs, wpg = ref_vtrace_row(lr[i].tolist(), r[i].tolist(), v[i].tolist(), nv[i].tolist(),
                                  d[i].tolist(), rho_bar, c_bar, lam)
        assert np.allclose(vs[i].tolist(), wvs, atol=1e-9)
        assert np.allclose(pg[i].tolist(), wpg, atol=1e-9)


@given(B=st.integers(1, 3), T=st.integers(1, 20), lam=st.floats(0.0, 1.0),
       clip=st.floats(1.0, 3.0), seed=st.integers(0, 10_000))
@SET
def test_vtrace_on_policy_is_lambda_return(B, T, lam, clip, seed):
    r, v, nv, d, _ = rand_steps(B, T, seed)
    vs, pg = vtrace(torch.zeros_like(r), r, v, nv, d, clip_rho=clip, clip_c=clip, lam=lam)
    G = lambda_returns(r, d, nv, lam)
    assert torch.allclose(vs, G, atol=1e-9)
    vs_next = torch.cat([G[:, 1:], nv[:, -1:]], dim=1)
    assert torch.allclose(pg, r + d * vs_next - v, atol=1e-9)


def test_vtrace_truncation_cut_matches_episode_by_episode():
    r, v, nv, d, lr = rand_steps(2, 12, 3, p_term=0.0)
    trunc = torch.zeros(2, 12, dtype=torch.bool)
    trunc[0, 4] = True
    trunc[1, 7] = True
    nv = nv.clone()
    nv[trunc] = 123.0            # V(final observation) differs from the next row entry
    _, lam_mask = from_gymnasium(torch.zeros_like(trunc), trunc, 0.9, dtype=D64)
    vs, pg = vtrace(lr, r, v, nv, d, lam=0.8 * lam_mask)
    for i, cut in ((0, 4), (1, 7)):
        for a, b in ((0, cut + 1), (cut + 1, 12)):
            wvs, wpg = ref_vtrace_row(lr[i, a:b].tolist(), r[i, a:b].tolist(),
                                      v[i, a:b].tolist(), nv[i, a:b].tolist(),
                                      d[i, a:b].tolist(), 1.0, 1.0, 0.8)
            assert np.allclose(vs[i, a:b].tolist(), wvs)
            assert np.allclose(pg[i, a:b].tolist(), wpg)


def test_vtrace_extremes_and_no_grad():
    r, v, nv, d, _ = rand_steps(2, 6, 4)
    lr = torch.tensor([[50.0, -50.0] * 3, [-50.0, 50.0] * 3], dtype=D64, requires_grad=True)
    vs, pg = vtrace(lr, r.float().double(), v, nv, d, clip_rho=2.0)
    assert torch.isfinite(vs).all() and torch.isfinite(pg).all()
    assert not vs.requires_grad and not pg.requires_grad
    vs32, pg32 = vtrace(lr.detach().float(), r.float(), v.float(), nv.float(), d.float())
    assert torch.isfinite(vs32).all() and torch.isfinite(pg32).all()


# ----------------------------------------------------------------------------------------------
# Retrace / Tree-Backup family
# ----------------------------------------------------------------------------------------------

def ref_q_returns_unrolled(c, r, q, vbar, d, lam):
    """G_t = Q_t + sum_k prod_{j=t}^{k-1}(d_j lam_j c_{j+1}) delta_k."""
    T = len(r)
    delta = [r[k] + d[k] * vbar[k] - q[k] for k in range(T)]
    out = []
    for t in range(T):
        tot, w = 0.0, 1.0
        for k in range(t, T):
            tot += w * delta[k]
            if k + 1 < T:
                w *= d[k] * lam[k] * c[k + 1]
        out.append(q[t] + tot)
    return out


@given(B=st.integers(1, 3), T=st.integers(1, 15), kind=st.sampled_from(
    ["retrace", "tree_backup", "q_lambda", "is"]), lam=st.floats(0.0, 1.0),
    per_step=st.booleans(), seed=st.integers(0, 10_000))
@SET
def test_q_returns_vs_unrolled_sum(B, T, kind, lam, per_step, seed):
    r, q, vbar, d, lr = rand_steps(B, T, seed)
    g = torch.Generator().manual_seed(seed + 1)
    logp_pi = torch.log(torch.rand(B, T, generator=g, dtype=D64))
    c = trace_coefficients(kind, log_rhos=lr, logp_target=logp_pi)
    lam_t = torch.rand(B, T, generator=g, dtype=D64) * lam if per_step else lam
    got = off_policy_q_returns(c, r, q, vbar, d, lam_t)
    lam_l = lam_t.tolist() if per_step else [[lam] * T] * B
    for i in range(B):
        want = ref_q_returns_unrolled(c[i].tolist(), r[i].tolist(), q[i].tolist(),
                                      vbar[i].tolist(), d[i].tolist(), lam_l[i])
        assert np.allclose(got[i].tolist(), want, atol=1e-9)
    if kind == "retrace":
        assert torch.allclose(got, retrace(lr, r, q, vbar, d, lam_t))
    if kind == "tree_backup":
        assert torch.allclose(got, tree_backup(logp_pi, r, q, vbar, d, lam_t))


def test_trace_coefficients_values():
    lr = torch.tensor([[-1.0, 0.0, 1.0, 50.0, -50.0]])
    assert torch.allclose(trace_coefficients("retrace", log_rhos=lr),
                          torch.tensor([[math.exp(-1), 1.0, 1.0, 1.0, math.exp(-50)]]))
    assert torch.allclose(trace_coefficients("is", log_rhos=lr[:, :3]),
                          torch.exp(lr[:, :3]))
    assert torch.equal(trace_coefficients("q_lambda", log_rhos=lr), torch.ones(1, 5))
    assert torch.allclose(trace_coefficients("tree_backup", logp_target=torch.log(
        torch.tensor([[0.2, 1.0]]))), torch.tensor([[0.2, 1.0]]))


def _deterministic_mdp(seed, S=4, A=3, gamma=0.9):
    g = np.random.default_rng(seed)
    nxt = g.integers(0, S, size=(S, A))
    rew = g.normal(size=(S, A))
    pi = g.dirichlet(np.ones(A), size=S)
    mu = g.dirichlet(np.ones(A), size=S)
    # Q = R + gamma * P_pi Q, solved exactly
    n = S * A
    M = np.eye(n)
    for s in range(S):
        for a in range(A):
            s2 = nxt[s, a]
            for a2 in range(A):
                M[s * A + a, s2 * A + a2] -= gamma * pi[s2, a2]
    Q = np.linalg.solve(M, rew.reshape(-1)).reshape(S, A)
    return nxt, rew, pi, mu, Q


@pytest.mark.parametrize("kind", ["retrace", "tree_backup", "q_lambda", "is"])
@pytest.mark.parametrize("lam", [0.0, 0.7, 1.0])
def test_targets_are_exact_at_q_pi_in_a_deterministic_mdp(kind, lam):
    gamma = 0.9
    nxt, rew, pi, mu, Q = _deterministic_mdp(0, gamma=gamma)
    g = np.random.default_rng(1)
    T, s = 25, 0
    rs, qs, vb, lr, lp = [], [], [], [], []
    for _ in range(T):
        a = g.choice(len(mu[s]), p=mu[s])
        s2 = nxt[s, a]
        rs.append(rew[s, a])
        qs.append(Q[s, a])
        vb.append(float(pi[s2] @ Q[s2]))
        lr.append(math.log(pi[s, a] / mu[s, a]))
        lp.append(math.log(pi[s, a]))
        s = s2
    t = lambda x: torch.tensor([x], dtype=D64)
    c = trace_coefficients(kind, log_rhos=t(lr), logp_target=t(lp))
    G = off_policy_q_returns(c, t(rs), t(qs), t(vb), torch.full((1, T), gamma, dtype=D64), lam)
    assert torch.allclose(G, t(qs), atol=1e-10)


def test_tree_backup_greedy_on_taken_actions_is_monte_carlo():
    r, q, _, d, _ = rand_steps(2, 10, 5)
    vbar = torch.cat([q[:, 1:], torch.randn(2, 1, dtype=D64)], dim=1)  # pi puts mass 1 on a_{t+1}
    G = tree_backup(torch.zeros_like(r), r, q, vbar, d, 1.0)
    assert torch.allclose(G, discounted_returns(r, d, vbar[:, -1]))


def test_lam0_is_expected_sarsa_target():
    r, q, vbar, d, lr = rand_steps(3, 7, 6)
    for kind in ("retrace", "is", "q_lambda"):
        c = trace_coefficients(kind, log_rhos=lr)
        assert torch.allclose(off_policy_q_returns(c, r, q, vbar, d, 0.0), r + d * vbar)


def test_retrace_extremes_finite():
    r, q, vbar, d, _ = rand_steps(2, 8, 7)
    lr = torch.tensor([[50.0, -50.0] * 4] * 2, dtype=D64)
    assert torch.isfinite(retrace(lr, r, q, vbar, d)).all()
    assert torch.isfinite(retrace(lr.float(), r.float(), q.float(), vbar.float(), d.float())).all()


# ----------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------

def test_validation_names_arguments():
    r, v, nv, d, lr = rand_steps(2, 5, 8)
    with pytest.raises(ValueError, match="log_rhos"):
        vtrace(lr[:, :3], r, v, nv, d)
    with pytest.raises(ValueError, match="discounts"):
        vtrace(lr, r, v, nv, d * 3)
    with pytest.raises(ValueError, match="lam"):
        vtrace(lr, r, v, nv, d, lam=2.0)
    with pytest.raises(ValueError, match="clip_rho"):
        vtrace(lr, r, v, nv, d, clip_rho=0.0)
    with pytest.raises(TypeError, match="values"):
        vtrace(lr, r, v.long(), nv, d)
    with pytest.raises(ValueError, match="q_taken"):
        retrace(lr, r, v[:1], nv, d)
    with pytest.raises(ValueError, match="logp_target"):
        trace_coefficients("tree_backup", log_rhos=lr)
    with pytest.raises(ValueError, match="kind"):
        trace_coefficients("vtrace", log_rhos=lr)
    with pytest.raises(ValueError, match="mask"):
        importance_ratio(lr, lr, mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="level"):
        importance_ratio(lr, lr, level="seq")
    with pytest.raises(ValueError, match="logp_old"):
        importance_ratio(lr, lr.float())


# ----------------------------------------------------------------------------------------------
# edges: caller's names, empty inputs, huge log-ratios, fast path == loop
# ----------------------------------------------------------------------------------------------

def test_retrace_and_tree_backup_name_the_callers_arguments():
    r, v, nv, d, lr = rand_steps(2, 5, 9)
    for fn, name in ((retrace, "log_rhos"), (tree_backup, "logp_target")):
        for bad in (lr[:, :3], lr.float(), lr.long()):
            with pytest.raises((ValueError, TypeError)) as err:
                fn(bad, r, v, nv, d)
            assert name in str(err.value) and "traces" not in str(err.value)
    with pytest.raises(ValueError, match="q_taken"):
        tree_backup(-lr.abs(), r, v[:, :2], nv, d)      # log-probabilities are <= 0


@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (0, 0), (0,)])
def test_empty_batches_and_sequences(shape):
    z = torch.zeros(shape, dtype=D64)
    d = torch.full(shape, 0.9, dtype=D64)
    vs, pg = vtrace(z, z, z, z, d)
    assert vs.shape == shape and pg.shape == shape
    assert vtrace(z, z, z, z, d, lam=d)[0].shape == shape
    assert retrace(z, z, z, z, d).shape == shape
    assert tree_backup(z, z, z, z, d).shape == shape
    assert off_policy_q_returns(z, z, z, z, d, d).shape == shape
    m = torch.zeros(shape, dtype=torch.bool)
    assert importance_ratio(z, z, m).shape == shape
    for level in ("sequence", "geometric"):
        out = importance_ratio(z, z, m, level=level)
        assert out.shape == shape[:-1] and torch.equal(out, torch.ones(shape[:-1], dtype=D64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_importance_ratio_saturates_instead_of_overflowing(dtype):
    lim = torch.tensor(math.log(torch.finfo(dtype).max) - 1.0, dtype=dtype).item()  # as held
    new = torch.tensor([[100.0, 50.0, -50.0, 0.0, 5.0]], dtype=dtype, requires_grad=True)
    old = torch.zeros(1, 5, dtype=dtype)
    r = importance_ratio(new, old)
    assert torch.isfinite(r).all()
    (g,) = torch.autograd.grad(r.float().sum(), new)
    assert torch.isfinite(g).all()
    want = [math.exp(min(x, lim)) for x in (100.0, 50.0, -50.0, 0.0, 5.0)]
    assert torch.allclose(r.double(), torch.tensor([want], dtype=D64), rtol=2e-2)
    assert g[0, 0] == 0.0                       # above the dtype's range: saturated, like a clip
    seq = importance_ratio(new, old, level="sequence")
    assert torch.isfinite(seq).all()


def test_masked_padding_with_nan_and_inf_never_leaks():
    new = torch.tensor([[0.1, float("nan"), float("inf")], [-0.2, 0.3, -float("inf")]],
                       requires_grad=True)
    old = torch.tensor([[0.0, float("inf"), float("nan")], [0.1, 0.0, 0.0]])
    m = torch.tensor([[True, False, False], [True, True, False]])
    for level in ("token", "sequence", "geometric"):
        for log in (False, True):
            out = importance_ratio(new, old, m, level=level, log=log)
            assert torch.isfinite(out).all()
            (g,) = torch.autograd.grad(out.sum(), new)
            assert torch.isfinite(g).all() and (g[~m] == 0).all()
    seq = importance_ratio(new, old, m, level="sequence", log=True)
    assert torch.allclose(seq, torch.tensor([0.1, -0.3 + 0.3]))


def test_vtrace_and_retrace_finite_for_overflowing_log_rhos():
    r, v, nv, d, _ = rand_steps(2, 12, 10)
    for dtype in (torch.float32, torch.bfloat16):
        lr = torch.tensor([[100.0, -100.0, float("inf"), 89.0] * 3] * 2, dtype=dtype)
        args = [x.to(dtype) for x in (r, v, nv, d)]
        vs, pg = vtrace(lr, *args)
        assert torch.isfinite(vs).all() and torch.isfinite(pg).all()
        assert torch.isfinite(retrace(lr, *args)).all()
        assert torch.isfinite(trace_coefficients("is", log_rhos=lr)).all()


@pytest.mark.parametrize("T", [9, 40, 200])
def test_fast_path_equals_readable_loop(T, monkeypatch):
    from rlkit import returns as R
    r, v, nv, d, lr = rand_steps(3, T, T)
    lam = torch.rand(3, T, dtype=D64)
    lam[:, T // 2] = 0.0
    c = trace_coefficients("retrace", log_rhos=lr)
    calls = [lambda: vtrace(lr, r, v, nv, d, 1.5, 0.8, 0.9), lambda: vtrace(lr, r, v, nv, d, lam=lam),
             lambda: (off_policy_q_returns(c, r, v, nv, d, lam),),
             lambda: (off_policy_q_returns(c, r, v, nv, d, 0.7),)]
    fast = [f() for f in calls]
    monkeypatch.setattr(R, "_LOOP_MAX_T", 10 ** 9)
    loop = [f() for f in calls]
    for a, b in zip(fast, loop):
        for x, y in zip(a, b):
            assert torch.allclose(x, y, atol=1e-10)


def test_non_finite_clips_and_traces_refused():
    r, v, nv, d, lr = rand_steps(2, 5, 11)
    with pytest.raises(ValueError, match="clip_c"):
        vtrace(lr, r, v, nv, d, clip_c=float("inf"))
    with pytest.raises(ValueError, match="clip_rho"):
        vtrace(lr, r, v, nv, d, clip_rho=float("nan"))
    with pytest.raises(ValueError, match="traces"):
        off_policy_q_returns(lr * float("nan"), r, v, nv, d)
