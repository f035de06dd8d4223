r"""Checkers for the exercises of chapter 23, ``lessons/23_plan_act_verify.ipynb``.

* ``expected_calls(p, f, n)``: the expected number of executor calls of a verified retry loop of at
  most ``n`` attempts, :math:`\sum_{i<n}(1-p-f)^i`, ``n`` where :math:`p + f = 0`; elementwise.
* ``beta_retry_rate(a, b, n)``: the share of a population of problems with :math:`p\sim\mathrm{Beta}(a, b)`
  solved by ``n`` independent attempts with an exact verifier, :math:`1 - B(a, b+n)/B(a, b)`; elementwise.
* ``two_step_success(q_carry, q_free)``: the exact probability that both steps of a two-step
  addition are right when a step's accuracy depends only on whether it needs a units carry, with
  the three units digits independent and uniform; a float64 0-dim tensor.

Chapter: 23_plan_act_verify.
"""
from __future__ import annotations

import torch

from rlkit import _validate as V
from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []


# ------------------------------------------------------------------- 1. expected_calls
# (retry_rate and fooled_retry were each one call of rlkit.llm.hierarchy.retry_success, whose call
# retry_success(p, n, f).mean() the chapter shows in a code cell; issue 23. The two exercises now ask
# for what retries cost and for how many are needed.)

def _ec_cases():
    g = torch.Generator().manual_seed(23)
    p = torch.rand(12, generator=g, dtype=torch.float64) * 0.7
    f = torch.rand(12, generator=g, dtype=torch.float64) * (1 - p) * 0.8
    return [
        Case(args=(torch.tensor([0.5], dtype=torch.float64), torch.tensor([0.0], dtype=torch.float64), 3),
             label="hand case: p = 0.5, f = 0, n = 3: 1 + 0.5 + 0.25 = 1.75"),
        Case(args=(torch.tensor([0.0, 0.0, 0.3], dtype=torch.float64),
                   torch.tensor([0.0, 0.2, 0.7], dtype=torch.float64), 5),
             label="never accepted (n calls), only wrong values accepted (p = 0), p + f = 1 (one call)"),
        Case(args=(p, f, 4), label="12 random (p, f) pairs, n = 4"),
        Case(args=(p, f, 1), label="n = 1: one call"),
    ]


@exercise(chapter=23, cases=_ec_cases, atol=1e-9, description="the expected number of calls of a verified retry loop")
def expected_calls(p, f, n):
    """sum_{i<n} (1 - p - f)^i = (1 - (1 - p - f)^n) / (p + f), n where p + f = 0; elementwise."""
    V.tensor_in(p, "p", 0.0, 1.0)
    V.tensor_in(f, "f", 0.0, 1.0)
    n = V.int_in(n, "n")
    a = p + f
    return torch.where(a > 0, (1 - (1 - a) ** n) / a.clamp_min(1e-300), torch.full_like(p, float(n)))


@mistake(expected_calls, "the loop does not always make n calls: it stops at the first accepted value")
def _ec_always_n(p, f, n):
    return torch.full_like(p, float(n))


@mistake(expected_calls, "1 / (p + f) is the mean of an unlimited geometric number of calls; the loop makes at "
         "most n, so the sum stops at i = n - 1")
def _ec_untruncated(p, f, n):
    a = p + f
    return torch.where(a > 0, 1 / a.clamp_min(1e-300), torch.full_like(p, float(n)))


@mistake(expected_calls, "f was ignored: a wrong value that the verifier accepts also stops the loop, so the "
         "chance to stop at each call is p + f, not p")
def _ec_ignores_f(p, f, n):
    return torch.where(p > 0, (1 - (1 - p) ** n) / p.clamp_min(1e-300), torch.full_like(p, float(n)))


@mistake(expected_calls, "off by one: the first call is always made, so the sum runs over i = 0 .. n - 1, "
         "(1 - s^n) / (1 - s) with s = 1 - p - f")
def _ec_off_by_one(p, f, n):
    a = p + f
    return torch.where(a > 0, (1 - a) * (1 - (1 - a) ** n) / a.clamp_min(1e-300), torch.full_like(p, float(n)))


# ------------------------------------------------------------------- 2. beta_retry_rate

def _br_cases():
    return [
        Case(args=(torch.tensor([1.0], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64), 3),
             label="hand case: p uniform (a = b = 1), n = 3: 1 - 1/4 = 0.75"),
        Case(args=(torch.tensor([0.5, 2.0, 5.0], dtype=torch.float64),
                   torch.tensor([0.5, 2.0, 1.0], dtype=torch.float64), 4),
             label="a U-shaped, a bell-shaped and an easy population, n = 4"),
        Case(args=(torch.tensor([0.3, 1.0], dtype=torch.float64), torch.tensor([3.0, 9.0], dtype=torch.float64), 1),
             label="n = 1: the mean success a / (a + b)"),
        Case(args=(torch.tensor([0.2, 2.0], dtype=torch.float64), torch.tensor([0.8, 50.0], dtype=torch.float64), 2000),
             label="n = 2000: the Beta functions overflow; needs lgamma"),
    ]


def _lbeta(a, b):
    return torch.lgamma(a) + torch.lgamma(b) - torch.lgamma(a + b)


@exercise(chapter=23, cases=_br_cases, atol=1e-9,
          description="what n retries buy over a Beta(a, b) population of problems, exactly")
def beta_retry_rate(a, b, n):
    """1 - E[(1 - p)^n] for p ~ Beta(a, b): 1 - B(a, b + n) / B(a, b), elementwise."""
    V.tensor_in(a, "a", 0.0)
    V.tensor_in(b, "b", 0.0)
    n = V.int_in(n, "n")
    return 1 - torch.exp(_lbeta(a, b + n) - _lbeta(a, b))


@mistake(beta_retry_rate, "you pooled the problems first, 1 - (1 - a/(a+b))^n; (1 - p)^n is convex in p, so the "
         "average problem overstates what retries buy: average (1 - p)^n over the Beta distribution")
def _br_pooled(a, b, n):
    return 1 - (1 - a / (a + b)) ** n


@mistake(beta_retry_rate, "that is E[(1 - p)^n] = B(a, b + n) / B(a, b), the chance that all n attempts fail; the "
         "success is 1 minus it")
def _br_failure(a, b, n):
    return torch.exp(_lbeta(a, b + n) - _lbeta(a, b))


@mistake(beta_retry_rate, "B(a + n, b) / B(a, b) is E[p^n], the chance that every attempt is right; the loop needs "
         "one right attempt")
def _br_all_right(a, b, n):
    return torch.exp(_lbeta(a + n, b) - _lbeta(a, b))


@mistake(beta_retry_rate, "off by one: E[(1 - p)^n] = B(a, b + n) / B(a, b), with b + n, not b + n - 1")
def _br_off_by_one(a, b, n):
    return 1 - torch.exp(_lbeta(a, b + n - 1) - _lbeta(a, b))


# ------------------------------------------------------------------- 3. two_step_success

def _ts_cases():
    return [
        Case(args=(0.0, 1.0), label="carries always wrong, carry-free sums always right: 0.22"),
        Case(args=(0.2, 0.95), label="the shipped model, roughly"),
        Case(args=(0.5, 0.5), label="no dependence on the carry: 0.25"),
        Case(args=(1.0, 0.0), label="only carries right"),
    ]


def _digits():
    d = torch.arange(10, dtype=torch.float64)
    return torch.meshgrid(d, d, d, indexing="ij")


def _q(c, q_carry, q_free):
    return torch.where(c, torch.tensor(float(q_carry), dtype=torch.float64),
                       torch.tensor(float(q_free), dtype=torch.float64))


@exercise(chapter=23, cases=_ts_cases, atol=1e-9, description="exact two-step success with the carry correlation")
def two_step_success(q_carry, q_free):
    """E[q(c1) q(c2)] over uniform units digits: c1 = ua + ub >= 10, c2 = (ua + ub) % 10 + uc >= 10."""
    q_carry = V.real_in(q_carry, "q_carry", 0.0, 1.0)
    q_free = V.real_in(q_free, "q_free", 0.0, 1.0)
    ua, ub, uc = _digits()
    c1, c2 = ua + ub >= 10, (ua + ub) % 10 + uc >= 10
    return (_q(c1, q_carry, q_free) * _q(c2, q_carry, q_free)).mean()


@mistake(two_step_success, "you multiplied the two steps' average accuracies; the same units digits decide "
         "both carries (a large (ua + ub) mod 10 makes step 1 carry-free and step 2 likely to carry), so the "
         "steps are correlated: average the product over the digits instead")
def _ts_product(q_carry, q_free):
    q = 0.45 * q_carry + 0.55 * q_free
    return torch.tensor(q * q, dtype=torch.float64)


@mistake(two_step_success, "step 2 adds the UNITS DIGIT of step 1's result, (ua + ub) mod 10, not ua + ub itself")
def _ts_no_mod(q_carry, q_free):
    ua, ub, uc = _digits()
    c1, c2 = ua + ub >= 10, ua + ub + uc >= 10
    return (_q(c1, q_carry, q_free) * _q(c2, q_carry, q_free)).mean()


@mistake(two_step_success, "off by one: a carry happens when the units digits sum to 10 or more, not 9")
def _ts_off_by_one(q_carry, q_free):
    ua, ub, uc = _digits()
    c1, c2 = ua + ub >= 9, (ua + ub) % 10 + uc >= 9
    return (_q(c1, q_carry, q_free) * _q(c2, q_carry, q_free)).mean()
