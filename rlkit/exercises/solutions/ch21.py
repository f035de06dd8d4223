r"""Checkers for the exercises of chapter 21, ``lessons/21_offline_rl_ope.ipynb``.

* ``expectile_loss(diff, kappa, mask)``: IQL's expectile loss, the masked mean of
  :math:`|\kappa - \mathbf 1[u<0]|\,u^2` (0 with no real entry).
* ``cql_term(q, actions, mask)``: CQL's penalty over a vocabulary without its factor, the masked
  mean of :math:`\log\sum_a e^{Q(h,a)} - Q(h, a_{\mathcal D})`.
* ``doubly_robust(log_ratios, rewards, reward_hat, target_values)``: the doubly robust OPE
  estimate :math:`\frac1n\sum_i[\hat v^\pi(x_i) + \rho_i(r_i - \hat r(x_i, y_i))]`.
"""
from __future__ import annotations

import torch

from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []
F64 = torch.float64


# ------------------------------------------------------------------- 1. expectile_loss

def _ex_cases():
    g = torch.Generator().manual_seed(2101)
    u = torch.randn(4, 6, generator=g, dtype=F64)
    m = torch.rand(4, 6, generator=g) < 0.7
    u_nan = u.clone()
    u_nan[~m] = float("nan")
    return [
        Case(args=(torch.tensor([1.0, -2.0], dtype=F64), 0.7, torch.tensor([True, True])),
             label="hand case: u = 1 (weight 0.7) and u = -2 (weight 0.3): (0.7 + 1.2) / 2 = 0.95"),
        Case(args=(u, 0.9, m), label="4 x 6 differences, kappa = 0.9, about 30% padding"),
        Case(args=(u_nan, 0.7, m), label="the same with NaN in the padding"),
        Case(args=(u, 0.5, torch.zeros(4, 6, dtype=torch.bool)), label="all-false mask: 0"),
    ]


@exercise(chapter=21, cases=_ex_cases, atol=1e-10, description="IQL's expectile loss, masked mean")
def expectile_loss(diff, kappa, mask):
    """Mean over mask of |kappa - 1[u < 0]| u^2 (0 when the mask is all false)."""
    u = torch.where(mask, diff, torch.zeros_like(diff))
    w = torch.where(u < 0, 1.0 - kappa, kappa)
    return (w * u * u).sum() / mask.sum().clamp_min(1)


@mistake(expectile_loss, "the two weights are swapped: a NEGATIVE u (prediction above its target) costs 1 - kappa, "
         "a positive one kappa, so that kappa > 1/2 pushes V up towards the best logged actions")
def _ex_swapped(diff, kappa, mask):
    return expectile_loss(diff, 1.0 - kappa, mask)


@mistake(expectile_loss, "the loss is |u| times the weight (a quantile / pinball loss); the expectile loss "
         "squares u")
def _ex_abs(diff, kappa, mask):
    u = torch.where(mask, diff, torch.zeros_like(diff))
    w = torch.where(u < 0, 1.0 - kappa, kappa)
    return (w * u.abs()).sum() / mask.sum().clamp_min(1)


@mistake(expectile_loss, "the mean is over ALL entries; padding must count neither in the sum nor in the count")
def _ex_all_entries(diff, kappa, mask):
    u = torch.where(mask, diff, torch.zeros_like(diff))
    w = torch.where(u < 0, 1.0 - kappa, kappa)
    return (w * u * u).mean()


# ------------------------------------------------------------------- 2. cql_term

def _cql_cases():
    g = torch.Generator().manual_seed(2102)
    q = torch.randn(3, 4, 5, generator=g, dtype=F64) * 2
    a = torch.randint(0, 5, (3, 4), generator=g)
    m = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    qj = q.clone()
    qj[~m] = 50.0                                        # padded states hold huge values on purpose
    hand = torch.log(torch.tensor([[[1.0, 2.0, 1.0]]], dtype=F64))
    return [
        Case(args=(hand, torch.tensor([[1]]), torch.tensor([[True]])),
             label="hand case: Q = log(1, 2, 1), logged action 1: log 4 - log 2 = log 2"),
        Case(args=(q, a, m), label="3 x 4 states, 5 actions, some padding"),
        Case(args=(qj, a, m), label="the same with Q = 50 at padded states"),
    ]


@exercise(chapter=21, cases=_cql_cases, atol=1e-10, description="CQL's log-sum-exp penalty over a vocabulary")
def cql_term(q, actions, mask):
    """Mean over real states of logsumexp_a Q(h, a) - Q(h, a_D)."""
    q = torch.where(mask[..., None], q, torch.zeros_like(q))
    pen = torch.logsumexp(q, -1) - q.gather(-1, actions[..., None]).squeeze(-1)
    return (pen * mask).sum() / mask.sum().clamp_min(1)


@mistake(cql_term, "you used the hard maximum max_a Q(h, a); CQL's penalty is the soft maximum, the log-sum-exp, "
         "whose gradient pushes down every action in proportion to softmax(Q)")
def _cql_max(q, actions, mask):
    pen = q.max(-1).values - q.gather(-1, actions[..., None]).squeeze(-1)
    return (pen * mask).sum() / mask.sum().clamp_min(1)


@mistake(cql_term, "the logged action's Q-value was not subtracted: the penalty lowers all actions and RAISES the "
         "logged one, log-sum-exp minus Q(h, a_D)")
def _cql_no_data_term(q, actions, mask):
    pen = torch.logsumexp(q, -1)
    return (pen * mask).sum() / mask.sum().clamp_min(1)


@mistake(cql_term, "you averaged Q over the actions instead of taking the log-sum-exp (mean_a Q - Q(a_D) can be "
         "negative; the penalty never is)")
def _cql_mean(q, actions, mask):
    pen = q.mean(-1) - q.gather(-1, actions[..., None]).squeeze(-1)
    return (pen * mask).sum() / mask.sum().clamp_min(1)


@mistake(cql_term, "padded states were averaged in; only the real states (mask) count")
def _cql_no_mask(q, actions, mask):
    pen = torch.logsumexp(q, -1) - q.gather(-1, actions[..., None]).squeeze(-1)
    return pen.mean()


# ------------------------------------------------------------------- 3. doubly_robust

def _dr_cases():
    g = torch.Generator().manual_seed(2103)
    n = 12
    lr = torch.randn(n, generator=g, dtype=F64)
    r = (torch.rand(n, generator=g, dtype=F64) < 0.5).to(F64)
    rh = torch.rand(n, generator=g, dtype=F64)
    v = torch.rand(n, generator=g, dtype=F64)
    return [
        Case(args=(torch.log(torch.tensor([2.0, 0.5], dtype=F64)), torch.tensor([1.0, 0.0], dtype=F64),
                   torch.tensor([0.5, 0.5], dtype=F64), torch.tensor([0.6, 0.4], dtype=F64)),
             label="hand case: ratios 2 and 0.5: [0.6 + 2(0.5)] and [0.4 + 0.5(-0.5)] average 0.875"),
        Case(args=(lr, r, rh, v), label="12 logged responses with random ratios, rewards and models"),
        Case(args=(lr, r, r.clone(), v), label="a perfect reward model on the logged responses: DR = DM"),
    ]


@exercise(chapter=21, cases=_dr_cases, atol=1e-10, description="the doubly robust off-policy estimate")
def doubly_robust(log_ratios, rewards, reward_hat, target_values):
    """mean_i [ v_hat(x_i) + rho_i (r_i - r_hat(x_i, y_i)) ] with rho_i = exp(log_ratios[i])."""
    return (target_values + torch.exp(log_ratios) * (rewards - reward_hat)).mean()


@mistake(doubly_robust, "the correction r - r_hat was not importance-weighted: it must be multiplied by the ratio "
         "rho_i, because the logged responses come from mu, not from the target")
def _dr_unweighted(log_ratios, rewards, reward_hat, target_values):
    return (target_values + (rewards - reward_hat)).mean()


@mistake(doubly_robust, "the log-ratio was used as the weight; the ratio is rho_i = exp(log_ratios[i])")
def _dr_log_weight(log_ratios, rewards, reward_hat, target_values):
    return (target_values + log_ratios * (rewards - reward_hat)).mean()


@mistake(doubly_robust, "the ratio also multiplies v_hat(x_i); the direct-method term is already an expectation "
         "under the target and needs no weight")
def _dr_weighted_dm(log_ratios, rewards, reward_hat, target_values):
    return (torch.exp(log_ratios) * (target_values + rewards - reward_hat)).mean()


@mistake(doubly_robust, "the sign of the correction is flipped: add rho_i (r_i - r_hat), the model's error on the "
         "logged response")
def _dr_sign(log_ratios, rewards, reward_hat, target_values):
    return (target_values - torch.exp(log_ratios) * (rewards - reward_hat)).mean()
