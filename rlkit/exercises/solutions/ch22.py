r"""Checkers for the exercises of chapter 22, ``lessons/22_exploration_diversity.ipynb``.

* ``pass_at_k_estimate(n, c, k)``: the unbiased pass@k of Chen et al. (2021),
  :math:`1-\binom{n-c}{k}/\binom{n}{k}`, elementwise over int64 tensors ``n`` and ``c``, float64.
* ``diversity_bonus(responses, correct, group_size)``: the within-group bonus
  :math:`d_i = c_i\,(1-\frac{n_i-1}{m-1})`, ``[N]`` float32.
* ``normalize_intrinsic(raw)``: raw intrinsic rewards ``[S, B]`` (``S`` steps of ``B``) divided, step
  by step, by the running population std of all raw rewards seen so far (this step included),
  :math:`\tilde r_{s,i} = r_{s,i}/\sqrt{\sigma^2_{\le s} + 10^{-8}}`, float64.
"""
from __future__ import annotations

import math
from collections import Counter

import torch

from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []


# ------------------------------------------------------------------- 1. pass_at_k_estimate

def _pk_cases():
    n = torch.tensor([10, 10, 10, 10, 5, 64, 64, 3])
    c = torch.tensor([0, 1, 3, 8, 5, 2, 40, 1])
    return [
        Case(args=(torch.tensor([4]), torch.tensor([1]), 2), label="hand case: n = 4, c = 1, k = 2 -> 1/2"),
        Case(args=(n, c, 1), label="k = 1 (pass@1 = c / n)"),
        Case(args=(n, c, 3), label="k = 3, including n - c < k (certain success)"),
        Case(args=(torch.tensor([64, 64, 20]), torch.tensor([1, 10, 0]), 16), label="k = 16"),
    ]


def _pk(n, c, k, f):
    return torch.tensor([f(int(a), int(b), k) for a, b in zip(n, c)], dtype=torch.float64)


@exercise(chapter=22, cases=_pk_cases, atol=1e-9,
          description="the unbiased pass@k estimator from n samples with c correct")
def pass_at_k_estimate(n, c, k):
    """1 - C(n - c, k) / C(n, k) elementwise (1 when n - c < k); float64."""
    return _pk(n, c, k, lambda a, b, k: 1.0 - math.comb(a - b, k) / math.comb(a, k))


@mistake(pass_at_k_estimate, "you plugged p = c / n into 1 - (1 - p)^k; that estimator is biased (downwards, by "
         "Jensen: 1 - (1 - p)^k is concave in p). Count the k-subsets without a correct sample: C(n - c, k) / C(n, k)")
def _pk_plugin(n, c, k):
    return _pk(n, c, k, lambda a, b, k: 1.0 - (1.0 - b / a) ** k)


@mistake(pass_at_k_estimate, "you returned C(n - c, k) / C(n, k), the chance that all k samples are WRONG; "
         "pass@k is one minus it")
def _pk_complement(n, c, k):
    return _pk(n, c, k, lambda a, b, k: math.comb(a - b, k) / math.comb(a, k))


@mistake(pass_at_k_estimate, "you used the union bound min(1, k c / n); it overcounts subsets with several "
         "correct samples")
def _pk_union(n, c, k):
    return _pk(n, c, k, lambda a, b, k: min(1.0, k * b / a))


@mistake(pass_at_k_estimate, "off by one in the product: 1 - prod_{i=n-c+1}^{n} (1 - k/i) runs over c terms "
         "starting at i = n - c + 1, not at i = n - c")
def _pk_off_by_one(n, c, k):
    def f(a, b, k):
        if a - b < k:
            return 1.0
        p = 1.0
        for i in range(a - b, a + 1):
            p *= 1.0 - k / i
        return 1.0 - p
    return _pk(n, c, k, f)


# ------------------------------------------------------------------- 2. diversity_bonus

def _db_cases():
    resp = ["10=370", "10=370", "20=740", "11=5", "10=370", "10=370", "10=370", "10=370",
            "12=144", "13=156", "14=168", "15=180"]
    corr = torch.tensor([1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 1])
    return [
        Case(args=(["a", "a", "b", "c"], torch.tensor([1, 1, 1, 0]), 4),
             label="hand case: 'a' twice, 'b' once, 'c' wrong -> [2/3, 2/3, 1, 0]"),
        Case(args=(resp, corr, 4), label="three groups of 4: mixed, all identical, all different"),
        Case(args=(resp[:6], corr[:6], 2), label="groups of 2"),
        Case(args=(["x", "y", "x", "x"], torch.tensor([1, 1, 1, 1]), 4),
             label="another group of 4: 'x' three times, 'y' once -> [1/3, 1, 1/3, 1/3]"),
    ]


def _db(responses, correct, m, gate=True, within=True, minus_self=True, denom=None):
    N = len(responses)
    out = torch.zeros(N)
    for g in range(N // m):
        grp = responses[g * m:(g + 1) * m]
        counts = Counter(grp if within else responses)
        for j, r in enumerate(grp):
            n_i = counts[r] - (1 if minus_self else 0)
            out[g * m + j] = 1.0 - n_i / (m - 1 if denom is None else denom)
    return out * torch.as_tensor(correct).float() if gate else out


@exercise(chapter=22, cases=_db_cases, atol=1e-6,
          description="the within-group diversity bonus for correct answers")
def diversity_bonus(responses, correct, group_size):
    """d_i = c_i (1 - (n_i - 1) / (m - 1)), n_i = copies of response i in its group; [N] float32."""
    return _db(responses, correct, group_size)


@mistake(diversity_bonus, "the bonus is not gated by correctness: a wrong but unusual response must earn 0, or "
         "the policy is paid for writing different junk")
def _db_ungated(responses, correct, group_size):
    return _db(responses, correct, group_size, gate=False)


@mistake(diversity_bonus, "you counted copies over the whole batch; the bonus compares a response with the other "
         "m - 1 responses of ITS group (the same prompt)")
def _db_batch(responses, correct, group_size):
    return _db(responses, correct, group_size, within=False, denom=group_size - 1)


@mistake(diversity_bonus, "the response counted itself as a copy: n_i includes i, so subtract one before dividing "
         "by the m - 1 others (a unique answer must earn exactly 1)")
def _db_self(responses, correct, group_size):
    return _db(responses, correct, group_size, minus_self=False)


# ------------------------------------------------------------------- 3. normalize_intrinsic

def _ni_cases():
    g = torch.Generator().manual_seed(22)
    shrink = torch.logspace(0, -2, 6, dtype=torch.float64)[:, None]
    decaying = torch.rand(6, 5, generator=g, dtype=torch.float64) * shrink
    return [
        Case(args=(torch.tensor([[1.0, 3.0], [2.0, 2.0]], dtype=torch.float64),),
             label="hand case: step 1 std 1 -> [1, 3]; step 2 std sqrt(1/2) over all four values"),
        Case(args=(decaying,), label="6 steps of 5 raw rewards that shrink 100-fold (a predictor that learns)"),
        Case(args=(torch.rand(3, 4, generator=g, dtype=torch.float64) * 50 + 10,),
             label="large raw rewards far from 0 (mean 35)"),
    ]


def _ni(raw, running=True, include_current=True, centre=False, var=False):
    out = torch.zeros_like(raw)
    seen = []
    for s in range(raw.shape[0]):
        if include_current:
            seen.append(raw[s])
        pool = (torch.cat(seen) if seen else raw[s][:0]) if running else raw[s]
        if len(pool) == 0:
            v, mu = torch.zeros((), dtype=raw.dtype), torch.zeros((), dtype=raw.dtype)
        else:
            v, mu = pool.var(unbiased=False), pool.mean()
        scale = (v + 1e-8) if var else (v + 1e-8).sqrt()
        out[s] = ((raw[s] - mu) if centre else raw[s]) / scale
        if not include_current:
            seen.append(raw[s])
    return out


@exercise(chapter=22, cases=_ni_cases, atol=1e-6, rtol=1e-6,
          description="divide intrinsic rewards by the running std of all raw rewards so far")
def normalize_intrinsic(raw):
    """r / sqrt(var(all raw rewards up to and including this step) + 1e-8), step by step; [S, B] float64."""
    return _ni(raw)


@mistake(normalize_intrinsic, "you divided by the std of the CURRENT step only; the running std over all steps is "
         "what lets the bonus fade as states become familiar (per-step scaling re-inflates it every step)")
def _ni_per_step(raw):
    return _ni(raw, running=False)


@mistake(normalize_intrinsic, "you subtracted the mean; RND only divides by the std, so novelty stays positive "
         "and its ordering and zero are kept")
def _ni_centred(raw):
    return _ni(raw, centre=True)


@mistake(normalize_intrinsic, "you divided by the variance, not the standard deviation: the result is not "
         "scale-free (doubling the raw rewards halves the bonus)")
def _ni_var(raw):
    return _ni(raw, var=True)


@mistake(normalize_intrinsic, "the current step's rewards were left out of the running statistics; update them "
         "first, then divide (the first step would otherwise divide by sqrt(1e-8))")
def _ni_stale(raw):
    return _ni(raw, include_current=False)
