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
* ``clip_loss_grad(logp_new, logp_old, advantages, eps, eps_high, dual_clip)``: the per-sample gradient in
  :math:`\log\pi_{new}` of PPO-clip's loss :math:`-\min(\rho\hat A, \mathrm{clip}(\rho, 1-\epsilon,
  1+\epsilon_{high})\hat A)` with DAPO's clip-higher and the dual clip of Ye et al.: :math:`-\rho\hat A` where
  the unclipped branch is selected, 0 elsewhere. (The chapter displays ``rlkit.objectives.ppo_clip_loss``, the
  loss itself, which a per-element loop turned into the old per-sample loss exercise.)
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


# --------------------------------------------------------------------------- 4. clip_loss_grad

def _clip_grad(logp_new, logp_old, advantages, eps, eps_high=None, dual_clip=None, *, symmetric=False,
               no_min=False, no_dual=False):
    eps_high = eps if (eps_high is None or symmetric) else eps_high
    ratio = torch.exp(logp_new - logp_old)
    pos, neg = advantages > 0, advantages < 0
    if no_min:      # -clip(r) A: no gradient wherever the ratio is outside the range, whatever the sign of A
        active = (ratio > 1 - eps) & (ratio < 1 + eps_high)
    else:           # the unclipped branch is the min: below the top for A > 0, above the bottom for A < 0
        active = (pos & (ratio < 1 + eps_high)) | (neg & (ratio > 1 - eps))
    if dual_clip is not None and not no_dual:
        active = active & ~(neg & (ratio > dual_clip))
    zero = torch.zeros((), dtype=ratio.dtype)
    return torch.where(active, -ratio * advantages, zero)


def _clip_grad_cases():
    g = torch.Generator().manual_seed(404)
    r = torch.tensor([0.5, 0.9, 1.0, 1.25, 1.5, 4.0, 0.5, 0.9, 1.0, 1.25, 1.5, 4.0])
    adv = torch.tensor([1.0] * 6 + [-1.0] * 6)
    old = torch.log(torch.tensor([0.3] * 12))
    return [
        Case(args=(old + torch.log(r), old, adv, 0.2),
             label="ratios 0.5..4, A = +1 and -1, eps = 0.2 (symmetric, no dual clip)"),
        Case(args=(old + torch.log(r), old, adv, 0.2), kwargs={"eps_high": 0.28},
             label="the same with DAPO's clip-higher, eps_high = 0.28: ratio 1.25 with A > 0 keeps its gradient"),
        Case(args=(old + torch.log(r), old, adv, 0.2), kwargs={"eps_high": 0.28, "dual_clip": 3.0},
             label="clip-higher and a dual clip c = 3: ratio 4 with A < 0 loses its gradient"),
        Case(args=(torch.log(torch.rand(6, 9, generator=g) * 0.9 + 0.05),
                   torch.log(torch.rand(6, 9, generator=g) * 0.9 + 0.05),
                   torch.randn(6, 9, generator=g), 0.1), kwargs={"eps_high": 0.3, "dual_clip": 2.0},
             label="[6, 9] random, eps = 0.1, eps_high = 0.3, c = 2"),
        Case(args=(torch.tensor([-50.0, 0.0, -60.0, -20.0], dtype=F64),
                   torch.tensor([-60.0, 0.0, -10.0, -20.7], dtype=F64),
                   torch.tensor([-2.0, 3.0, 1.0, -1.0], dtype=F64), 0.3), kwargs={"dual_clip": 3.0},
             label="float64: log-ratio +10 with A < 0 (the dual clip binds), -50 with A > 0, ratio e^0.7 ~ 2.01 < c"),
    ]


@exercise(chapter=4, cases=_clip_grad_cases, atol=1e-6, rtol=1e-6,
          description="the per-sample gradient of PPO-clip's loss in log pi, with clip-higher and a dual clip")
def clip_loss_grad(logp_new, logp_old, advantages, eps, eps_high=None, dual_clip=None):
    r""":math:`\partial\ell/\partial\log\pi_{new} = -\rho\hat A` where the unclipped branch is selected, else 0;
    :math:`\ell = -\min(\rho\hat A, \mathrm{clip}(\rho, 1-\epsilon, 1+\epsilon_{high})\hat A)`, capped at
    :math:`-c\hat A` for :math:`\hat A < 0` (dual clip)."""
    V.matching_floats(min_dim=0, logp_new=logp_new, logp_old=logp_old, advantages=advantages)
    eps = V.real_in(eps, "eps", 0.0, 1.0, lo_open=True, hi_open=True)
    if eps_high is not None:
        eps_high = V.real_in(eps_high, "eps_high", 0.0, lo_open=True)
    if dual_clip is not None:
        dual_clip = V.real_in(dual_clip, "dual_clip (c > 1)", 1.0, lo_open=True)
    return _clip_grad(logp_new, logp_old, advantages, eps, eps_high, dual_clip)


@mistake(clip_loss_grad, "you kept the gradient -rho A everywhere: where the clipped branch is the min "
         "(rho above 1 + eps_high with A > 0, below 1 - eps with A < 0) the loss is flat in log pi")
def _cg_never_clipped(logp_new, logp_old, advantages, eps, eps_high=None, dual_clip=None):
    return -torch.exp(logp_new - logp_old) * advantages


@mistake(clip_loss_grad, "the sign is flipped: that is the gradient of the OBJECTIVE min(rho A, clip(rho) A); "
         "the loss is its negative, so its gradient is -rho A where unclipped")
def _cg_sign(logp_new, logp_old, advantages, eps, eps_high=None, dual_clip=None):
    return -_clip_grad(logp_new, logp_old, advantages, eps, eps_high, dual_clip)


@mistake(clip_loss_grad, "the gradient in log pi carries the ratio: d(rho A)/d log pi = rho A, not A "
         "(you differentiated in rho)")
def _cg_no_ratio(logp_new, logp_old, advantages, eps, eps_high=None, dual_clip=None):
    g = _clip_grad(logp_new, logp_old, advantages, eps, eps_high, dual_clip)
    return torch.where(g != 0, -advantages, g)


@mistake(clip_loss_grad, "eps_high is ignored: clip-higher widens only the TOP of the range, to 1 + eps_high, "
         "so a good action with ratio between 1 + eps and 1 + eps_high still gets a gradient")
def _cg_symmetric(logp_new, logp_old, advantages, eps, eps_high=None, dual_clip=None):
    return _clip_grad(logp_new, logp_old, advantages, eps, eps_high, dual_clip, symmetric=True)


@mistake(clip_loss_grad, "without the min, -clip(rho) A has no gradient wherever rho leaves the range; PPO's min "
         "keeps it where the unclipped term is the smaller (rho > 1 + eps with A < 0, rho < 1 - eps with A > 0)")
def _cg_no_min(logp_new, logp_old, advantages, eps, eps_high=None, dual_clip=None):
    return _clip_grad(logp_new, logp_old, advantages, eps, eps_high, dual_clip, no_min=True)


@mistake(clip_loss_grad, "the dual clip is ignored: for A < 0 the loss is capped at -c A, so a token whose "
         "ratio exceeds c gets no gradient")
def _cg_no_dual(logp_new, logp_old, advantages, eps, eps_high=None, dual_clip=None):
    return _clip_grad(logp_new, logp_old, advantages, eps, eps_high, dual_clip, no_dual=True)


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
