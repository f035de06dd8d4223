r"""Checkers for the exercises of chapter 23, ``lessons/23_plan_act_verify.ipynb``.

* ``retry_rate(p, n)``: the expected share of problems solved by ``n`` independent attempts with an
  exact verifier, :math:`\frac1N\sum_i \big(1-(1-p_i)^n\big)`; ``p`` ``[N]`` -> 0-dim.
* ``fooled_retry(p, f, n)``: the probability that a verified retry loop ends with a right value when
  a wrong value passes with probability :math:`f`:
  :math:`\frac{p}{p+f}\big(1-(1-p-f)^n\big)`, 0 where :math:`p + f = 0`; elementwise.
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


# ------------------------------------------------------------------- 1. retry_rate

def _rr_cases():
    g = torch.Generator().manual_seed(23)
    p = torch.rand(16, generator=g, dtype=torch.float64)
    return [
        Case(args=(torch.tensor([0.0, 1.0], dtype=torch.float64), 4), label="p = (0, 1), n = 4: 0.5, not 1 - 0.5^4"),
        Case(args=(torch.tensor([0.5], dtype=torch.float64), 3), label="one problem, p = 0.5, n = 3: 0.875"),
        Case(args=(p, 5), label="16 problems with random p, n = 5"),
        Case(args=(p ** 3, 2), label="16 mostly hard problems, n = 2"),
    ]


@exercise(chapter=23, cases=_rr_cases, atol=1e-9, description="expected share solved by n independent attempts")
def retry_rate(p, n):
    """mean_i [1 - (1 - p_i)^n]: apply the retry formula per problem, THEN average; p [N] -> 0-dim."""
    V.tensor_in(p, "p", 0.0, 1.0)
    n = V.int_in(n, "n")
    return (1 - (1 - p) ** n).mean()


@mistake(retry_rate, "you pooled the problems first, 1 - (1 - mean p)^n; the formula is concave in p, so "
         "averaging before applying it overstates what retries buy: apply it per problem, then average")
def _rr_pooled(p, n):
    return 1 - (1 - p.mean()) ** n


@mistake(retry_rate, "that is the probability that all n attempts FAIL, (1 - p)^n; the success is 1 minus it")
def _rr_failure(p, n):
    return ((1 - p) ** n).mean()


@mistake(retry_rate, "p^n is the probability that every attempt is right; the loop needs only one right attempt")
def _rr_all_right(p, n):
    return (p ** n).mean()


# ------------------------------------------------------------------- 2. fooled_retry

def _fr_cases():
    g = torch.Generator().manual_seed(7)
    p = torch.rand(12, generator=g, dtype=torch.float64) * 0.7
    f = torch.rand(12, generator=g, dtype=torch.float64) * (1 - p) * 0.8
    return [
        Case(args=(torch.tensor([0.5], dtype=torch.float64), torch.tensor([0.25], dtype=torch.float64), 2),
             label="p = 0.5, f = 0.25, n = 2: 0.5 + 0.25 * 0.5 = 0.625"),
        Case(args=(torch.tensor([0.6, 0.2], dtype=torch.float64), torch.zeros(2, dtype=torch.float64), 3),
             label="an exact verifier (f = 0): 1 - (1 - p)^n"),
        Case(args=(torch.tensor([0.0, 0.3], dtype=torch.float64), torch.tensor([0.0, 0.7], dtype=torch.float64), 5),
             label="p + f = 0 (never accepted: 0) and p + f = 1 (the first attempt always stops the loop)"),
        Case(args=(p, f, 4), label="12 random (p, f) pairs, n = 4"),
    ]


@exercise(chapter=23, cases=_fr_cases, atol=1e-9, description="verified retries when the verifier can be fooled")
def fooled_retry(p, f, n):
    """p / (p + f) * (1 - (1 - p - f)^n), elementwise, 0 where p + f = 0."""
    V.tensor_in(p, "p", 0.0, 1.0)
    V.tensor_in(f, "f", 0.0, 1.0)
    n = V.int_in(n, "n")
    s = p + f
    return torch.where(s > 0, p / s.clamp_min(1e-300) * (1 - (1 - s) ** n), torch.zeros_like(p))


@mistake(fooled_retry, "f was ignored (1 - (1 - p)^n): a wrong value the verifier accepts ends the loop, "
         "so it cannot be retried")
def _fr_ignores_f(p, f, n):
    return 1 - (1 - p) ** n


@mistake(fooled_retry, "an accepted wrong value was counted as a success: 1 - (1 - p - f)^n is the "
         "probability that the loop stops on an accepted value, right or wrong")
def _fr_accepted(p, f, n):
    return 1 - (1 - p - f) ** n


@mistake(fooled_retry, "the normalisation by p + f is missing: the loop stops on a right value with "
         "probability p / (p + f) among the attempts it stops on")
def _fr_unnormalised(p, f, n):
    return p * (1 - (1 - p - f) ** n)


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
