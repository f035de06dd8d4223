r"""Checkers for the exercises of chapter 20, ``lessons/20_value_guided_decoding.ipynb``.

Chapter: 20_value_guided_decoding.

* ``guided_kl(logits, next_values, eta)``: the KL of the guided next-token distribution from the base
  model's, :math:`\mathrm{KL}(q\,\|\,\pi)` with :math:`q\propto\pi\,e^{\eta V(h\oplus v)}`,
  :math:`\pi = \mathrm{softmax}(\text{logits})`, 0 where :math:`q = 0`; ``[..., V]`` -> ``[...]``.
* ``filter_then_guide(logits, next_values, eta, top_p)``: the log-probabilities of the sampling
  distribution when the base model is truncated to its top-p support first and guided after,
  :math:`\log q = \mathrm{log\_softmax}(\log\pi_{S} + \eta\,V(h\oplus\cdot))`; ``[..., V]``.
* ``best_of_n_exact(p, n)``: accuracy and KL from the base model of best-of-n with a perfect
  binary verifier, ``(1 - (1-p)^n, KL(Bernoulli(a) || Bernoulli(p)))``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from rlkit.exercises import Case, exercise, mistake
from rlkit.llm.sampling import sampling_logprobs

__all__: list[str] = []


# ------------------------------------------------------------------- 1. guided_kl
# (was soft_value_backup: beta * log_normaliser(logits, child_values, 0, 1 / beta), with the
# log_normaliser the chapter shows, passed its check; issue 23. The exercise now asks for the KL that
# the chapter's sweep measures per token, the price of guidance.)

def _gkl_cases():
    g = torch.Generator().manual_seed(20)
    ls = torch.log(torch.rand(3, 6, generator=g, dtype=torch.float64))
    ls[0, 1] = float("-inf")                               # success impossible after these tokens
    ls[2, [0, 4]] = float("-inf")
    trunc = torch.randn(3, 6, generator=g, dtype=torch.float64)
    trunc[:, 3:] = float("-inf")                            # a truncated base: tokens 3-5 never sampled
    return [
        Case(args=(torch.zeros(1, 2, dtype=torch.float64), torch.tensor([[0.0, math.log(2.0)]], dtype=torch.float64),
                   1.0),
             label="hand case: pi = (1/2, 1/2), e^V = (1, 2), eta = 1 -> q = (1/3, 2/3), "
                   "KL = log(2/3)/3 + 2 log(4/3)/3"),
        Case(args=(torch.randn(4, 5, generator=g, dtype=torch.float64) * 2 + 3.0,
                   torch.rand(4, 5, generator=g, dtype=torch.float64), 2.0),
             label="4 states, 5 tokens, logits not normalised (shifted by +3), eta = 2"),
        Case(args=(torch.randn(3, 6, generator=g, dtype=torch.float64), ls, 1.0),
             label="log-success values with -inf (p = 0) on some tokens, eta = 1 (Bayes)"),
        Case(args=(trunc, torch.rand(3, 6, generator=g, dtype=torch.float64), 4.0),
             label="a truncated base (logits -inf on half the tokens), eta = 4"),
        Case(args=(torch.randn(2, 5, generator=g, dtype=torch.float64),
                   torch.rand(2, 5, generator=g, dtype=torch.float64), 0.0),
             label="eta = 0: no guidance, KL 0"),
        Case(args=(torch.randn(2, 5, generator=g, dtype=torch.float64),
                   torch.rand(2, 5, generator=g, dtype=torch.float64), 1000.0),
             label="eta = 1000: e^(eta V) overflows; the guided distribution is nearly the argmax of V"),
    ]


@exercise(chapter=20, cases=_gkl_cases, atol=1e-8,
          description="the KL of the guided next-token distribution from the base model's, per state")
def guided_kl(logits, next_values, eta):
    """KL(q || pi) with pi = softmax(logits), q proportional to pi e^(eta V); 0 log 0 = 0; [..., V] -> [...]."""
    logp = F.log_softmax(logits, -1)
    lg = logp + eta * next_values
    logq = lg - torch.logsumexp(lg, -1, keepdim=True)
    q = logq.exp()
    return (q * torch.where(q > 0, logq - logp, torch.zeros_like(logq))).sum(-1)


def _gkl_parts(logits, next_values, eta):
    logp = F.log_softmax(logits, -1)
    lg = logp + eta * next_values
    logq = lg - torch.logsumexp(lg, -1, keepdim=True)
    return logp, logq, logq.exp()


@mistake(guided_kl, "the KL is the wrong way round: the chapter measures KL(q || pi), the divergence of the "
         "distribution that samples (the guided q) from the base model")
def _gkl_reverse(logits, next_values, eta):
    logp, logq, q = _gkl_parts(logits, next_values, eta)
    p = logp.exp()
    return (p * torch.where(p > 0, logp - logq, torch.zeros_like(logp))).sum(-1)


@mistake(guided_kl, "the normaliser is missing: q = pi e^(eta V) / Z, so log(q / pi) = eta V - log Z, and the KL "
         "is eta E_q[V] - log Z, not eta E_q[V]")
def _gkl_no_logz(logits, next_values, eta):
    logp, logq, q = _gkl_parts(logits, next_values, eta)
    return (q * torch.where(q > 0, eta * next_values, torch.zeros_like(logq))).sum(-1)


@mistake(guided_kl, "the logits were used as log-probabilities; log pi = log_softmax(logits) (a shift of the "
         "logits must not change the KL)")
def _gkl_raw_logits(logits, next_values, eta):
    logp, logq, q = _gkl_parts(logits, next_values, eta)
    return (q * torch.where(q > 0, logq - logits, torch.zeros_like(logq))).sum(-1)


@mistake(guided_kl, "you averaged log(q / pi) under the base pi instead of under q: that is -KL(pi || q), "
         "never positive")
def _gkl_under_pi(logits, next_values, eta):
    logp, logq, q = _gkl_parts(logits, next_values, eta)
    p = logp.exp()
    return (p * torch.where(q > 0, logq - logp, torch.zeros_like(logq))).sum(-1)


# ------------------------------------------------------------------- 2. filter_then_guide

def _ftg_cases():
    # base pi = (0.6, 0.3, 0.07, 0.03): top-p 0.85 keeps the first two; the critic loves token 3
    base = torch.log(torch.tensor([[0.6, 0.3, 0.07, 0.03]], dtype=torch.float64))
    vals = torch.log(torch.tensor([[0.2, 0.5, 0.1, 0.99]], dtype=torch.float64))
    g = torch.Generator().manual_seed(2)
    return [
        Case(args=(base, vals, 1.0, 0.85),
             label="hand case: top-p 0.85 keeps tokens 0 and 1; the critic loves token 3"),
        Case(args=(base + 1.5, vals, 4.0, 0.85), label="the same with shifted logits and eta = 4"),
        Case(args=(torch.randn(5, 8, generator=g, dtype=torch.float64) * 2,
                   torch.log(torch.rand(5, 8, generator=g, dtype=torch.float64)), 2.0, 0.8),
             label="5 states, 8 tokens, eta = 2, top-p 0.8"),
    ]


@exercise(chapter=20, cases=_ftg_cases, atol=1e-8,
          description="log q of top-p truncation of the base model followed by guidance, renormalised")
def filter_then_guide(logits, next_values, eta, top_p):
    """log_softmax(log pi truncated to its top-p support + eta * next_values); -inf outside the support."""
    return F.log_softmax(sampling_logprobs(logits, 1.0, None, top_p) + eta * next_values, -1)


@mistake(filter_then_guide, "you guided first and truncated after: the top-p set is then chosen by the GUIDED "
         "distribution, so a token the base model finds implausible but the critic loves survives (value hacking)")
def _ftg_guide_first(logits, next_values, eta, top_p):
    return sampling_logprobs(F.log_softmax(logits, -1) + eta * next_values, 1.0, None, top_p)


@mistake(filter_then_guide, "the guided scores were not renormalised: after adding eta * V the values are no longer "
         "log-probabilities; apply log_softmax (the article's open question: Z(h) != 1 for a learned critic)")
def _ftg_no_renorm(logits, next_values, eta, top_p):
    return sampling_logprobs(logits, 1.0, None, top_p) + eta * next_values


@mistake(filter_then_guide, "the guidance is missing: these are the truncated base model's log-probs, which is "
         "what a trainer recomputes if it forgets the logits processor")
def _ftg_no_guidance(logits, next_values, eta, top_p):
    return sampling_logprobs(logits, 1.0, None, top_p)


@mistake(filter_then_guide, "no truncation: the top-p filter of the base model was not applied before guiding")
def _ftg_no_filter(logits, next_values, eta, top_p):
    return F.log_softmax(F.log_softmax(logits, -1) + eta * next_values, -1)


# ------------------------------------------------------------------- 3. best_of_n_exact

def _bon_cases():
    return [
        Case(args=(torch.tensor([0.5], dtype=torch.float64), 2),
             label="hand case: p = 1/2, n = 2 -> accuracy 3/4, KL = 3/4 log(3/2) + 1/4 log(1/2)"),
        Case(args=(torch.tensor([0.05, 0.2, 0.6, 0.9], dtype=torch.float64), 8), label="four prompts, n = 8"),
        Case(args=(torch.tensor([0.3, 0.7], dtype=torch.float64), 1), label="n = 1 is the base model: KL 0"),
    ]


def _bkl(a, p):
    return a * torch.log(a / p) + (1 - a) * torch.log((1 - a) / (1 - p))


@exercise(chapter=20, cases=_bon_cases, atol=1e-8,
          description="exact accuracy and KL of best-of-n with a perfect binary verifier")
def best_of_n_exact(p, n):
    """(a, KL) with a = 1 - (1 - p)^n and KL = a log(a/p) + (1 - a) log((1 - a)/(1 - p)); p in (0, 1)."""
    a = 1 - (1 - p) ** n
    return a, _bkl(a, p)


@mistake(best_of_n_exact, "you used the bound log n - (n - 1)/n; it holds for continuous rewards, while with a "
         "binary verifier best-of-n is a two-outcome tilt whose KL is the Bernoulli KL between a and p")
def _bon_bound(p, n):
    a = 1 - (1 - p) ** n
    return a, torch.full_like(p, math.log(n) - (n - 1) / n)


@mistake(best_of_n_exact, "the KL is reversed: it is KL(best-of-n || base), an expectation under best-of-n, "
         "i.e. a log(a/p) + (1 - a) log((1 - a)/(1 - p))")
def _bon_reversed(p, n):
    a = 1 - (1 - p) ** n
    return a, _bkl(p, a)


@mistake(best_of_n_exact, "the failure term is missing: best-of-n also rescales the failures, by (1 - a)/(1 - p)")
def _bon_no_failure(p, n):
    a = 1 - (1 - p) ** n
    return a, a * torch.log(a / p)


@mistake(best_of_n_exact, "the accuracy is not n * p (a union bound that exceeds 1): at least one of n independent "
         "draws succeeds with probability 1 - (1 - p)^n")
def _bon_union(p, n):
    a = torch.clamp(n * p, max=1 - 1e-12)
    return a, _bkl(a, p)
