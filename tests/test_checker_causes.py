"""Wrong answers written as a student would write them, each caught WITH its cause (issue 23, item 7).

The teaching review (``../shared/reviews/teaching.md``, section 1b) wrote slips from the exercise texts
alone; 11 of the 50 it caught came with no cause, and two were not caught or wrongly rejected. Each
function below is a slip written independently of the registered mistakes (a different formula or
code path that computes the same wrong thing), so a test passes only if the checker recognises the
slip by its outputs and names it.
"""
from __future__ import annotations

import math

import pytest
import torch

from rlkit.exercises import check


def _reinforce_loss_over_T(logits, actions, weights, mask):
    logp = torch.log_softmax(logits, -1).gather(-1, actions[..., None]).squeeze(-1)
    per_step = -(weights.detach() * logp * mask)
    return per_step.sum() / logits.shape[1]


def _inverse_shifted_trace(advantages, values, next_values, discounts, lam):
    lam = torch.as_tensor(lam, dtype=advantages.dtype).expand_as(advantages)
    rewards = torch.zeros_like(advantages)
    T = advantages.shape[-1]
    for t in range(T):
        if t + 1 < T:
            delta = advantages[..., t] - discounts[..., t + 1] * lam[..., t + 1] * advantages[..., t + 1]
        else:
            delta = advantages[..., t]
        rewards[..., t] = delta - discounts[..., t] * next_values[..., t] + values[..., t]
    return rewards


def _tempering_with_the_count(log_w, share):
    # the ESS count (not the share ESS / n) compared with the share
    lw = log_w.double() - log_w.double().amax(-1, keepdim=True)
    lo, hi = torch.zeros(lw.shape[:-1], dtype=torch.float64), torch.ones(lw.shape[:-1], dtype=torch.float64)
    full = 1.0 / torch.softmax(lw, -1).pow(2).sum(-1) >= share
    for _ in range(50):
        mid = (lo + hi) / 2
        ok = 1.0 / torch.softmax(mid[..., None] * lw, -1).pow(2).sum(-1) >= share
        lo, hi = torch.where(ok, mid, lo), torch.where(ok, hi, mid)
    return torch.where(full, torch.ones_like(lo), lo).to(log_w.dtype)


def _shaped_rewards_wrapping(score, logp, logp_ref, mask, beta):
    m = mask.to(logp.dtype)
    r = -beta * (logp - logp_ref) * m
    for i in range(r.shape[0]):
        last = int(m[i].sum().item()) - 1          # -1 for an empty row: wraps to the last column
        r[i, last] = r[i, last] + score[i]
    return r


def _response_logprob_hf_shift(logits, response_ids, mask):
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, response_ids[:, 1:, None]).squeeze(-1)
    return (lp * mask[:, 1:]).sum(-1)


def _mis_no_mask(logp_learner, logp_sampler, mask, cap, level="token"):
    log_rho = logp_learner - logp_sampler
    if level == "sequence":
        keep = log_rho.sum(-1, keepdim=True) <= math.log(cap)
    else:
        keep = log_rho <= math.log(cap)
    return torch.where(keep, torch.exp(log_rho), torch.zeros_like(log_rho))


SLIPS = [
    ("reinforce_loss", _reinforce_loss_over_T, "you divided by T"),
    ("rewards_from_advantages", _inverse_shifted_trace, "discounts[..., t+1] * lam[..., t+1]"),
    ("tempering_exponent", _tempering_with_the_count, "ESS COUNT"),
    ("kl_shaped_rewards", _shaped_rewards_wrapping, "index -1 wraps around"),
    ("response_logprob", _response_logprob_hf_shift, "Hugging Face"),
    ("masked_is_weights", _mis_no_mask, "the mask is ignored"),
]


@pytest.mark.parametrize("name, slip, cause", SLIPS, ids=[s[0] for s in SLIPS])
def test_a_student_slip_is_caught_with_its_cause(name, slip, cause):
    result = check(slip, name, verbose=False)
    assert not result, f"{name}: the slip passed"
    assert cause in result.message, f"{name}: caught without the right cause:\n{result.message}"


def test_a_correct_float32_tempering_exponent_is_accepted():
    """The review's false rejection of a correct, more accurate float32 ESS (1/sum(softmax^2)) must not come back
    in the exercise that replaced it: the same formula inside a bisection, in float32, passes."""
    def tempering_exponent(log_w, share):
        lo = torch.zeros(log_w.shape[:-1], dtype=log_w.dtype)
        hi = torch.ones(log_w.shape[:-1], dtype=log_w.dtype)
        for _ in range(30):
            mid = (lo + hi) / 2
            ok = 1.0 / torch.softmax(mid[..., None] * log_w, -1).pow(2).sum(-1) / log_w.shape[-1] >= share
            lo, hi = torch.where(ok, mid, lo), torch.where(ok, hi, mid)
        full = 1.0 / torch.softmax(log_w, -1).pow(2).sum(-1) / log_w.shape[-1] >= share - 1e-6
        return torch.where(full, torch.ones_like(lo), lo)

    assert check(tempering_exponent, verbose=False)



def test_an_empty_row_gets_neither_score_nor_penalty():
    from rlkit.exercises import get
    ex = get("kl_shaped_rewards")
    empty = [c for c in ex.get_cases() if "no real token" in c.label]
    assert len(empty) == 1
    score, logp, logp_ref, mask, beta = empty[0].args
    out = ex.reference(score, logp, logp_ref, mask, beta)
    assert torch.equal(out[1], torch.zeros(3, dtype=out.dtype))
    # row 0 by hand: penalty on its two real tokens, the score at the second
    expect = -beta * (logp[0, :2] - logp_ref[0, :2])
    expect[1] += score[0]
    assert torch.allclose(out[0, :2], expect, atol=1e-12) and out[0, 2] == 0
    assert math.isfinite(float(out.sum()))


def test_the_dtype_contract_of_best_of_k_is_checked():
    """The review's float32 pass@k (the exercise stated float64) passed the checker of rlkit 0.2; it must not.
    The exercise is now chapter 22's best_of_k_estimate, its generalisation to graded rewards (issue 23)."""
    def best_of_k_float32(rewards, k):
        n = rewards.shape[-1]
        w = torch.tensor([math.comb(i - 1, k - 1) / math.comb(n, k) for i in range(1, n + 1)], dtype=torch.float32)
        return (rewards.float().sort(-1).values * w).sum(-1)

    result = check(best_of_k_float32, "best_of_k_estimate", verbose=False)
    assert not result and "wrong dtype: expected torch.float64, got torch.float32" in result.message


def _vtrace_slip(swap=False, raw_delta_weight=False, undiscounted_trace=False):
    """A student's n-step V-trace target as a forward sum over each window (the reference is written
    differently), with one slip."""
    def vtrace_nstep_target(log_rhos, rewards, values, next_values, discounts, clip_rho, clip_c, n):
        rho = torch.exp(log_rhos)
        w_delta = rho if raw_delta_weight else rho.clamp(max=clip_c if swap else clip_rho)
        c = rho.clamp(max=clip_rho if swap else clip_c)
        delta = w_delta * (rewards + discounts * next_values - values)
        T = values.shape[-1]
        out = values.clone()
        for t in range(T):
            coef = torch.ones_like(values[..., 0])
            for s in range(t, min(t + n, T)):
                out[..., t] = out[..., t] + coef * delta[..., s]
                coef = coef * (1.0 if undiscounted_trace else discounts[..., s]) * c[..., s]
        return out
    return vtrace_nstep_target


def _nstep_off_by_one(rewards, values, mask, lam, h):
    """Chapter 14's truncated lambda-return, its n-step targets bootstrapped one token early."""
    L = mask.sum(-1).long()
    out = torch.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        for t in range(int(L[i])):
            def G(n, i=i, t=t):
                end = min(t + n, int(L[i]))
                return rewards[i, t:end].sum() + (values[i, t + n - 1] if t + n < int(L[i]) else 0.0)
            out[i, t] = sum((1 - lam) * lam ** (n - 1) * G(n) for n in range(1, h)) + lam ** (h - 1) * G(h)
    return out


def _expectile_over_all_entries(values, kappa, mask):
    # chapter 21's expectile by bisection, as a student might write it, over every entry, padding included
    out = torch.zeros(values.shape[0], dtype=values.dtype)
    for b in range(values.shape[0]):
        x, lo, hi = values[b], float(values[b].min()), float(values[b].max())
        for _ in range(200):
            v = 0.5 * (lo + hi)
            g = kappa * float((x - v).clamp_min(0).sum()) - (1 - kappa) * float((v - x).clamp_min(0).sum())
            lo, hi = (v, hi) if g > 0 else (lo, v)
        out[b] = 0.5 * (lo + hi)
    return out


MORE_SLIPS = [
    ("vtrace_nstep_target", _vtrace_slip(swap=True), "rho-bar and c-bar are swapped"),
    ("vtrace_nstep_target", _vtrace_slip(raw_delta_weight=True), "weighted by the raw ratio"),
    ("vtrace_nstep_target", _vtrace_slip(undiscounted_trace=True), "the discount is missing from the trace"),
    ("truncated_lambda_target", _nstep_off_by_one, "off by one in the n-step targets"),
    ("masked_expectile", _expectile_over_all_entries, "the padding counts"),
]


@pytest.mark.parametrize("name, slip, cause", MORE_SLIPS, ids=[f"{s[0]}-{s[2][:20]}" for s in MORE_SLIPS])
def test_the_review_s_uncaused_slips_now_have_a_cause(name, slip, cause):
    """The V-trace slips (chapter 16), the n-step off-by-one (14) and the padding counted (21), which the
    teaching review saw caught with only "first differing element"."""
    result = check(slip, name, verbose=False)
    assert not result, f"{name}: the slip passed"
    assert cause in result.message, f"{name}: caught without the right cause:\n{result.message}"


def test_a_correct_forward_sum_vtrace_is_accepted():
    assert check(_vtrace_slip(), "vtrace_nstep_target", verbose=False)
