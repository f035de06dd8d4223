"""Property-based tests (hypothesis) over the public math of objectives, staleness, estimators,
tabular and controllers.

For random inputs (0-size shapes included, float32/float64, log-ratios up to +-50 and beyond, masks
that may be all false, NaN and inf in the padding) every call either raises a ValueError/TypeError
whose message names the argument that was wrong, or returns a finite answer equal to a slow
reference loop written here, in float64 Python arithmetic, from the equations in the docstrings.
"""
import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rlkit import staleness as S
from rlkit import tabular as T
from rlkit.controllers import AdaptiveKLController, KLLearningRateController, KLTriggeredLR
from rlkit.estimators import effective_sample_size, importance_weight_variance, trace_covariance
from rlkit.objectives import (
    AGGREGATIONS,
    LOG_RATIO_CAP,
    aggregate,
    clipped_policy_loss,
    grpo_advantages,
    normalize_advantages,
    policy_gradient_loss,
    ppo_clip_loss,
    rloo_advantages,
)

torch.set_num_threads(1)
FAST = settings(max_examples=25, deadline=None, derandomize=True)
DTYPES = st.sampled_from([torch.float32, torch.float64])
NAN = float("nan")


# ----------------------------------------------------------------------------------------------
# strategies
# ----------------------------------------------------------------------------------------------

@st.composite
def batches(draw, n=4, lim=50.0, min_b=0, min_t=0):
    """``n`` [B, T] float64 tensors with entries in [-lim, lim], a mask (maybe all false, maybe
    None) and NaN/inf written into the padding of every tensor."""
    B, Tn = draw(st.integers(min_b, 3)), draw(st.integers(min_t, 4))
    vals = st.floats(-lim, lim, allow_nan=False, width=32)
    ts = [torch.tensor(draw(st.lists(st.lists(vals, min_size=Tn, max_size=Tn), min_size=B, max_size=B)),
                       dtype=torch.float64).reshape(B, Tn) for _ in range(n)]
    kind = draw(st.sampled_from(["none", "random", "all-false"]))
    if kind == "none":
        return ts, None
    if kind == "all-false":
        mask = torch.zeros(B, Tn, dtype=torch.bool)
    else:
        bits = draw(st.lists(st.booleans(), min_size=B * Tn, max_size=B * Tn))
        mask = torch.tensor(bits, dtype=torch.bool).reshape(B, Tn)
    junk = draw(st.sampled_from([NAN, math.inf, -math.inf]))
    for t in ts:
        t[~mask] = junk
    return ts, mask


def ones_like_mask(x, mask):
    return torch.ones(x.shape, dtype=torch.bool) if mask is None else mask


def ref_weights(mask, mode):
    """Per-token weight of :func:`aggregate` (its gradient), from the equations."""
    B, Tn = mask.shape
    w = [[0.0] * Tn for _ in range(B)]
    total = sum(bool(mask[i, t]) for i in range(B) for t in range(Tn))
    seqs = [i for i in range(B) if any(bool(mask[i, t]) for t in range(Tn))]
    for i in range(B):
        cnt = sum(bool(mask[i, t]) for t in range(Tn))
        for t in range(Tn):
            if not mask[i, t]:
                continue
            if mode == "token-mean":
                w[i][t] = 1.0 / total
            elif mode == "seq-mean-token-mean":
                w[i][t] = 1.0 / (cnt * len(seqs))
            else:
                w[i][t] = 1.0 / (max(1, B) * max(1, Tn))
    return w


def ref_agg(tok, mask, mode):
    w = ref_weights(mask, mode)
    return sum(w[i][t] * tok[i][t] for i in range(len(w)) for t in range(len(w[i])) if mask[i, t])


def close(a, b, rtol=1e-4):
    return abs(a - b) <= rtol * (1.0 + abs(b))


def names_an_argument(err, *names):
    msg = str(err.value)
    return any(n in msg for n in names)


# ----------------------------------------------------------------------------------------------
# the clipped losses, token by token
# ----------------------------------------------------------------------------------------------

def capped_exp(x):
    return math.exp(min(x, LOG_RATIO_CAP))


def ref_clip_token(r, a, lo, hi, dual=None):
    """(loss, d loss / d r, clipped) of -min(r A, clip(r, lo, hi) A), dual-capped at -c A."""
    unc, clp = -a * r, -a * min(max(r, lo), hi)
    if clp > unc:
        tok, grad, frozen = clp, 0.0, True
    else:
        tok, grad, frozen = unc, -a, False
    if dual is not None and a < 0 and tok > -dual * a:
        tok, grad, frozen = -dual * a, 0.0, True
    return tok, grad, frozen


def near_boundary(r, lo, hi, dual=None):
    pts = [lo, hi] + ([dual] if dual is not None else [])
    return any(abs(r - p) <= 1e-3 * (1 + abs(p)) for p in pts)


METHOD = st.sampled_from(["standard", "adaptive", "decoupled"])


@given(data=batches(), method=METHOD, mode=st.sampled_from(AGGREGATIONS), eps=st.floats(0.05, 0.5),
       per_sample=st.booleans(), dtype=DTYPES, dual=st.sampled_from([None, 3.0]), bc=st.sampled_from([None, 1.5]))
@FAST
def test_clipped_losses_equal_the_token_loop(data, method, mode, eps, per_sample, dtype, dual, bc):
    (new, prox, beh, adv), mask = data
    B, Tn = new.shape
    m = ones_like_mask(new, mask)
    # log-probabilities whose pairwise differences stay within +-50
    new, prox, beh = new.clamp(-25, 25), prox.clamp(-25, 25), beh.clamp(-25, 25)
    if mask is not None:
        for t in (new, prox, beh, adv):
            t[~mask] = NAN
    row_eps = [eps * (1 + i % 3) / 3 if per_sample else eps for i in range(B)]
    radii = [[row_eps[i]] * Tn for i in range(B)]
    eps_arg = torch.tensor(row_eps, dtype=dtype) if per_sample else eps      # [B]: one radius per response
    x = new.to(dtype).requires_grad_(True)
    bc_ = bc if method == "decoupled" else None
    if method == "standard" and dual is not None:        # the dual clip is ppo_clip_loss's own option
        e = eps_arg[:, None].expand(B, Tn) if per_sample else eps
        loss, stats = ppo_clip_loss(x, beh.to(dtype), adv.to(dtype), eps=e, dual_clip=dual, mask=mask,
                                    aggregation=mode)
    else:
        loss, stats = clipped_policy_loss(method, x, prox.to(dtype), beh.to(dtype), adv.to(dtype), eps_arg,
                                          behav_clip=bc_, mask=mask, aggregation=mode)
    (g,) = torch.autograd.grad(loss, x)
    assert torch.isfinite(loss) and torch.isfinite(g).all()
    # the reference, in float64 from the inputs as the dtype holds them
    q = lambda t: t.to(dtype).double()
    nw, pr, bh, ad = q(new), q(prox), q(beh), q(adv)
    tok = [[0.0] * Tn for _ in range(B)]
    dtok = [[0.0] * Tn for _ in range(B)]
    skip = [[False] * Tn for _ in range(B)]
    d = dual if method == "standard" else None
    for i in range(B):
        for t in range(Tn):
            if not m[i, t]:
                continue
            e, a = radii[i][t], ad[i, t].item()
            if method == "standard":
                r = capped_exp(nw[i, t].item() - bh[i, t].item())
                v, dv, _ = ref_clip_token(r, a, 1 - e, 1 + e, d)
                tok[i][t], dtok[i][t] = v, dv * r
                skip[i][t] = near_boundary(r, 1 - e, 1 + e, d)
            elif method == "adaptive":
                r = capped_exp(nw[i, t].item() - bh[i, t].item())
                rk = capped_exp(pr[i, t].item() - bh[i, t].item())
                v, dv, _ = ref_clip_token(r, a, rk - e, rk + e)
                tok[i][t], dtok[i][t] = v, dv * r
                skip[i][t] = near_boundary(r, rk - e, rk + e)
            else:
                w = capped_exp(pr[i, t].item() - bh[i, t].item())
                wb = w if bc_ is None else min(w, bc_)
                r = capped_exp(nw[i, t].item() - pr[i, t].item())
                v, dv, _ = ref_clip_token(r, a, 1 - e, 1 + e)
                tok[i][t], dtok[i][t] = wb * v, wb * dv * r
                skip[i][t] = near_boundary(r, 1 - e, 1 + e)
    assume(not any(any(row) for row in skip)) if dtype == torch.float32 else None
    want = ref_agg(tok, m, mode)
    assert close(loss.item(), want, 1e-3 if dtype == torch.float32 else 1e-9)
    wts = ref_weights(m, mode)
    for i in range(B):
        for t in range(Tn):
            gw = wts[i][t] * dtok[i][t]
            if skip[i][t]:
                continue
            assert close(g[i, t].item(), gw, 1e-3 if dtype == torch.float32 else 1e-9), (i, t)
            if dtok[i][t] == 0.0:
                assert g[i, t].item() == 0.0            # exactly 0 where the clip binds
    for v in stats.values():
        assert not torch.isnan(v)


@given(data=batches(n=2), mode=st.sampled_from(AGGREGATIONS), dtype=DTYPES)
@FAST
def test_aggregate_and_policy_gradient_equal_the_loop(data, mode, dtype):
    (x, adv), mask = data
    m = ones_like_mask(x, mask)
    xx = x.to(dtype).requires_grad_(True)
    got = aggregate(xx, mask, mode)
    want = ref_agg([[xx[i, t].item() if m[i, t] else 0.0 for t in range(x.shape[1])] for i in range(x.shape[0])],
                   m, mode)
    assert torch.isfinite(got) and close(got.item(), want, 1e-5)
    pg = policy_gradient_loss(xx, adv.to(dtype), mask, mode)
    (g,) = torch.autograd.grad(pg, xx)
    wts = ref_weights(m, mode)
    for i in range(x.shape[0]):
        for t in range(x.shape[1]):
            want_g = -wts[i][t] * adv[i, t].item() if m[i, t] else 0.0
            assert close(g[i, t].item(), want_g, 1e-5)


# ----------------------------------------------------------------------------------------------
# advantages
# ----------------------------------------------------------------------------------------------

@given(n=st.integers(0, 3), G=st.integers(1, 5), dtype=DTYPES, const=st.booleans(),
       vals=st.lists(st.floats(-10, 10, width=32), min_size=15, max_size=15))
@FAST
def test_group_advantages_equal_the_loop(n, G, dtype, const, vals):
    r = torch.tensor(vals[:n * G], dtype=dtype)
    if const:
        r = torch.full_like(r, 0.7)
    a = grpo_advantages(r, G)
    for k in range(n):
        grp = [float(v) for v in r[k * G:(k + 1) * G]]
        mu = sum(grp) / G
        sd = math.sqrt(sum((v - mu) ** 2 for v in grp) / (G - 1)) if G > 1 else 0.0
        for j in range(G):
            want = 0.0 if len(set(grp)) == 1 else (grp[j] - mu) / (sd + 1e-6)
            got = a[k * G + j].item()
            assert got == want if want == 0.0 else close(got, want, 1e-3)
    if G >= 2:
        lo = rloo_advantages(r, G)
        for k in range(n):
            grp = [float(v) for v in r[k * G:(k + 1) * G]]
            for j in range(G):
                assert close(lo[k * G + j].item(), grp[j] - (sum(grp) - grp[j]) / (G - 1), 1e-5)
    else:
        with pytest.raises(ValueError, match="group_size"):
            rloo_advantages(r, G)


@given(data=batches(n=1), dtype=DTYPES)
@FAST
def test_normalize_advantages_equals_the_loop(data, dtype):
    (x,), mask = data
    m = ones_like_mask(x, mask)
    y = normalize_advantages(x.to(dtype), mask)
    real = [x[i, t].to(dtype).item() for i in range(x.shape[0]) for t in range(x.shape[1]) if m[i, t]]
    assert torch.isfinite(y).all() and y.shape == x.shape
    if not real:
        assert (y == 0).all()
        return
    mu = sum(real) / len(real)
    sd = math.sqrt(sum((v - mu) ** 2 for v in real) / max(len(real) - 1, 1))
    for i in range(x.shape[0]):
        for t in range(x.shape[1]):
            if not m[i, t]:
                assert y[i, t].item() == 0.0
            elif len(set(real)) == 1:
                assert y[i, t].item() == 0.0                   # a constant batch: exactly 0
            else:
                want = (x[i, t].to(dtype).item() - mu) / (sd + 1e-8)
                assert close(y[i, t].item(), want, 1e-3)


# ----------------------------------------------------------------------------------------------
# staleness: lem-ch11-ratio estimators, filters, radii, means by age
# ----------------------------------------------------------------------------------------------

@given(data=batches(n=3), dtype=DTYPES, dim=st.sampled_from([None, -1]))
@FAST
def test_lemma51_estimators_equal_the_loop(data, dtype, dim):
    (a, b, mu), mask = data
    m = ones_like_mask(a, mask)
    a, b, mu = (t.to(dtype) for t in (a, b, mu))
    if mask is None:
        a, b, mu = a.clamp(-30, 30), b.clamp(-30, 30), mu.clamp(-30, 30)

    def term(i, t, x, y):
        return 0.5 * abs(math.exp(x[i, t].item() - mu[i, t].item()) - math.exp(y[i, t].item() - mu[i, t].item()))

    for got, x, y in ((S.half_abs_ratio_diff(a, b, mu, mask, dim), a, b), (S.update_shift(a, b, mu, mask, dim), a, b),
                      (S.staleness(a, mu, mask, dim), a, mu)):
        assert torch.isfinite(got).all()
        rows = range(a.shape[0])
        cells = lambda i, x=x, y=y: [term(i, t, x, y) for t in range(a.shape[1]) if m[i, t]]
        if dim is None:
            vals = [v for i in rows for v in cells(i)]
            assert close(got.item(), sum(vals) / len(vals) if vals else 0.0, 1e-4)
        else:
            for i in rows:
                vals = cells(i)
                assert close(got[i].item(), sum(vals) / len(vals) if vals else 0.0, 1e-4)


@given(data=batches(n=2, lim=3.0), eps=st.floats(0.01, 2.0), level=st.sampled_from(["token", "sequence",
                                                                                    "sequence-mean"]))
@FAST
def test_staleness_filter_equals_the_loop(data, eps, level):
    (lp, lb), mask = data
    m = ones_like_mask(lp, mask)
    keep = S.staleness_filter(lp, lb, eps, mask, level)
    for i in range(lp.shape[0]):
        d = [lp[i, t].item() - lb[i, t].item() for t in range(lp.shape[1]) if m[i, t]]
        for t in range(lp.shape[1]):
            if not m[i, t]:
                assert not keep[i, t]
                continue
            if level == "token":
                s = lp[i, t].item() - lb[i, t].item()
            elif level == "sequence":
                s = sum(d)
            else:
                s = sum(d) / max(1, len(d))
            if abs(abs(math.expm1(s)) - eps) > 1e-9:
                assert bool(keep[i, t]) == (abs(math.expm1(s)) <= eps)


@given(vers=st.lists(st.integers(0, 9), max_size=8), current=st.integers(0, 12), window=st.integers(-1, 5))
@FAST
def test_version_window_equals_the_loop_or_names_its_argument(vers, current, window):
    v = torch.tensor(vers, dtype=torch.long)
    if window < 1:
        with pytest.raises(ValueError, match="window"):
            S.version_window(v, current, window)
    elif vers and max(vers) > current:
        with pytest.raises(ValueError, match="versions"):
            S.version_window(v, current, window)
    else:
        assert S.version_window(v, current, window).tolist() == [current - x < window for x in vers]


@given(w=st.lists(st.floats(0, 1), min_size=0, max_size=5), eps=st.floats(-0.1, 0.5),
       ages=st.lists(st.integers(0, 6), max_size=6))
@FAST
def test_clip_radii_equal_the_formulas(w, eps, ages):
    a = torch.tensor(ages, dtype=torch.long)
    if eps <= 0:
        for f in (lambda: S.geppo_clip_radius(eps, [1.0]), lambda: S.age_clip_radius(eps, a)):
            with pytest.raises(ValueError, match="eps"):
                f()
        return
    assert S.age_clip_radius(eps, a).tolist() == pytest.approx([eps / (1 + x) for x in ages], rel=1e-6)
    s = sum(w)
    if not w or s == 0:
        with pytest.raises(ValueError, match="version_weights"):
            S.geppo_clip_radius(eps, w)
        return
    nu = [x / s for x in w]
    assert S.geppo_clip_radius(eps, nu) == pytest.approx(eps / sum(p * (i + 1) for i, p in enumerate(nu)), rel=1e-9)


@given(data=batches(n=1, min_b=0), ages=st.lists(st.integers(0, 3), min_size=3, max_size=3))
@FAST
def test_mean_by_age_equals_the_loop(data, ages):
    (x,), mask = data
    B = x.shape[0]
    assume(x.shape[1] > 0)
    m = ones_like_mask(x, mask)
    ag = torch.tensor(ages[:B], dtype=torch.long)
    out = S.mean_by_age(x, ag, mask)
    top = max(ages[:B]) if B else 0
    assert out.shape == (top + 1,)
    for a in range(top + 1):
        vals = [x[i, t].item() for i in range(B) if ages[i] == a for t in range(x.shape[1]) if m[i, t]]
        if vals:
            assert close(out[a].item(), sum(vals) / len(vals), 1e-9)
        else:
            assert math.isnan(out[a].item())          # documented: NaN for an age with no sample


# ----------------------------------------------------------------------------------------------
# estimators
# ----------------------------------------------------------------------------------------------

@given(data=batches(n=1, lim=80.0), share=st.booleans(), dim=st.sampled_from([None, -1]))
@FAST
def test_effective_sample_size_equals_the_loop(data, share, dim):
    (lw,), mask = data
    m = ones_like_mask(lw, mask)

    def kish(vals):
        if not vals:
            return 0.0
        top = max(vals)
        w = [math.exp(v - top) for v in vals]
        ess = sum(w) ** 2 / sum(x * x for x in w)
        return ess / len(vals) if share else ess

    got = effective_sample_size(lw, mask=mask, dim=dim, share=share)
    assert torch.isfinite(got).all()
    if dim is None:
        vals = [lw[i, t].item() for i in range(lw.shape[0]) for t in range(lw.shape[1]) if m[i, t]]
        assert close(got.item(), kish(vals), 1e-9)
    else:
        for i in range(lw.shape[0]):
            assert close(got[i].item(), kish([lw[i, t].item() for t in range(lw.shape[1]) if m[i, t]]), 1e-9)


@given(K=st.integers(1, 4), H=st.integers(1, 3), seed=st.integers(0, 1000))
@FAST
def test_importance_weight_variance_equals_the_loop(K, H, seed):
    g = torch.Generator().manual_seed(seed)
    lp, lq = torch.randn(2, K, generator=g, dtype=torch.float64)
    p = torch.softmax(lp, -1).tolist()
    q = torch.softmax(lq, -1).tolist()
    m2 = sum(pi * pi / qi for pi, qi in zip(p, q))
    assert close(importance_weight_variance(lp, lq, H).item(), m2 ** H - 1, 1e-9)


@given(M=st.integers(0, 4), P=st.integers(1, 3), seed=st.integers(0, 1000))
@FAST
def test_trace_covariance_equals_the_loop_or_names_samples(M, P, seed):
    x = torch.randn(M, P, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    if M < 2:
        with pytest.raises(ValueError, match="samples"):
            trace_covariance(x)
        return
    mean = [sum(x[m, p].item() for m in range(M)) / M for p in range(P)]
    want = sum((x[m, p].item() - mean[p]) ** 2 for m in range(M) for p in range(P)) / (M - 1)
    assert close(trace_covariance(x), want, 1e-12)


# ----------------------------------------------------------------------------------------------
# tabular (small cases): Bellman iteration, visitation, TV, surrogate
# ----------------------------------------------------------------------------------------------

@given(S=st.integers(1, 3), A=st.integers(1, 3), gamma=st.floats(0.0, 0.8), seed=st.integers(0, 1000))
@FAST
def test_tabular_solves_equal_the_bellman_loops(S, A, gamma, seed):
    g = torch.Generator().manual_seed(seed)
    mdp = T.random_mdp((), S, A, gamma, generator=g)
    pi = T.random_policy((), S, A, generator=g)
    P, R, rho0, pl = mdp.P.tolist(), mdp.R.tolist(), mdp.rho0.tolist(), pi.tolist()
    Vv = [0.0] * S
    for _ in range(300):                                   # gamma <= 0.8: 0.8^300 ~ 1e-29
        Vv = [sum(pl[s][a] * (R[s][a] + gamma * sum(P[s][a][t] * Vv[t] for t in range(S))) for a in range(A))
              for s in range(S)]
    assert all(close(x, y, 1e-9) for x, y in zip(T.value(mdp, pi).tolist(), Vv))
    d, p_t = [0.0] * S, list(rho0)
    for k in range(300):
        d = [d[s] + (1 - gamma) * gamma ** k * p_t[s] for s in range(S)]
        p_t = [sum(p_t[s] * pl[s][a] * P[s][a][t] for s in range(S) for a in range(A)) for t in range(S)]
    assert all(close(x, y, 1e-9) for x, y in zip(T.visitation(mdp, pi).tolist(), d))
    pi2 = T.random_policy((), S, A, generator=g)
    tv = [0.5 * sum(abs(pi[s, a].item() - pi2[s, a].item()) for a in range(A)) for s in range(S)]
    assert all(close(x, y, 1e-12) for x, y in zip(T.tv_distance(pi, pi2).tolist(), tv))


@given(S=st.integers(1, 3), A=st.integers(1, 3), bad=st.sampled_from(["shape", "dtype", "sum", "nan"]))
@FAST
def test_tabular_refuses_a_bad_policy_by_name(S, A, bad):
    mdp = T.random_mdp((), S, A, 0.5, generator=torch.Generator().manual_seed(0))
    pi = T.uniform_policy(mdp)
    pi = {"shape": pi[..., :1].expand(S, 1).clone() if A > 1 else torch.ones(S, 2) / 2, "dtype": pi.long(),
          "sum": pi * 2, "nan": pi.masked_fill(torch.ones_like(pi, dtype=torch.bool), NAN)}[bad]
    with pytest.raises((ValueError, TypeError)) as err:
        T.value(mdp, pi)
    assert names_an_argument(err, "pi")


# ----------------------------------------------------------------------------------------------
# controllers: one interface, positive and finite whatever the KLs
# ----------------------------------------------------------------------------------------------

@given(kls=st.lists(st.floats(0, 1e6), min_size=1, max_size=30), n_steps=st.integers(1, 10 ** 6),
       rule=st.sampled_from(AdaptiveKLController.RULES))
@FAST
def test_controllers_stay_in_bounds_and_equal_their_rules(kls, n_steps, rule):
    beta_ctl = AdaptiveKLController(1.0, 0.01, rule)
    beta = 1.0
    for kl in kls:
        if rule == "proportional":
            e = min(max(kl / 0.01 - 1, -0.2), 0.2)
            f = math.exp(min(0.1 * e * n_steps, 700.0))
        else:
            low = 0.01 / 1.5 if rule == "ppo" else 0.005
            f = 2.0 if kl > 0.015 else (0.5 if kl < low else 1.0)
        beta = min(max(beta * f, 1e-8), 1e8)
        got = beta_ctl.update(kl, n_steps)
        assert math.isfinite(got) and got > 0 and close(got, beta, 1e-9)
    for ctl in (KLLearningRateController(), KLTriggeredLR()):
        lr = 1e-3
        for kl in kls:
            lr2 = ctl(kl, lr)
            assert ctl.value_min <= lr2 <= ctl.value_max and close(lr2, min(max(lr * ctl.factor(kl), ctl.value_min),
                                                                            ctl.value_max), 1e-12)
            lr = lr2


# ----------------------------------------------------------------------------------------------
# bad input: the message names the argument
# ----------------------------------------------------------------------------------------------

BAD = st.sampled_from(["shape", "dtype", "eps", "mask", "aggregation", "float16", "mask-values"])


@given(bad=BAD, method=METHOD)
@FAST
def test_bad_input_is_refused_by_name(bad, method):
    x = torch.zeros(2, 3)
    args = dict(logp_new=x, logp_prox=x, logp_behav=x, advantages=x)
    kw = dict(eps=0.2, mask=None, aggregation="token-mean")
    want = {"shape": "advantages", "dtype": "logp_behav", "eps": "eps", "mask": "mask", "aggregation": "aggregation",
            "float16": "logp_new", "mask-values": "mask"}[bad]
    if bad == "shape":
        args["advantages"] = torch.zeros(2, 2)
    elif bad == "dtype":
        args["logp_behav"] = torch.zeros(2, 3, dtype=torch.long)
    elif bad == "eps":
        kw["eps"] = -0.1
    elif bad == "mask":
        kw["mask"] = torch.ones(3, 2)
    elif bad == "aggregation":
        kw["aggregation"] = "sum"
    elif bad == "float16":
        args = {k: v.half() for k, v in args.items()}
    else:
        kw["mask"] = torch.full((2, 3), 0.5)
    with pytest.raises((ValueError, TypeError)) as err:
        clipped_policy_loss(method, args["logp_new"], args["logp_prox"], args["logp_behav"], args["advantages"],
                            kw["eps"], mask=kw["mask"], aggregation=kw["aggregation"])
    assert names_an_argument(err, want)
    for fn, name in ((lambda: S.half_abs_ratio_diff(x, x, torch.zeros(3)), "logp_behav"),
                     (lambda: effective_sample_size(x, mask=torch.ones(2)), "mask"),
                     (lambda: grpo_advantages(torch.zeros(5), 2), "group_size"),
                     (lambda: normalize_advantages(torch.zeros(3), torch.ones(2)), "mask"),
                     (lambda: KLTriggeredLR()(-1.0, 1e-3), "kl"),
                     (lambda: AdaptiveKLController(init_beta=-1.0), "init_beta")):
        with pytest.raises((ValueError, TypeError)) as err:
            fn()
        assert names_an_argument(err, name)
