"""Tests for rlkit.objectives against per-token Python loops written from the papers."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.objectives import (
    AGGREGATIONS,
    LOG_RATIO_CAP,
    aggregate,
    clipped_policy_loss,
    decoupled_ppo_loss,
    geppo_loss,
    grpo_advantages,
    normalize_advantages,
    policy_gradient_loss,
    ppo_clip_loss,
    rloo_advantages,
)

torch.set_num_threads(1)
SET = settings(max_examples=30, deadline=None)
D64 = torch.float64


def data(B=4, T=6, seed=0, scale=1.0, dtype=D64):
    g = torch.Generator().manual_seed(seed)
    new = (torch.randn(B, T, generator=g, dtype=dtype) * scale).requires_grad_(True)
    old = torch.randn(B, T, generator=g, dtype=dtype) * scale
    beh = torch.randn(B, T, generator=g, dtype=dtype) * scale
    adv = torch.randn(B, T, generator=g, dtype=dtype)
    mask = torch.rand(B, T, generator=g) < 0.7
    mask[:, 0] = True
    return new, old, beh, adv, mask


# ----------------------------------------------------------------------------------------------
# slow references
# ----------------------------------------------------------------------------------------------

def ref_aggregate(x, m, mode, max_len=None):
    x, m = x.tolist(), m.tolist()
    B, T = len(x), len(x[0])
    if mode == "token-mean":
        s = sum(x[i][t] for i in range(B) for t in range(T) if m[i][t])
        n = sum(1 for i in range(B) for t in range(T) if m[i][t])
        return s / max(n, 1)
    if mode == "seq-mean-token-mean":
        per = []
        for i in range(B):
            n = sum(m[i])
            if n:
                per.append(sum(x[i][t] for t in range(T) if m[i][t]) / n)
        return sum(per) / max(len(per), 1)
    L = max_len or T
    return sum(x[i][t] for i in range(B) for t in range(T) if m[i][t]) / (B * L)


def ref_ppo_token(lpn, lpo, a, eps, eps_high, dual):
    r = math.exp(lpn - lpo)
    lo, hi = 1 - eps, 1 + eps_high
    rc = min(max(r, lo), hi)
    obj = min(r * a, rc * a)
    if dual is not None and a < 0:
        obj = max(obj, dual * a)
    clipped = rc * a < r * a
    return -obj, clipped


def ref_ppo_grad_token(lpn, lpo, a, eps, eps_high, dual):
    """d(-objective)/d logp_new for one token: -r*a if the unclipped branch is active, else 0."""
    r = math.exp(lpn - lpo)
    lo, hi = 1 - eps, 1 + eps_high
    if a >= 0:
        active = r <= hi
    else:
        active = r >= lo
        if dual is not None and r * a < dual * a:
            active = False
    return -r * a if active else 0.0


# ----------------------------------------------------------------------------------------------
# aggregation
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_aggregate_vs_reference(mode):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 7, generator=g, dtype=D64)
    m = torch.rand(5, 7, generator=g) < 0.6
    m[2] = False  # an empty sequence
    got = aggregate(x, m, mode)
    assert abs(got.item() - ref_aggregate(x, m, mode)) < 1e-12
    # no mask == all-ones mask
    assert torch.allclose(aggregate(x, None, mode), aggregate(x, torch.ones_like(m), mode))
    if mode == "seq-mean-token-sum-norm":
        assert abs(aggregate(x, m, mode, max_len=20).item() - ref_aggregate(x, m, mode, 20)) < 1e-12


def test_aggregate_gradient_weights():
    # lengths 1 and 3, padded length 4
    m = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    x = torch.zeros(2, 4, dtype=D64, requires_grad=True)
    want = {
        "token-mean": [[1 / 4, 0, 0, 0], [1 / 4, 1 / 4, 1 / 4, 0]],
        "seq-mean-token-mean": [[1 / 2, 0, 0, 0], [1 / 6, 1 / 6, 1 / 6, 0]],
        "seq-mean-token-sum-norm": [[1 / 8, 0, 0, 0], [1 / 8, 1 / 8, 1 / 8, 0]],
    }
    for mode, w in want.items():
        (gx,) = torch.autograd.grad(aggregate(x, m, mode), x)
        assert torch.allclose(gx, torch.tensor(w, dtype=D64)), mode


def test_aggregate_padding_garbage_and_empty_mask():
    x = torch.tensor([[1.0, float("nan")], [2.0, float("inf")]], requires_grad=True)
    m = torch.tensor([[1, 0], [1, 0]])
    for mode in AGGREGATIONS:
        v = aggregate(x, m, mode)
        assert torch.isfinite(v)
        (gx,) = torch.autograd.grad(v, x)
        assert torch.isfinite(gx).all()
        assert aggregate(x, torch.zeros_like(m), mode).item() == 0.0


# ----------------------------------------------------------------------------------------------
# policy gradient and PPO
# ----------------------------------------------------------------------------------------------

def test_policy_gradient_loss_gradient():
    new, _, _, adv, mask = data()
    loss = policy_gradient_loss(new, adv, mask)
    (g,) = torch.autograd.grad(loss, new)
    n = mask.sum().item()
    assert torch.allclose(g, torch.where(mask, -adv / n, torch.zeros((), dtype=D64)))
    # advantages are constants: no gradient flows into them
    a = adv.clone().requires_grad_(True)
    policy_gradient_loss(new, a, mask).backward()
    assert a.grad is None


@given(seed=st.integers(0, 10_000), eps=st.floats(0.05, 0.5), high=st.floats(0.05, 0.8),
       dual=st.one_of(st.none(), st.floats(1.5, 5.0)), mode=st.sampled_from(AGGREGATIONS))
@SET
def test_ppo_clip_vs_reference_loop(seed, eps, high, dual, mode):
    new, old, _, adv, mask = data(seed=seed, scale=0.3)
    loss, stats = ppo_clip_loss(new, old, adv, eps=eps, eps_high=high, dual_clip=dual,
                                mask=mask, aggregation=mode)
    B, T = new.shape
    tok = torch.zeros(B, T, dtype=D64)
    gtok = torch.zeros(B, T, dtype=D64)
    clipped = 0
    for i in range(B):
        for t in range(T):
            l, c = ref_ppo_token(new[i, t].item(), old[i, t].item(), adv[i, t].item(), eps,
                                 high, dual)
            tok[i, t] = l
            gtok[i, t] = ref_ppo_grad_token(new[i, t].item(), old[i, t].item(),
                                            adv[i, t].item(), eps, high, dual)
            clipped += int(c and mask[i, t])
    assert abs(loss.item() - ref_aggregate(tok, mask, mode)) < 1e-10
    (g,) = torch.autograd.grad(loss, new)
    # gradient of the aggregate = per-token gradient times the aggregation weight
    x = torch.zeros(B, T, dtype=D64, requires_grad=True)
    (wts,) = torch.autograd.grad(aggregate(x, mask, mode), x)
    assert torch.allclose(g, gtok * wts, atol=1e-10)
    assert abs(stats["clip_fraction"].item() - clipped / mask.sum().item()) < 1e-12


def test_ppo_stats_approx_kl():
    new, old, _, adv, mask = data(seed=3, scale=0.2)
    _, st_ = ppo_clip_loss(new, old, adv, mask=mask)
    lr = (new - old).detach()[mask]
    assert abs(st_["approx_kl"].item() - (lr.exp() - 1 - lr).mean().item()) < 1e-12
    assert abs(st_["approx_kl_k1"].item() - (-lr).mean().item()) < 1e-12


def test_ppo_on_policy_gradient_is_policy_gradient():
    # at ratio = 1 nothing is clipped and the gradient equals the plain policy gradient
    new, _, _, adv, mask = data(seed=4)
    loss, st_ = ppo_clip_loss(new, new.detach(), adv, mask=mask)
    g1 = torch.autograd.grad(loss, new)[0]
    g2 = torch.autograd.grad(policy_gradient_loss(new, adv, mask), new)[0]
    assert torch.allclose(g1, g2) and st_["clip_fraction"].item() == 0.0


EXTREMES = torch.tensor([[50.0, -50.0, 50.0, -50.0, 0.0, 20.0]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_extreme_log_ratios_finite(dtype):
    new = EXTREMES.to(dtype).clone().requires_grad_(True)
    zero = torch.zeros_like(new).detach()
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, 2.0, -3.0]], dtype=dtype)
    outs = [
        ppo_clip_loss(new, zero, adv)[0],
        ppo_clip_loss(new, zero, adv, dual_clip=3.0, eps_high=0.28)[0],
        geppo_loss(new, zero - 1.0, -new.detach() * 0.5, adv)[0],
        geppo_loss(new, zero, zero + 50.0, adv)[0],
        decoupled_ppo_loss(new, new.detach() * 0.5, zero, adv)[0],   # log w, log r: +-25
        decoupled_ppo_loss(new, zero, zero + 50.0, adv, behav_clip=2.0)[0],
        policy_gradient_loss(new, adv),
    ]
    for i, loss in enumerate(outs):
        assert torch.isfinite(loss), i
        (g,) = torch.autograd.grad(loss, new)
        assert torch.isfinite(g).all(), i
    for _, st_ in [ppo_clip_loss(new, zero, adv), geppo_loss(new, zero, zero, adv),
                   decoupled_ppo_loss(new, zero, zero, adv)]:
        assert all(torch.isfinite(v) for v in st_.values())


def test_padding_with_inf_logprobs_gives_no_nan():
    new = torch.tensor([[-1.0, float("-inf")]], requires_grad=True)
    old = torch.tensor([[-1.2, float("-inf")]])
    adv = torch.tensor([[1.0, float("nan")]])
    m = torch.tensor([[True, False]])
    for fn in (lambda: ppo_clip_loss(new, old, adv, mask=m),
               lambda: geppo_loss(new, old, old, adv, mask=m),
               lambda: decoupled_ppo_loss(new, old, old, adv, mask=m)):
        loss, stats = fn()
        (g,) = torch.autograd.grad(loss, new)
        assert torch.isfinite(loss) and not torch.isnan(g).any()
        assert all(torch.isfinite(v) for v in stats.values())


def test_gradcheck_objectives_float64():
    new, old, beh, adv, mask = data(B=3, T=4, seed=5, scale=0.1)
    fns = [
        lambda x: policy_gradient_loss(x, adv, mask, "seq-mean-token-mean"),
        lambda x: ppo_clip_loss(x, old, adv, mask=mask)[0],
        lambda x: ppo_clip_loss(x, old, adv, eps_high=0.3, dual_clip=2.0, mask=mask,
                                aggregation="seq-mean-token-sum-norm")[0],
        lambda x: geppo_loss(x, old, beh, adv, mask=mask)[0],
        lambda x: decoupled_ppo_loss(x, old, beh, adv, behav_clip=1.5, mask=mask)[0],
        lambda x: aggregate(x * x, mask, "seq-mean-token-mean"),
    ]
    for f in fns:
        assert torch.autograd.gradcheck(f, (new,))


# ----------------------------------------------------------------------------------------------
# method 1 and method 2 (Part II)
# ----------------------------------------------------------------------------------------------

def test_geppo_vs_reference_loop():
    new, prox, beh, adv, mask = data(seed=6, scale=0.4)
    eps = 0.2
    loss, stats = geppo_loss(new, prox, beh, adv, eps=eps, mask=mask)
    B, T = new.shape
    tok = torch.zeros(B, T, dtype=D64)
    shift = []
    for i in range(B):
        for t in range(T):
            r_new = math.exp(new[i, t].item() - beh[i, t].item())
            r_k = math.exp(prox[i, t].item() - beh[i, t].item())
            a = adv[i, t].item()
            rc = min(max(r_new, r_k - eps), r_k + eps)
            tok[i, t] = -min(r_new * a, rc * a)
            if mask[i, t]:
                shift.append(abs(r_new - r_k))
    assert abs(loss.item() - ref_aggregate(tok, mask, "token-mean")) < 1e-10
    assert abs(stats["update_shift"].item() - 0.5 * np.mean(shift)) < 1e-12


def test_geppo_staleness_stat_is_half_the_mean_abs_deviation():
    # S-hat = 1/2 mean |rho_k - 1| over the mask (the 1/2 of lem-ch11-ratio: an expected TV in [0, 1])
    new, prox, beh, adv, mask = data(seed=16, scale=0.5)
    stats = geppo_loss(new, prox, beh, adv, eps=0.2, mask=mask)[1]
    dev = [abs(math.exp(prox[i, t].item() - beh[i, t].item()) - 1.0)
           for i in range(new.shape[0]) for t in range(new.shape[1]) if mask[i, t]]
    assert abs(stats["staleness"].item() - 0.5 * np.mean(dev)) < 1e-12
    # exact on a stratified sample: tokens drawn in exact proportion to mu give exactly TV(pi_k, mu)
    mu, pk = torch.tensor([0.5, 0.25, 0.25], dtype=D64), torch.tensor([0.2, 0.3, 0.5], dtype=D64)
    a = torch.tensor([0, 0, 1, 2], dtype=torch.long)               # 4 samples in mu's proportions
    lb, lk = mu.log()[a][None], pk.log()[a][None]
    z = torch.zeros_like(lb, requires_grad=True)
    st_ = geppo_loss(lk + z, lk, lb, torch.ones_like(lb))[1]
    assert abs(st_["staleness"].item() - 0.5 * (pk - mu).abs().sum().item()) < 1e-12   # = 0.3


def test_behav_clip_truncates_where_areal_masks():
    # rlkit: w_bar = min(w, c); a token with w > c keeps weight c and a nonzero gradient. AReaL's
    # behav_imp_weight_cap zeroes such a token's weight (token still in the token-mean denominator);
    # rlkit reproduces that with behav_clip=None and advantages * 1{w <= c}.
    _, prox, beh, adv, mask = data(seed=17, scale=0.8)
    g0 = torch.Generator().manual_seed(18)
    new = (prox + 0.3 * torch.randn(prox.shape, generator=g0, dtype=D64)).requires_grad_(True)
    cap = 1.5
    w = torch.exp(prox - beh)
    assert ((w > cap) & mask).any() and ((w <= cap) & mask).any()
    loss, stats = decoupled_ppo_loss(new, prox, beh, adv, eps=0.2, behav_clip=cap, mask=mask)
    g = torch.autograd.grad(loss, new)[0]
    r = torch.exp(new.detach() - prox)
    inside = (r > 0.8) & (r < 1.2)                                  # clip inactive at these tokens
    big = (w > cap) & mask & inside
    assert big.any() and (g[big] != 0).all()                        # truncated, not masked
    assert abs(stats["behav_truncated_fraction"].item() - ((w > cap) & mask).sum().item() / mask.sum().item()) < 1e-12
    B, T = new.shape
    areal = 0.0
    for i in range(B):
        for t in range(T):
            if not mask[i, t]:
                continue
            wi, ri, a = w[i, t].item(), r[i, t].item(), adv[i, t].item()
            keep = 1.0 if wi <= cap else 0.0
            areal += -keep * wi * min(ri * a, min(max(ri, 0.8), 1.2) * a)
    areal /= mask.sum().item()
    ours = decoupled_ppo_loss(new, prox, beh, adv * (prox - beh <= math.log(cap)), eps=0.2, mask=mask)[0]
    assert abs(ours.item() - areal) < 1e-10
    assert abs(loss.item() - areal) > 1e-6                          # the two rules differ on this batch


def test_geppo_on_policy_is_ppo():
    new, old, _, adv, mask = data(seed=7, scale=0.3)
    a = geppo_loss(new, old, old, adv, eps=0.15, mask=mask)[0]
    b = ppo_clip_loss(new, old, adv, eps=0.15, mask=mask)[0]
    assert torch.allclose(a, b)
    ga, gb = (torch.autograd.grad(x, new)[0] for x in (a, b))
    assert torch.allclose(ga, gb)


def test_decoupled_vs_reference_and_identities():
    new, prox, beh, adv, mask = data(seed=8, scale=0.4)
    loss, stats = decoupled_ppo_loss(new, prox, beh, adv, eps=0.2, behav_clip=1.3, mask=mask)
    B, T = new.shape
    tok = torch.zeros(B, T, dtype=D64)
    for i in range(B):
        for t in range(T):
            w = min(math.exp(prox[i, t].item() - beh[i, t].item()), 1.3)
            r = math.exp(new[i, t].item() - prox[i, t].item())
            a = adv[i, t].item()
            tok[i, t] = -w * min(r * a, min(max(r, 0.8), 1.2) * a)
    assert abs(loss.item() - ref_aggregate(tok, mask, "token-mean")) < 1e-10
    # mu = pi_prox: plain PPO
    a = decoupled_ppo_loss(new, prox, prox, adv, mask=mask)[0]
    b = ppo_clip_loss(new, prox, adv, mask=mask)[0]
    assert torch.allclose(a, b)
    # no truncation: PPO-clip with advantage w * A (the article's A-hat = rho_k A)
    w = torch.exp(prox - beh)
    a = decoupled_ppo_loss(new, prox, beh, adv, mask=mask)[0]
    b = ppo_clip_loss(new, prox, w * adv, mask=mask)[0]
    assert torch.allclose(a, b)
    # unclipped region: gradient equals the importance-sampled PG, grad of (pi/mu) A
    newc = prox.clone().requires_grad_(True)
    g1 = torch.autograd.grad(decoupled_ppo_loss(newc, prox, beh, adv, mask=mask)[0], newc)[0]
    is_pg = -(torch.exp(newc - beh) * adv)[mask].sum() / mask.sum()
    g2 = torch.autograd.grad(is_pg, newc)[0]
    assert torch.allclose(g1, g2)


# ----------------------------------------------------------------------------------------------
# per-sample clip radii and the one dispatcher of the stale trainers
# ----------------------------------------------------------------------------------------------

def _group_loop(method, new, prox, beh, adv, eps, mask=None, aggregation="token-mean", behav_clip=None):
    """The stale trainers' old computation: one loss call per distinct radius, weighted by the
    group's share of tokens (token-mean) or of non-empty sequences (sequence means)."""
    fns = {"standard": lambda s, e: ppo_clip_loss(new[s], beh[s], adv[s], eps=e, mask=None if mask is None else mask[s],
                                                  aggregation=aggregation),
           "adaptive": lambda s, e: geppo_loss(new[s], prox[s], beh[s], adv[s], eps=e,
                                               mask=None if mask is None else mask[s], aggregation=aggregation),
           "decoupled": lambda s, e: decoupled_ppo_loss(new[s], prox[s], beh[s], adv[s], eps=e, behav_clip=behav_clip,
                                                        mask=None if mask is None else mask[s],
                                                        aggregation=aggregation)}
    if mask is None:
        units = torch.ones(new.shape[0], dtype=new.dtype)
    else:
        m = mask > 0
        units = (m.sum(-1) if aggregation == "token-mean" else (m.sum(-1) > 0)).to(new.dtype)
    total = units.sum()
    loss = 0.0
    for e in torch.unique(eps).tolist():
        rows = [i for i in range(new.shape[0]) if eps[i].item() == e]
        w = units[rows].sum() / total
        if w > 0:
            loss = loss + w * fns[method](rows, e)[0]
    return loss


@pytest.mark.parametrize("method", ["standard", "adaptive", "decoupled"])
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_per_response_radius_equals_the_group_weighted_loop(method, aggregation):
    # the LLM trainer: [B, T] tokens with a mask, one radius per response (age schedule)
    new, prox, beh, adv, mask = data(B=6, T=5, seed=11, scale=0.5)
    eps = torch.tensor([0.2, 0.1, 0.2, 0.05, 0.1, 0.2], dtype=D64)
    bc = 1.5 if method == "decoupled" else None
    loss, st_ = clipped_policy_loss(method, new, prox, beh, adv, eps, behav_clip=bc, mask=mask,
                                    aggregation=aggregation)
    want = _group_loop(method, new, prox, beh, adv, eps, mask, aggregation, behav_clip=bc)
    assert abs(loss.item() - float(want)) < 1e-12
    g1 = torch.autograd.grad(loss, new)[0]
    g2 = torch.autograd.grad(want, new)[0]
    assert torch.allclose(g1, g2, atol=1e-14)
    assert 0.0 <= st_["clip_fraction"].item() <= 1.0


@pytest.mark.parametrize("method", ["standard", "adaptive", "decoupled"])
def test_per_sample_radius_on_flat_batches_equals_the_group_loop(method):
    # the CartPole trainer: flat [B] tensors, one radius per sample
    new, prox, beh, adv, _ = data(B=1, T=12, seed=12, scale=0.5)
    new, prox, beh, adv = (x[0] for x in (new, prox, beh, adv))
    new = new.detach().requires_grad_(True)
    eps = torch.tensor([0.2, 0.1, 0.2 / 3] * 4, dtype=D64)
    loss, _ = clipped_policy_loss(method, new, prox, beh, adv, eps)
    want = _group_loop(method, new[:, None], prox[:, None], beh[:, None], adv[:, None], eps)
    assert abs(loss.item() - float(want)) < 1e-12
    # and, token by token, a radius tensor gives the same loss as a float where all radii are equal
    same = clipped_policy_loss(method, new, prox, beh, adv, torch.full_like(new, 0.2).detach())[0]
    assert same.item() == clipped_policy_loss(method, new, prox, beh, adv, 0.2)[0].item()


def test_clipped_policy_loss_dispatches_to_the_named_losses():
    new, prox, beh, adv, mask = data(seed=13, scale=0.4)
    pairs = [("standard", ppo_clip_loss(new, beh, adv, eps=0.15, mask=mask)),
             ("adaptive", geppo_loss(new, prox, beh, adv, eps=0.15, mask=mask)),
             ("decoupled", decoupled_ppo_loss(new, prox, beh, adv, eps=0.15, mask=mask))]
    for method, (want, want_st) in pairs:
        got, got_st = clipped_policy_loss(method, new, prox, beh, adv, 0.15, mask=mask)
        assert got.item() == want.item() and got_st.keys() == want_st.keys()
    with pytest.raises(ValueError, match="method"):
        clipped_policy_loss("incremental", new, prox, beh, adv, 0.2)
    with pytest.raises(ValueError, match="behav_clip"):
        clipped_policy_loss("adaptive", new, prox, beh, adv, 0.2, behav_clip=2.0)
    with pytest.raises(ValueError, match="eps"):
        clipped_policy_loss("standard", new, prox, beh, adv, torch.full((3,), 0.2, dtype=D64))
    with pytest.raises(ValueError, match="eps"):
        clipped_policy_loss("standard", new, prox, beh, adv, torch.full((new.shape[0],), -0.2, dtype=D64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradient_is_zero_where_the_clip_binds_even_past_overflow(dtype):
    # log-ratios 100 and -100: exp overflows float32/bfloat16 at 88.7
    lr = torch.tensor([100.0, 100.0, -100.0, 50.0, -50.0, 100.0], dtype=dtype)
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0, -1.0, -1.0], dtype=dtype)
    new = lr.clone().requires_grad_(True)
    zero = torch.zeros_like(lr)
    loss, st_ = ppo_clip_loss(new, zero, adv, dual_clip=3.0)
    (g,) = torch.autograd.grad(loss, new)
    assert torch.isfinite(loss) and torch.isfinite(g).all()
    # 0: A > 0, r > 1 + eps: clipped; 1, 5: A < 0, r > c: dual clip; 2: A < 0, r < 1 - eps: clipped;
    # 3: A > 0, r > 1 + eps: clipped; 4: A < 0, r < 1 - eps: clipped -> every gradient is 0
    assert (g == 0).all()
    # without the dual clip, index 1 is unclipped: ratio held at e^60, gradient -A e^60 / n (finite)
    loss, _ = ppo_clip_loss(new, zero, adv)
    (g,) = torch.autograd.grad(loss, new)
    assert torch.isfinite(loss) and torch.isfinite(g).all()
    want = math.exp(LOG_RATIO_CAP) / 6
    assert abs(g[1].item() - want) < 1e-2 * want and abs(g[5].item() - want) < 1e-2 * want
    assert g[0] == 0 and g[2] == 0 and g[3] == 0 and g[4] == 0


def test_float16_is_refused_by_name():
    x = torch.zeros(2, 3, dtype=torch.float16)
    with pytest.raises(TypeError, match="logp_new.*float16"):
        ppo_clip_loss(x, x, x)
    with pytest.raises(TypeError, match="logp_new.*float16"):
        clipped_policy_loss("adaptive", x, x, x, x, 0.2)


@pytest.mark.parametrize("shape", [(0,), (0, 4), (3, 0)])
def test_every_loss_is_finite_on_an_empty_batch(shape):
    z = torch.zeros(shape, requires_grad=True)
    m = torch.zeros(shape, dtype=torch.bool)
    for mask in (None, m):
        for agg in AGGREGATIONS:
            losses = [policy_gradient_loss(z, z, mask, agg), ppo_clip_loss(z, z, z, mask=mask, aggregation=agg)[0],
                      geppo_loss(z, z, z, z, mask=mask, aggregation=agg)[0],
                      decoupled_ppo_loss(z, z, z, z, mask=mask, aggregation=agg)[0]]
            losses += [clipped_policy_loss(k, z, z, z, z, 0.2, mask=mask, aggregation=agg)[0]
                       for k in ("standard", "adaptive", "decoupled")]
            for loss in losses:
                assert loss.item() == 0.0
                assert torch.isfinite(torch.autograd.grad(loss, z, allow_unused=True)[0] if loss.requires_grad
                                      else torch.zeros(())).all()


# ----------------------------------------------------------------------------------------------
# GRPO family
# ----------------------------------------------------------------------------------------------

def test_grpo_hand_worked():
    r = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    a = grpo_advantages(r, 4, eps=0.0 + 1e-12)
    # group 1: mean .75, sample std = sqrt(.75*.25*4/3) = .5 -> (.5, -1.5, .5, .5)
    assert torch.allclose(a[:4], torch.tensor([0.5, -1.5, 0.5, 0.5]))
    assert torch.equal(a[4:], torch.zeros(4))                    # identical rewards
    assert torch.allclose(grpo_advantages(r, 4, scale="none")[:4],
                          torch.tensor([0.25, -0.75, 0.25, 0.25]))
    assert torch.equal(grpo_advantages(r, 1), torch.zeros(8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_identical_rewards_give_exactly_zero_advantages(dtype):
    # the case: a float32 group of 0.7s used to get 0.056 each (an ulp over a 1e-6 std)
    r = torch.full((3, 8), 0.7, dtype=dtype)
    for scale in ("std", "none"):
        assert (grpo_advantages(r, 4, scale=scale) == 0).all()
    assert (normalize_advantages(r) == 0).all()
    assert (normalize_advantages(r, torch.ones(3, 8)) == 0).all()
    pad = r.clone()
    pad[:, -1] = float("nan")                       # padding: the real entries are all 0.7
    m = torch.ones(3, 8, dtype=torch.bool)
    m[:, -1] = False
    assert (normalize_advantages(pad, m) == 0).all()


@given(n=st.integers(1, 4), G=st.integers(2, 6), seed=st.integers(0, 10_000))
@SET
def test_grpo_and_rloo_vs_loops(n, G, seed):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(2, n * G, generator=g, dtype=D64)
    a = grpo_advantages(r, G, eps=1e-6)
    l = rloo_advantages(r, G)
    for row in range(2):
        for k in range(n):
            grp = r[row, k * G:(k + 1) * G].tolist()
            mu = sum(grp) / G
            sd = math.sqrt(sum((x - mu) ** 2 for x in grp) / (G - 1))
            for j in range(G):
                assert abs(a[row, k * G + j].item() - (grp[j] - mu) / (sd + 1e-6)) < 1e-9
                others = [grp[i] for i in range(G) if i != j]
                assert abs(l[row, k * G + j].item() - (grp[j] - sum(others) / (G - 1))) < 1e-12
    # RLOO advantages sum to zero in each group and equal G/(G-1) times the centred reward
    assert torch.allclose(l.reshape(2, n, G).sum(-1), torch.zeros(2, n, dtype=D64), atol=1e-12)
    assert torch.allclose(l, grpo_advantages(r, G, scale="none") * G / (G - 1))


def test_normalize_advantages():
    g = torch.Generator().manual_seed(9)
    x = torch.randn(4, 7, generator=g, dtype=D64) * 3 + 2
    m = torch.rand(4, 7, generator=g) < 0.6
    y = normalize_advantages(x, m)
    vals = np.array(x[m].tolist())
    want = (vals - vals.mean()) / (vals.std(ddof=1) + 1e-8)
    assert np.allclose(y[m].numpy(), want)
    assert (y[~m] == 0).all()
    z = normalize_advantages(x)
    assert abs(z.mean().item()) < 1e-12 and abs(z.std().item() - 1) < 1e-6
    one = normalize_advantages(torch.tensor([3.0]))
    assert torch.isfinite(one).all()
    assert normalize_advantages(torch.zeros(0)).shape == (0,)
    assert normalize_advantages(torch.zeros(2, 0), torch.zeros(2, 0)).shape == (2, 0)
    assert grpo_advantages(torch.zeros(0), 4).shape == (0,)


# ----------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------

def test_validation_names_arguments():
    new, old, beh, adv, mask = data()
    with pytest.raises(ValueError, match="mask"):
        ppo_clip_loss(new, old, adv, mask=mask[:, :3])
    with pytest.raises(ValueError, match="advantages"):
        ppo_clip_loss(new, old, adv[:, :1])
    with pytest.raises(ValueError, match="logp_old"):
        ppo_clip_loss(new, old[0], adv)
    with pytest.raises(TypeError, match="logp_new"):
        ppo_clip_loss(new.detach().long(), old, adv)
    with pytest.raises(ValueError, match="eps"):
        ppo_clip_loss(new, old, adv, eps=1.5)
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_clip_loss(new, old, adv, dual_clip=0.5)
    with pytest.raises(ValueError, match="aggregation"):
        ppo_clip_loss(new, old, adv, aggregation="sum")
    with pytest.raises(ValueError, match="logp_behav"):
        geppo_loss(new, old, beh[:2], adv)
    with pytest.raises(ValueError, match="behav_clip"):
        decoupled_ppo_loss(new, old, beh, adv, behav_clip=-1.0)
    with pytest.raises(ValueError, match="mask"):
        aggregate(adv, torch.full(adv.shape, 2.0))
    with pytest.raises(ValueError, match="max_len"):
        aggregate(adv, None, "seq-mean-token-sum-norm", max_len=0)
    with pytest.raises(ValueError, match="group_size"):
        grpo_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="scale"):
        grpo_advantages(torch.zeros(8), 4, scale="mad")
    with pytest.raises(ValueError, match="group_size"):
        rloo_advantages(torch.zeros(8), 1)
    with pytest.raises(TypeError, match="rewards"):
        grpo_advantages(torch.zeros(8, dtype=torch.int64), 4)
    with pytest.raises(ValueError, match="mask"):
        normalize_advantages(torch.zeros(3), torch.ones(4))
