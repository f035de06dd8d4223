r"""Checkers for the exercises of chapter 2, ``lessons/02_advantage_gae.ipynb``.

Four exercises, each with the reference solution, the cases it is checked on, and the known wrong
variants whose outputs :func:`rlkit.exercises.check` recognises ("likely cause: ..."):

* ``k_step_advantage(rewards, values, next_values, discounts, k)``: the k-step advantage
  :math:`\hat A^{(k)}_t = \sum_{l<m}\big(\prod_{j<l}\gamma_{t+j}\big) r_{t+l}
  + \big(\prod_{j<m}\gamma_{t+j}\big) V(s_{t+m}) - V(s_t)`, :math:`m = \min(k, T-t)`.
* ``rewards_from_advantages(advantages, values, next_values, discounts, lam)``: GAE's backward
  recursion :math:`\hat A_t = \delta_t + \gamma_t\lambda_t \hat A_{t+1}` run the other way, from stored
  advantages back to the TD errors and the rewards (the chapter shows the forward map, ``rlkit.returns.gae``).
* ``lambda_average(k_step, lam)``: the lambda-weighted average of the k-step advantages of a finite
  episode, :math:`(1-\lambda)\sum_{k<K}\lambda^{k-1}\hat A^{(k)} + \lambda^{K-1}\hat A^{(K)}`.
* ``optimal_constant_baseline(scores, returns)``: the constant :math:`b` that minimises the
  summed variance of :math:`\nabla\log\pi\,(G - b)`,
  :math:`b^\star = \mathbb E[\|\nabla\log\pi\|^2 G] / \mathbb E[\|\nabla\log\pi\|^2]`.

Conventions as in :mod:`rlkit.returns`: time is the last dimension, ``discounts[..., t]`` is
:math:`\gamma(1-\text{terminated}_t)`, ``next_values[..., t]`` is :math:`V(s_{t+1})`.
"""
from __future__ import annotations

import torch

from rlkit import _validate as V
from rlkit.exercises import Case, exercise, mistake
from rlkit.exercises.solutions.ch01 import reward_to_go

__all__: list[str] = []


def _episode_rows(g, shape, p_term, gamma, dtype=torch.float32):
    """Random rewards / values / discounts for rows that may contain several episodes.

    next_values[..., t] = values[..., t+1] inside a row; the last step bootstraps from a random
    value; at a termination the discount is 0 (the next value is then irrelevant).
    """
    rewards = torch.randn(*shape, generator=g, dtype=dtype)
    values = torch.randn(*shape, generator=g, dtype=dtype)
    last = torch.randn(*shape[:-1], 1, generator=g, dtype=dtype)
    next_values = torch.cat([values[..., 1:], last], dim=-1)
    term = (torch.rand(*shape, generator=g) < p_term).to(dtype)
    return rewards, values, next_values, gamma * (1.0 - term)


def _td_errors(rewards, values, next_values, discounts):
    r""":math:`\delta_t = r_t + \gamma_t V(s_{t+1}) - V(s_t)`."""
    return rewards + discounts * next_values - values


# ---------------------------------------------------------------------- 1. k_step_advantage

def _ks_cases():
    g = torch.Generator().manual_seed(2001)
    return [
        Case(args=(torch.tensor([1.0, 1.0, 1.0, 1.0]), torch.tensor([2.0, 1.5, 1.0, 0.5]),
                   torch.tensor([1.5, 1.0, 0.5, 3.0]), torch.tensor([0.9, 0.9, 0.9, 0.9]), 2),
             label="one segment, k=2, cut by the end of the rollout (bootstrap V=3 after it)"),
        Case(args=(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]), torch.tensor([0.5, 1.0, 1.5, 2.0, 2.5]),
                   torch.tensor([1.0, 9.0, 2.0, 2.5, 4.0]), torch.tensor([0.5, 0.0, 0.5, 0.5, 0.5]), 3),
             label="an episode ends at t=1 (discount 0), k=3"),
        Case(args=(*_episode_rows(g, (3, 9), 0.2, 0.95, torch.float64), 4), label="[3, 9] float64, k=4"),
        Case(args=(*_episode_rows(g, (2, 2, 6), 0.2, 0.9), 1), label="[2, 2, 6], k=1 (the TD error)"),
        Case(args=(*_episode_rows(g, (2, 5), 0.0, 0.99), 7), label="k=7 > T=5: Monte Carlo minus V"),
    ]


@exercise(chapter=2, cases=_ks_cases, atol=1e-5, description="k-step advantage estimates with per-step discounts.")
def k_step_advantage(rewards, values, next_values, discounts, k):
    r""":math:`\hat A^{(k)}_t`, the k-step bootstrapped return minus :math:`V(s_t)`; ``[..., T]``."""
    V.matching_floats(rewards=rewards, values=values, next_values=next_values, discounts=discounts)
    V.tensor_in(discounts, "discounts", 0.0, 1.0)
    k = V.int_in(k, "k")
    T = rewards.shape[-1]
    out = torch.empty_like(rewards)
    for t in range(T):
        m = min(k, T - t)
        total = torch.zeros_like(rewards[..., 0])
        disc = torch.ones_like(rewards[..., 0])
        for j in range(m):
            total = total + disc * rewards[..., t + j]
            disc = disc * discounts[..., t + j]
        out[..., t] = total + disc * next_values[..., t + m - 1] - values[..., t]
    return out


@mistake(k_step_advantage, "V(s_t) is not subtracted: this is the k-step RETURN; the advantage "
         "is the return minus the baseline V(s_t)")
def _ks_no_baseline(rewards, values, next_values, discounts, k):
    return k_step_advantage(rewards, values, next_values, discounts, k) + values


@mistake(k_step_advantage, "your window has k+1 rewards: A^(k) uses r_t ... r_{t+k-1} and "
         "bootstraps with V(s_{t+k}) (an off-by-one in the window length)")
def _ks_k_plus_one(rewards, values, next_values, discounts, k):
    return k_step_advantage(rewards, values, next_values, discounts, k + 1)


@mistake(k_step_advantage, "you discounted with gamma^l and ignored the per-step discounts: "
         "a termination (discount 0) inside the window must stop the sum there")
def _ks_constant_gamma(rewards, values, next_values, discounts, k):
    return k_step_advantage(rewards, values, next_values, discounts.clamp(min=float(discounts.max())), k)


@mistake(k_step_advantage, "you bootstrapped with values[t+m] (and 0 past the end): "
         "V(s_{t+m}) is next_values[..., t+m-1], which holds a real value after the last step")
def _ks_zero_bootstrap_at_end(rewards, values, next_values, discounts, k):
    padded = torch.cat([values[..., 1:], torch.zeros_like(values[..., :1])], dim=-1)
    return k_step_advantage(rewards, values, padded, discounts, k)


@mistake(k_step_advantage, "windows near the end of the row wrap around to its start "
         "(torch.roll): cut the window at the end of the segment, m = min(k, T - t)")
def _ks_wraps_around(rewards, values, next_values, discounts, k):
    # a vectorised version built with torch.roll: windows wrap around to the start of the row
    total = torch.zeros_like(rewards)
    disc = torch.ones_like(rewards)
    for j in range(k):
        total = total + disc * torch.roll(rewards, -j, dims=-1)
        disc = disc * torch.roll(discounts, -j, dims=-1)
    return total + disc * torch.roll(next_values, -(k - 1), dims=-1) - values


# ------------------------------------------------------------------ 2. rewards_from_advantages

def _gae_forward(rewards, values, next_values, discounts, lam):
    r"""The forward map the chapter shows (``rlkit.returns.gae``), written here for the cases."""
    lam = V.scalar_or_like(lam, "lam", rewards, "rewards")
    return reward_to_go(_td_errors(rewards, values, next_values, discounts), discounts * lam)


def _rfa_cases():
    g = torch.Generator().manual_seed(2002)
    r, v, nv, d = _episode_rows(g, (3, 10), 0.15, 0.99, torch.float64)
    # a truncation at t=4 of row 0: V(final obs) differs from values[..., 5], and the trace stops
    nv[0, 4] = 7.0
    lam_mask = torch.ones_like(r)
    lam_mask[0, 4] = 0.0
    r2, v2, nv2, d2 = _episode_rows(g, (2, 2, 7), 0.2, 0.9)

    def case(rewards, values, next_values, discounts, lam, label):
        adv = _gae_forward(rewards, values, next_values, discounts, lam)
        return Case(args=(adv, values, next_values, discounts, lam), label=label)

    return [
        case(torch.tensor([1.0, 1.0, 1.0]), torch.tensor([0.5, 0.5, 0.5]),
             torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.9, 0.9, 0.0]), 0.5,
             "one terminating episode, rewards 1, lam=0.5"),
        case(torch.tensor([1.0, 0.0, 2.0, 1.0, 0.0]), torch.tensor([0.5, 1.0, 0.2, 0.4, 0.6]),
             torch.tensor([1.0, 3.0, 0.4, 0.6, 2.0]), torch.tensor([0.9, 0.0, 0.9, 0.9, 0.9]), 0.5,
             "two episodes in one row: the first terminates at t=1 (discount 0), the second is cut "
             "by the end of the rollout and bootstraps from V=2"),
        case(torch.tensor([0.0, 0.0, 0.0, 1.0]), torch.tensor([0.2, 0.4, 0.6, 0.8]),
             torch.tensor([0.4, 0.6, 0.8, 0.0]), torch.tensor([1.0, 1.0, 1.0, 0.0]), 0.95,
             "gamma=1, one reward at the end (an LLM response), lam=0.95"),
        case(r, v, nv, d, 0.95 * lam_mask, "[3, 10] float64, per-step lam with a truncation at t=4 of row 0"),
        case(r2, v2, nv2, d2, 0.8, "[2, 2, 7], lam=0.8"),
    ]


@exercise(chapter=2, cases=_rfa_cases, atol=1e-5,
          description="The rewards behind stored GAE advantages: the backward recursion run the other way.")
def rewards_from_advantages(advantages, values, next_values, discounts, lam):
    r"""Invert GAE: :math:`\delta_t = \hat A_t - \gamma_t\lambda_t\hat A_{t+1}` (:math:`\hat A_T = 0`),
    then :math:`r_t = \delta_t - \gamma_t V(s_{t+1}) + V(s_t)`; all ``[..., T]``, ``lam`` a float or ``[..., T]``.
    """
    V.matching_floats(advantages=advantages, values=values, next_values=next_values, discounts=discounts)
    V.tensor_in(discounts, "discounts", 0.0, 1.0)
    lam = V.scalar_or_like(lam, "lam", advantages, "advantages")
    trace = discounts * lam
    after = torch.cat([advantages[..., 1:], torch.zeros_like(advantages[..., :1])], dim=-1)   # A_{t+1}, A_T = 0
    delta = advantages - trace * after
    return delta - discounts * next_values + values


def _rfa_with(advantages, values, next_values, discounts, trace):
    after = torch.cat([advantages[..., 1:], torch.zeros_like(advantages[..., :1])], dim=-1)
    return advantages - trace * after - discounts * next_values + values


@mistake(rewards_from_advantages, "lambda is missing: the recursion is A_t = delta_t + gamma_t lambda_t "
         "A_{t+1}, so delta_t = A_t - gamma_t lambda_t A_{t+1}; without lambda you undid the lambda=1 "
         "(Monte Carlo) recursion")
def _rfa_no_lambda(advantages, values, next_values, discounts, lam):
    return _rfa_with(advantages, values, next_values, discounts, discounts)


@mistake(rewards_from_advantages, "you used discounts[..., t+1] * lam[..., t+1] for step t: the trace "
         "of step t is gamma_t lambda_t, the discount and lambda of step t itself (an off-by-one in time: a "
         "termination or a truncation acts one step late)")
def _rfa_next_trace(advantages, values, next_values, discounts, lam):
    lam = V.scalar_or_like(lam, "lam", advantages, "advantages")
    trace = discounts * lam
    late = torch.cat([trace[..., 1:], torch.zeros_like(trace[..., :1])], dim=-1)
    return _rfa_with(advantages, values, next_values, discounts, late)


@mistake(rewards_from_advantages, "you used values[..., t+1] instead of next_values[..., t]: wrong at a "
         "truncation, where V(s_{t+1}) is the value of the final observation and values[..., t+1] already "
         "belongs to the next episode")
def _rfa_values_shifted(advantages, values, next_values, discounts, lam):
    shifted = torch.cat([values[..., 1:], next_values[..., -1:]], dim=-1)
    return rewards_from_advantages(advantages, values, shifted, discounts, lam)


@mistake(rewards_from_advantages, "you returned the TD errors delta_t: the reward is "
         "r_t = delta_t - gamma_t V(s_{t+1}) + V(s_t)")
def _rfa_returns_delta(advantages, values, next_values, discounts, lam):
    return rewards_from_advantages(advantages, values, next_values, discounts, lam) + discounts * next_values - values


@mistake(rewards_from_advantages, "you used one constant gamma (the largest discount) instead of the per-step "
         "discounts gamma_t = gamma (1 - terminated_t): at a termination gamma_t = 0 drops the bootstrap "
         "V(s_{t+1}) and stops the trace, so use discounts[..., t] in both places")
def _rfa_constant_gamma(advantages, values, next_values, discounts, lam):
    gamma = discounts.amax(dim=-1, keepdim=True).expand_as(discounts)
    return rewards_from_advantages(advantages, values, next_values, gamma, lam)


@mistake(rewards_from_advantages, "the bootstrap uses the per-step discount, but the trace uses one constant "
         "gamma: a termination must stop the trace (discounts[..., t] * lam is 0 there), or A_{t+1} of the next "
         "episode leaks into step t")
def _rfa_constant_gamma_in_trace(advantages, values, next_values, discounts, lam):
    gamma = discounts.amax(dim=-1, keepdim=True).expand_as(discounts)
    lam = V.scalar_or_like(lam, "lam", advantages, "advantages")
    return _rfa_with(advantages, values, next_values, discounts, gamma * lam)


@mistake(rewards_from_advantages, "after the last step you took A_0 (torch.roll wraps around): there is no "
         "step after T-1, so A_T = 0 and delta_{T-1} = A_{T-1}")
def _rfa_wraps(advantages, values, next_values, discounts, lam):
    lam = V.scalar_or_like(lam, "lam", advantages, "advantages")
    after = torch.roll(advantages, -1, dims=-1)
    return advantages - discounts * lam * after - discounts * next_values + values


@mistake(rewards_from_advantages, "you ran the recursion forwards, delta_t = A_t - gamma_t lambda_t A_{t-1}: "
         "A_t collects the TD errors AFTER t, so step t is undone with A_{t+1}")
def _rfa_backwards_in_time(advantages, values, next_values, discounts, lam):
    lam = V.scalar_or_like(lam, "lam", advantages, "advantages")
    before = torch.cat([torch.zeros_like(advantages[..., :1]), advantages[..., :-1]], dim=-1)
    return advantages - discounts * lam * before - discounts * next_values + values


@mistake(rewards_from_advantages, "the per-step lam is treated as one number: where lam is 0 "
         "(a truncation) the trace stopped, so there delta_t = A_t")
def _rfa_ignores_lam_mask(advantages, values, next_values, discounts, lam):
    if isinstance(lam, torch.Tensor) and lam.dim() > 0:
        lam = float(lam.max())
    return rewards_from_advantages(advantages, values, next_values, discounts, lam)


# --------------------------------------------------------------------------- 3. lambda_average

def _lam_powers(k_step, lam, offset=0):
    r""":math:`\lambda^{k-1+\text{offset}}` for :math:`k = 1, \dots, K` (``K = k_step.shape[-1]``)."""
    k = torch.arange(1, k_step.shape[-1] + 1, dtype=k_step.dtype, device=k_step.device)
    return torch.pow(torch.tensor(float(lam), dtype=k_step.dtype), k - 1 + offset)


def _la_cases():
    g = torch.Generator().manual_seed(2003)
    return [
        Case(args=(torch.tensor([[1.0, 2.0, 4.0], [4.0, 0.0, -2.0]]), 0.5), label="two rows, K=3, lam=0.5"),
        Case(args=(torch.tensor([3.0, -1.0, 2.0, 5.0]), 0.0), label="lam=0: only the TD error A^(1)"),
        Case(args=(torch.tensor([3.0, -1.0, 2.0, 5.0]), 1.0), label="lam=1: only the Monte Carlo A^(K)"),
        Case(args=(torch.randn(4, 6, generator=g, dtype=torch.float64), 0.9), label="[4, 6] float64, lam=0.9"),
        Case(args=(torch.randn(2, 3, 5, generator=g), 0.7), label="[2, 3, 5], lam=0.7"),
    ]


@exercise(chapter=2, cases=_la_cases, atol=1e-5,
          description="The lambda-weighted average of k-step advantages in a finite episode.")
def lambda_average(k_step, lam):
    r"""Weights :math:`(1-\lambda)\lambda^{k-1}` for :math:`k<K` and the tail :math:`\lambda^{K-1}` on
    :math:`\hat A^{(K)}`. ``k_step``: ``[..., K]`` holding :math:`\hat A^{(1)},\dots,\hat A^{(K)}`."""
    V.float_tensor(k_step, "k_step", 1)
    lam = V.real_in(lam, "lam", 0.0, 1.0)
    w = (1.0 - lam) * _lam_powers(k_step, lam)
    w[-1] = lam ** (k_step.shape[-1] - 1)
    return (k_step * w).sum(-1)


@mistake(lambda_average, "the weights (1-lam) lam^(k-1) stop at k=K and sum to 1 - lam^K, not 1: in "
         "a finite episode every A^(k) with k >= K equals A^(K), so A^(K) gets the whole tail mass lam^(K-1)")
def _la_no_tail(k_step, lam):
    return (k_step * ((1.0 - lam) * _lam_powers(k_step, lam))).sum(-1)


@mistake(lambda_average, "the exponent is off by one: A^(1) gets weight (1-lam) lam^0 = 1-lam")
def _la_power_k(k_step, lam):
    w = (1.0 - lam) * _lam_powers(k_step, lam, offset=1)
    w[-1] = lam ** k_step.shape[-1]
    return (k_step * w).sum(-1)


@mistake(lambda_average, "you renormalised the truncated weights; the tail mass belongs to "
         "A^(K) (this changes which estimate lam=1 gives)")
def _la_renormalised(k_step, lam):
    w = _lam_powers(k_step, lam)
    return (k_step * w).sum(-1) / w.sum()


@mistake(lambda_average, "a plain mean of the k-step estimates ignores lambda")
def _la_plain_mean(k_step, lam):
    return k_step.mean(-1)


# ---------------------------------------------------------------- 4. optimal_constant_baseline

def _ocb_cases():
    g = torch.Generator().manual_seed(2004)
    s = torch.randn(200, 5, generator=g, dtype=torch.float64) * torch.linspace(0.2, 2.0, 5, dtype=torch.float64)
    G = 3.0 + (s ** 2).sum(-1) + 0.5 * torch.randn(200, generator=g, dtype=torch.float64)
    return [
        Case(args=(torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]), torch.tensor([1.0, 2.0, 3.0])),
             label="three samples, hand-sized"),
        Case(args=(s, G), label="200 samples whose return grows with |score|^2"),
        Case(args=(torch.randn(50, 3, generator=g), torch.randn(50, generator=g) + 1.0), label="50 samples"),
    ]


@exercise(chapter=2, cases=_ocb_cases, atol=1e-5,
          description="The constant baseline that minimises the summed variance of the gradient estimate.")
def optimal_constant_baseline(scores, returns):
    r""":math:`b^\star = \sum_i \|s_i\|^2 G_i / \sum_i \|s_i\|^2`; scores ``[N, P]``, returns ``[N]`` -> 0-dim."""
    sizes = V.layout("N P", floating=True, scores=scores)
    V.layout("N", sizes, floating=True, returns=returns)
    sq = (scores ** 2).sum(-1)
    return (sq * returns).sum() / sq.sum()


@mistake(optimal_constant_baseline, "the mean return is the natural guess, but the variance-minimising "
         "constant weights each return by |grad log pi|^2: b* = E[|s|^2 G] / E[|s|^2]")
def _ocb_mean_return(scores, returns):
    return returns.mean()


@mistake(optimal_constant_baseline, "the weights must be the SQUARED norms |s|^2 (the variance is a "
         "second moment), not |s|")
def _ocb_unsquared(scores, returns):
    n = scores.norm(dim=-1)
    return (n * returns).sum() / n.sum()


@mistake(optimal_constant_baseline, "you forgot to divide by E[|s|^2]: setting the derivative of "
         "E[|s|^2 (G - b)^2] to zero gives b = E[|s|^2 G] / E[|s|^2]")
def _ocb_not_normalised(scores, returns):
    return ((scores ** 2).sum(-1) * returns).mean()


@mistake(optimal_constant_baseline, "you averaged per-parameter optimal baselines; one constant for "
         "all parameters weights every parameter by its share of |s|^2")
def _ocb_per_parameter(scores, returns):
    sq = scores ** 2
    return ((sq * returns[:, None]).sum(0) / sq.sum(0)).mean()
