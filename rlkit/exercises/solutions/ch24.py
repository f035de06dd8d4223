r"""Checkers for the exercises of chapter 24, ``lessons/24_pitfalls_recipe.ipynb``.

* ``lagrange_update(lam, costs, limit, lr)``: the multiplier after one projected dual-ascent step per
  measured cost, :math:`\nu \leftarrow \max(0, \nu + \eta(\hat C_k - C_{\max}))`, returned for every step
  (``lam`` is the initial multiplier :math:`\nu_0`, ``limit`` the cost budget :math:`C_{\max}`, ``lr`` the step
  :math:`\eta`).
* ``pessimistic_reward(scores, k)``: an ensemble of judges aggregated pessimistically,
  :math:`\bar r - k\sigma` with the population deviation over the judges (dimension 0).
* ``lagrangian_advantage(adv_r, adv_c, lam)``: :math:`(\hat A^r - \nu\hat A^c)/(1 + \nu)`, ``lam`` the multiplier
  :math:`\nu`.
"""
from __future__ import annotations

import torch

from rlkit import _validate as V
from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []
F64 = torch.float64


# ---------------------------------------------------------------------- 1. lagrange_update

def _lu_cases():
    return [
        Case(args=(0.0, torch.tensor([0.2, 0.2, 0.0, 0.0, 0.0], dtype=F64), 0.1, 2.0),
             label="nu from 0, costs 0.2, 0.2, 0, 0, 0 against a limit of 0.1, lr 2"),
        Case(args=(1.0, torch.tensor([0.11, 0.5, 0.09], dtype=F64), 0.1, 1.0),
             label="small and large violations: the steps must differ (0.01 vs 0.4)"),
        Case(args=(0.5, torch.tensor([0.0, 0.0, 0.0, 0.3], dtype=F64), 0.05, 4.0),
             label="a satisfied constraint drives nu to 0 and no lower"),
    ]


@exercise(chapter=24, cases=_lu_cases, atol=1e-9, description="projected dual ascent on a Lagrange multiplier")
def lagrange_update(lam, costs, limit, lr):
    r"""``[K]``: :math:`\nu_k = \max(0, \nu_{k-1} + \eta(\hat C_k - C_{\max}))` for each measured cost.

    ``lam`` is the initial multiplier :math:`\nu_0`, ``limit`` the cost budget :math:`C_{\max}`, ``lr`` the step
    :math:`\eta`.
    """
    costs = V.float_tensor(costs, "costs")
    out = torch.empty_like(costs)
    for i in range(costs.shape[0]):
        lam = max(0.0, lam + lr * (float(costs[i]) - limit))
        out[i] = lam
    return out


@mistake(lagrange_update, "the sign is reversed: nu must RISE while the cost exceeds the limit "
         "(the dual gradient is C - C_max), not fall")
def _lu_sign(lam, costs, limit, lr):
    return lagrange_update(lam, -costs + 2 * limit, limit, lr)


@mistake(lagrange_update, "nu is not projected onto nu >= 0: a negative multiplier REWARDS cost")
def _lu_noproj(lam, costs, limit, lr):
    out = torch.empty_like(costs)
    for i in range(costs.shape[0]):
        lam = lam + lr * (float(costs[i]) - limit)
        out[i] = lam
    return out


@mistake(lagrange_update, "the step is lr * sign(violation), as Adam on a scalar behaves: the step must be "
         "proportional to the violation C - C_max")
def _lu_signstep(lam, costs, limit, lr):
    out = torch.empty_like(costs)
    for i in range(costs.shape[0]):
        d = float(costs[i]) - limit
        lam = max(0.0, lam + lr * ((d > 0) - (d < 0)))
        out[i] = lam
    return out


# ------------------------------------------------------------------- 2. pessimistic_reward

def _pr_cases():
    g = torch.Generator().manual_seed(2402)
    judges = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 1.0]], dtype=F64)
    return [
        Case(args=(judges, 1.0), label="3 judges x 4 responses (0/1 verdicts), k = 1"),
        Case(args=(torch.rand(5, 7, generator=g, dtype=F64), 0.5), label="5 judges x 7 graded scores, k = 0.5"),
        Case(args=(torch.rand(2, 3, generator=g, dtype=F64), 2.0), label="2 judges, k = 2"),
    ]


@exercise(chapter=24, cases=_pr_cases, atol=1e-9, description="pessimistic aggregation of a judge ensemble")
def pessimistic_reward(scores, k):
    r"""``[N]``: :math:`\bar r - k\sigma` over the judges (dimension 0), population deviation."""
    scores = V.float_tensor(scores, "scores", min_dim=2)
    return scores.mean(0) - k * scores.std(0, unbiased=False)


@mistake(pessimistic_reward, "the deviation is subtracted, not added: mean + k sigma rewards disagreement "
         "(optimism), which is what a policy hacking one judge exploits")
def _pr_plus(scores, k):
    return scores.mean(0) + k * scores.std(0, unbiased=False)


@mistake(pessimistic_reward, "k is ignored: the plain mean of the judges is not pessimistic (chapter 24 "
         "shows the mean of three sloppy judges still rewards the hack)")
def _pr_mean(scores, k):
    return scores.mean(0)


@mistake(pessimistic_reward, "use the population deviation over the K judges (unbiased=False), not the "
         "sample deviation (the judges are the whole ensemble, not a sample to generalise from)")
def _pr_sample(scores, k):
    return scores.mean(0) - k * scores.std(0, unbiased=True)


@mistake(pessimistic_reward, "aggregate over the judges (dimension 0), not over the responses")
def _pr_dim(scores, k):
    return (scores.mean(1) - k * scores.std(1, unbiased=False)).mean() + 0 * scores[0]


# ----------------------------------------------------------------- 3. lagrangian_advantage

def _la_cases():
    g = torch.Generator().manual_seed(2403)
    return [
        Case(args=(torch.tensor([1.0, -1.0, 0.5], dtype=F64), torch.tensor([1.0, 0.0, -2.0], dtype=F64), 1.0),
             label="three tokens, nu = 1"),
        Case(args=(torch.randn(4, 5, generator=g, dtype=F64), torch.randn(4, 5, generator=g, dtype=F64), 3.0),
             label="4 responses x 5 tokens, nu = 3"),
        Case(args=(torch.randn(6, generator=g, dtype=F64), torch.randn(6, generator=g, dtype=F64), 0.0),
             label="nu = 0: the reward advantage itself"),
    ]


@exercise(chapter=24, cases=_la_cases, atol=1e-9, description="the advantage of r - nu c, rescaled")
def lagrangian_advantage(adv_r, adv_c, lam):
    r""":math:`(\hat A^r - \nu\hat A^c)/(1 + \nu)`, with ``lam`` the multiplier :math:`\nu`."""
    V.matching_floats(adv_r=adv_r, adv_c=adv_c, min_dim=0)
    return (adv_r - lam * adv_c) / (1.0 + lam)


@mistake(lagrangian_advantage, "the cost advantage must be SUBTRACTED (a costly token is discouraged), "
         "not added")
def _la_plus(adv_r, adv_c, lam):
    return (adv_r + lam * adv_c) / (1.0 + lam)


@mistake(lagrangian_advantage, "divide by 1 + nu: without it the advantage grows with nu and the "
         "step size with it (the clip and the learning rate were tuned for |A| ~ 1)")
def _la_unscaled(adv_r, adv_c, lam):
    return adv_r - lam * adv_c


@mistake(lagrangian_advantage, "nu weights the cost only; dividing the cost term alone by 1 + nu "
         "leaves the reward term unscaled")
def _la_partial(adv_r, adv_c, lam):
    return adv_r - lam * adv_c / (1.0 + lam)
