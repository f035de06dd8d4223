"""Property tests over every public math function of rlkit.returns, rlkit.offpolicy,
rlkit.divergences and rlkit.trust_region.

For random shapes (empty batches and empty sequences included), dtypes, values (extreme ones
included), masks, and now and then one corrupted argument, each call must end in one of two ways:

* a ValueError or TypeError whose message names the argument that was corrupted (and for an
  uncorrupted call, no error at all), or
* a finite answer equal, to a dtype-dependent tolerance, to a slow reference written below as
  plain Python loops over t on Python floats, independent of rlkit's implementation.
"""
import inspect
import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit import divergences as DV
from rlkit import offpolicy as OP
from rlkit import returns as R
from rlkit import trust_region as TR

torch.set_num_threads(1)
SET = settings(max_examples=60, deadline=None)
F32, F64 = torch.float32, torch.float64

# ----------------------------------------------------------------------------------------------
# the two allowed outcomes
# ----------------------------------------------------------------------------------------------


def names_argument(fn, err, name):
    assert name in inspect.signature(fn).parameters, (fn.__name__, name)
    return re.search(rf"\b{re.escape(name)}\b", str(err)) is not None


def outcome(fn, args, corrupted, reference, tol, rtol=None):
    """Call ``fn(**args)``; check the error or compare with ``reference()`` (nested lists).

    The tolerance is ``tol * (1 + max |reference|)``, or elementwise ``rtol`` (a tensor) times
    ``|reference|`` where given."""
    try:
        out = fn(**args)
    except (ValueError, TypeError) as err:
        assert corrupted is not None, f"{fn.__name__} refused a valid call: {err}"
        assert names_argument(fn, err, corrupted), (corrupted, str(err))
        return None
    assert corrupted is None, f"{fn.__name__} accepted a corrupted {corrupted}"
    outs = out if isinstance(out, tuple) else (out,)
    refs = reference()
    refs = refs if isinstance(refs, tuple) else (refs,)
    for o, r in zip(outs, refs):
        assert torch.isfinite(o).all(), fn.__name__
        want = torch.tensor(r, dtype=F64).reshape(o.shape)
        if rtol is not None:
            err = (o.double() - want).abs()
            assert (err <= rtol.reshape(o.shape) * want.abs() + tol).all(), (fn.__name__, err)
            continue
        scale = 1.0 + want.abs().max().item() if want.numel() else 1.0
        assert torch.allclose(o.double(), want, rtol=tol, atol=tol * scale), (
            fn.__name__, (o.double() - want).abs().max())
    return outs


TOL = {F32: 1e-4, F64: 1e-9, torch.bfloat16: 3e-2, torch.float16: 3e-3}

# ----------------------------------------------------------------------------------------------
# random inputs
# ----------------------------------------------------------------------------------------------

shapes = st.tuples(st.lists(st.integers(0, 3), max_size=2), st.integers(0, 20)).map(
    lambda p: tuple(p[0]) + (p[1],))
scales = st.sampled_from([1.0, 1e3, 1e6])


def randn(shape, seed, dtype, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=g, dtype=F64)).to(dtype)


def unit(shape, seed, dtype, p_zero=0.2):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=g, dtype=F64)
    x[torch.rand(shape, generator=g) < p_zero] = 0.0
    return x.to(dtype)


def rows(x):
    """A [..., T] tensor as a list of rows (Python floats)."""
    return x.double().reshape(-1, x.shape[-1]).tolist() if x.numel() else [[]] * _nrows(x)


def _nrows(x):
    return math.prod(x.shape[:-1])


CORRUPTIONS = ["shape", "int", "dtype", "list"]


def corrupt(x, how):
    if how == "shape":
        return torch.stack([x, x])                 # one more leading dimension
    if how == "int":
        return x.to(torch.int64)
    if how == "dtype":
        return x.to(F32 if x.dtype == F64 else F64)
    return x.tolist()


def maybe_corrupt(data, args, tensor_names, extra=(), hows=CORRUPTIONS):
    """With probability 1/3, corrupt one argument; return its name (or None). ``extra`` lists
    (name, [bad values]) pairs; ``hows`` the corruptions applied to the tensors."""
    if not data.draw(st.integers(0, 2)) == 0:
        return None
    name = data.draw(st.sampled_from(list(tensor_names) + [e[0] for e in extra]))
    for ename, bad in extra:
        if ename == name:
            args[name] = data.draw(st.sampled_from(bad))
            return name
    args[name] = corrupt(args[name], data.draw(st.sampled_from(hows)))
    return name


ALONE = ["int", "list"]          # corruptions of a tensor that is not compared with another


# ----------------------------------------------------------------------------------------------
# reference loops (Python floats, one row at a time)
# ----------------------------------------------------------------------------------------------


def ref_discounted(r, d, boot):
    out = []
    for rr, dd, G in zip(r, d, boot):
        row = [0.0] * len(rr)
        for t in range(len(rr) - 1, -1, -1):
            G = rr[t] + dd[t] * G
            row[t] = G
        out.append(row)
    return out


def ref_nstep(r, d, nv, n):
    out = []
    for rr, dd, vv in zip(r, d, nv):
        T, row = len(rr), []
        for t in range(T):
            m, g, w = min(n, T - t), 0.0, 1.0
            for k in range(m):
                g += w * rr[t + k]
                w *= dd[t + k]
            row.append(g + w * vv[t + m - 1])
        out.append(row)
    return out


def ref_lambda(r, d, nv, lam):
    out = []
    for rr, dd, vv, ll in zip(r, d, nv, lam):
        T = len(rr)
        row, G = [0.0] * T, (vv[-1] if T else 0.0)
        for t in range(T - 1, -1, -1):
            G = rr[t] + dd[t] * ((1 - ll[t]) * vv[t] + ll[t] * G)
            row[t] = G
        out.append(row)
    return out


def ref_gae(r, v, nv, d, lam):
    adv, ret = [], []
    for rr, vv, nn, dd, ll in zip(r, v, nv, d, lam):
        T = len(rr)
        row, A = [0.0] * T, 0.0
        for t in range(T - 1, -1, -1):
            A = rr[t] + dd[t] * nn[t] - vv[t] + dd[t] * ll[t] * A
            row[t] = A
        adv.append(row)
        ret.append([a + x for a, x in zip(row, vv)])
    return adv, ret


def ref_vtrace(lr, r, v, nv, d, clip_rho, clip_c, lam, cut):
    vs_all, pg_all = [], []
    for lrr, rr, vv, nn, dd, ll, cc in zip(lr, r, v, nv, d, lam, cut):
        T = len(rr)
        vs, pg, acc = [0.0] * T, [0.0] * T, 0.0
        for t in range(T - 1, -1, -1):
            rho = math.exp(min(lrr[t], 700.0))
            rb, c = min(clip_rho, rho), ll[t] * min(clip_c, rho)
            td = rr[t] + dd[t] * nn[t] - vv[t]
            pg[t] = rb * (td + dd[t] * (0.0 if cc[t] else acc))
            acc = rb * td + dd[t] * c * acc
            vs[t] = vv[t] + acc
        vs_all.append(vs)
        pg_all.append(pg)
    return vs_all, pg_all


def ref_q_returns(c, r, q, vbar, d, lam):
    out = []
    for cc, rr, qq, vb, dd, ll in zip(c, r, q, vbar, d, lam):
        T = len(rr)
        row, G = [0.0] * T, 0.0
        for t in range(T - 1, -1, -1):
            corr = ll[t] * cc[t + 1] * (G - qq[t + 1]) if t + 1 < T else 0.0
            G = rr[t] + dd[t] * (vb[t] + corr)
            row[t] = G
        out.append(row)
    return out


def max_log(dtype):
    """The documented saturation point of e^l, as the dtype holds it."""
    return torch.tensor(math.log(torch.finfo(dtype).max) - 1.0, dtype=dtype).item()


# ----------------------------------------------------------------------------------------------
# rlkit.returns
# ----------------------------------------------------------------------------------------------

BAD_LAM = [1.5, -0.1, float("nan"), "0.9"]


def step_inputs(data, shape, dtype):
    seed = data.draw(st.integers(0, 2 ** 16))
    scale = data.draw(scales)
    r, v, nv = (randn(shape, seed + k, dtype, scale) for k in range(3))
    d = unit(shape, seed + 3, dtype)
    return r, v, nv, d


def lam_arg(data, shape, dtype, seed=7):
    return unit(shape, seed, dtype) if data.draw(st.booleans()) else data.draw(st.floats(0, 1))


def lam_rows(lam, like):
    return rows(lam) if isinstance(lam, torch.Tensor) else [[lam] * like.shape[-1]] * _nrows(like)


@given(shape=shapes, dtype=st.sampled_from([F32, F64]), data=st.data())
@SET
def test_gae_property(shape, dtype, data):
    r, v, nv, d = step_inputs(data, shape, dtype)
    args = dict(rewards=r, values=v, next_values=nv, discounts=d, lam=lam_arg(data, shape, dtype))
    bad = maybe_corrupt(data, args, ["rewards", "values", "next_values", "discounts"],
                        [("lam", BAD_LAM)] + ([("discounts", [d + 1.5, d * float("nan")])] if d.numel() else []))
    outcome(R.gae, args, bad, lambda: ref_gae(rows(r), rows(v), rows(nv), rows(d),
                                              lam_rows(args["lam"], r)), TOL[dtype])


@given(shape=shapes, dtype=st.sampled_from([F32, F64]), data=st.data())
@SET
def test_lambda_returns_property(shape, dtype, data):
    r, _, nv, d = step_inputs(data, shape, dtype)
    args = dict(rewards=r, discounts=d, next_values=nv, lam=lam_arg(data, shape, dtype))
    bad = maybe_corrupt(data, args, ["rewards", "discounts", "next_values"], [("lam", BAD_LAM)])
    outcome(R.lambda_returns, args, bad,
            lambda: ref_lambda(rows(r), rows(d), rows(nv), lam_rows(args["lam"], r)), TOL[dtype])


@given(shape=shapes, dtype=st.sampled_from([F32, F64]), data=st.data())
@SET
def test_discounted_returns_property(shape, dtype, data):
    r, _, nv, d = step_inputs(data, shape, dtype)
    boot = nv[..., 0] if data.draw(st.booleans()) and shape[-1] else data.draw(
        st.floats(-1e3, 1e3))
    args = dict(rewards=r, discounts=d, bootstrap=boot)
    bad = maybe_corrupt(data, args, ["rewards", "discounts"], [
        ("bootstrap", [float("inf"), float("nan"), -float("inf"), "1", torch.zeros(shape)])])
    b = args["bootstrap"]
    b_rows = b.double().reshape(-1).tolist() if isinstance(b, torch.Tensor) else \
        [b] * _nrows(r)
    outcome(R.discounted_returns, args, bad, lambda: ref_discounted(rows(r), rows(d), b_rows),
            TOL[dtype])


@given(shape=shapes, dtype=st.sampled_from([F32, F64]), n=st.integers(1, 25), data=st.data())
@SET
def test_n_step_and_td_errors_property(shape, dtype, n, data):
    r, v, nv, d = step_inputs(data, shape, dtype)
    args = dict(rewards=r, discounts=d, next_values=nv, n=n)
    bad = maybe_corrupt(data, args, ["rewards", "discounts", "next_values"],
                        [("n", [0, -1, 2.0, None])])
    outcome(R.n_step_returns, args, bad, lambda: ref_nstep(rows(r), rows(d), rows(nv), n),
            TOL[dtype])
    args = dict(rewards=r, values=v, next_values=nv, discounts=d)
    bad = maybe_corrupt(data, args, ["rewards", "values", "next_values", "discounts"])
    outcome(R.td_errors, args, bad, lambda: [[a + c * b - x for a, x, b, c in zip(*z)] for z in
                                             zip(rows(r), rows(v), rows(nv), rows(d))],
            TOL[dtype])


@given(shape=shapes, gamma=st.floats(0, 1), data=st.data())
@SET
def test_from_gymnasium_property(shape, gamma, data):
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 999)))
    term, trunc = torch.rand(shape, generator=g) < 0.3, torch.rand(shape, generator=g) < 0.3
    args = dict(terminated=term, truncated=trunc, gamma=gamma)
    bad = maybe_corrupt(data, args, [], [
        ("terminated", [term.double(), term[..., :-1] if shape[-1] else term[None]]),
        ("truncated", [trunc.float(), torch.cat([trunc, trunc], -1) if shape[-1] else trunc[0:0, None]]),
        ("gamma", [1.5, float("nan"), "0.9"])])
    outcome(R.from_gymnasium, args, bad,
            lambda: ([[gamma * (1 - x) for x in row] for row in rows(term.double())],
                     [[1.0 - x for x in row] for row in rows(trunc.double())]), 1e-6)


@pytest.mark.parametrize("T", [0, 1, 9, 40])
def test_returns_gradients_finite_and_equal_to_loop(T):
    """With autograd the loops run; their gradients equal the closed form of the loop."""
    r, v, nv = (randn((2, T), k, F64) for k in range(3))
    d = unit((2, T), 3, F64)
    nv.requires_grad_(True)
    adv, ret = R.gae(r, v, nv, d, 0.8)
    assert torch.isfinite(adv).all()
    if T:
        (g,) = torch.autograd.grad(adv[:, 0].sum(), nv)
        # dA_0/dV(s_{t+1}) = d_t * prod_{j<t} d_j * lam
        for i in range(2):
            w = 1.0
            for t in range(T):
                assert abs(g[i, t].item() - w * d[i, t].item()) < 1e-12
                w *= d[i, t].item() * 0.8


# ----------------------------------------------------------------------------------------------
# rlkit.offpolicy
# ----------------------------------------------------------------------------------------------

log_scales = st.sampled_from([0.3, 3.0, 50.0, 120.0])


@given(shape=shapes, dtype=st.sampled_from([F32, F64]), clip_rho=st.floats(0.1, 3.0),
       clip_c=st.floats(0.1, 3.0), data=st.data())
@SET
def test_vtrace_property(shape, dtype, clip_rho, clip_c, data):
    r, v, nv, d = step_inputs(data, shape, dtype)
    lr = randn(shape, 11, dtype, data.draw(log_scales))
    lam = lam_arg(data, shape, dtype)
    args = dict(log_rhos=lr, rewards=r, values=v, next_values=nv, discounts=d, clip_rho=clip_rho,
                clip_c=clip_c, lam=lam)
    bad = maybe_corrupt(data, args, ["log_rhos", "rewards", "values", "next_values", "discounts"],
                        [("lam", BAD_LAM), ("clip_rho", [0.0, -1.0, float("nan")]),
                         ("clip_c", [0.0, float("inf"), None])])
    cut = rows(lam == 0) if isinstance(lam, torch.Tensor) else [[False] * shape[-1]] * _nrows(r)
    outcome(OP.vtrace, args, bad, lambda: ref_vtrace(
        rows(lr), rows(r), rows(v), rows(nv), rows(d), clip_rho, clip_c, lam_rows(lam, r), cut),
        TOL[dtype])


@given(shape=shapes, dtype=st.sampled_from([F32, F64]),
       kind=st.sampled_from(["retrace", "tree_backup", "q_lambda", "is", "own"]), data=st.data())
@SET
def test_q_returns_property(shape, dtype, kind, data):
    r, q, vbar, d = step_inputs(data, shape, dtype)
    # importance-sampling traces multiply unclipped ratios: with log-ratios of 50 their product
    # (the true answer) overflows every dtype, so "is" is drawn with moderate ones only
    lr = randn(shape, 12, dtype, data.draw(st.sampled_from([0.3, 1.0] if kind == "is" else
                                                           [0.3, 3.0, 50.0])))
    logp = -unit(shape, 13, dtype, 0.0) * data.draw(st.sampled_from([1.0, 50.0]))
    lam = lam_arg(data, shape, dtype)
    rest = dict(rewards=r, q_taken=q, next_values=vbar, discounts=d, lam=lam)
    names = ["rewards", "q_taken", "next_values", "discounts"]
    if kind == "retrace":
        fn, args, c = OP.retrace, dict(log_rhos=lr, **rest), [
            [math.exp(min(x, 0.0)) for x in row] for row in rows(lr)]
        names.append("log_rhos")
    elif kind == "tree_backup":
        fn, args, c = OP.tree_backup, dict(logp_target=logp, **rest), [
            [math.exp(x) for x in row] for row in rows(logp)]
        names.append("logp_target")
    else:
        traces = OP.trace_coefficients(kind, log_rhos=lr) if kind != "own" else unit(shape, 5,
                                                                                     dtype)
        lim = max_log(dtype)
        c = {"is": [[math.exp(min(x, lim)) for x in row] for row in rows(lr)],
             "q_lambda": [[1.0] * shape[-1]] * _nrows(r)}.get(kind) or rows(traces)
        assert torch.allclose(traces.double(), torch.tensor(c, dtype=F64).reshape(shape),
                              rtol=TOL[dtype])
        fn, args = OP.off_policy_q_returns, dict(traces=traces, **rest)
        names.append("traces")
    bad = maybe_corrupt(data, args, names, [("lam", BAD_LAM)])
    outcome(fn, args, bad, lambda: ref_q_returns(c, rows(r), rows(q), rows(vbar), rows(d),
                                                 lam_rows(lam, r)), TOL[dtype])


@given(shape=shapes, dtype=st.sampled_from([F32, F64, torch.bfloat16, torch.float16]),
       level=st.sampled_from(["token", "sequence", "geometric"]), log=st.booleans(),
       masked=st.booleans(), pad=st.sampled_from([float("nan"), float("inf"), -float("inf"), 0.0]),
       data=st.data())
@SET
def test_importance_ratio_property(shape, dtype, level, log, masked, pad, data):
    """Padding that holds NaN or inf never reaches the value or the gradient."""
    scale = data.draw(st.sampled_from([0.1, 1.0, 50.0]))
    new, old = randn(shape, 1, dtype, scale), randn(shape, 2, dtype, scale)
    mask = torch.rand(shape, generator=torch.Generator().manual_seed(3)) < 0.7 if masked else None
    if mask is not None:
        new = new.masked_fill(~mask, pad)
    new.requires_grad_(True)
    args = dict(logp_new=new, logp_old=old, mask=mask, level=level, log=log)
    bad = maybe_corrupt(data, args, ["logp_old"], [
        ("mask", [torch.ones(shape + (1,)), "all"] + ([torch.full(shape, 0.5)] if old.numel() else [])),
        ("level", ["seq", None])])
    lim = max_log(dtype)
    # reference on the values as the dtype holds them
    nv, ov = rows(new.detach()), rows(old)
    mv = rows(mask.double()) if mask is not None else [[1.0] * shape[-1]] * _nrows(old)

    def reference():
        out = []
        for a, b, m in zip(nv, ov, mv):
            lrs = [x - y if mm else 0.0 for x, y, mm in zip(a, b, m)]
            if level == "token":
                vals = lrs
            else:
                s = sum(lrs)
                vals = s if level == "sequence" else s / max(1.0, sum(m))
            f = (lambda z: z) if log else (lambda z: math.exp(min(z, lim)))
            out.append([f(z) for z in vals] if level == "token" else f(vals))
        return out

    tol = TOL[dtype] * (10 if level != "token" else 1)
    rtol = None
    if not log:   # a ratio e^l inherits the rounding of l: relative error about eps * |l|
        size = (new.detach().double() - old.double()).nan_to_num(0.0, 0.0, 0.0).abs()
        size = size if level == "token" else size.sum(-1)
        rtol = 4 * torch.finfo(dtype).eps * (4 + size) + tol
    outs = outcome(OP.importance_ratio, args, bad, reference, tol, rtol)
    if outs is not None:
        if outs[0].requires_grad:
            (g,) = torch.autograd.grad(outs[0].float().sum(), new)
            assert torch.isfinite(g).all()
            if mask is not None:
                assert (g[~mask] == 0).all()


# ----------------------------------------------------------------------------------------------
# rlkit.divergences
# ----------------------------------------------------------------------------------------------

LOW = [F32, F64, torch.bfloat16, torch.float16]


@given(shape=st.lists(st.integers(0, 4), max_size=2).map(tuple), dtype=st.sampled_from(LOW),
       est=st.sampled_from(["kl_k1", "kl_k2", "kl_k3"]), scale=st.sampled_from([0.1, 1.0, 50.0]),
       data=st.data())
@SET
def test_sample_kl_estimators_property(shape, dtype, est, scale, data):
    """Values and gradients finite for log-probs up to +-50 (log-ratios up to +-100)."""
    fn = getattr(DV, est)
    lp = randn(shape, 1, dtype, scale).clamp(-50, 50).requires_grad_(True)
    lq = randn(shape, 2, dtype, scale).clamp(-50, 50).requires_grad_(True)
    args = dict(logp=lp, logq=lq)
    bad = maybe_corrupt(data, args, ["logp", "logq"])
    lim = max_log(dtype)

    def k(a, b):
        ell = b - a
        if est == "kl_k1":
            return -ell
        if est == "kl_k2":
            return 0.5 * ell * ell
        ell = min(ell, lim)
        return math.expm1(ell) - ell

    ref = lambda: [k(a, b) for a, b in zip(lp.detach().double().reshape(-1).tolist(),
                                           lq.detach().double().reshape(-1).tolist())]
    outs = outcome(fn, args, bad, ref, TOL[dtype] * 3)
    if outs is not None and outs[0].numel():
        gp, gq = torch.autograd.grad(outs[0].sum(), (lp, lq))
        assert torch.isfinite(gp).all() and torch.isfinite(gq).all()
        if est == "kl_k3":
            assert (outs[0] >= 0).all()


def py_log_softmax(row):
    m = max(row)
    if m == -math.inf:
        return [-math.inf] * len(row)
    z = math.log(sum(math.exp(x - m) for x in row)) + m
    return [x - z for x in row]


@given(lead=st.lists(st.integers(0, 3), max_size=2).map(tuple), A=st.integers(0, 6),
       dtype=st.sampled_from([F32, F64]), scale=st.sampled_from([1.0, 10.0, 1e3]),
       data=st.data())
@SET
def test_categorical_property(lead, A, dtype, scale, data):
    a, b = randn(lead + (A,), 1, dtype, scale), randn(lead + (A,), 2, dtype, scale)
    pa = [py_log_softmax(row) for row in rows(a)] if A else []
    pb = [py_log_softmax(row) for row in rows(b)] if A else []

    def kl():
        return [sum(math.exp(x) * (x - y) for x, y in zip(u, w) if math.exp(x) > 0)
                for u, w in zip(pa, pb)]

    def tv():
        return [0.5 * sum(abs(math.exp(x) - math.exp(y)) for x, y in zip(u, w))
                for u, w in zip(pa, pb)]

    bad_pair = maybe_corrupt(data, d2 := dict(logits_p=a, logits_q=b), ["logits_p", "logits_q"])
    if A == 0 and bad_pair is None:
        bad_pair = "logits_p"            # no category: refused, naming the argument
    outcome(DV.kl_categorical, d2, bad_pair, kl, TOL[dtype] * 10)
    outcome(DV.tv_categorical, d2, bad_pair, tv, TOL[dtype] * 10)
    d1 = dict(logits=a)
    bad = maybe_corrupt(data, d1, ["logits"], hows=ALONE) or ("logits" if A == 0 else None)
    outcome(DV.entropy_categorical, d1, bad,
            lambda: [-sum(math.exp(x) * x for x in u if math.exp(x) > 0) for u in pa],
            TOL[dtype] * 10)


# ----------------------------------------------------------------------------------------------
# rlkit.trust_region
# ----------------------------------------------------------------------------------------------


def spd(n, seed):
    g = torch.Generator().manual_seed(seed)
    M = torch.randn(n, n, generator=g, dtype=F64)
    return M @ M.T + n * torch.eye(n, dtype=F64)


def py_solve(A, b):
    """Gaussian elimination on Python floats (A is SPD, no pivoting needed)."""
    n = len(b)
    M = [list(A[i]) + [b[i]] for i in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            f = M[j][i] / M[i][i]
            M[j] = [x - f * y for x, y in zip(M[j], M[i])]
    x = [0.0] * n
    for i in range(n - 1, -1, -1):
        x[i] = (M[i][n] - sum(M[i][k] * x[k] for k in range(i + 1, n))) / M[i][i]
    return x


@given(n=st.integers(0, 6), seed=st.integers(0, 999), data=st.data())
@SET
def test_conjugate_gradient_property(n, seed, data):
    A = spd(n, seed)
    b = randn((n,), seed + 1, F64)
    args = dict(Avp=lambda v: A @ v, b=b, iters=max(n, 1), tol=0.0)
    bad = maybe_corrupt(data, args, ["b"], hows=ALONE, extra=[("iters", [0, 2.5]), ("tol", [-1.0, float("nan")]),
                                            ("Avp", [None, "A"])])
    outcome(TR.conjugate_gradient, args, bad, lambda: py_solve(A.tolist(), b.tolist()), 1e-6)


@given(n=st.integers(1, 5), seed=st.integers(0, 999), damping=st.floats(0, 1), data=st.data())
@SET
def test_fisher_vector_product_property(n, seed, damping, data):
    """KL = 1/2 (theta - theta0)^T A (theta - theta0) has Hessian A: F v = A v + damping v."""
    A = spd(n, seed)
    theta = torch.zeros(n, dtype=F64, requires_grad=True)
    theta0 = theta.detach().clone()              # the expansion point: the gradient there is 0
    v = randn((n,), seed + 3, F64)
    kl = lambda: 0.5 * (theta - theta0) @ A @ (theta - theta0)
    args = dict(kl_fn=kl, params=[theta], v=v, damping=damping)
    bad = maybe_corrupt(data, args, ["v"], hows=ALONE + ["shape"],
                        extra=[("damping", [-0.1, float("nan")]), ("kl_fn", [None])])
    ref = lambda: [sum(A[i, j].item() * v[j].item() for j in range(n)) + damping * v[i].item()
                   for i in range(n)]
    outcome(TR.fisher_vector_product, args, bad, ref, 1e-9)


@given(c=st.floats(0.1, 5.0), target=st.floats(-3, 3), max_constraint=st.floats(0, 10),
       ratio=st.floats(0.1, 0.9), k=st.integers(1, 8), data=st.data())
@SET
def test_backtracking_line_search_property(c, target, max_constraint, ratio, k, data):
    """A 1-D quadratic loss (x - target)^2 and constraint c x^2, against a loop in the test."""
    full = torch.tensor([2.0], dtype=F64)
    evaluate = lambda s: ((s.item() - target) ** 2, c * s.item() ** 2)
    args = dict(evaluate=evaluate, full_step=full, max_constraint=max_constraint,
                backtrack_ratio=ratio, max_backtracks=k)
    bad = maybe_corrupt(data, args, ["full_step"], hows=ALONE, extra=[
        ("max_constraint", [-1.0, float("nan")]), ("backtrack_ratio", [0.0, 1.0, 2.0]),
        ("max_backtracks", [0, 1.5])])
    try:
        ok, frac, info = TR.backtracking_line_search(**args)
    except (ValueError, TypeError) as err:
        assert bad is not None and names_argument(TR.backtracking_line_search, err, bad)
        return
    assert bad is None
    loss0, f, want = target ** 2, 1.0, (False, 0.0)
    for _ in range(k):
        loss, con = evaluate(f * full)
        if con <= max_constraint and loss0 - loss > 0:
            want = (True, f)
            break
        f *= ratio
    assert (ok, frac) == (want[0], pytest.approx(want[1]))
