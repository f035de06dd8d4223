r"""Checkers for the exercises of chapter 17, ``lessons/17_uncertainty_risk.ipynb``.

* ``cvar_of_samples(rewards, alpha)``: the lower-tail CVaR of each row of samples ``[B, n] -> [B]``,
  :math:`\frac1\alpha\big(\frac1n\sum_{x_i<q} x_i + (\alpha - F(q^-))\,q\big)` with :math:`q` the lower
  :math:`\alpha`-quantile: exact when rewards tie (atoms).
* ``entropic_advantages(rewards, tau)``: the policy-gradient advantages of the entropic risk
  :math:`-\tau\log\mathbb E\,e^{-R/\tau}` of each row, :math:`\tau(1 - e^{-R/\tau}/Z)` ``[B, n]`` with
  :math:`Z` the row's mean of :math:`e^{-R/\tau}` (stable for small :math:`\tau`).
* ``pinball(quantiles, targets, taus)``: the quantile-regression loss, mean over rows and levels,
  :math:`\ell_\tau(u) = u(\tau - \mathbf 1[u<0])` with :math:`u = y - q`.
* ``bt_pair_grads(margins, p_a, rule)``: the gradient in each pair's margin of three readings of "weight
  pairs by Bradley-Terry confidence": soft labels :math:`\sigma(d) - \hat p`, the majority weighted by the
  agreement :math:`|2\hat p - 1|(\sigma(d) - y)`, and the majority weighted by the model's own confidence
  :math:`|\sigma(d) - \tfrac12|(\sigma(d) - y)` (weight held fixed), :math:`y = \mathbf 1[\hat p > \tfrac12]`.

Chapter: 17_uncertainty_risk.
"""
from __future__ import annotations

import torch

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


# ------------------------------------------------------------------- 2. entropic_advantages
# (was cvar_advantages: rlkit.risk.cvar_pg_weights, which the chapter shows, passed its check as a
# one-line call; issue 23. The entropic risk is the smooth risk measure the chapter recommends where
# the within-prompt CVaR has no gradient.)

def _ent_cases():
    g = torch.Generator().manual_seed(1717)
    cont = torch.rand(3, 8, generator=g, dtype=torch.float64)
    graded = torch.tensor([[1., 2 / 3, 1., 1 / 3, 1., 0., 1., 1.], [1., 1., 2 / 3, 1., 1., 1., 1., 0.]],
                          dtype=torch.float64)
    binary = torch.tensor([[0., 0., 0., 0., 1., 1., 1., 1.], [1., 1., 1., 1., 1., 1., 1., 1.]], dtype=torch.float64)
    high = 2.0 + torch.rand(2, 6, generator=g, dtype=torch.float64)
    return [
        Case(args=(torch.tensor([[0.0, 1.0]], dtype=torch.float64), 1.0),
             label="hand case: [0, 1], tau 1 -> +-(1 - e^-1) / (1 + e^-1) = -+0.4621"),
        Case(args=(cont, 0.5), label="3 prompts x 8 answers with distinct rewards, tau 0.5"),
        Case(args=(graded, 0.2), label="2 prompts x 8 answers, graded rewards with atoms, tau 0.2"),
        Case(args=(binary, 1.0), label="binary rewards: half right (CVaR_0.25 is flat there), and all right (all 0)"),
        Case(args=(high, 0.002), label="rewards 2 to 3 at tau 0.002: e^(-R/tau) underflows, needs a log-sum-exp"),
        Case(args=(cont, 1000.0), label="tau 1000: close to R - mean(R)"),
    ]


@exercise(chapter=17, cases=_ent_cases, atol=1e-9,
          description="entropic-risk policy-gradient advantages per prompt: tau (1 - e^(-R/tau) / Z)")
def entropic_advantages(rewards, tau):
    """tau * (1 - e^(-R/tau) / Z) with Z the mean of e^(-R/tau) over each row (prompt); [B, n]."""
    n = rewards.shape[-1]
    return tau * (1 - n * torch.softmax(-rewards / tau, dim=-1))


@mistake(entropic_advantages, "the baseline is missing: -tau e^(-R/tau) / Z is the gradient's weight, and "
         "subtracting the constant -tau (E[grad log pi] = 0) centres it: tau (1 - e^(-R/tau) / Z)")
def _ent_no_baseline(rewards, tau):
    n = rewards.shape[-1]
    return -tau * n * torch.softmax(-rewards / tau, dim=-1)


@mistake(entropic_advantages, "the normaliser Z = mean of e^(-R/tau) over the prompt's answers is missing: the "
         "gradient of -tau log E[e^(-R/tau)] divides by it")
def _ent_no_normaliser(rewards, tau):
    return tau * (1 - torch.exp(-rewards / tau))


@mistake(entropic_advantages, "you tilted towards the BEST answers (e^(+R/tau)): that is the risk-seeking soft "
         "maximum; the entropic risk of a reward weights the worst answers by e^(-R/tau)")
def _ent_risk_seeking(rewards, tau):
    n = rewards.shape[-1]
    return tau * (n * torch.softmax(rewards / tau, dim=-1) - 1)


@mistake(entropic_advantages, "you used ONE normaliser Z over the whole batch; each prompt (row) needs its own "
         "mean of e^(-R/tau)")
def _ent_batch_normaliser(rewards, tau):
    w = rewards.numel() * torch.softmax(-rewards.reshape(-1) / tau, dim=0)
    return tau * (1 - w.reshape(rewards.shape))


@mistake(entropic_advantages, "the factor tau is missing: the gradient of -tau log E[e^(-R/tau)] keeps the tau in "
         "front (without it the advantages do not tend to R - mean(R) as tau grows)")
def _ent_no_tau(rewards, tau):
    n = rewards.shape[-1]
    return 1 - n * torch.softmax(-rewards / tau, dim=-1)


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


# ------------------------------------------------------------------- 4. bt_pair_grads
# (was soft_bt_loss: rlkit.risk.soft_bradley_terry_loss, which the chapter shows, passed its check as a
# one-line call; issue 23. The exercise now compares the three readings of "weight pairs by
# Bradley-Terry confidence" through the gradient each gives a pair's margin.)

def _bg_cases():
    g = torch.Generator().manual_seed(3)
    d = torch.randn(7, generator=g, dtype=torch.float64) * 2
    p = torch.tensor([0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 0.6], dtype=torch.float64)
    wrong = torch.tensor([-6.0, -1.0, 0.0, 1.0, 6.0], dtype=torch.float64)
    unanimous = torch.ones(5, dtype=torch.float64)
    return [
        Case(args=(torch.tensor([1.0], dtype=torch.float64), torch.tensor([0.6], dtype=torch.float64), "soft"),
             label="hand case: margin 1, p = 0.6, soft -> sigma(1) - 0.6"),
        Case(args=(d, p, "soft"), label="7 pairs, votes 0/5 .. 5/5, soft labels"),
        Case(args=(d, p, "weighted_majority"), label="the same pairs, majority weighted by |2p - 1|"),
        Case(args=(d, p, "model_confidence"), label="the same pairs, majority weighted by |sigma(d) - 1/2|"),
        Case(args=(d * 25, p, "soft"), label="large margins (|d| up to about 100)"),
        Case(args=(wrong, unanimous, "model_confidence"),
             label="a unanimous label and margins from confidently wrong to confidently right"),
        Case(args=(torch.zeros(3, dtype=torch.float64), torch.tensor([0.5, 0.5, 0.5], dtype=torch.float64),
                   "weighted_majority"), label="tied votes: no majority, weight 0"),
    ]


def _bg(margins, p_a, rule, agree=lambda p: (2 * p - 1).abs(), through=False, sign=1.0):
    s = torch.sigmoid(margins)
    if rule == "soft":
        return sign * (s - p_a)
    y = (p_a > 0.5).to(margins.dtype)
    if rule == "weighted_majority":
        return sign * agree(p_a) * (s - y)
    w = (s - 0.5).abs()
    out = w * (s - y)
    if through:                                           # d/dd of the weight times the loss
        loss = y * torch.nn.functional.softplus(-margins) + (1 - y) * torch.nn.functional.softplus(margins)
        out = out + torch.sign(s - 0.5) * s * (1 - s) * loss
    return sign * out


@exercise(chapter=17, cases=_bg_cases, atol=1e-9,
          description="the per-pair gradient in the margin of three readings of 'weight pairs by confidence'")
def bt_pair_grads(margins, p_a, rule):
    """d loss_i / d d_i per pair: soft sigma(d) - p; weighted_majority |2p - 1| (sigma(d) - y);
    model_confidence |sigma(d) - 1/2| (sigma(d) - y) with the weight held fixed; y = 1[p > 1/2]."""
    return _bg(margins, p_a, rule)


@mistake(bt_pair_grads, "the sign is flipped: the gradient of the loss -[p log sigma(d) + (1 - p) log sigma(-d)] "
         "in d is sigma(d) - p, positive when the model already prefers a more than the annotators do")
def _bg_sign(margins, p_a, rule):
    return _bg(margins, p_a, rule, sign=-1.0)


@mistake(bt_pair_grads, "the agreement weight is |2p - 1| (0 at a tie, 1 when unanimous), not |p - 1/2|")
def _bg_half_agreement(margins, p_a, rule):
    return _bg(margins, p_a, rule, agree=lambda p: (p - 0.5).abs())


@mistake(bt_pair_grads, "you differentiated the model's confidence weight |sigma(d) - 1/2| too; the reading uses it "
         "as a fixed per-pair weight (stop-gradient), which is what makes it push confidently wrong pairs hardest")
def _bg_through(margins, p_a, rule):
    return _bg(margins, p_a, rule, through=True)


@mistake(bt_pair_grads, "you used the majority label for the soft rule: a 3-to-2 vote is then fitted as if it "
         "were unanimous (sigma(d) - 1[p > 1/2] instead of sigma(d) - p)")
def _bg_soft_rounded(margins, p_a, rule):
    if rule == "soft":
        return torch.sigmoid(margins) - (p_a > 0.5).to(margins.dtype)
    return _bg(margins, p_a, rule)
