r"""Checkers for the exercises of chapter 17, ``lessons/17_uncertainty_risk.ipynb``.

* ``cvar_of_samples(rewards, alpha)``: the lower-tail CVaR of each row of samples ``[B, n] -> [B]``,
  :math:`\frac1\alpha\big(\frac1n\sum_{x_i<q} x_i + (\alpha - F(q^-))\,q\big)` with :math:`q` the lower
  :math:`\alpha`-quantile: exact when rewards tie (atoms).
* ``cvar_advantages(rewards, alpha)``: the CVaR policy-gradient advantages of each row,
  :math:`(R - q_\alpha)\,\mathbf 1[R\le q_\alpha]/\alpha` ``[B, n]``: only the tail gets gradient.
* ``pinball(quantiles, targets, taus)``: the quantile-regression loss, mean over rows and levels,
  :math:`\ell_\tau(u) = u(\tau - \mathbf 1[u<0])` with :math:`u = y - q`.
* ``soft_bt_loss(r_a, r_b, p_a)``: Bradley-Terry with soft labels,
  :math:`-\frac1M\sum_i[\hat p_i\log\sigma(d_i) + (1-\hat p_i)\log\sigma(-d_i)]`.

Chapter: 17_uncertainty_risk.
"""
from __future__ import annotations

import torch
from torch import nn

from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []


def _var(rewards, alpha):
    # lower alpha-quantile of each row: the k-th smallest value with k = ceil(alpha * n)
    n = rewards.shape[-1]
    k = max(1, min(n, int(torch.ceil(torch.tensor(alpha * n - 1e-9)).item())))
    return rewards.sort(-1).values[..., k - 1]


# ------------------------------------------------------------------- 1. cvar_of_samples

def _cvar_cases():
    g = torch.Generator().manual_seed(17)
    cont = torch.randn(3, 10, generator=g, dtype=torch.float64)
    binary = torch.tensor([[0., 0., 0., 1., 1., 1., 1., 1., 1., 1.],
                           [1., 1., 1., 1., 1., 1., 1., 1., 1., 0.]], dtype=torch.float64)
    graded = torch.tensor([[2 / 3, 2 / 3, 2 / 3, 1., 1., 1., 1 / 3], [1., 1., 1., 0., 1., 1., 2 / 3]],
                          dtype=torch.float64)
    return [
        Case(args=(torch.tensor([[1., 2., 3., 4.]], dtype=torch.float64), 0.5),
             label="hand case: [1, 2, 3, 4], alpha 0.5 -> mean of the worst two = 1.5"),
        Case(args=(cont, 0.25), label="3 rows of 10 distinct values, alpha 0.25 (2.5 samples: a fractional one)"),
        Case(args=(binary, 0.2), label="binary rewards with ties at the boundary, alpha 0.2"),
        Case(args=(graded, 0.3), label="graded rewards with atoms, alpha 0.3"),
    ]


@exercise(chapter=17, cases=_cvar_cases, atol=1e-9,
          description="lower-tail CVaR of each row of samples, exact with atoms")
def cvar_of_samples(rewards, alpha):
    """(1/alpha) * (sum of the values below q / n + (alpha - share below q) * q), per row; [B, n] -> [B]."""
    n = rewards.shape[-1]
    q = _var(rewards, alpha)[..., None]
    below = rewards < q
    share = below.to(rewards.dtype).mean(-1)
    return ((rewards * below).sum(-1) / n + (alpha - share) * q[..., 0]) / alpha


@mistake(cvar_of_samples, "you averaged every sample <= q_alpha (E[R | R <= q]): with ties the whole atom at "
         "q_alpha counts, which can be far more than an alpha fraction; count only enough of it to fill alpha")
def _cvar_conditional_mean(rewards, alpha):
    q = _var(rewards, alpha)[..., None]
    m = (rewards <= q).to(rewards.dtype)
    return (rewards * m).sum(-1) / m.sum(-1)


@mistake(cvar_of_samples, "you took the mean of the floor(alpha * n) smallest samples: when alpha * n is not an "
         "integer the boundary sample must count with the fractional weight alpha * n - floor(alpha * n)")
def _cvar_floor(rewards, alpha):
    n = rewards.shape[-1]
    k = max(1, int(alpha * n))
    return rewards.sort(-1).values[..., :k].mean(-1)


@mistake(cvar_of_samples, "you averaged the BEST alpha fraction: for a reward (higher is better) CVaR is the mean "
         "of the worst outcomes, the lower tail")
def _cvar_upper(rewards, alpha):
    return -cvar_of_samples(-rewards, alpha)


@mistake(cvar_of_samples, "you took the mean of the ceil(alpha * n) smallest samples: the last of them belongs "
         "to the tail only with the fractional weight alpha * n - floor(alpha * n)")
def _cvar_ceil(rewards, alpha):
    n = rewards.shape[-1]
    k = max(1, min(n, int(torch.ceil(torch.tensor(alpha * n - 1e-9)).item())))
    return rewards.sort(-1).values[..., :k].mean(-1)


# ------------------------------------------------------------------- 2. cvar_advantages

def _adv_cases():
    g = torch.Generator().manual_seed(71)
    cont = torch.rand(3, 8, generator=g, dtype=torch.float64)
    graded = torch.tensor([[1., 2 / 3, 1., 1 / 3, 1., 0., 1., 1.], [1., 1., 2 / 3, 1., 1., 1., 1., 0.]],
                          dtype=torch.float64)
    return [
        Case(args=(torch.tensor([[0.0, 0.5, 1.0, 1.0]], dtype=torch.float64), 0.5),
             label="hand case: [0, 0.5, 1, 1], alpha 0.5: q = 0.5, advantages [-1, 0, 0, 0]"),
        Case(args=(cont, 0.25), label="3 prompts x 8 answers with distinct rewards, alpha 0.25"),
        Case(args=(graded, 0.25), label="2 prompts x 8 answers, graded rewards, alpha 0.25"),
    ]


@exercise(chapter=17, cases=_adv_cases, atol=1e-9,
          description="CVaR policy-gradient advantages per prompt: (R - q_alpha) 1[R <= q_alpha] / alpha")
def cvar_advantages(rewards, alpha):
    """(R - q) * 1[R <= q] / alpha with q the lower alpha-quantile of each row (prompt); [B, n]."""
    q = _var(rewards, alpha)[..., None]
    return torch.where(rewards <= q, (rewards - q) / alpha, torch.zeros_like(rewards))


@mistake(cvar_advantages, "you masked the LOW quantiles and kept the rest (the article's wording read literally): "
         "the CVaR gradient is the other way round, only the tail R <= q_alpha gets gradient")
def _adv_mask_low(rewards, alpha):
    q = _var(rewards, alpha)[..., None]
    return torch.where(rewards > q, rewards - rewards.mean(-1, keepdim=True), torch.zeros_like(rewards))


@mistake(cvar_advantages, "the baseline q_alpha is missing: the tail's advantage is (R - q_alpha) / alpha, not "
         "R / alpha (without it the update is biased by the moving threshold)")
def _adv_no_baseline(rewards, alpha):
    q = _var(rewards, alpha)[..., None]
    return torch.where(rewards <= q, rewards / alpha, torch.zeros_like(rewards))


@mistake(cvar_advantages, "you used ONE quantile over the whole batch; CVaR within a prompt needs each prompt's "
         "own q_alpha (each row)")
def _adv_batch_quantile(rewards, alpha):
    q = _var(rewards.reshape(1, -1), alpha)
    return torch.where(rewards <= q, (rewards - q) / alpha, torch.zeros_like(rewards))


@mistake(cvar_advantages, "the factor 1/alpha is missing (the tail has probability alpha, so its density is 1/alpha)")
def _adv_no_alpha(rewards, alpha):
    return alpha * cvar_advantages(rewards, alpha)


# ------------------------------------------------------------------- 3. pinball

def _pin_cases():
    g = torch.Generator().manual_seed(7)
    q = torch.randn(6, 4, generator=g, dtype=torch.float64)
    y = torch.randn(6, generator=g, dtype=torch.float64)
    taus = torch.tensor([0.125, 0.375, 0.625, 0.875], dtype=torch.float64)
    return [
        Case(args=(torch.tensor([[0.0, 1.0]], dtype=torch.float64), torch.tensor([0.5], dtype=torch.float64),
                   torch.tensor([0.25, 0.75], dtype=torch.float64)),
             label="hand case: q = [0, 1], y = 0.5, taus [0.25, 0.75] -> mean(0.125, 0.125) = 0.125"),
        Case(args=(q, y, taus), label="6 samples, 4 levels"),
        Case(args=(q, y, torch.tensor([0.1, 0.2, 0.3, 0.9], dtype=torch.float64)), label="6 samples, uneven levels"),
    ]


@exercise(chapter=17, cases=_pin_cases, atol=1e-9, description="the pinball (quantile-regression) loss")
def pinball(quantiles, targets, taus):
    """mean over rows and levels of u * (tau - 1[u < 0]), u = target - quantile; quantiles [B, M], targets [B]."""
    u = targets[:, None] - quantiles
    return (u * (taus - (u < 0).to(u.dtype))).mean()


@mistake(pinball, "u has the wrong sign (prediction minus target): that loss is minimised by the (1 - tau)-quantile")
def _pin_sign(quantiles, targets, taus):
    u = quantiles - targets[:, None]
    return (u * (taus - (u < 0).to(u.dtype))).mean()


@mistake(pinball, "you used the absolute error: every level then learns the median; the pinball loss weights "
         "under- and over-prediction by tau and 1 - tau")
def _pin_abs(quantiles, targets, taus):
    return (targets[:, None] - quantiles).abs().mean()


@mistake(pinball, "you used the squared error: that is minimised by the mean, not by a quantile")
def _pin_sq(quantiles, targets, taus):
    return ((targets[:, None] - quantiles) ** 2).mean()


# ------------------------------------------------------------------- 4. soft_bt_loss

def _bt_cases():
    g = torch.Generator().manual_seed(3)
    ra, rb = torch.randn(7, generator=g, dtype=torch.float64), torch.randn(7, generator=g, dtype=torch.float64)
    p = torch.tensor([0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 0.6], dtype=torch.float64)
    return [
        Case(args=(torch.tensor([1.0], dtype=torch.float64), torch.tensor([0.0], dtype=torch.float64),
                   torch.tensor([0.6], dtype=torch.float64)),
             label="hand case: margin 1, p = 0.6 -> 0.6 softplus(-1) + 0.4 softplus(1)"),
        Case(args=(ra, rb, p), label="7 pairs, votes 0/5 .. 5/5"),
        Case(args=(ra * 20, rb * 20, p), label="large margins (needs softplus, not log(sigmoid))"),
    ]


@exercise(chapter=17, cases=_bt_cases, atol=1e-9, description="Bradley-Terry loss with soft labels")
def soft_bt_loss(r_a, r_b, p_a):
    """mean of p softplus(-(r_a - r_b)) + (1 - p) softplus(r_a - r_b); a scalar."""
    d = r_a - r_b
    return (p_a * nn.functional.softplus(-d) + (1 - p_a) * nn.functional.softplus(d)).mean()


@mistake(soft_bt_loss, "you rounded the soft label to the majority vote: a 3-to-2 split is then fitted as if it "
         "were unanimous, which is what soft labels avoid")
def _bt_round(r_a, r_b, p_a):
    return soft_bt_loss(r_a, r_b, (p_a > 0.5).to(p_a.dtype))


@mistake(soft_bt_loss, "the roles are swapped: p is the probability that a is preferred, so it multiplies "
         "-log sigma(r_a - r_b) = softplus(-(r_a - r_b))")
def _bt_swapped(r_a, r_b, p_a):
    return soft_bt_loss(r_a, r_b, 1 - p_a)


@mistake(soft_bt_loss, "you regressed sigma(r_a - r_b) onto p with a squared error: that is not the Bradley-Terry "
         "likelihood (its gradient vanishes for confident wrong margins)")
def _bt_mse(r_a, r_b, p_a):
    return ((torch.sigmoid(r_a - r_b) - p_a) ** 2).mean()


@mistake(soft_bt_loss, "you weighted the majority label by the agreement |2p - 1|: that is a different rule "
         "(confidence weighting), and it ignores pairs with a tied vote")
def _bt_weighted_majority(r_a, r_b, p_a):
    d = r_a - r_b
    major = (p_a > 0.5).to(p_a.dtype)
    w = (2 * p_a - 1).abs()
    return (w * (major * nn.functional.softplus(-d) + (1 - major) * nn.functional.softplus(d))).mean()
