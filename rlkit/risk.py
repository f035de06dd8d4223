r"""Uncertainty and risk: ensemble aggregation, quantile regression, CVaR, soft preference labels.

The pieces of chapter 17, each a small function on tensors:

* **Ensemble rules** (:func:`ensemble_aggregate`): turn the scores :math:`r_1..r_K` of :math:`K`
  reward models into one reward. ``"mean"`` :math:`\bar r`; the pessimistic rules ``"lcb"``
  :math:`\bar r - k\sigma`, ``"uwo"`` :math:`\bar r - k\sigma^2` (uncertainty-weighted
  optimisation), ``"min"`` (worst-case optimisation) and ``"softmin"``
  :math:`-\tau\log\frac1K\sum_j e^{-r_j/\tau}`, which runs from the mean
  (:math:`\tau\to\infty`) to the minimum (:math:`\tau\to0`). :func:`downweighted_advantages` is
  the source article's :math:`\tilde A = A/(1+\alpha\sigma)`: it rescales an advantage but never
  changes its sign. Whether it is pessimistic depends on where the KL sits (see its docstring).
* **Quantiles** (:func:`quantile_levels`, :func:`pinball_loss`): the quantile-regression loss
  that trains a head predicting :math:`M` quantiles of a reward distribution.
* **CVaR** of a reward (the mean of its worst :math:`\alpha` fraction):
  :func:`value_at_risk`, :func:`cvar` (exact for discrete distributions with atoms, from samples
  or from probabilities), :func:`cvar_weights` (CVaR as a reweighting, the form a DRO over
  prompts uses), :func:`cvar_from_quantiles` (from a quantile head), and
  :func:`cvar_pg_weights`, the per-sample advantages of the CVaR policy gradient, which give
  gradient to the lower tail *only*.
* **Preferences**: :func:`soft_bradley_terry_loss`, the Bradley-Terry likelihood with soft labels
  (the share of annotators preferring a) and optional per-pair weights.
* **Laplace** (last layer): :func:`laplace_bt_map`, the maximum a posteriori last layer under a
  Gaussian prior, :func:`laplace_bt_covariance`, the Gaussian posterior of a reward model's last
  layer under the Bradley-Terry likelihood, and :func:`linear_predictive_std`.

Conventions: rewards are "higher is better" throughout, so CVaR is the *lower* tail. Ensembles
put the member dimension first (``[K, ...]``). Nothing is broadcast silently.

Chapter: 17_uncertainty_risk.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from . import _validate as V

Tensor = torch.Tensor

__all__ = ["ENSEMBLE_RULES", "ensemble_aggregate", "downweighted_advantages", "quantile_levels", "pinball_loss",
           "value_at_risk", "cvar", "cvar_weights", "cvar_from_quantiles", "cvar_pg_weights",
           "soft_bradley_terry_loss", "laplace_bt_covariance", "laplace_bt_map", "linear_predictive_std"]

#: the rules :func:`ensemble_aggregate` knows
ENSEMBLE_RULES = ("mean", "lcb", "uwo", "min", "softmin")


# ----------------------------------------------------------------------------- ensemble rules

def ensemble_aggregate(scores: Tensor, rule: str = "mean", k: float = 1.0, tau: float = 1.0, dim: int = 0) -> Tensor:
    r"""Combine the scores of :math:`K` ensemble members into one reward.

    With :math:`\bar r = \frac1K\sum_j r_j` and the population standard deviation
    :math:`\sigma = \big(\frac1K\sum_j (r_j-\bar r)^2\big)^{1/2}` (0 for a single member):

    .. math::
        \text{mean: } \bar r,\quad
        \text{lcb: } \bar r - k\,\sigma,\quad
        \text{uwo: } \bar r - k\,\sigma^2,\quad
        \text{min: } \min_j r_j,\quad
        \text{softmin: } -\tau\log\frac1K\sum_{j} e^{-r_j/\tau}.

    The soft minimum is the value of the KL-ball worst case over members,
    :math:`\min_{q}\{\mathbb E_q[r] + \tau\,\mathrm{KL}(q\,\|\,\mathrm{unif})\}`; it lies between
    the minimum and the mean, tends to the mean as :math:`\tau\to\infty` and is
    :math:`\bar r - \sigma^2/(2\tau) + O(\tau^{-2})` for large :math:`\tau` (the uwo rule with
    :math:`k = 1/(2\tau)`). It is computed from the minimum with ``expm1``/``log1p``, so its error is
    the dtype's rounding of the scores for every :math:`\tau` (no overflow for a small :math:`\tau`,
    no cancellation for a large one).

    Args:
        scores: ``[..., K, ...]`` floating, finite; ``dim`` indexes the members (``K >= 1``).
        rule: one of :data:`ENSEMBLE_RULES`.
        k: the penalty coefficient of "lcb" and "uwo", a finite number >= 0.
        tau: the temperature of "softmin", a finite number > 0.
        dim: the member dimension.

    Returns: the scores with ``dim`` removed. Chapter: 17_uncertainty_risk.
    """
    V.float_tensor(scores, "scores", min_dim=1)
    rule = V.choice(rule, "rule", ENSEMBLE_RULES)
    k = V.real_in(k, "k", 0.0)
    tau = V.real_in(tau, "tau", 0.0, lo_open=True)
    dim = V.int_in(dim, "dim", -scores.dim(), scores.dim() - 1)
    V.int_in(scores.shape[dim], "the number of ensemble members (scores.shape[dim])")
    V.tensor_in(scores, "scores")
    mean = scores.mean(dim)
    if rule == "mean":
        return mean
    if rule == "min":
        return scores.amin(dim)
    if rule == "softmin":
        return _softmin(scores, tau, dim)
    var = ((scores - mean.unsqueeze(dim)) ** 2).mean(dim)
    return mean - k * (var.sqrt() if rule == "lcb" else var)


def _softmin(x: Tensor, tau: float, dim: int) -> Tensor:
    r""":math:`-\tau\log\frac1K\sum_j e^{-x_j/\tau}`, written as
    :math:`m - \tau\,\mathrm{log1p}\big(\frac1K\sum_j \mathrm{expm1}(-(x_j - m)/\tau)\big)` with
    :math:`m = \min_j x_j`. Every exponent is :math:`\le 0`, so nothing overflows for a small
    :math:`\tau`, and for a large :math:`\tau` the correction to :math:`m` (about
    :math:`\bar x - m`) comes out with the dtype's relative precision instead of as the difference of
    two numbers near :math:`\tau\log K` (which lost the mean in float32 for :math:`\tau \ge 10^4`)."""
    m = x.amin(dim, keepdim=True)
    u = torch.expm1(-(x - m) / tau).mean(dim)
    return m.squeeze(dim) - tau * torch.log1p(u)


def downweighted_advantages(advantages: Tensor, sigma: Tensor, alpha: float) -> Tensor:
    r"""The source article's uncertainty down-weighting, :math:`\tilde A = A / (1 + \alpha\,\sigma)`.

    Every factor :math:`1/(1+\alpha\sigma)` lies in :math:`(0, 1]`, so :math:`\tilde A` has the sign
    of :math:`A`: a response the reward model overrates is still pushed up, only more slowly.
    Where the update ends depends on where the KL sits (chapter 17, for a tabular softmax policy
    and the natural gradient): without a KL term, or with the KL folded into the reward and so into
    the advantage that is down-weighted, the fixed points are those of the unweighted update. With
    the KL as a separate gradient term (a KL loss, as GRPO-style trainers use) the fixed point is
    :math:`\pi_{ref}\,e^{w(\bar r - b^*)/\beta}` with :math:`w = 1/(1+\alpha\sigma)`: the weighting
    then shrinks uncertain rewards toward the baseline and acts as a pessimism
    (:func:`rlkit.reward_models.downweighted_fixed_point`). For a policy with shared parameters the
    stationary points move with :math:`\alpha` even with the KL in the reward.

    Args:
        advantages: ``[...]`` floating. sigma: ``[...]`` the same shape, finite, >= 0 (e.g. the
            ensemble standard deviation of the sequence reward, broadcast over a response's tokens
            by the caller). alpha: a finite number >= 0.

    Returns: ``[...]``. Chapter: 17_uncertainty_risk.
    """
    V.float_tensor(advantages, "advantages", min_dim=0)
    V.float_tensor(sigma, "sigma", min_dim=0)
    V.same_layout(advantages, "advantages", sigma, "sigma")
    V.tensor_in(sigma, "sigma", 0.0)
    alpha = V.real_in(alpha, "alpha", 0.0)
    return advantages / (1.0 + alpha * sigma)


# ----------------------------------------------------------------------------- quantile regression

def quantile_levels(m: int, dtype: torch.dtype = torch.float32, device=None) -> Tensor:
    r"""The midpoint levels :math:`\tau_i = \frac{2i+1}{2M}`, :math:`i = 0..M-1`, of an :math:`M`-quantile head.

    A head trained with :func:`pinball_loss` at these levels represents the distribution by
    :math:`M` atoms of mass :math:`1/M` (the quantile-regression view of Dabney et al., 2018).

    Returns: ``[M]``. Chapter: 17_uncertainty_risk.
    """
    m = V.int_in(m, "m")
    V.floating_dtype(dtype, "dtype")
    return (2 * torch.arange(m, dtype=dtype, device=device) + 1) / (2 * m)


def pinball_loss(quantiles: Tensor, targets: Tensor, taus: Tensor | None = None, kappa: float = 0.0,
                 mask: Tensor | None = None) -> Tensor:
    r"""Quantile-regression (pinball) loss of predicted quantiles against samples.

    With :math:`u = y - q_i` (target minus prediction),

    .. math::  \rho_\tau(u) = u\,\big(\tau - \mathbf 1[u < 0]\big) = \max(\tau u,\,(\tau-1)u),

    whose expectation over :math:`y` is minimised by the :math:`\tau`-quantile of :math:`y`. With
    ``kappa`` :math:`=\kappa > 0` the Huber version
    :math:`|\tau - \mathbf 1[u<0]|\,H_\kappa(u)/\kappa` (QR-DQN) is used, with
    :math:`H_\kappa(u) = \tfrac12u^2` for :math:`|u|\le\kappa` and :math:`\kappa(|u|-\tfrac12\kappa)`
    beyond. The result is the mean over the real samples and the :math:`M` levels.

    Args:
        quantiles: ``[..., M]`` predictions :math:`q_i` for each sample's distribution.
        targets: ``[...]`` one observed value per row.
        taus: ``[M]`` levels in (0, 1); None means :func:`quantile_levels`.
        kappa: 0 for the pinball loss, a finite number > 0 for the quantile Huber loss.
        mask: ``[...]`` bool or 0/1, the rows that count; None: all. No real row gives 0.

    Returns: a scalar. Chapter: 17_uncertainty_risk.
    """
    V.float_tensor(quantiles, "quantiles", min_dim=1)
    V.float_tensor(targets, "targets", min_dim=0)
    V.same_layout(quantiles[..., 0], "quantiles[..., 0]", targets, "targets")
    m = quantiles.shape[-1]
    if taus is None:
        taus = quantile_levels(m, quantiles.dtype, quantiles.device)
    V.float_tensor(taus, "taus")
    V.layout("M", {"M": m}, taus=taus)
    V.same_kind(taus, "taus", quantiles, "quantiles")
    V.tensor_in(taus, "taus", 0.0, 1.0, lo_open=True, hi_open=True)
    kappa = V.real_in(kappa, "kappa", 0.0)
    w = V.check_mask(mask, targets, "targets")
    u = targets.unsqueeze(-1) - quantiles
    if w is not None:  # padding may hold anything (NaN too): zero it before it can reach the sum
        u = torch.where(w.unsqueeze(-1) > 0, u, torch.zeros_like(u))
    below = (u < 0).to(u.dtype)
    if kappa == 0.0:
        per = u * (taus - below)
    else:
        a = u.abs()
        huber = torch.where(a <= kappa, 0.5 * u ** 2, kappa * (a - 0.5 * kappa))
        per = (taus - below).abs() * huber / kappa
    per = per.mean(-1)
    if w is None:
        return per.mean() if per.numel() else per.sum()
    return (per * w).sum() / w.sum().clamp_min(1.0)


# ----------------------------------------------------------------------------- CVaR

def _to_last(values: Tensor, weights: Tensor | None, dim: int, caller: str):
    V.float_tensor(values, "values", min_dim=1)
    dim = V.int_in(dim, "dim", -values.dim(), values.dim() - 1)
    V.int_in(values.shape[dim], f"{caller}: the number of values along dim (values.shape[dim])")
    V.tensor_in(values, "values")
    x = values.movedim(dim, -1)
    if weights is None:
        w = torch.full_like(x, 1.0 / x.shape[-1])
    else:
        V.float_tensor(weights, "weights", min_dim=1)
        V.same_layout(values, "values", weights, "weights")
        V.tensor_in(weights, "weights", 0.0)
        w = weights.movedim(dim, -1)
        total = w.sum(-1, keepdim=True)
        if w.numel() and bool((total <= 0).any()):
            raise ValueError(f"{caller}: weights must have a positive sum along dim in every row")
        w = w / total
    return x, w, dim


def _var_last(x: Tensor, w: Tensor | None, alpha: float) -> Tensor:
    """The lower alpha-quantile inf{v : F(v) >= alpha} along the last dim (``w`` None: equal weights).

    F is accumulated in float64. Equal weights give F(x_(k)) = k/n exactly, so alpha = k/n picks
    the k-th smallest value in every dtype; given weights carry their dtype's rounding (the masses
    were normalised in it), so F(v) counts as reaching alpha within a few units of that dtype's
    precision (1e-9 at the least, as before, for float64)."""
    xs, order = x.sort(-1)
    n = x.shape[-1]
    if w is None:
        cum = torch.arange(1, n + 1, dtype=torch.float64, device=x.device) / n
        tol = 1e-9
    else:
        cum = w.gather(-1, order).double().cumsum(-1)
        cum = cum / cum[..., -1:]
        tol = max(1e-9, 8 * torch.finfo(w.dtype).eps)
    idx = (cum < alpha - tol * (1 + alpha)).sum(-1, keepdim=True).clamp(max=n - 1)
    return xs.gather(-1, idx.expand(*xs.shape[:-1], 1)).squeeze(-1)


def value_at_risk(values: Tensor, alpha: float, weights: Tensor | None = None, dim: int = -1) -> Tensor:
    r"""The lower :math:`\alpha`-quantile of a reward, :math:`q_\alpha = \inf\{v: F(v) \ge \alpha\}`.

    :math:`F(v) = \sum_{i:\,x_i\le v} w_i` is the distribution function of the values (equal
    weights :math:`1/n` for samples; probabilities for an enumerated distribution). For a
    Bernoulli(:math:`p`) reward, :math:`q_\alpha = 0` whenever :math:`1-p \ge \alpha`.

    Args:
        values: ``[..., n, ...]`` finite; ``dim`` indexes the outcomes (n >= 1).
        alpha: the tail level in (0, 1].
        weights: None (samples) or ``[..., n, ...]`` non-negative masses (normalised per row).

    Returns: ``values`` with ``dim`` removed. Chapter: 17_uncertainty_risk.
    """
    alpha = V.real_in(alpha, "alpha", 0.0, 1.0, lo_open=True)
    x, w, _ = _to_last(values, weights, dim, "value_at_risk")
    return _var_last(x, None if weights is None else w, alpha)


def cvar_weights(values: Tensor, alpha: float, weights: Tensor | None = None, dim: int = -1) -> Tensor:
    r"""CVaR as a reweighting: masses :math:`c_i \ge 0` summing to 1, :math:`\mathrm{CVaR}_\alpha = \sum_i c_i x_i`.

    With :math:`q = q_\alpha` (:func:`value_at_risk`) and :math:`F(q^-) = \sum_{x_i<q} w_i`,

    .. math::
        c_i = \frac{w_i}{\alpha}\ (x_i < q),\qquad
        c_i = \frac{\alpha - F(q^-)}{\alpha}\,\frac{w_i}{\sum_{x_j = q} w_j}\ (x_i = q),\qquad
        c_i = 0\ (x_i > q):

    the worst outcomes get density :math:`1/\alpha` relative to :math:`w`, and the atom at the
    boundary gets just enough mass to fill :math:`\alpha` (split evenly over ties). So
    :math:`c` is the worst case over reweightings with density at most :math:`1/\alpha`: CVaR over
    prompts is this DRO.

    Args: as :func:`value_at_risk`.
    Returns: ``[..., n, ...]`` like ``values``. Chapter: 17_uncertainty_risk.
    """
    alpha = V.real_in(alpha, "alpha", 0.0, 1.0, lo_open=True)
    x, w, dim = _to_last(values, weights, dim, "cvar_weights")
    q = _var_last(x, None if weights is None else w, alpha).unsqueeze(-1)
    below, at = x < q, x == q
    f_below = (w * below).sum(-1, keepdim=True)
    w_at = (w * at).sum(-1, keepdim=True)
    fill = (alpha - f_below).clamp_min(0.0)
    c = torch.where(below, w / alpha, torch.zeros_like(w))
    c = c + torch.where(at, fill / alpha * w / w_at.clamp_min(torch.finfo(w.dtype).tiny), torch.zeros_like(w))
    return c.movedim(-1, dim)


def cvar(values: Tensor, alpha: float, weights: Tensor | None = None, dim: int = -1) -> Tensor:
    r"""Conditional value at risk of a reward, the mean of its worst :math:`\alpha` fraction:

    .. math::
        \mathrm{CVaR}_\alpha(R) = \frac1\alpha\int_0^\alpha q_u\,du
        = \sup_{\eta}\Big\{\eta - \frac1\alpha\,\mathbb E\,(\eta - R)_+\Big\}
        \quad\text{(Rockafellar-Uryasev; the sup is attained at } \eta = q_\alpha).

    For a continuous distribution this is :math:`\mathbb E[R\mid R\le q_\alpha]`; with atoms (a
    binary reward, a few distinct scores) that conditional mean is wrong, and the forms above
    count only part of the boundary atom (:func:`cvar_weights`). :math:`\alpha = 1` gives the mean.

    Args: as :func:`value_at_risk`.
    Returns: ``values`` with ``dim`` removed. Chapter: 17_uncertainty_risk.
    """
    alpha = V.real_in(alpha, "alpha", 0.0, 1.0, lo_open=True)
    c = cvar_weights(values, alpha, weights, dim)
    return (c * values).sum(dim)


def cvar_from_quantiles(quantiles: Tensor, alpha: float) -> Tensor:
    r"""CVaR of the distribution an :math:`M`-quantile head represents (:func:`quantile_levels`).

    The head's quantile function is piecewise constant, :math:`q(u) = q_{(i)}` on
    :math:`[i/M, (i+1)/M)` (the predictions sorted, which also repairs crossed quantiles), so

    .. math::
        \mathrm{CVaR}_\alpha = \frac1\alpha\sum_{i=0}^{M-1} q_{(i)}\,
        \big|[\tfrac iM, \tfrac{i+1}M)\cap[0,\alpha)\big| .

    Args: quantiles: ``[..., M]``; alpha in (0, 1].
    Returns: ``[...]``. Chapter: 17_uncertainty_risk.
    """
    V.float_tensor(quantiles, "quantiles", min_dim=1)
    alpha = V.real_in(alpha, "alpha", 0.0, 1.0, lo_open=True)
    m = V.int_in(quantiles.shape[-1], "the number of quantiles (quantiles.shape[-1])")
    q = quantiles.sort(-1).values
    lo = torch.arange(m, dtype=q.dtype, device=q.device) / m
    width = (alpha - lo).clamp(0.0, 1.0 / m)
    return (q * width).sum(-1) / alpha


def cvar_pg_weights(values: Tensor, alpha: float, var: Tensor | None = None, weights: Tensor | None = None,
                    dim: int = -1) -> Tensor:
    r"""Per-sample advantages of the CVaR policy gradient (Tamar et al., 2015):

    .. math::
        \nabla_\theta\,\mathrm{CVaR}_\alpha(R)
        = \frac1\alpha\,\mathbb E_{\pi_\theta}\big[(R - q_\alpha)\,\mathbf 1[R\le q_\alpha]\,
          \nabla_\theta\log\pi_\theta(y)\big],
        \qquad A^{\rm CVaR} = \frac{(R - q_\alpha)\,\mathbf 1[R\le q_\alpha]}{\alpha} \le 0 .

    Only the lower tail gets gradient (pushed down in probability, the worst the most); every
    sample above :math:`q_\alpha` gets exactly 0. With a binary reward and success rate
    :math:`p \le 1-\alpha`, :math:`q_\alpha = 0` and every advantage is 0: no gradient at all.

    Args:
        values: ``[..., n, ...]`` rewards; ``dim`` indexes the samples of one distribution (e.g.
            the responses to one prompt).
        alpha: the tail level in (0, 1].
        var: None (use the empirical :func:`value_at_risk` of each row) or ``values`` without
            ``dim``: a given :math:`q_\alpha` per row, e.g. from a quantile head.
        weights: None (samples) or masses per outcome (an enumerated distribution; the
            advantages are then the functional gradient :math:`\partial\,\mathrm{CVaR}/\partial\pi(y)`
            up to a constant).

    Returns: ``[..., n, ...]`` like ``values``. Chapter: 17_uncertainty_risk.
    """
    alpha = V.real_in(alpha, "alpha", 0.0, 1.0, lo_open=True)
    x, w, dim = _to_last(values, weights, dim, "cvar_pg_weights")
    if var is None:
        q = _var_last(x, None if weights is None else w, alpha)
    else:
        V.float_tensor(var, "var", min_dim=0)
        V.same_layout(x[..., 0], "values without dim", var, "var")
        q = V.tensor_in(var, "var")
    q = q.unsqueeze(-1)
    adv = torch.where(x <= q, (x - q) / alpha, torch.zeros_like(x))
    return adv.movedim(-1, dim)


# ----------------------------------------------------------------------------- preferences

def soft_bradley_terry_loss(r_a: Tensor, r_b: Tensor, p_a: Tensor, weights: Tensor | None = None) -> Tensor:
    r"""Bradley-Terry negative log-likelihood with soft labels and optional per-pair weights:

    .. math::
        L = \frac{\sum_i w_i\,\ell_i}{\sum_i w_i},\qquad
        \ell_i = \hat p_i\,\operatorname{softplus}(-d_i) + (1-\hat p_i)\operatorname{softplus}(d_i),
        \qquad d_i = \hat r(a_i) - \hat r(b_i),

    the cross-entropy between the label :math:`\hat p_i` (e.g. the share of :math:`K` annotators
    who preferred :math:`a_i`) and the model's :math:`\sigma(d_i)`. Hard labels
    :math:`\hat p\in\{0,1\}` and unit weights give :func:`rlkit.reward_models.bradley_terry_loss`.
    Its minimum over :math:`d_i` is the entropy of :math:`\hat p_i`, reached at
    :math:`d_i = \operatorname{logit}\hat p_i`: a 3-to-2 split asks for a small margin, a
    unanimous vote for a large one. No pair (or zero total weight) gives 0.

    Args:
        r_a, r_b: ``[M]`` rewards of the two responses of each pair. p_a: ``[M]`` in [0, 1].
        weights: ``[M]`` finite, >= 0, or None (all 1).

    Returns: a scalar. Chapter: 17_uncertainty_risk.
    """
    V.float_tensor(r_a, "r_a")
    V.float_tensor(r_b, "r_b")
    V.float_tensor(p_a, "p_a")
    V.same_layout(r_a, "r_a", r_b, "r_b")
    V.same_layout(r_a, "r_a", p_a, "p_a")
    V.tensor_in(p_a, "p_a", 0.0, 1.0)
    d = r_a - r_b
    per = p_a * nn.functional.softplus(-d) + (1 - p_a) * nn.functional.softplus(d)
    if weights is None:
        return per.mean() if per.numel() else per.sum()
    V.float_tensor(weights, "weights")
    V.same_layout(r_a, "r_a", weights, "weights")
    V.tensor_in(weights, "weights", 0.0)
    total = weights.sum()
    return (weights * per).sum() / torch.where(total > 0, total, torch.ones_like(total))


# ----------------------------------------------------------------------------- Laplace (last layer)

def _bt_last_layer(phi_a: Tensor, phi_b: Tensor, w: Tensor, prior_precision) -> tuple:
    """The checks shared by the Laplace functions: ``[M, D]`` features, ``[D]`` weights, ``nu > 0``."""
    V.float_tensor(phi_a, "phi_a", min_dim=2)
    V.float_tensor(phi_b, "phi_b", min_dim=2)
    V.same_layout(phi_a, "phi_a", phi_b, "phi_b")
    sizes = V.layout("M D", phi_a=phi_a)
    V.float_tensor(w, "w")
    V.layout("D", sizes, w=w)
    return sizes, V.real_in(prior_precision, "prior_precision", 0.0, lo_open=True)


def laplace_bt_covariance(phi_a: Tensor, phi_b: Tensor, w: Tensor, prior_precision: float = 1.0,
                          p_a: Tensor | None = None) -> Tensor:
    r"""Posterior covariance of a reward model's last layer under Bradley-Terry (a Laplace approximation).

    Hold the features :math:`\phi(y)` (the last hidden layer) fixed and put a Gaussian prior
    :math:`\mathcal N(0, \nu^{-1}I)` on the last-layer weights :math:`w`. The Hessian of the
    Bradley-Terry negative log-likelihood in :math:`w` (exact here: the model is linear in
    :math:`w`, so it equals the generalised Gauss-Newton matrix) at the fitted :math:`w` gives

    .. math::
        \Sigma = \Big(\nu I + \sum_i s_i(1-s_i)\,\delta_i\delta_i^\top\Big)^{-1},
        \qquad \delta_i = \phi(a_i) - \phi(b_i),\quad s_i = \sigma(w^\top\delta_i).

    The bias cancels in every difference, so it has no posterior: Bradley-Terry fixes a reward
    only up to a constant. The labels do not enter the Hessian (``p_a`` is accepted only to check
    its shape, so that a call with data of the wrong size fails).

    Args:
        phi_a, phi_b: ``[M, D]`` features of the two responses of each pair. w: ``[D]`` the fitted
            last-layer weights. prior_precision: :math:`\nu > 0`, finite. p_a: None or ``[M]``.
            All tensors share one dtype and device (a float32 ``w`` with float64 features is refused).

    Returns: ``[D, D]`` float64. Chapter: 17_uncertainty_risk.
    """
    sizes, lam = _bt_last_layer(phi_a, phi_b, w, prior_precision)
    V.same_kind(w, "w", phi_a, "phi_a")
    if p_a is not None:
        V.layout("M", sizes, floating=True, p_a=p_a)
        V.same_kind(p_a, "p_a", phi_a, "phi_a")
    delta = (phi_a - phi_b).double()
    s = torch.sigmoid(delta @ w.double())
    h = (delta * (s * (1 - s))[:, None]).T @ delta
    return torch.linalg.inv(h + lam * torch.eye(h.shape[0], dtype=h.dtype, device=h.device))


def laplace_bt_map(phi_a: Tensor, phi_b: Tensor, w: Tensor, prior_precision: float = 1.0,
                   p_a: Tensor | None = None, max_steps: int = 100, tol: float = 1e-10) -> Tensor:
    r"""The maximum a posteriori last layer under Bradley-Terry, the expansion point of the Laplace approximation.

    With the features :math:`\phi` fixed and the prior :math:`\mathcal N(0, \nu^{-1}I)`, minimise

    .. math::
        \sum_i \big[p_i\,\mathrm{softplus}(-w^\top\delta_i) + (1-p_i)\,\mathrm{softplus}(w^\top\delta_i)\big]
        + \frac\nu2\lVert w\rVert^2,\qquad \delta_i = \phi(a_i) - \phi(b_i),

    (:math:`p_i = 1`: a preferred, unless ``p_a`` gives soft labels) by Newton's method with
    backtracking, starting from ``w`` (e.g. the weights of a network fitted without a prior). The
    objective is strictly convex, so the minimiser is unique. :func:`laplace_bt_covariance` at the
    result is the Laplace approximation of the posterior under that prior.

    Args:
        phi_a, phi_b: ``[M, D]`` features. w: ``[D]`` the starting weights. prior_precision:
            :math:`\nu > 0`, finite. p_a: None (all 1) or ``[M]`` in [0, 1]. max_steps: an int >= 1.
            tol: stop when the gradient's norm is below ``tol`` (a finite number > 0).

    Returns: ``[D]`` float64. Raises ``RuntimeError`` if the gradient is not below ``tol`` after
    ``max_steps`` steps. Chapter: 17_uncertainty_risk.
    """
    sizes, lam = _bt_last_layer(phi_a, phi_b, w, prior_precision)
    V.tensor_in(w, "w")
    V.tensor_in(phi_a, "phi_a")
    V.tensor_in(phi_b, "phi_b")
    max_steps = V.int_in(max_steps, "max_steps")
    tol = V.real_in(tol, "tol", 0.0, lo_open=True)
    delta = (phi_a - phi_b).double()
    if p_a is None:
        p = torch.ones(delta.shape[0], dtype=torch.float64, device=delta.device)
    else:
        V.layout("M", sizes, floating=True, p_a=p_a)
        p = V.tensor_in(p_a, "p_a", 0.0, 1.0).double()
    eye = torch.eye(delta.shape[1], dtype=torch.float64, device=delta.device)

    def loss(v):
        d = delta @ v
        return float((p * nn.functional.softplus(-d) + (1 - p) * nn.functional.softplus(d)).sum()
                     + 0.5 * lam * (v @ v))

    x = w.detach().double().clone()
    for _ in range(max_steps):
        s = torch.sigmoid(delta @ x)
        grad = delta.T @ (s - p) + lam * x
        if float(grad.norm()) < tol:
            return x
        hess = (delta * (s * (1 - s))[:, None]).T @ delta + lam * eye
        step = torch.linalg.solve(hess, grad)
        f0, t = loss(x), 1.0
        while t > 1e-10 and loss(x - t * step) > f0 - 1e-4 * t * float(grad @ step):
            t *= 0.5
        x = x - t * step
    s = torch.sigmoid(delta @ x)
    gnorm = float((delta.T @ (s - p) + lam * x).norm())
    if gnorm < tol:
        return x
    raise RuntimeError(f"laplace_bt_map: the gradient's norm is {gnorm:.3g} after max_steps={max_steps} Newton "
                       f"steps (tol={tol:g})")


def _psd(cov: Tensor, name: str) -> None:
    """Refuse a covariance that is not finite or not positive semi-definite (beyond rounding)."""
    V.tensor_in(cov, name)
    c = cov.detach().double()
    eig = torch.linalg.eigvalsh(0.5 * (c + c.T))
    if eig.numel() and float(eig[0]) < -math.sqrt(torch.finfo(cov.dtype).eps) * max(float(eig.abs().max()), 1e-300):
        raise ValueError(f"{name} must be a covariance matrix (positive semi-definite), but its symmetric part has "
                         f"the eigenvalue {float(eig[0]):.3g} (largest in size {float(eig.abs().max()):.3g})")


def linear_predictive_std(phi: Tensor, cov: Tensor, center: Tensor | None = None) -> Tensor:
    r"""Standard deviation of :math:`w^\top(\phi - c)` when :math:`w \sim \mathcal N(\hat w, \Sigma)`:

    .. math::  \sigma(y) = \sqrt{(\phi(y) - c)^\top\,\Sigma\,(\phi(y) - c)} .

    With :math:`c = \mathbb E_{\pi_{ref}}[\phi]` this is the uncertainty of a reward measured
    relative to its mean under the reference policy, which is what a Bradley-Terry model can know.

    Args:
        phi: ``[..., D]``.
        cov: ``[D, D]``, finite and positive semi-definite: its symmetric part's eigenvalues are
            all >= 0 up to :math:`\sqrt{\varepsilon}` of the dtype times the largest. Anything else
            raises ``ValueError``, since :math:`x^\top\Sigma x` could be negative.
        center: ``[D]`` or None (0).

    Returns:
        ``[...]`` in ``phi``'s dtype.

    Chapter: 17_uncertainty_risk.
    """
    V.float_tensor(phi, "phi", min_dim=1)
    V.float_tensor(cov, "cov", min_dim=2)
    sizes = V.layout("... D", phi=phi)
    V.layout("D D", sizes, cov=cov)
    _psd(cov, "cov")
    x = phi.double()
    if center is not None:
        V.float_tensor(center, "center")
        V.layout("D", sizes, center=center)
        x = x - center.double()
    var = ((x @ cov.double()) * x).sum(-1).clamp_min(0.0)
    return var.sqrt().to(phi.dtype)
