r"""Checkers for the exercises of chapter 5, ``lessons/05_onpolicy_offpolicy_drift.ipynb``.

* ``active_clip_fraction(logp_new, logp_old, advantages, eps)``: the fraction of samples whose
  PPO-clip gradient is zero, i.e.
  :math:`(\hat A > 0 \wedge \rho > 1+\epsilon) \vee (\hat A < 0 \wedge \rho < 1-\epsilon)`.
* ``wasserstein_1d_unequal(x, y)``: the 1-Wasserstein distance between two empirical samples of
  possibly different sizes ``n`` and ``m`` along the last dimension,
  :math:`W_1 = \int |F_x(t) - F_y(t)|\,dt`. (The chapter's code cell ``w1`` handles equal sizes.)
* ``kl_regularised_frontier(ref_logprobs, reward, beta)``: the point of the Goodhart curve that
  :math:`\pi_\beta \propto \pi_{ref}\, e^{r/\beta}` reaches, ``(E_{pi_beta}[r], KL(pi_beta || pi_ref))``, with
  :math:`\mathrm{KL} = \mathbb E_{\pi_\beta}[r]/\beta - \log Z_\beta`. (The chapter displays
  ``rlkit.reward_models.kl_regularised_optimum``, which gives :math:`\pi_\beta` itself.)
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


# ----------------------------------------------------------------- 2. wasserstein_1d_unequal

def _cdf_gaps(x, y):
    """On the sorted union t_0 <= ... of both samples: the widths t_{k+1} - t_k and F_x(t_k), F_y(t_k)."""
    xs, ys = x.sort(-1).values, y.sort(-1).values
    t = torch.cat([xs, ys], -1).sort(-1).values
    left = t[..., :-1].contiguous()
    fx = torch.searchsorted(xs.contiguous(), left, right=True).to(x.dtype) / x.shape[-1]
    fy = torch.searchsorted(ys.contiguous(), left, right=True).to(x.dtype) / y.shape[-1]
    return t.diff(dim=-1), fx, fy


def _w1u_cases():
    g = torch.Generator().manual_seed(606)
    return [
        Case(args=(torch.tensor([0.0, 1.0]), torch.tensor([0.0, 0.5, 1.0])),
             label="{0, 1} against {0, 0.5, 1}: W1 = 1/6"),
        Case(args=(torch.tensor([0.0, 1.0, 2.0]), torch.tensor([2.0, 0.5, 1.0])),
             label="equal sizes, unsorted: the sorted pairing"),
        Case(args=(torch.tensor([3.0]), torch.tensor([0.0, 1.0, 2.0, 10.0])),
             label="one point against four: the mean distance to the point"),
        Case(args=(torch.tensor([1.0, 1.0, 2.0, 2.0]), torch.tensor([2.0, 1.0])),
             label="ties, and the same distribution written twice: W1 = 0"),
        Case(args=(torch.randn(3, 40, generator=g, dtype=F64), 0.5 + 2.0 * torch.randn(3, 25, generator=g, dtype=F64)),
             label="[3, 40] against [3, 25] (float64), shifted and wider"),
        Case(args=(torch.randn(200, generator=g), torch.randn(130, generator=g).abs()),
             label="200 points of a normal against 130 of a half-normal"),
    ]


@exercise(chapter=5, cases=_w1u_cases, atol=1e-5,
          description="1-Wasserstein distance between two empirical samples of possibly different sizes.")
def wasserstein_1d_unequal(x, y):
    r""":math:`W_1 = \int |F_x - F_y|\,dt`; ``x [..., n]``, ``y [..., m]`` -> ``[...]``."""
    V.float_tensor(x, "x", min_dim=1)
    V.float_tensor(y, "y", min_dim=1)
    if x.dtype != y.dtype or x.shape[:-1] != y.shape[:-1]:
        raise ValueError(f"x and y must share dtype and leading dimensions, got {tuple(x.shape)} {x.dtype} "
                         f"and {tuple(y.shape)} {y.dtype}")
    if x.shape[-1] == 0 or y.shape[-1] == 0:
        raise ValueError("x and y need at least one sample each")
    width, fx, fy = _cdf_gaps(x, y)
    return ((fx - fy).abs() * width).sum(-1)


@mistake(wasserstein_1d_unequal, "you cut both samples to the shorter length and paired them sorted; with "
         "n != m every point carries mass 1/n on one side and 1/m on the other: compare the CDFs (or the "
         "quantile functions) over the whole line")
def _w1u_truncate(x, y):
    k = min(x.shape[-1], y.shape[-1])
    return (x.sort(-1).values[..., :k] - y.sort(-1).values[..., :k]).abs().mean(-1)


@mistake(wasserstein_1d_unequal, "you integrated the SQUARED gap of the CDFs (a Cramer-von Mises-type "
         "distance); W1 integrates the absolute gap |F_x - F_y|")
def _w1u_squared(x, y):
    width, fx, fy = _cdf_gaps(x, y)
    return ((fx - fy) ** 2 * width).sum(-1)


@mistake(wasserstein_1d_unequal, "you summed |F_x - F_y| at the points without the widths of the gaps "
         "between them; W1 is an integral over t, dt = t_{k+1} - t_k")
def _w1u_no_width(x, y):
    width, fx, fy = _cdf_gaps(x, y)
    return (fx - fy).abs().sum(-1) / (x.shape[-1] + y.shape[-1])


@mistake(wasserstein_1d_unequal, "you compared the means only. |mean(x) - mean(y)| is a lower bound on W_1 "
         "that is blind to a change of spread or shape")
def _w1u_mean_gap(x, y):
    return (x.mean(-1) - y.mean(-1)).abs()


# ----------------------------------------------------------------- 3. kl_regularised_frontier

def _front_cases():
    g = torch.Generator().manual_seed(707)
    ref = torch.log_softmax(torch.randn(5, 7, generator=g, dtype=F64), -1)
    r = torch.randn(5, 7, generator=g, dtype=F64)
    ref3 = torch.log(torch.tensor([0.5, 0.25, 0.25]))
    banned = torch.log(torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=F64))
    return [
        Case(args=(ref3, torch.tensor([0.0, 1.0, 0.0]), 1.0), label="three responses, beta = 1"),
        Case(args=(ref, r, 0.5), label="[5, 7], beta = 0.5"),
        Case(args=(ref, r, 4.0), label="[5, 7], beta = 4"),
        Case(args=(ref3, torch.tensor([0.0, 30.0, -30.0]), 0.02),
             label="reward / beta = +-1500: overflows unless you stay in log space"),
        Case(args=(banned, torch.tensor([0.0, 1.0, 5.0, -1.0], dtype=F64), 0.3),
             label="pi_ref = 0 on two responses (log-prob -inf): they add nothing, not NaN"),
        Case(args=(ref3, torch.ones(3), 0.7), label="a constant reward: KL = 0 and E[r] = 1"),
    ]


def _tilt(ref_logprobs, reward, beta):
    """log pi_beta and log Z_beta; responses with pi_ref = 0 keep log pi_beta = -inf."""
    s = ref_logprobs + reward / beta
    log_z = torch.logsumexp(s, dim=-1)
    return s - log_z[..., None], log_z


def _expect(logp, values):
    """E_p[values] with 0 where p = 0 (so that -inf or inf values there add nothing)."""
    p = logp.exp()
    return torch.where(p > 0, p * values, torch.zeros((), dtype=p.dtype)).sum(-1)


@exercise(chapter=5, cases=_front_cases, atol=1e-6,
          description="The expected reward and the KL to pi_ref of the KL-regularised optimum pi_beta.")
def kl_regularised_frontier(ref_logprobs, reward, beta):
    r"""``(E_{pi_beta}[r], KL(pi_beta || pi_ref))`` with :math:`\mathrm{KL} = \mathbb E[r]/\beta - \log Z_\beta`;
    ``[..., N]`` -> two ``[...]`` tensors."""
    V.matching_floats(ref_logprobs=ref_logprobs, reward=reward)
    beta = V.real_in(beta, "beta", 0.0, lo_open=True)
    logp, log_z = _tilt(ref_logprobs, reward, beta)
    mean_r = _expect(logp, reward)
    return mean_r, mean_r / beta - log_z


@mistake(kl_regularised_frontier, "you took the expected reward under pi_ref; the frontier's reward is "
         "E under the optimum pi_beta, the policy that the penalty lets move")
def _front_ref_reward(ref_logprobs, reward, beta):
    logp, log_z = _tilt(ref_logprobs, reward, beta)
    mean_r = _expect(logp, reward)
    return _expect(ref_logprobs, reward), mean_r / beta - log_z


@mistake(kl_regularised_frontier, "the KL points the wrong way: you computed KL(pi_ref || pi_beta); the "
         "objective penalises KL(pi_beta || pi_ref), the expectation under the NEW policy")
def _front_reverse_kl(ref_logprobs, reward, beta):
    logp, _ = _tilt(ref_logprobs, reward, beta)
    return _expect(logp, reward), _expect(ref_logprobs, ref_logprobs - logp)


@mistake(kl_regularised_frontier, "the sign of log Z is wrong: log(pi_beta / pi_ref) = r / beta - log Z, so "
         "KL = E[r] / beta - log Z")
def _front_log_z_sign(ref_logprobs, reward, beta):
    logp, log_z = _tilt(ref_logprobs, reward, beta)
    mean_r = _expect(logp, reward)
    return mean_r, mean_r / beta + log_z


@mistake(kl_regularised_frontier, "the 1 / beta is missing from the KL: log(pi_beta / pi_ref) = r / beta - log Z")
def _front_no_beta(ref_logprobs, reward, beta):
    logp, log_z = _tilt(ref_logprobs, reward, beta)
    mean_r = _expect(logp, reward)
    return mean_r, mean_r - log_z


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
