r"""Checkers for the exercises of chapter 4, ``lessons/04_kl_trpo_ppo.ipynb``.

* ``markov_sequence_kl(logits_p, logits_q, start, T)``: the exact :math:`\mathrm{KL}(p\,\|\,q)` between the
  distributions of length-``T`` sequences of two bigram models (``logits[..., prev, next]``, first token
  drawn after ``start``), by the chain rule:
  :math:`\sum_t \mathbb E_{y_{t-1}\sim p}[\mathrm{KL}(p(\cdot\mid y_{t-1})\,\|\,q(\cdot\mid y_{t-1}))]`,
  with :math:`0\log 0 = 0`.
  (The chapter displays ``rlkit.divergences.kl_categorical``, the one-step KL.)
* ``reverse_kl_estimators(logp, logq)``: two per-sample estimators of the REVERSE divergence
  :math:`\mathrm{KL}(q\,\|\,p)` from samples of :math:`p`, with :math:`\ell = \log q - \log p` and
  :math:`r = e^\ell`: :math:`r_1 = r\ell` and :math:`r_3 = r\ell - (r - 1) = (\ell - 1)e^\ell + 1 \ge 0`,
  checked to a relative tolerance that rejects :math:`r_3` computed with ``exp`` (cancellation at small
  :math:`|\ell|`; use ``expm1``). (The chapter displays ``kl_k3`` and imports ``kl_k1``, ``kl_k2``, which
  estimate :math:`\mathrm{KL}(p\,\|\,q)` and passed the old exercise.)
* ``penalty_beta_trajectory(beta0, c, target, steps, power)``: the PPO paper's penalty rule (double above
  :math:`1.5\,D_{targ}`, halve below :math:`D_{targ}/1.5`) run in closed loop on the model KL
  :math:`c\,\beta^{-p}`, returning :math:`\beta_0, \dots, \beta_{\text{steps}}`. (The chapter displays
  ``AdaptiveKLController.factor``, one step of the rule, which passed the old one-step exercise.)
* ``clipped_surrogate_loss(logp_new, logp_old, advantages, eps)``: PPO-clip's per-sample loss
  :math:`-\min(\rho\hat A, \mathrm{clip}(\rho, 1-\epsilon, 1+\epsilon)\hat A)`.
* ``natural_step(s, Fs, delta)``: TRPO's full step :math:`\sqrt{2\delta / s^\top F s}\; s` along the
  natural-gradient direction ``s`` (:math:`\tilde g = F^{-1}g` in the chapter).
"""
from __future__ import annotations

import math

import torch

from rlkit import _validate as V
from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []
F64 = torch.float64


# --------------------------------------------------------------------------- 1. markov_sequence_kl

def _row_kl(lp, lq):
    """KL of each row (next-token distribution after each previous token), 0 log 0 = 0: [..., V, V] -> [..., V]."""
    p = lp.exp()
    return (p * torch.where(p > 0, lp - lq, torch.zeros((), dtype=lp.dtype))).sum(-1)


def _seq_kl(logits_p, logits_q, start, T, walk="p", advance_first=False):
    lp, lq = torch.log_softmax(logits_p, -1), torch.log_softmax(logits_q, -1)
    step = _row_kl(lp, lq)
    move = (lp if walk == "p" else lq).exp()
    d = torch.zeros_like(step)
    d[..., start] = 1.0                                   # the previous token of step 0 is `start`
    total = torch.zeros(step.shape[:-1], dtype=step.dtype)
    for _ in range(T):
        if advance_first:
            d = (d[..., :, None] * move).sum(-2)
        total = total + (d * step).sum(-1)
        if not advance_first:
            d = (d[..., :, None] * move).sum(-2)          # the distribution of the token just drawn
    return total


def _skl_cases():
    g = torch.Generator().manual_seed(401)
    masked_p = torch.randn(5, 5, generator=g, dtype=F64)
    masked_p[:, 3:] = -math.inf                            # two tokens p never writes (a masked vocabulary)
    masked_p[0, 3] = 0.0                                   # ... except token 3 after token 0
    half = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=F64))
    return [
        Case(args=(torch.log(torch.tensor([[0.9, 0.1], [0.2, 0.8]], dtype=F64)), half, 0, 2),
             label="two tokens, two steps from token 0 (hand case)"),
        Case(args=(torch.randn(4, 4, generator=g, dtype=F64), torch.randn(4, 4, generator=g, dtype=F64), 2, 1),
             label="T = 1: the KL of the row of the start token"),
        Case(args=(2 * torch.randn(6, 6, generator=g), torch.randn(6, 6, generator=g), 1, 5),
             label="6 tokens, 5 steps"),
        Case(args=(torch.randn(3, 4, 4, generator=g, dtype=F64), torch.randn(3, 4, 4, generator=g, dtype=F64), 0, 4),
             label="a batch of 3 pairs of models, float64"),
        Case(args=(masked_p, torch.randn(5, 5, generator=g, dtype=F64), 0, 4),
             label="p gives probability 0 to some tokens: finite"),
        Case(args=(half, torch.zeros(2, 2, dtype=F64), 1, 0), label="T = 0: the empty sequence, KL 0"),
    ]


@exercise(chapter=4, cases=_skl_cases, atol=1e-5,
          description="exact KL between the sequence distributions of two bigram models")
def markov_sequence_kl(logits_p, logits_q, start, T):
    r""":math:`\sum_{t<T}\sum_v \Pr_p(y_{t-1} = v)\,\mathrm{KL}(p(\cdot\mid v)\,\|\,q(\cdot\mid v))`,
    :math:`y_{-1}` = ``start``; ``logits [..., V, V]`` -> ``[...]``."""
    V.matching_floats(logits_p=logits_p, logits_q=logits_q)
    sizes = V.layout("... V V", floating=True, logits_p=logits_p)
    start = V.int_in(start, "start", 0, sizes["V"] - 1)
    T = V.int_in(T, "T", 0)
    return _seq_kl(logits_p, logits_q, start, T)


@mistake(markov_sequence_kl, "you charged every step the KL of the start token's row; after the first step the "
         "previous token is random: weight each row's KL by the probability, under p, of having just written it")
def _skl_start_row_only(logits_p, logits_q, start, T):
    step = _row_kl(torch.log_softmax(logits_p, -1), torch.log_softmax(logits_q, -1))
    return T * step[..., start]


@mistake(markov_sequence_kl, "you moved the distribution of the previous token with q; the expectation in the "
         "chain rule is under p, the first argument of the KL (the model that writes the sequence)")
def _skl_walk_q(logits_p, logits_q, start, T):
    return _seq_kl(logits_p, logits_q, start, T, walk="q")


@mistake(markov_sequence_kl, "off by one step: you advanced the token distribution before adding the first "
         "term; step 0's next token is drawn after the start token itself")
def _skl_advance_first(logits_p, logits_q, start, T):
    return _seq_kl(logits_p, logits_q, start, T, advance_first=True)


@mistake(markov_sequence_kl, "you computed KL(q || p): the expectation must be under p, the first argument "
         "(KL is not symmetric)")
def _skl_reversed(logits_p, logits_q, start, T):
    return _seq_kl(logits_q, logits_p, start, T)


# --------------------------------------------------------------------------- 2. reverse_kl_estimators

def _rev_cases():
    g = torch.Generator().manual_seed(402)
    return [
        Case(args=(torch.tensor([math.log(0.5), math.log(0.25)]), torch.tensor([math.log(0.25), math.log(0.5)])),
             label="two samples, ratios q/p = 1/2 and 2"),
        Case(args=(torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)), label="[8, 16] tokens"),
        Case(args=(torch.zeros(3, dtype=F64), torch.tensor([-20.0, 0.0, 20.0], dtype=F64)),
             label="large log-ratios, float64"),
        # nearly identical policies: r3 ~ l^2 / 2 is 5e-9 at |l| = 1e-4, far below the rounding error of
        # (l - 1) e^l + 1 in float32; the expm1 form keeps about 3 correct digits there
        Case(args=(_LOGP_TINY, _LOGP_TINY + torch.tensor([1e-4, -1e-4, 2e-4, -3e-4, 1.5e-4, -2e-4])),
             label="tiny log-ratios |l| ~ 1e-4, float32"),
        Case(args=(_LOGP_TINY[:5].double(), _LOGP_TINY[:5].double()
                   + torch.tensor([1e-8, -1e-8, 3e-8, -2e-7, 5e-7], dtype=F64)),
             label="tiny log-ratios |l| ~ 1e-8, float64"),
    ]


_LOGP_TINY = torch.tensor([-0.7, -1.3, -2.1, -0.2, -3.0, -1.0])
# the outputs are compared RELATIVELY (atol 0): r3 at a tiny log-ratio is tiny, and an absolute
# tolerance would accept any answer there. rtol 5e-3 leaves room for the float32 rounding of the
# expm1 form itself (about 1e-3 on these cases).


def _r3(lr):
    """(l - 1) e^l + 1 = l expm1(l) - (expm1(l) - l), without the cancellation of forming e^l."""
    em1 = torch.expm1(lr)
    return lr * em1 - (em1 - lr)


@exercise(chapter=4, cases=_rev_cases, atol=0.0, rtol=5e-3,
          description="two estimators of the reverse KL(q || p) from samples of p")
def reverse_kl_estimators(logp, logq):
    r"""Per-sample :math:`(r_1, r_3) = (e^\ell\ell,\ (\ell - 1)e^\ell + 1)` with :math:`\ell = \log q - \log p`."""
    V.matching_floats(min_dim=0, logp=logp, logq=logq)
    lr = logq - logp
    return torch.exp(lr) * lr, _r3(lr)


@mistake(reverse_kl_estimators, "these are k1 and k3 of the chapter, estimators of KL(p || q); the reverse "
         "divergence KL(q || p) = E_q[log q/p] needs the importance weight r = q/p under samples of p")
def _rev_forward(logp, logq):
    lr = logq - logp
    return -lr, torch.expm1(lr) - lr


@mistake(reverse_kl_estimators, "r1 lacks the importance weight: under samples of p, E_p[l] = -KL(p || q); "
         "E_p[r l] = E_q[l] = KL(q || p) with r = e^l = q/p")
def _rev_no_weight(logp, logq):
    lr = logq - logp
    return lr, _r3(lr)


@mistake(reverse_kl_estimators, "the control variate has the wrong sign: E_p[r - 1] = 0, and r3 = r l - (r - 1) "
         "is the one that is never negative (r log r - r + 1 >= 0)")
def _rev_plus(logp, logq):
    lr = logq - logp
    return torch.exp(lr) * lr, torch.exp(lr) * lr + torch.expm1(lr)


@mistake(reverse_kl_estimators, "r3 computed as (l - 1) * exp(l) + 1 loses all its digits when the log-ratio l "
         "is tiny: the result is about l^2/2, far below the rounding error of numbers near 1 (6e-8 in float32), "
         "and adding 1 cancels the leading digits. Use torch.expm1: r3 = l * expm1(l) - (expm1(l) - l)")
def _rev_no_expm1(logp, logq):
    lr = logq - logp
    return torch.exp(lr) * lr, (lr - 1) * torch.exp(lr) + 1


# --------------------------------------------------------------------------- 3. penalty_beta_trajectory

def _ppo_rule(beta, kl, target, up=2.0, low_divisor=1.5, strict=True, swapped=False):
    above = kl > 1.5 * target if strict else kl >= 1.5 * target
    below = kl < target / low_divisor if strict else kl <= target / low_divisor
    if swapped:
        above, below = below, above
    if above:
        return up * beta
    if below:
        return beta / up
    return beta


def _trajectory(beta0, c, target, steps, power, **rule):
    betas = [float(beta0)]
    for _ in range(steps):
        betas.append(_ppo_rule(betas[-1], c / betas[-1] ** power, target, **rule))
    return torch.tensor(betas, dtype=F64)


def _beta_cases():
    return [
        Case(args=(1.0, 0.02, 0.01, 6), kwargs={"power": 2.0},
             label="the chapter's quadratic model c / beta^2, c = 0.02: beta cycles 1, 2, 1, 2, ..."),
        Case(args=(1.0, 0.1, 0.01, 6), kwargs={"power": 1.0},
             label="KL = c / beta: doubles to 8 (KL 0.0125, in the band) and stays"),
        Case(args=(1.0, 0.16, 0.01, 5), kwargs={"power": 2.0}, label="c = 0.16: beta = 4 gives KL = target and stays"),
        Case(args=(100.0, 0.1, 0.01, 8), kwargs={"power": 1.0},
             label="a penalty far too large: halves to 12.5 (KL 0.008) and stays"),
        Case(args=(1.0, 0.375, 0.25, 4), kwargs={"power": 2.0},
             label="KL exactly 1.5 x target (0.375, exact in binary): the test is strict, beta never moves"),
        Case(args=(1.0, 0.02, 0.01, 0), kwargs={"power": 2.0}, label="no update: the trajectory is [beta0]"),
        Case(args=(3.0, 0.05, 0.02, 10), kwargs={"power": 1.5}, label="KL = c / beta^1.5"),
    ]


@exercise(chapter=4, cases=_beta_cases, atol=0.0, rtol=1e-12,
          description="PPO's adaptive KL penalty run in closed loop on a model of the KL")
def penalty_beta_trajectory(beta0, c, target, steps, power=2.0):
    r""":math:`\beta_0, \dots, \beta_{\text{steps}}` (float64) under the PPO paper's rule with the measured KL
    :math:`d_k = c\,\beta_k^{-p}`: :math:`\times 2` if :math:`d_k > 1.5\,d_{targ}`, :math:`/2` if
    :math:`d_k < d_{targ}/1.5`."""
    beta0 = V.real_in(beta0, "beta0", 0.0, lo_open=True)
    c = V.real_in(c, "c (the KL at beta = 1)", 0.0, lo_open=True)
    target = V.real_in(target, "target", 0.0, lo_open=True)
    steps = V.int_in(steps, "steps", 0)
    power = V.real_in(power, "power", 0.0, lo_open=True)
    return _trajectory(beta0, c, target, steps, power)


@mistake(penalty_beta_trajectory, "you relax beta only below 0.5 x target: that is the article's rule; the PPO "
         "paper (and this book) halves beta below target / 1.5, a band symmetric in log KL")
def _beta_article(beta0, c, target, steps, power=2.0):
    return _trajectory(beta0, c, target, steps, power, low_divisor=2.0)


@mistake(penalty_beta_trajectory, "the directions are swapped: a KL above target needs a LARGER penalty "
         "(beta x 2), a KL below target a smaller one")
def _beta_inverted(beta0, c, target, steps, power=2.0):
    return _trajectory(beta0, c, target, steps, power, swapped=True)


@mistake(penalty_beta_trajectory, "the band edges are 1.5 x target and target / 1.5, but beta itself moves by a "
         "factor of 2")
def _beta_times_15(beta0, c, target, steps, power=2.0):
    return _trajectory(beta0, c, target, steps, power, up=1.5)


@mistake(penalty_beta_trajectory, "the comparisons are strict: a KL exactly at 1.5 x target (or target / 1.5) "
         "is inside the band and leaves beta unchanged")
def _beta_non_strict(beta0, c, target, steps, power=2.0):
    return _trajectory(beta0, c, target, steps, power, strict=False)


@mistake(penalty_beta_trajectory, "your KL ignores the power: the model's KL is c / beta^power (power 2 for the "
         "quadratic model), not c / beta")
def _beta_power_one(beta0, c, target, steps, power=2.0):
    return _trajectory(beta0, c, target, steps, 1.0)


@mistake(penalty_beta_trajectory, "the trajectory starts with beta0: return steps + 1 values, "
         "beta_0, ..., beta_steps")
def _beta_no_start(beta0, c, target, steps, power=2.0):
    return _trajectory(beta0, c, target, steps, power)[1:]


# --------------------------------------------------------------------------- 4. clipped_surrogate_loss

def _sur_cases():
    g = torch.Generator().manual_seed(404)
    r = torch.tensor([0.5, 0.9, 1.0, 1.1, 1.5, 0.5, 0.9, 1.0, 1.1, 1.5])
    adv = torch.tensor([1.0] * 5 + [-1.0] * 5)
    old = torch.log(torch.tensor([0.3] * 10))
    return [
        Case(args=(old + torch.log(r), old, adv, 0.2), label="ratios 0.5..1.5, A = +1 and -1"),
        Case(args=(torch.log(torch.rand(6, 9, generator=g) * 0.9 + 0.05),
                   torch.log(torch.rand(6, 9, generator=g) * 0.9 + 0.05),
                   torch.randn(6, 9, generator=g), 0.1), label="[6, 9] random, eps = 0.1"),
        Case(args=(torch.tensor([-50.0, 0.0, -60.0], dtype=F64), torch.tensor([-60.0, 0.0, -10.0], dtype=F64),
                   torch.tensor([-2.0, 3.0, 1.0], dtype=F64), 0.3), label="log-ratios of +10 and -50, float64"),
    ]


@exercise(chapter=4, cases=_sur_cases, atol=1e-5, description="PPO-clip's per-sample loss")
def clipped_surrogate_loss(logp_new, logp_old, advantages, eps):
    r""":math:`-\min(\rho\hat A, \mathrm{clip}(\rho, 1-\epsilon, 1+\epsilon)\hat A)`,
    :math:`\rho = e^{\log\pi - \log\pi_{old}}`."""
    V.matching_floats(min_dim=0, logp_new=logp_new, logp_old=logp_old, advantages=advantages)
    eps = V.real_in(eps, "eps", 0.0, 1.0, lo_open=True, hi_open=True)
    ratio = torch.exp(logp_new - logp_old)
    return -torch.minimum(ratio * advantages, ratio.clamp(1 - eps, 1 + eps) * advantages)


@mistake(clipped_surrogate_loss, "you dropped the min: -clip(r) A alone is not pessimistic (for A < 0 and "
         "r > 1 + eps it would stop pushing the bad action down); keep min(r A, clip(r) A)")
def _sur_no_min(logp_new, logp_old, advantages, eps):
    return -torch.exp(logp_new - logp_old).clamp(1 - eps, 1 + eps) * advantages


@mistake(clipped_surrogate_loss, "you took the max of the two objectives (the optimistic one); PPO takes the "
         "min of the objectives, i.e. the max of the two losses")
def _sur_max(logp_new, logp_old, advantages, eps):
    # -max(rA, clip(r)A) = min(-rA, -clip(r)A): minus the reference on the negated advantages
    return -clipped_surrogate_loss(logp_new, logp_old, -advantages, eps)


@mistake(clipped_surrogate_loss, "the ratio is pi_new / pi_old = exp(logp_new - logp_old), not "
         "logp_new / logp_old")
def _sur_ratio_of_logs(logp_new, logp_old, advantages, eps):
    ratio = logp_new / logp_old
    return -torch.minimum(ratio * advantages, ratio.clamp(1 - eps, 1 + eps) * advantages)


@mistake(clipped_surrogate_loss, "clip the ratio r to [1 - eps, 1 + eps], not the advantage")
def _sur_clip_advantage(logp_new, logp_old, advantages, eps):
    ratio = torch.exp(logp_new - logp_old)
    return -torch.minimum(ratio * advantages, ratio * advantages.clamp(1 - eps, 1 + eps))


# --------------------------------------------------------------------------- 5. natural_step

def _step_cases():
    g = torch.Generator().manual_seed(405)
    M = torch.randn(6, 6, generator=g, dtype=F64)
    F = M @ M.T + 0.1 * torch.eye(6, dtype=F64)
    s2 = torch.randn(6, generator=g, dtype=F64)
    s3 = torch.randn(40, generator=g)
    d3 = torch.rand(40, generator=g) + 0.5
    return [
        Case(args=(torch.tensor([1.0, 0.0]), torch.tensor([4.0, 0.0]), 0.02), label="F = diag(4, .), s = e1"),
        Case(args=(s2, F @ s2, 0.01), label="random SPD F, 6 parameters"),
        Case(args=(s3, d3 * s3, 0.05), label="diagonal F, 40 parameters"),
    ]


@exercise(chapter=4, cases=_step_cases,
          description="TRPO's step to the KL boundary along the natural-gradient direction")
def natural_step(s, Fs, delta):
    r""":math:`\Delta = \sqrt{2\delta / s^\top F s}\; s`, so that :math:`\tfrac12\Delta^\top F\Delta = \delta`."""
    V.matching_floats(s=s, Fs=Fs)
    delta = V.real_in(delta, "delta", 0.0, lo_open=True)
    return torch.sqrt(2 * delta / (s * Fs).sum()) * s


@mistake(natural_step, "the quadratic model of the KL is (1/2) D^T F D; setting it to delta gives "
         "sqrt(2 delta / s^T F s), you dropped the 2")
def _step_no_two(s, Fs, delta):
    return natural_step(s, Fs, delta / 2)


@mistake(natural_step, "the KL is quadratic in the step length, so the scale is a square root: "
         "sqrt(2 delta / s^T F s)")
def _step_no_sqrt(s, Fs, delta):
    return (2 * delta / (s * Fs).sum()) * s


@mistake(natural_step, "you normalised the Euclidean length of s; the trust region is measured by "
         "the KL, i.e. in the metric F: divide by sqrt(s^T F s)")
def _step_unit_norm(s, Fs, delta):
    return math.sqrt(2 * delta) * s / s.norm()
