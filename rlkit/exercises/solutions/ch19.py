r"""Checkers for the exercises of chapter 19, ``lessons/19_robust_prompts.ipynb``.

Values are per-prompt (or per-group) rewards: lower is worse, and the adversary minimises.

* ``kl_radius(values, target)``: the KL worst case inverted: the radius :math:`\delta = \mathrm{KL}(q\|u)`
  of the ball around the uniform distribution whose worst case :math:`\sum_i q_iv_i`, with
  :math:`q \propto e^{-v/\nu}`, equals ``target`` (0 for a target at or above the mean,
  :math:`\log(n/\#\text{minimisers})` at the minimum); returns ``(delta, q)``.
* ``cvar_prompts(values, alpha)``: the mean of the worst :math:`\alpha` share of equally likely
  prompts, the boundary prompt counted fractionally.
* ``group_dro_update(q, values, eta)``: one exponentiated-gradient step of the group adversary,
  :math:`q_g \leftarrow q_g e^{-\eta v_g}/Z`.
* ``tv_worst_case(values, eps, p)``: the worst case over the TV ball of radius :math:`\delta`
  (``eps``), mass :math:`\delta` moved
  from the best points to the worst point anywhere (including points with :math:`p = 0`); returns
  ``(value, q)``.
"""
from __future__ import annotations

import math

import torch

from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []
F64 = torch.float64


def _t(x):
    return torch.tensor(x, dtype=F64)


def _tilt(v, tau):
    w = torch.softmax(-(v - v.min()) / tau, 0)
    return w


def _kl_u(q):
    n = q.shape[0]
    m = q > 0
    return float((q[m] * (q[m] * n).log()).sum())


# ------------------------------------------------------------------------ 1. kl_radius
# (was kl_worst_case: rlkit.dro.kl_dro, which the chapter shows, passed its check through a one-line
# adapter; issue 23. The exercise now asks the inverse question: how large a ball brings the worst
# case down to a given value.)

def _kr_cases():
    g = torch.Generator().manual_seed(1901)
    r8 = torch.rand(8, generator=g, dtype=F64)
    ties = _t([0.2, 0.9, 0.2, 0.7, 0.5, 0.2])
    return [
        Case(args=(_t([0.0, 1.0]), 0.25), label="hand case: values 0 and 1, target 0.25 -> q = (3/4, 1/4), "
             "delta = 3/4 log 3/2 + 1/4 log 1/2"),
        Case(args=(_t([0.2, 0.9, 0.5, 0.7]), 0.4), label="four prompts, target 0.4"),
        Case(args=(r8, float(r8.min()) + 0.02), label="eight random values, target just above the minimum"),
        Case(args=(r8, float(r8.mean()) + 0.1), label="a target at or above the mean: radius 0"),
        Case(args=(ties, 0.2), label="three prompts tied at the minimum, target = the minimum"),
    ]


def _kr_solve(values, target):
    lo, hi = math.log(1e-8), math.log(1e8)
    for _ in range(300):
        mid = 0.5 * (lo + hi)
        if float((_tilt(values, math.exp(mid)) * values).sum()) < target:
            lo = mid
        else:
            hi = mid
    return _tilt(values, math.exp(0.5 * (lo + hi)))


@exercise(chapter=19, cases=_kr_cases, atol=1e-7,
          description="the KL radius whose worst case equals a target value (the KL worst case, inverted)")
def kl_radius(values, target):
    """(delta, q): the radius delta = KL(q || uniform) whose worst case sum q v is target (>= min v)."""
    n = values.shape[0]
    if target >= float(values.mean()):
        return torch.zeros((), dtype=values.dtype), torch.full_like(values, 1.0 / n)
    at_min = values == values.min()
    if target <= float(values.min()):
        q = at_min.to(values.dtype) / at_min.sum()
    else:
        q = _kr_solve(values, target)
    return torch.tensor(_kl_u(q), dtype=values.dtype), q


@mistake(kl_radius, "the KL is the wrong way round: the ball is KL(q || p) = sum q log(q / p), not KL(p || q)")
def _kr_reverse(values, target):
    delta, q = kl_radius(values, target)
    n = values.shape[0]
    return -(torch.log(q * n)).mean(), q


@mistake(kl_radius, "you returned sum q log q, the negative entropy; the KL to the uniform distribution is "
         "sum q log(n q) = log n + sum q log q")
def _kr_neg_entropy(values, target):
    delta, q = kl_radius(values, target)
    return delta - math.log(values.shape[0]), q


@mistake(kl_radius, "the radius is in nats (natural logarithms), not bits")
def _kr_bits(values, target):
    delta, q = kl_radius(values, target)
    return delta / math.log(2.0), q


@mistake(kl_radius, "with several prompts at the minimum the worst case spreads over all of them: the radius that "
         "reaches the minimum is log(n / #minimisers), not log n")
def _kr_ties(values, target):
    delta, q = kl_radius(values, target)
    if target <= float(values.min()):
        q = torch.zeros_like(values)
        q[int(torch.argmin(values))] = 1.0
        return torch.tensor(math.log(values.shape[0]), dtype=values.dtype), q
    return delta, q


# ------------------------------------------------------------------------ 2. cvar_prompts

def _cv_cases():
    g = torch.Generator().manual_seed(1902)
    return [
        Case(args=(_t([0.0, 1.0, 0.5, 0.25]), 0.5), label="four prompts, alpha = 0.5: the mean of the worst two"),
        Case(args=(_t([0.3, 0.1, 0.9, 0.6, 0.2]), 0.3),
             label="five prompts, alpha = 0.3: 1.5 prompts, one counted half"),
        Case(args=(torch.rand(10, generator=g, dtype=F64), 0.25), label="ten random values, alpha = 0.25"),
        Case(args=(torch.rand(7, generator=g, dtype=F64), 1.0), label="alpha = 1: the mean"),
    ]


def _tail(values, alpha, worst=True, frac=True):
    n = values.shape[0]
    v = torch.sort(values, descending=not worst).values
    k = alpha * n
    whole = int(math.floor(k + 1e-12))
    out = v[:whole].sum()
    if frac and whole < n and k - whole > 1e-12:
        out = out + (k - whole) * v[whole]
    return out / (k if frac else max(whole, 1))


@exercise(chapter=19, cases=_cv_cases, atol=1e-9,
          description="CVaR over prompts: the mean of the worst alpha share, the boundary prompt fractional")
def cvar_prompts(values, alpha):
    """The lower-tail CVaR of equally likely prompts (a 0-dim tensor)."""
    return _tail(values, alpha)


@mistake(cvar_prompts, "this is the mean of the BEST alpha share: for rewards the risk is in the lower tail "
         "(sort ascending)")
def _cv_upper(values, alpha):
    return _tail(values, alpha, worst=False)


@mistake(cvar_prompts, "only floor(alpha * n) whole prompts were averaged: the boundary prompt must count with "
         "weight alpha*n - floor(alpha*n), and the sum is divided by alpha*n")
def _cv_floor(values, alpha):
    return _tail(values, alpha, frac=False)


@mistake(cvar_prompts, "the worst share was divided by n instead of alpha * n: CVaR is a MEAN over the tail "
         "(its weights q_i = 1/(alpha n) sum to 1)")
def _cv_over_n(values, alpha):
    return _tail(values, alpha) * alpha


# ------------------------------------------------------------------------ 3. group_dro_update

def _gd_cases():
    return [
        Case(args=(_t([0.5, 0.5]), _t([1.0, 0.0]), 1.0), label="two groups, accuracies 1 and 0, eta = 1"),
        Case(args=(_t([0.2, 0.5, 0.3]), _t([0.9, 0.4, 0.6]), 2.0), label="three groups, eta = 2"),
        Case(args=(_t([0.7, 0.1, 0.1, 0.1]), _t([0.2, 0.8, 0.5, 0.5]), 0.3), label="four groups, eta = 0.3"),
    ]


@exercise(chapter=19, cases=_gd_cases, atol=1e-10,
          description="one exponentiated-gradient step of the group-DRO adversary on group values")
def group_dro_update(q, values, eta):
    """q_g exp(-eta v_g), normalised to sum to 1."""
    w = q * torch.exp(-eta * values)
    return w / w.sum()


@mistake(group_dro_update, "the exponent has the wrong sign: with values = rewards (higher is better) the "
         "adversary up-weights the WORST groups, q exp(-eta v); Sagawa et al. write exp(+eta * loss)")
def _gd_sign(q, values, eta):
    w = q * torch.exp(eta * values)
    return w / w.sum()


@mistake(group_dro_update, "the weights were not renormalised: q must stay a distribution over groups")
def _gd_unnormalised(q, values, eta):
    return q * torch.exp(-eta * values)


@mistake(group_dro_update, "an additive step q - eta v (clipped, renormalised) is projected gradient descent in "
         "the Euclidean geometry; group DRO uses the multiplicative (exponentiated-gradient) step q exp(-eta v)")
def _gd_additive(q, values, eta):
    w = (q - eta * values).clamp_min(0.0)
    return w / w.sum()


# ------------------------------------------------------------------------ 4. tv_worst_case

def _tv_cases():
    return [
        Case(args=(_t([0.2, 0.9, 0.5]), 0.1, _t([1 / 3, 1 / 3, 1 / 3])), label="three prompts, delta = 0.1"),
        Case(args=(_t([0.6, 0.9, 0.8, 0.0]), 0.2, _t([0.5, 0.3, 0.2, 0.0])),
             label="an unseen prompt (p = 0) with value 0, delta = 0.2"),
        Case(args=(_t([0.4, 0.1, 0.7, 0.9, 0.3]), 0.45, _t([0.1, 0.3, 0.2, 0.25, 0.15])),
             label="five prompts, delta = 0.45: mass taken from two of the best"),
    ]


def _tv(values, eps, p, support_only=False, proportional=False):
    key = values if not support_only else torch.where(p > 0, values, torch.full_like(values, math.inf))
    j = int(torch.argmin(key))
    if proportional:
        q = (1 - eps) * p
        q[j] += eps
        return (q * values).sum(), q
    q = p.clone()
    budget = eps
    for i in torch.argsort(values, descending=True).tolist():
        if i == j or budget <= 0:
            continue
        take = min(float(q[i]), budget)
        q[i] -= take
        q[j] += take
        budget -= take
    return (q * values).sum(), q


@exercise(chapter=19, cases=_tv_cases, atol=1e-10,
          description="the worst case over a total-variation ball: delta of the mass moved from the best to the worst")
def tv_worst_case(values, eps, p):
    """(value, q): mass delta (the radius eps) taken from the highest values, put on the lowest value anywhere."""
    return _tv(values, eps, p)


@mistake(tv_worst_case, "the worst point was searched only where p > 0: a TV ball does NOT require q << p, so it "
         "can move mass onto prompts the training mix never showed (that is why it is large and conservative)")
def _tv_support(values, eps, p):
    return _tv(values, eps, p, support_only=True)


@mistake(tv_worst_case, "the mixture (1 - delta) p + delta * (point mass at the minimum) is inside the ball but not "
         "its worst point: the delta of mass should come from the HIGHEST values, not from every point in proportion")
def _tv_prop(values, eps, p):
    return _tv(values, eps, p, proportional=True)
