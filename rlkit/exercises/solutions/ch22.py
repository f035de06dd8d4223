r"""Checkers for the exercises of chapter 22, ``lessons/22_exploration_diversity.ipynb``.

* ``best_of_k_estimate(rewards, k)``: the unbiased expected best of ``k`` of ``n`` graded rewards,
  :math:`\sum_i \binom{i-1}{k-1}/\binom nk\, r_{(i)}` over each row sorted ascending ``[B, n] -> [B]``;
  for 0/1 rewards the pass@k of Chen et al. (2021).
* ``near_duplicate_bonus(responses, correct, group_size)``: the within-group bonus with near-duplicates
  counted by the Jaccard similarity :math:`J` of their character bigrams,
  :math:`d_i = c_i\,(1-\frac1{m-1}\sum_{j\ne i}J(y_i,y_j))`, ``[N]`` float32.
* ``normalize_intrinsic(raw)``: raw intrinsic rewards ``[S, B]`` (``S`` steps of ``B``) divided, step
  by step, by the running population std of all raw rewards seen so far (this step included),
  :math:`\tilde r_{s,i} = r_{s,i}/\sqrt{\sigma^2_{\le s} + 10^{-8}}`, float64.
"""
from __future__ import annotations

import math

import torch

from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []


# ------------------------------------------------------------------- 1. best_of_k_estimate
# (was pass_at_k_estimate: rlkit.llm.explore.pass_at_k, which the chapter shows, passed its check as a
# one-line call; issue 23. The exercise now generalises it to graded rewards.)

def _bk_cases():
    g = torch.Generator().manual_seed(2201)
    binary = torch.tensor([[0.] * 10, [1.] + [0.] * 9, [1., 0., 1., 0., 0., 1., 0., 0., 0., 0.],
                           [1., 1., 1., 0., 1., 1., 1., 1., 0., 1.]], dtype=torch.float64)
    graded = torch.randint(0, 4, (3, 8), generator=g).double() / 3
    cont = torch.rand(2, 64, generator=g, dtype=torch.float64)
    return [
        Case(args=(torch.tensor([[0.0, 0.5, 1.0]], dtype=torch.float64), 2),
             label="hand case: {0, 0.5, 1}, k = 2 -> (0.5 + 1 + 1) / 3 = 5/6"),
        Case(args=(binary, 3), label="0/1 rewards, n = 10, k = 3: pass@3 (c = 0, 1, 3, 8)"),
        Case(args=(graded, 4), label="graded rewards with ties, n = 8, k = 4"),
        Case(args=(graded, 1), label="k = 1: the mean"),
        Case(args=(graded, 8), label="k = n: the maximum"),
        Case(args=(cont, 16), label="n = 64 continuous rewards, k = 16"),
    ]


def _bk(rewards, k, weight):
    n = rewards.shape[-1]
    w = torch.tensor([weight(i, n, k) for i in range(1, n + 1)], dtype=rewards.dtype)
    return (rewards.sort(-1).values * w).sum(-1)


@exercise(chapter=22, cases=_bk_cases, atol=1e-9,
          description="the unbiased expected best of k samples from n graded rewards (pass@k for 0/1 rewards)")
def best_of_k_estimate(rewards, k):
    """sum_i C(i - 1, k - 1) / C(n, k) * r_(i) over each row's rewards sorted ascending; [B, n] -> [B]."""
    return _bk(rewards, k, lambda i, n, k: math.comb(i - 1, k - 1) / math.comb(n, k))


@mistake(best_of_k_estimate, "you took the best of k draws WITH replacement from the samples, sum r_(i) [(i/n)^k - "
         "((i-1)/n)^k]: the plug-in, biased downwards like 1 - (1 - c/n)^k; average over the k-subsets instead")
def _bk_plugin(rewards, k):
    return _bk(rewards, k, lambda i, n, k: (i / n) ** k - ((i - 1) / n) ** k)


@mistake(best_of_k_estimate, "you averaged the k best samples; best-of-k keeps ONE answer, the best of k, and the "
         "i-th smallest is that answer in C(i - 1, k - 1) of the C(n, k) subsets")
def _bk_top_k_mean(rewards, k):
    return rewards.sort(-1).values[..., -k:].mean(-1)


@mistake(best_of_k_estimate, "the weights run the wrong way: C(n - i, k - 1) / C(n, k) on the i-th smallest is "
         "the expected WORST of k samples")
def _bk_worst(rewards, k):
    return _bk(rewards, k, lambda i, n, k: math.comb(n - i, k - 1) / math.comb(n, k))


@mistake(best_of_k_estimate, "off by one in the weights: the i-th smallest is the maximum of a k-subset when the "
         "other k - 1 members come from the i - 1 samples below it, C(i - 1, k - 1), not C(i, k - 1)")
def _bk_off_by_one(rewards, k):
    return _bk(rewards, k, lambda i, n, k: math.comb(i, k - 1) / math.comb(n, k))


# ------------------------------------------------------------------- 2. near_duplicate_bonus
# (was diversity_bonus: rlkit.llm.explore.group_diversity_bonus, which the chapter shows, passed its
# check as a one-line call; issue 23. The exercise now counts near-duplicates by their similarity.)

def _bigrams(s):
    return {s[i:i + 2] for i in range(len(s) - 1)}


def _jaccard(a, b):
    A, B = _bigrams(a), _bigrams(b)
    if not A and not B:
        return 1.0 if a == b else 0.0
    return len(A & B) / len(A | B)


def _nd_cases():
    resp = ["10=370", "10=370.", "20=740", "11=5", "10=370", "10=370", "10=370", "10=370",
            "12=144", "13=156", "14=168", "15=180"]
    corr = torch.tensor([1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 1])
    return [
        Case(args=(["10=370", "10=370.", "20=740", "11=5"], torch.tensor([1, 1, 1, 0]), 4),
             label="hand case: a near-duplicate ('10=370' and '10=370.', similarity 5/6), a different answer, "
                   "a wrong one"),
        Case(args=(resp, corr, 4), label="three groups of 4: near-duplicates, identical answers, different answers"),
        Case(args=(resp[:6], corr[:6], 2), label="groups of 2"),
        Case(args=(["", "", "7", "7", "7", "70", "ab", "ba"], torch.tensor([1, 1, 1, 1, 1, 1, 1, 1]), 4),
             label="strings without bigrams: equal ones are duplicates ('' and '', '7' and '7'), others are not"),
        Case(args=(["x", "y", "x", "x"], torch.tensor([1, 1, 1, 1]), 4),
             label="'x' three times, 'y' once: the exact-copy bonus [1/3, 1, 1/3, 1/3]"),
    ]


def _nd(responses, correct, m, gate=True, sim=_jaccard, within=True, self_too=False, denom=None):
    N = len(responses)
    out = torch.zeros(N)
    for g in range(N // m):
        grp = responses[g * m:(g + 1) * m]
        pool = grp if within else responses
        for j, r in enumerate(grp):
            others = [x for k, x in enumerate(pool) if self_too or (pool is grp and k != j)
                      or (pool is not grp and k != g * m + j)]
            out[g * m + j] = 1.0 - sum(sim(r, x) for x in others) / (m - 1 if denom is None else denom)
    return out * torch.as_tensor(correct).float() if gate else out


@exercise(chapter=22, cases=_nd_cases, atol=1e-6,
          description="the within-group diversity bonus for correct answers, counting near-duplicates by similarity")
def near_duplicate_bonus(responses, correct, group_size):
    """d_i = c_i (1 - sum_{j != i in the group} J(y_i, y_j) / (m - 1)), J the bigram Jaccard; [N] float32."""
    return _nd(responses, correct, group_size)


@mistake(near_duplicate_bonus, "you counted exact copies only (the chapter's bonus); near-duplicates such as '10=370' "
         "and '10=370.' must count by their bigram similarity J")
def _nd_exact(responses, correct, group_size):
    return _nd(responses, correct, group_size, sim=lambda a, b: 1.0 if a == b else 0.0)


@mistake(near_duplicate_bonus, "the bonus is not gated by correctness: a wrong but unusual response must earn 0, "
         "or the policy is paid for writing different junk")
def _nd_ungated(responses, correct, group_size):
    return _nd(responses, correct, group_size, gate=False)


@mistake(near_duplicate_bonus, "the response was compared with itself (similarity 1): sum over the m - 1 OTHER "
         "responses of its group, so that a unique answer earns exactly 1")
def _nd_self(responses, correct, group_size):
    return _nd(responses, correct, group_size, self_too=True)


@mistake(near_duplicate_bonus, "you compared with every response of the batch; the bonus compares a response with "
         "the other m - 1 responses of ITS group (the same prompt)")
def _nd_batch(responses, correct, group_size):
    return _nd(responses, correct, group_size, within=False)


@mistake(near_duplicate_bonus, "you divided by m; the similarities are averaged over the m - 1 other responses")
def _nd_over_m(responses, correct, group_size):
    return _nd(responses, correct, group_size, denom=group_size)


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
