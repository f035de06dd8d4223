r"""Checkers for the exercises of chapter 3, ``lessons/03_importance_sampling.ipynb``.

Four exercises, each with the reference solution, the cases it is checked on, and the known wrong
variants whose outputs :func:`rlkit.exercises.check` recognises ("likely cause: ..."):

* ``importance_sampling_estimate(f_values, logp, logq)``: the ordinary importance-sampling
  estimate :math:`\frac1n\sum_i \frac{p(x_i)}{q(x_i)} f(x_i)` from log-probabilities.
* ``chi_square_divergence(logits_p, logits_q)``: :math:`\chi^2(p\|q) = \sum_x p(x)^2/q(x) - 1`,
  the variance of the importance weight under :math:`q`.
* ``tempering_exponent(log_w, share)``: the largest :math:`\alpha\in[0,1]` whose tempered weights
  :math:`w^\alpha` keep Kish's effective sample size :math:`(\sum w^\alpha)^2/\sum w^{2\alpha}` at or above
  ``share`` times n, computed in log space (the chapter displays ``rlkit.estimators.effective_sample_size``,
  the ESS at :math:`\alpha = 1`).
* ``gspo_sequence_loss(logp_new, logp_old, mask, advantages, eps)``: GSPO's clipped loss per response,
  :math:`-\min\big(s\hat A,\ \mathrm{clip}(s, 1-\epsilon, 1+\epsilon)\hat A\big)` with the length-normalised
  ratio :math:`s = \exp\big(\frac{1}{|y|}\sum_t m_t(\log\pi_{\text{new}} - \log\pi_{\text{old}})\big)`. (The
  chapter displays ``rlkit.offpolicy.importance_ratio``, whose ``level="geometric"`` is :math:`s` itself.)
"""
from __future__ import annotations

import math

import torch

from rlkit import _validate as V
from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []


# ------------------------------------------------------------ 1. importance_sampling_estimate

def _is_cases():
    g = torch.Generator().manual_seed(3001)
    x = torch.randn(6, 50, generator=g, dtype=torch.float64)            # x ~ q = N(0, 1)
    mu = torch.linspace(0.0, 1.0, 6, dtype=torch.float64)[:, None]      # p = N(mu, 1)
    logq = -0.5 * x ** 2
    logp = -0.5 * (x - mu) ** 2
    lp3 = torch.log(torch.tensor([0.5, 0.25, 0.25]))
    lq3 = torch.log(torch.tensor([0.25, 0.25, 0.5]))
    return [
        Case(args=(torch.tensor([1.0, 2.0, 3.0]), lp3, lq3), label="three samples, weights (2, 1, 1/2)"),
        Case(args=(x, logp, logq), label="6 Gaussian shifts, 50 samples each, f(x) = x (float64)"),
        Case(args=(torch.tensor([[1.0, -1.0, 2.0]]), torch.tensor([[-1000.0, -1001.0, -1002.0]]),
                   torch.tensor([[-1000.5, -1000.0, -1003.0]])),
             label="log-probabilities near -1000 (long sequences): exp underflows to 0"),
    ]


@exercise(chapter=3, cases=_is_cases,
          description="Ordinary importance-sampling estimate computed from log-probabilities.")
def importance_sampling_estimate(f_values, logp, logq):
    r""":math:`\frac1n\sum_i e^{\log p_i - \log q_i} f_i` over the last dimension; ``[..., n] -> [...]``."""
    V.matching_floats(f_values=f_values, logp=logp, logq=logq)
    return (torch.exp(logp - logq) * f_values).mean(-1)


@mistake(importance_sampling_estimate, "the ratio is upside down: the weight is p/q (target over sampling "
         "distribution), exp(logp - logq)")
def _is_inverted(f_values, logp, logq):
    return importance_sampling_estimate(f_values, logq, logp)


@mistake(importance_sampling_estimate, "you self-normalised the weights (divided by their sum): that "
         "is a different, slightly biased estimator; the ordinary estimate divides by n")
def _is_self_normalised(f_values, logp, logq):
    return (torch.softmax(logp - logq, dim=-1) * f_values).sum(-1)


@mistake(importance_sampling_estimate, "exp(logp) / exp(logq) underflows to 0/0 = NaN for log-probabilities "
         "like -1000: subtract the logs first, exp(logp - logq)")
def _is_exp_then_divide(f_values, logp, logq):
    return (torch.exp(logp) / torch.exp(logq) * f_values).mean(-1)


@mistake(importance_sampling_estimate, "f is missing: you averaged the weights alone (which estimates 1)")
def _is_forgot_f(f_values, logp, logq):
    return torch.exp(logp - logq).mean(-1)


# ------------------------------------------------------------------- 2. chi_square_divergence

def _chi_cases():
    g = torch.Generator().manual_seed(3002)
    return [
        Case(args=(torch.log(torch.tensor([0.5, 0.5])), torch.log(torch.tensor([0.25, 0.75]))),
             label="p=(1/2, 1/2), q=(1/4, 3/4): 4/3 - 1"),
        Case(args=(torch.randn(4, 6, generator=g, dtype=torch.float64),
                   torch.randn(4, 6, generator=g, dtype=torch.float64)), label="[4, 6] random logits, float64"),
        Case(args=(torch.tensor([2.0, 1.0, 0.0]), torch.tensor([5.0, 4.0, 3.5])),
             label="unnormalised logits (shifted by a constant)"),
        Case(args=(torch.tensor([[0.0, -60.0, 1.0], [1.0, -45.0, -50.0]]),
                   torch.tensor([[0.0, -110.0, 1.0], [1.0, -100.0, -104.0]])),
             label="float32, a symbol with q = e^-110 (below the smallest float32, so softmax gives 0) "
                   "and p about e^-60: p^2/q is e^-10, small but not 0/0"),
    ]


@exercise(chapter=3, cases=_chi_cases,
          description="Chi-square divergence between categoricals = variance of the importance weight.")
def chi_square_divergence(logits_p, logits_q):
    r""":math:`\sum_x p^2/q - 1` with :math:`p, q` = softmax of the logits; ``[..., K] -> [...]``."""
    V.matching_floats(logits_p=logits_p, logits_q=logits_q)
    lp = torch.log_softmax(logits_p, dim=-1)
    lq = torch.log_softmax(logits_q, dim=-1)
    return torch.exp(torch.logsumexp(2 * lp - lq, dim=-1)) - 1.0


@mistake(chi_square_divergence, "you computed sum p^2/q - 1 from the probabilities: where q(x) underflows "
         "to 0 (here q = e^-110 in float32) p^2/q is 0/0 = NaN; compute in log space, "
         "exp(logsumexp(2 log p - log q)) - 1, which needs only the difference of the logs")
def _chi_from_probabilities(logits_p, logits_q):
    p, q = torch.softmax(logits_p, dim=-1), torch.softmax(logits_q, dim=-1)
    return (p ** 2 / q).sum(-1) - 1.0


@mistake(chi_square_divergence, "you computed E_p[p/q] - 1 from the probabilities: where q(x) underflows "
         "to 0 (here q = e^-110 in float32) the ratio p/q is inf; compute in log space, "
         "exp(logsumexp(2 log p - log q)) - 1")
def _chi_ratio_from_probabilities(logits_p, logits_q):
    p, q = torch.softmax(logits_p, dim=-1), torch.softmax(logits_q, dim=-1)
    return (p * (p / q)).sum(-1) - 1.0


@mistake(chi_square_divergence, "p and q are swapped: the variance of w = p/q under q is "
         "sum p^2/q - 1 (the sampling distribution q is in the denominator)")
def _chi_swapped(logits_p, logits_q):
    return chi_square_divergence(logits_q, logits_p)


@mistake(chi_square_divergence, "you returned E_q[w^2] = sum p^2/q; the variance subtracts "
         "(E_q[w])^2 = 1")
def _chi_no_minus_one(logits_p, logits_q):
    return chi_square_divergence(logits_p, logits_q) + 1.0


@mistake(chi_square_divergence, "this is KL(p || q); the variance of the weight is the chi-square divergence")
def _chi_kl(logits_p, logits_q):
    lp = torch.log_softmax(logits_p, dim=-1)
    return (lp.exp() * (lp - torch.log_softmax(logits_q, dim=-1))).sum(-1)


@mistake(chi_square_divergence, "the logits were used as log-probabilities without normalising "
         "(log_softmax) them first")
def _chi_unnormalised(logits_p, logits_q):
    return (torch.exp(2 * logits_p - logits_q)).sum(-1) - 1.0


# ------------------------------------------------------------------- 3. tempering_exponent

def _tempered_share(log_w, alpha):
    r""":math:`\mathrm{ESS}(\alpha\ell)/n` of each row, centred (float64 in, float64 out)."""
    centred = log_w - log_w.amax(-1, keepdim=True)
    a = alpha[..., None]
    return torch.exp(2 * torch.logsumexp(a * centred, -1) - torch.logsumexp(2 * a * centred, -1)) / log_w.shape[-1]


def _bisect_alpha(share_of, shape, share, steps=60):
    lo = torch.zeros(shape, dtype=torch.float64)
    hi = torch.ones(shape, dtype=torch.float64)
    share = share - 1e-12          # equal weights have share 1 up to round-off
    done = share_of(hi) >= share
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        ok = share_of(mid) >= share
        lo, hi = torch.where(ok, mid, lo), torch.where(ok, hi, mid)
    return torch.where(done, torch.ones_like(lo), lo)


def _te_cases():
    g = torch.Generator().manual_seed(3003)
    big = torch.tensor([[400.0, 399.0, 390.0, 380.0], [-800.0, -801.0, -805.0, -790.0]])
    return [
        Case(args=(torch.tensor([0.0, math.log(9.0)]), 0.8),
             label="weights (1, 9), share 0.8: w^(1/2) = (1, 3) has ESS 16/10 = 1.6 = 0.8 * 2, so alpha = 1/2"),
        Case(args=(torch.zeros(5), 1.0), label="equal weights, share 1: alpha = 1 (the full step)"),
        Case(args=(torch.tensor([[0.0, 1.0, 2.0], [0.0, 0.0, 0.01]]), 0.95),
             label="two rows: the second already has ESS/n >= 0.95 at alpha = 1"),
        Case(args=(torch.randn(3, 40, generator=g, dtype=torch.float64) * 2, 0.5), label="[3, 40] float64, share 1/2"),
        Case(args=(big, 0.6), label="float32 log-weights of +400 and -800: exp overflows or underflows"),
        Case(args=(1.0e4 + 3.0 * torch.randn(2, 50, generator=g), 0.3),
             label="float32 log-weights near 1e4 (sequence log-ratios): uncentred, the log-sum-exps keep ~3 digits"),
    ]


@exercise(chapter=3, cases=_te_cases, atol=2e-5, rtol=1e-5,
          description="The tempering exponent that keeps a share of the effective sample size.")
def tempering_exponent(log_w, share):
    r"""The largest :math:`\alpha\in[0,1]` with :math:`\mathrm{ESS}(w^\alpha)/n \ge` ``share``; ``[..., n] -> [...]``.

    :math:`\mathrm{ESS}(w^\alpha) = \exp(2\,\mathrm{LSE}(\alpha\ell) - \mathrm{LSE}(2\alpha\ell))` falls as
    :math:`\alpha` grows (its log-derivative is :math:`-2(\mathbb E_{\alpha}[\ell] - \mathbb E_{2\alpha}[\ell]) \le 0`),
    so bisection finds the crossing; the log-weights are centred on their row maximum first (scale-free)."""
    V.float_tensor(log_w, "log_w", 1)
    share = V.real_in(share, "share", 0.0, 1.0)
    if log_w.shape[-1] == 0:
        raise ValueError("log_w: expected at least one sample in the last dimension, got 0")
    lw = log_w.to(torch.float64)
    return _bisect_alpha(lambda a: _tempered_share(lw, a), lw.shape[:-1], share).to(log_w.dtype)


@mistake(tempering_exponent, "exp(alpha * log_w) overflows to inf (or underflows to 0) for large log-weights, "
         "and inf / inf is NaN: stay in log space, ESS = exp(2 LSE(alpha l) - LSE(2 alpha l))")
def _te_naive(log_w, share):
    lw = log_w.to(torch.float32)

    def share_of(a):
        w = torch.exp(a[..., None].float() * lw)
        return (w.sum(-1) ** 2 / (w ** 2).sum(-1) / lw.shape[-1]).double()
    return _bisect_alpha(share_of, lw.shape[:-1], share).to(log_w.dtype)


@mistake(tempering_exponent, "you compared the ESS COUNT with the share: the share is ESS / n, "
         "a number in [1/n, 1]")
def _te_count(log_w, share):
    lw = log_w.to(torch.float64)
    return _bisect_alpha(lambda a: _tempered_share(lw, a) * lw.shape[-1], lw.shape[:-1], share).to(log_w.dtype)


@mistake(tempering_exponent, "you multiplied the weights by alpha: tempering raises them to the power alpha "
         "(alpha times the LOG-weights); a common factor does not change the ESS at all")
def _te_scaled_weights(log_w, share):
    lw = log_w.to(torch.float64)
    # ESS(alpha w) = ESS(w) for every alpha > 0: the answer is 1 or (the bisection's floor) 0
    return _bisect_alpha(lambda a: _tempered_share(lw, torch.ones_like(a)), lw.shape[:-1], share).to(log_w.dtype)


@mistake(tempering_exponent, "n / mean(w^2) assumes the tempered weights have mean 1; Kish's formula "
         "(sum w)^2 / sum w^2 does not depend on their scale")
def _te_unnormalised(log_w, share):
    lw = log_w.to(torch.float64)
    centred = lw - lw.amax(-1, keepdim=True)

    def share_of(a):
        w = torch.exp(a[..., None] * centred)
        return 1.0 / (w ** 2).mean(-1) / lw.shape[-1]
    return _bisect_alpha(share_of, lw.shape[:-1], share).to(log_w.dtype)


@mistake(tempering_exponent, "the bisection stopped too early: 10 halvings leave alpha uncertain by 2^-10 ~ 1e-3; "
         "halve until the interval is below 1e-6 (about 20 halvings, or 60 to reach float64 precision)")
def _te_few_steps(log_w, share):
    lw = log_w.to(torch.float64)
    return _bisect_alpha(lambda a: _tempered_share(lw, a), lw.shape[:-1], share, steps=10).to(log_w.dtype)


@mistake(tempering_exponent, "the log-sum-exps are not centred: for log-weights near 1e4 their difference keeps only "
         "about 3 significant digits in float32; subtract the row maximum first (the ESS is scale-free)")
def _te_uncentred(log_w, share):
    def share_of(a):
        al = a[..., None].to(log_w.dtype) * log_w
        ess = torch.exp(2 * torch.logsumexp(al, -1) - torch.logsumexp(2 * al, -1))
        return (ess / log_w.shape[-1]).double()
    return _bisect_alpha(share_of, log_w.shape[:-1], share).to(log_w.dtype)


# ------------------------------------------------------------------- 4. gspo_sequence_loss

def _log_geo(logp_new, logp_old, mask, length=None):
    """(1/|y|) sum_t m_t (logp_new - logp_old), |y| = max(1, sum m); [B, T] -> [B]."""
    m = mask.to(logp_new.dtype)
    lr = torch.where(m > 0, logp_new - logp_old, torch.zeros_like(logp_new))
    n = m.sum(-1).clamp(min=1.0) if length is None else length
    return lr.sum(-1) / n


def _gspo(log_s, advantages, eps):
    s = torch.exp(log_s)
    return -torch.minimum(s * advantages, s.clamp(1 - eps, 1 + eps) * advantages)


def _gspo_cases():
    g = torch.Generator().manual_seed(3004)
    B, T = 4, 7
    lengths = torch.tensor([7, 3, 5, 1])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    lo = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    ln = lo + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)
    ln = torch.where(mask, ln, torch.full_like(ln, 5.0))         # garbage in the padding
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0], dtype=torch.float64)
    empty = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    return [
        Case(args=(torch.log(torch.tensor([[0.5, 0.2]])), torch.log(torch.tensor([[0.25, 0.4]])),
                   torch.tensor([[True, True]]), torch.tensor([1.5]), 0.2),
             label="token ratios 2 and 1/2: s = 1, loss -A"),
        Case(args=(ln, lo, mask, adv, 0.05), label="4 responses of lengths 7, 3, 5, 1, A = +-, eps = 0.05 "
                                                  "(float64, garbage in padding)"),
        Case(args=(torch.tensor([[-1.0, -1.5], [-2.0, -1.0]]), torch.tensor([[-1.5, -1.5], [-1.0, -1.0]]),
                   torch.ones(2, 2), torch.tensor([1.0, -1.0]), 0.1),
             label="s = e^0.25 with A > 0 (clipped at 1.1) and s = e^-0.5 with A < 0 (clipped at 0.9)"),
        Case(args=(torch.tensor([[-1.0, -60.0, -1.0], [-3.0, -3.0, -3.0]]), torch.tensor([[-51.0, -12.0, -3.0],
                                                                                            [-1.0, -1.0, -1.0]]),
                   empty, torch.tensor([2.0, 3.0]), 3e-4),
             label="log-ratios of +50 and -48 (s = e), and an empty response (s = 1); GSPO's eps 3e-4"),
    ]


@exercise(chapter=3, cases=_gspo_cases, description="GSPO's clipped loss per response, from the geometric-mean ratio.")
def gspo_sequence_loss(logp_new, logp_old, mask, advantages, eps):
    r""":math:`-\min(s\hat A, \mathrm{clip}(s, 1-\epsilon, 1+\epsilon)\hat A)`,
    :math:`s = \exp\big(\sum_t m_t \ell_t / \max(1, \sum_t m_t)\big)`; ``[B, T], [B] -> [B]``."""
    V.matching_floats(logp_new=logp_new, logp_old=logp_old)
    V.check_mask(mask, logp_new, "logp_new")
    V.layout("B", {"B": logp_new.shape[0]}, floating=True, advantages=advantages)
    eps = V.real_in(eps, "eps", 0.0, 1.0, lo_open=True)
    return _gspo(_log_geo(logp_new, logp_old, mask), advantages, eps)


@mistake(gspo_sequence_loss, "the mask is ignored: padding tokens enter the average log-ratio")
def _gspo_no_mask(logp_new, logp_old, mask, advantages, eps):
    return _gspo((logp_new - logp_old).mean(-1), advantages, eps)


@mistake(gspo_sequence_loss, "you clipped the full sequence ratio (the product of the token ratios); GSPO "
         "clips its |y|-th root, the geometric mean, which stays on a per-token scale")
def _gspo_product(logp_new, logp_old, mask, advantages, eps):
    return _gspo(_log_geo(logp_new, logp_old, mask, length=1.0), advantages, eps)


@mistake(gspo_sequence_loss, "you took max instead of min: the clipped objective is the PESSIMISTIC (smaller) "
         "of the two terms, so that the clip removes the incentive to move further, never adds one")
def _gspo_max(logp_new, logp_old, mask, advantages, eps):
    s = torch.exp(_log_geo(logp_new, logp_old, mask))
    return -torch.maximum(s * advantages, s.clamp(1 - eps, 1 + eps) * advantages)


@mistake(gspo_sequence_loss, "you averaged the token ratios (an arithmetic mean); GSPO uses the geometric mean, "
         "the exp of the mean log-ratio")
def _gspo_arithmetic(logp_new, logp_old, mask, advantages, eps):
    m = mask.to(logp_new.dtype)
    ratio = torch.where(m > 0, torch.exp(logp_new - logp_old), torch.zeros_like(logp_new))
    s = ratio.sum(-1) / m.sum(-1).clamp(min=1.0)
    s = torch.where(m.sum(-1) > 0, s, torch.ones_like(s))
    return -torch.minimum(s * advantages, s.clamp(1 - eps, 1 + eps) * advantages)
