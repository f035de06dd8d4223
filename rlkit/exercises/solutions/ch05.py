r"""Checkers for the exercises of chapter 5, ``lessons/05_onpolicy_offpolicy_drift.ipynb``.

* ``active_clip_fraction(logp_new, logp_old, advantages, eps)``: the fraction of samples whose
  PPO-clip gradient is zero, i.e.
  :math:`(\hat A > 0 \wedge \rho > 1+\epsilon) \vee (\hat A < 0 \wedge \rho < 1-\epsilon)`.
* ``wasserstein_1d(x, y)``: the 1-Wasserstein distance between two empirical samples of equal size
  along the last dimension, :math:`W_1 = \frac1n\sum_i |x_{(i)} - y_{(i)}|` (sorted samples).
* ``kl_regularised_optimum(ref_logprobs, reward, beta)``: the log-probabilities of
  :math:`\pi_\beta \propto \pi_{ref}\, e^{r/\beta}`, the maximiser of
  :math:`\mathbb E_\pi[r] - \beta\,\mathrm{KL}(\pi\,\|\,\pi_{ref})`.
* ``kl_shaped_rewards(score, logp, logp_ref, mask, beta)``: RLHF's per-token rewards,
  :math:`r_t = -\beta(\log\pi(y_t) - \log\pi_{ref}(y_t)) + [t = \text{last real token}]\,\hat r`,
  0 on padding.
"""
from __future__ import annotations

import torch

from rlkit import _validate as V
from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []
F64 = torch.float64


# ------------------------------------------------------------------ 1. active_clip_fraction

def _clip_cases():
    g = torch.Generator().manual_seed(505)
    lo = torch.tensor([-1.0, -1.0, -1.0, -1.0, -1.0, -1.0])
    ln = lo + torch.tensor([0.3, 0.3, -0.3, -0.3, 0.05, -0.05])
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 2.0, -2.0])
    old = torch.randn(4, 50, generator=g, dtype=F64) - 2.0
    new = old + 0.25 * torch.randn(4, 50, generator=g, dtype=F64)
    adv2 = torch.randn(4, 50, generator=g, dtype=F64)
    big_old = torch.full((4,), -60.0)
    big_new = torch.tensor([-10.0, -110.0, -10.0, -110.0])
    big_adv = torch.tensor([1.0, -1.0, -1.0, 1.0])
    return [
        Case(args=(ln, lo, adv, 0.2), label="six hand-made samples, one of each kind"),
        Case(args=(new, old, adv2, 0.2), label="[4, 50] tokens, float64"),
        Case(args=(new, old, adv2, 0.1), label="the same with eps = 0.1"),
        Case(args=(big_new, big_old, big_adv, 0.2), label="log-ratios of +-50"),
    ]


@exercise(chapter=5, cases=_clip_cases, atol=1e-9, description="Fraction of samples whose PPO-clip gradient is zero.")
def active_clip_fraction(logp_new, logp_old, advantages, eps):
    r"""Fraction of samples where PPO-clip selects the clipped branch (zero gradient), a 0-dim tensor:
    :math:`\frac1n \#\{i : (\hat A_i > 0 \wedge \rho_i > 1+\epsilon)
    \vee (\hat A_i < 0 \wedge \rho_i < 1-\epsilon)\}`."""
    V.matching_floats(min_dim=0, logp_new=logp_new, logp_old=logp_old, advantages=advantages)
    eps = V.real_in(eps, "eps", 0.0, 1.0, lo_open=True, hi_open=True)
    ratio = torch.exp(logp_new - logp_old)
    active = ((advantages > 0) & (ratio > 1 + eps)) | ((advantages < 0) & (ratio < 1 - eps))
    return active.to(logp_new.dtype).mean()


@mistake(active_clip_fraction, "you counted every ratio outside [1-eps, 1+eps]. The clip only zeroes the "
         "gradient on the side that would help: r > 1+eps with A > 0, or r < 1-eps with A < 0 (a ratio "
         "of 1.5 with A < 0 still gets a gradient, pulling it back). Several codebases log your "
         "quantity as 'clipfrac'; it measures drift, not where the clip acts")
def _clip_any_side(logp_new, logp_old, advantages, eps):
    ratio = torch.exp(logp_new - logp_old)
    return ((ratio > 1 + eps) | (ratio < 1 - eps)).to(logp_new.dtype).mean()


@mistake(active_clip_fraction, "you compared the LOG-ratio with 1 +- eps; exponentiate it first: "
         "r = exp(logp_new - logp_old)")
def _clip_log_ratio(logp_new, logp_old, advantages, eps):
    lr = logp_new - logp_old
    return (((advantages > 0) & (lr > 1 + eps)) | ((advantages < 0) & (lr < 1 - eps))).to(lr.dtype).mean()


@mistake(active_clip_fraction, "you only counted the upper clip (A > 0, r > 1+eps); for a negative "
         "advantage the clip acts when r < 1-eps")
def _clip_upper_only(logp_new, logp_old, advantages, eps):
    return active_clip_fraction(logp_new, logp_old, advantages.clamp(min=0.0), eps)


@mistake(active_clip_fraction, "the advantage signs are swapped: with A > 0 the objective wants r to "
         "grow, so the clip stops it at r > 1+eps (not r < 1-eps)")
def _clip_swapped_signs(logp_new, logp_old, advantages, eps):
    return active_clip_fraction(logp_new, logp_old, -advantages, eps)


# ----------------------------------------------------------------------- 2. wasserstein_1d

def _w1_cases():
    g = torch.Generator().manual_seed(606)
    return [
        Case(args=(torch.tensor([0.0, 1.0, 2.0]), torch.tensor([2.0, 0.5, 1.0])), label="three points each"),
        Case(args=(torch.randn(3, 40, generator=g, dtype=F64),
                   0.5 + 2.0 * torch.randn(3, 40, generator=g, dtype=F64)), label="[3, 40], shifted and wider"),
        Case(args=(torch.randn(200, generator=g), torch.randn(200, generator=g).abs()),
             label="200 points, a half-normal vs a normal"),
    ]


@exercise(chapter=5, cases=_w1_cases, description="1-Wasserstein distance between two equal-size empirical samples.")
def wasserstein_1d(x, y):
    r""":math:`W_1 = \frac1n \sum_i |x_{(i)} - y_{(i)}|`; ``x, y [..., n]`` -> ``[...]``."""
    V.matching_floats(x=x, y=y)
    V.int_in(x.shape[-1], "the number of samples x.shape[-1]")
    return (x.sort(-1).values - y.sort(-1).values).abs().mean(-1)


@mistake(wasserstein_1d, "you paired x_i with y_i in the order given; the samples are unordered "
         "sets, and the optimal coupling in 1-D pairs the i-th smallest x with the i-th smallest y: "
         "sort both first")
def _w1_unsorted(x, y):
    return (x - y).abs().mean(-1)


@mistake(wasserstein_1d, "you sorted x but not y; sort both so that quantiles meet quantiles")
def _w1_one_sorted(x, y):
    return (x.sort(-1).values - y).abs().mean(-1)


@mistake(wasserstein_1d, "you averaged squared gaps (that is W_2 squared); W_1 averages absolute gaps")
def _w1_squared(x, y):
    return ((x.sort(-1).values - y.sort(-1).values) ** 2).mean(-1)


@mistake(wasserstein_1d, "you compared the means only. |mean(x) - mean(y)| is a lower bound on W_1 "
         "that is blind to a change of spread or shape")
def _w1_mean_gap(x, y):
    return (x.mean(-1) - y.mean(-1)).abs()


@mistake(wasserstein_1d, "you sorted x ascending and y descending, coupling the smallest x with "
         "the largest y: the worst coupling, not the best")
def _w1_opposite_order(x, y):
    return (x.sort(-1).values - y.sort(-1, descending=True).values).abs().mean(-1)


# ----------------------------------------------------------------- 3. kl_regularised_optimum

def _opt_cases():
    g = torch.Generator().manual_seed(707)
    ref = torch.log_softmax(torch.randn(5, 7, generator=g, dtype=F64), -1)
    r = torch.randn(5, 7, generator=g, dtype=F64)
    ref3 = torch.log(torch.tensor([0.5, 0.25, 0.25]))
    return [
        Case(args=(ref3, torch.tensor([0.0, 1.0, 0.0]), 1.0), label="three responses, beta = 1"),
        Case(args=(ref, r, 0.5), label="[5, 7], beta = 0.5"),
        Case(args=(ref, r, 4.0), label="[5, 7], beta = 4"),
        Case(args=(ref3, torch.tensor([0.0, 30.0, -30.0]), 0.02),
             label="reward / beta = +-1500: overflows unless you stay in log space"),
    ]


@exercise(chapter=5, cases=_opt_cases, description="The closed-form maximiser of E[r] - beta KL(pi || pi_ref).")
def kl_regularised_optimum(ref_logprobs, reward, beta):
    r""":math:`\log\pi_\beta = \log\pi_{ref} + r/\beta - \log Z`; ``[..., N]`` -> ``[..., N]``."""
    V.matching_floats(ref_logprobs=ref_logprobs, reward=reward)
    beta = V.real_in(beta, "beta", 0.0, lo_open=True)
    return torch.log_softmax(ref_logprobs + reward / beta, dim=-1)


@mistake(kl_regularised_optimum, "you multiplied the reward by beta; the optimum tilts by exp(r / beta): "
         "a LARGER penalty must keep the policy CLOSER to pi_ref")
def _opt_times_beta(ref_logprobs, reward, beta):
    return torch.log_softmax(ref_logprobs + beta * reward, dim=-1)


@mistake(kl_regularised_optimum, "you dropped pi_ref: softmax(r / beta) is the optimum of the entropy-regularised "
         "objective (a uniform reference), not of the KL-regularised one")
def _opt_no_ref(ref_logprobs, reward, beta):
    return torch.log_softmax(reward / beta, dim=-1)


@mistake(kl_regularised_optimum, "your log-probabilities are not normalised: subtract log Z = "
         "logsumexp(log pi_ref + r / beta) (torch.log_softmax does it)")
def _opt_unnormalised(ref_logprobs, reward, beta):
    return ref_logprobs + reward / beta


@mistake(kl_regularised_optimum, "you returned probabilities; the exercise asks for log-probabilities")
def _opt_probabilities(ref_logprobs, reward, beta):
    return kl_regularised_optimum(ref_logprobs, reward, beta).exp()


@mistake(kl_regularised_optimum, "you exponentiated before normalising, which overflows for large r / beta "
         "(inf / inf = NaN); stay in log space with torch.log_softmax")
def _opt_naive(ref_logprobs, reward, beta):
    w = ref_logprobs.exp() * torch.exp(reward / beta)
    return (w / w.sum(-1, keepdim=True)).log()


# ---------------------------------------------------------------------- 4. kl_shaped_rewards

def _kl_penalty(logp, logp_ref, mask, beta):
    r""":math:`-\beta(\log\pi - \log\pi_{ref})` on the tokens where ``mask`` is 1."""
    return -beta * (logp - logp_ref) * mask.to(logp.dtype)


def _shaped_cases():
    g = torch.Generator().manual_seed(808)
    B, T = 4, 6
    logp = -torch.rand(B, T, generator=g, dtype=F64) * 3
    logp_ref = -torch.rand(B, T, generator=g, dtype=F64) * 3
    lengths = torch.tensor([6, 3, 1, 5])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    score = torch.randn(B, generator=g, dtype=F64)
    logp1 = torch.log(torch.tensor([[0.5, 0.4, 0.9], [0.2, 0.1, 0.3]]))
    ref1 = torch.log(torch.tensor([[0.25, 0.4, 0.3], [0.2, 0.2, 0.6]]))
    mask1 = torch.tensor([[True, True, True], [True, True, False]])
    return [
        Case(args=(torch.tensor([1.0, -1.0]), logp1, ref1, mask1, 0.1), label="two responses, the second padded"),
        Case(args=(score, logp, logp_ref, mask, 0.05), label="[4, 6], lengths 6, 3, 1, 5"),
        Case(args=(score, logp, logp_ref, mask.float(), 0.5), label="a 0/1 float mask, beta = 0.5"),
        Case(args=(torch.tensor([2.0, 5.0, -1.0], dtype=F64), logp[:3, :3], logp_ref[:3, :3],
                   torch.tensor([[True, True, False], [False, False, False], [True, True, True]]), 0.1),
             label="a row with no real token (it gets no score and no penalty)"),
    ]


@exercise(chapter=5, cases=_shaped_cases, atol=1e-9,
          description="Per-token RLHF rewards: KL penalty on every real token, the score at the last one.")
def kl_shaped_rewards(score, logp, logp_ref, mask, beta):
    r"""Per-token RLHF rewards ``[B, T]`` from ``score [B]``, ``logp, logp_ref, mask [B, T]``."""
    sizes = V.layout("B T", floating=True, logp=logp, logp_ref=logp_ref)
    V.layout("B", sizes, floating=True, score=score)
    m = V.check_mask(mask, logp, "logp")
    beta = V.real_in(beta, "beta", 0.0)
    rewards = -beta * (logp - logp_ref) * m
    t = torch.arange(logp.shape[1])
    last = torch.where(m > 0, t, torch.full_like(t, -1)).max(dim=1).values
    has = last >= 0
    rows = torch.arange(logp.shape[0])[has]
    rewards = rewards.clone()
    rewards[rows, last[has]] += score[has]
    return rewards


@mistake(kl_shaped_rewards, "you put the reward-model score in the last COLUMN; for a padded "
         "response that is a padding position. It belongs at the last REAL token of each row")
def _shaped_last_column(score, logp, logp_ref, mask, beta):
    rewards = _kl_penalty(logp, logp_ref, mask, beta)
    rewards[:, -1] += score
    return rewards


@mistake(kl_shaped_rewards, "the KL term has the wrong sign: the per-token penalty is "
         "-beta (log pi - log pi_ref), which is negative where the policy is more likely than the reference")
def _shaped_sign(score, logp, logp_ref, mask, beta):
    return kl_shaped_rewards(score, logp, logp_ref, mask, beta) - 2 * _kl_penalty(logp, logp_ref, mask, beta)


@mistake(kl_shaped_rewards, "padding positions got a KL penalty; every reward must be 0 where mask is 0")
def _shaped_unmasked(score, logp, logp_ref, mask, beta):
    padding = 1 - mask.to(logp.dtype)
    return kl_shaped_rewards(score, logp, logp_ref, mask, beta) + _kl_penalty(logp, logp_ref, padding, beta)


@mistake(kl_shaped_rewards, "you added the score to every token. The reward model scores the whole "
         "response once, at its end; adding it to all tokens multiplies it by the length and makes "
         "long answers worth more")
def _shaped_every_token(score, logp, logp_ref, mask, beta):
    m = mask.to(logp.dtype)
    return (-beta * (logp - logp_ref) + score[:, None]) * m


@mistake(kl_shaped_rewards, "a row with no real token got the score in its last column: mask.sum(-1) - 1 "
         "is -1 there, and index -1 wraps around to the last position. A row without a real token gets "
         "no score (and, being all padding, no penalty)")
def _shaped_empty_row_wraps(score, logp, logp_ref, mask, beta):
    rewards = _kl_penalty(logp, logp_ref, mask, beta)
    last = mask.to(torch.int64).sum(-1) - 1
    rewards[torch.arange(logp.shape[0]), last] += score
    return rewards
