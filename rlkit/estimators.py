r"""Measuring estimators: effective sample size, closed-form importance-weight variance, and the
bias and variance of gradient estimates.

Two chapters measure estimators instead of asserting their properties:

* 02_advantage_gae compares policy-gradient estimators (no baseline, a learned baseline, GAE for
  several :math:`\lambda`) against a high-sample reference gradient. It needs the per-episode
  gradients :math:`g_i^{(k)} = \sum_t w^{(k)}_{i,t}\,\nabla_\theta \log\pi_\theta(a_{i,t}\mid s_{i,t})`
  for several weightings :math:`k` at once (:func:`score_sums`), and their bias and variance
  (:func:`gradient_bias_variance`).
* 03_importance_sampling measures the variance of importance weights :math:`w = p/q` and the
  effective sample size (:func:`effective_sample_size`), and compares them with the closed form
  :math:`\operatorname{Var}_q(w) = \chi^2(p\,\|\,q)` (:func:`importance_weight_variance`).

Everything that touches weights works from log-weights, so log-ratios of :math:`\pm 1000` give
finite answers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from . import _validate as V

Tensor = torch.Tensor

__all__ = [
    "effective_sample_size",
    "importance_weight_variance",
    "score_sums",
    "trace_covariance",
    "gradient_bias_variance",
    "BiasVariance",
]


# ------------------------------------------------------------------------------------------------
# Importance weights
# ------------------------------------------------------------------------------------------------

def effective_sample_size(log_weights: Tensor | None = None, *, weights: Tensor | None = None,
                          mask: Tensor | None = None, dim: int | None = -1,
                          share: bool = False) -> Tensor:
    r"""Kish's effective sample size of importance weights: a COUNT, or with ``share=True`` a SHARE of n.

    .. math::  \mathrm{ESS} = \frac{\big(\sum_{i=1}^n w_i\big)^2}{\sum_{i=1}^n w_i^2}
               = \exp\Big(2\,\operatorname{LSE}_i(\ell_i) - \operatorname{LSE}_i(2\ell_i)\Big),
               \qquad \ell_i = \log w_i ,

    computed in log space (the right-hand form, after subtracting the largest log-weight), so it is
    finite and accurate to the dtype's precision for log-weights of any size, and unchanged when every
    weight is multiplied by the same constant. The count lies in
    :math:`[1, n]`: :math:`n` for equal weights, 1 when one weight dominates. ``share=True``
    returns :math:`\mathrm{ESS}/n \in [1/n, 1]` instead (chapter 13 monitors the share of a
    stale batch that still counts after the :math:`\rho_k` correction). For large :math:`n`,
    :math:`\mathrm{ESS}/n \to 1 / \mathbb E_q[w^2] = 1/(1 + \chi^2(p\|q))` when the weights have
    mean 1 (chapter 3).

    No sample (an empty ``dim``, an all-false mask, or all weights 0) gives 0, count and share alike.

    Args:
        log_weights: ``[..., n, ...]`` floating tensor of log-weights (``-inf`` = weight 0; ``+inf``
            and NaN are refused, except in masked-out entries). Give either this or ``weights``.
        weights: the same as plain non-negative finite weights (keyword only).
        mask: optional bool / 0-1 tensor of the input's shape: the samples to count (padding may
            hold anything).
        dim: the dimension holding the ``n`` samples (default: the last); ``None``: every entry is
            one sample of one batch (a 0-dim result).
        share: return :math:`\mathrm{ESS}/n` (``n`` = the number of kept samples) instead of the count.

    Returns: ``[...]``, the input with ``dim`` reduced (0-dim for ``dim=None``).

    Chapters: 03_importance_sampling (count), 05 and 13_engineering_checklist (share).
    """
    name = V.one_of(log_weights=log_weights, weights=weights)
    x = V.float_tensor(weights if weights is not None else log_weights, name, min_dim=0 if dim is None else 1)
    m = V.check_mask(mask, x, name, as_bool=True)
    V.boolean(share, "share")
    if dim is not None:
        V.int_in(dim, "dim", -x.dim(), x.dim() - 1)
    real = x if m is None else x[m]
    if weights is not None:
        V.tensor_in(real, "weights", 0.0)
        log_w = torch.log(weights)
    else:
        if bool(torch.isnan(real).any()) or bool((real == math.inf).any()):
            raise ValueError("log_weights must not contain NaN or +inf (-inf, a zero weight, is fine)")
        log_w = log_weights
    if m is not None:
        log_w = torch.where(m, log_w, torch.full((), -math.inf, dtype=x.dtype, device=x.device))
    if dim is None:
        log_w, dim = log_w.reshape(-1), 0
        m = None if m is None else m.reshape(-1)
    # centred on the largest log-weight (ESS is scale-free): the difference of two log-sum-exps near
    # 800 keeps only about 5 significant digits in float32, the centred one full precision
    if log_w.shape[dim] > 0:
        top = log_w.amax(dim=dim, keepdim=True)
        log_w = log_w - torch.where(torch.isfinite(top), top, torch.zeros((), dtype=top.dtype, device=top.device))
    lse1 = torch.logsumexp(log_w, dim=dim)
    lse2 = torch.logsumexp(2.0 * log_w, dim=dim)
    ess = torch.where(torch.isfinite(lse1), torch.exp(2.0 * lse1 - lse2), torch.zeros_like(lse1))
    if not share:
        return ess
    n = torch.full_like(ess, log_w.shape[dim]) if m is None else m.sum(dim).to(ess.dtype)
    return ess / n.clamp(min=1.0)


def importance_weight_variance(logits_p: Tensor, logits_q: Tensor, horizon: int = 1) -> Tensor:
    r"""Exact variance under :math:`q` of the importance weight of :math:`T` independent draws.

    For one draw :math:`x \sim q` and :math:`w = p(x)/q(x)`,

    .. math::  \operatorname{Var}_q(w) = \mathbb E_q[w^2] - 1 = \sum_x \frac{p(x)^2}{q(x)} - 1
               = \chi^2(p\,\|\,q),

    and for the product of :math:`T` independent ratios (a sequence of :math:`T` tokens drawn
    independently from :math:`q`, weighted by :math:`\prod_t p(x_t)/q(x_t)`)

    .. math::  \operatorname{Var}_q\Big(\prod_{t=1}^T w_t\Big) = \big(1 + \chi^2(p\|q)\big)^T - 1 .

    Computed as ``expm1(T * logsumexp(2 log p - log q))``: exact for small divergences and
    ``inf`` (not NaN) when the true value overflows. A category with :math:`q(x) = 0 < p(x)`
    gives ``inf`` (importance sampling cannot see it).

    Args:
        logits_p, logits_q: ``[..., K]`` logits of the target :math:`p` and the sampling
            distribution :math:`q` (normalised inside with ``log_softmax``; ``-inf`` allowed).
        horizon: :math:`T \ge 1`, the number of independent ratios multiplied.

    Returns: ``[...]``.

    Chapter: 03_importance_sampling.
    """
    V.float_tensor(logits_p, "logits_p", min_dim=1)
    V.float_tensor(logits_q, "logits_q", min_dim=1)
    V.same_layout(logits_p, "logits_p", logits_q, "logits_q")
    horizon = V.int_in(horizon, "horizon")
    logp = torch.log_softmax(logits_p, dim=-1)
    logq = torch.log_softmax(logits_q, dim=-1)
    # terms with p = 0 contribute 0 whatever q is; p > 0 = q gives +inf
    terms = torch.where(torch.isneginf(logp), torch.full_like(logp, -float("inf")), 2.0 * logp - logq)
    log_m2 = torch.logsumexp(terms, dim=-1)          # log E_q[w^2] = log(1 + chi2)
    return torch.expm1(horizon * log_m2)


# ------------------------------------------------------------------------------------------------
# Gradients of a policy, per sequence, for several weightings at once
# ------------------------------------------------------------------------------------------------

def score_sums(policy: nn.Module, obs: Tensor, actions: Tensor, weights: Tensor,
               mask: Tensor | None = None) -> Tensor:
    r"""Weighted sums of score vectors along each sequence, for ``K`` weightings at once.

    .. math::  g_{b,k} = \sum_{t} m_{b,t}\, w_{b,t,k}\,
               \nabla_\theta \log \pi_\theta(a_{b,t} \mid s_{b,t}) \;\in\; \mathbb R^{P}.

    With :math:`w_{b,t,k}` the advantage estimate of weighting :math:`k` (a return, a return
    minus a baseline, a GAE advantage), :math:`g_{b,k}` is the policy-gradient estimate that
    episode :math:`b` contributes under estimator :math:`k`; their mean over episodes is the
    usual batch estimate. The weights are treated as constants.

    How: one forward and one backward pass give, for every ``nn.Linear`` layer and every step,
    the gradient of :math:`\log\pi(a_t|s_t)` with respect to the layer's output,
    :math:`\delta_t`; the step's weight gradient is the outer product :math:`\delta_t x_t^\top`
    with the layer's input :math:`x_t` (steps do not interact in an MLP), so the weighted sums
    are two batched matrix products per layer. No per-step gradient vector of length
    :math:`P` is ever stored.

    Args:
        policy: a module mapping observations ``[..., obs_dim]`` to logits ``[..., A]`` (a
            :class:`rlkit.nets.CategoricalPolicy`), each step independently. Every parameter must
            belong to an ``nn.Linear`` layer (true for the book's MLPs); otherwise ``TypeError``.
        obs: ``[B, T, obs_dim]`` float.
        actions: ``[B, T]`` int64, each in ``[0, A)``.
        weights: ``[B, T, K]`` float (``K`` weightings of the same steps).
        mask: optional ``[B, T]`` bool or 0/1 of real steps (padding gets weight 0).

    Returns: ``[B, K, P]`` with the parameters flattened in the order of
    ``policy.parameters()`` (the order :func:`torch.nn.utils.parameters_to_vector` uses).

    Chapter: 02_advantage_gae (the variance experiment).
    """
    V.instance_of(policy, "policy", nn.Module, "torch.nn.Module")
    sizes = V.layout("B T K", V.layout("B T obs_dim", floating=True, obs=obs), floating=True, weights=weights)
    B, T = sizes["B"], sizes["T"]
    V.index_tensor(actions, "actions", shape=(B, T), shape_of="[B, T] like obs")
    m = V.check_mask(mask, actions.to(weights.dtype), "actions")
    if m is not None:
        weights = weights * m[..., None]
    linears = [mod for mod in policy.modules() if isinstance(mod, nn.Linear)]
    owner = {}
    for mod in linears:
        owner[id(mod.weight)] = (mod, "weight")
        if mod.bias is not None:
            owner[id(mod.bias)] = (mod, "bias")
    params = list(policy.parameters())
    for p in params:
        if id(p) not in owner:
            raise TypeError("score_sums: every parameter of policy must belong to an nn.Linear layer")

    saved = {}

    def hook(mod, inputs, output):
        saved[mod] = (inputs[0].detach(), output)

    handles = [mod.register_forward_hook(hook) for mod in linears]
    try:
        with torch.enable_grad():
            logits = policy(obs)
            if tuple(logits.shape[:2]) != (B, T) or logits.dim() != 3:
                raise ValueError(f"policy(obs) must return logits [B, T, A], got {tuple(logits.shape)}")
            V.index_tensor(actions, "actions", n=logits.shape[-1])    # A = the number of logits per step
            logp = torch.log_softmax(logits, dim=-1).gather(-1, actions[..., None]).squeeze(-1)
            used = [mod for mod in linears if mod in saved]
            outs = [saved[mod][1] for mod in used]
            grads = torch.autograd.grad(logp.sum(), outs, allow_unused=True)
    finally:
        for h in handles:
            h.remove()
    per_param = {}
    w = weights.to(obs.dtype)
    for mod, g_out in zip(used, grads):
        x = saved[mod][0]
        if g_out is None:
            g_out = torch.zeros_like(saved[mod][1])
        # [B, T, out] x [B, T, K] -> [B, K, T, out]
        wg = w.transpose(1, 2)[..., None] * g_out[:, None]
        per_param[id(mod.weight)] = torch.einsum("bkto,bti->bkoi", wg, x).reshape(B, weights.shape[2], -1)
        if mod.bias is not None:
            per_param[id(mod.bias)] = wg.sum(2)
    K = weights.shape[2]
    pieces = []
    for p in params:
        if id(p) in per_param:
            pieces.append(per_param[id(p)])
        else:  # a layer the forward pass never used: zero gradient
            pieces.append(obs.new_zeros(B, K, p.numel()))
    return torch.cat(pieces, dim=-1)


# ------------------------------------------------------------------------------------------------
# Bias and variance of an estimator against a reference
# ------------------------------------------------------------------------------------------------

def trace_covariance(samples: Tensor) -> float:
    r"""Trace of the sample covariance of ``M`` vectors: the mean squared distance from their mean.

    .. math::  \widehat{\operatorname{tr}\Sigma} = \frac{1}{M-1}\sum_{m=1}^M \|x_m - \bar x\|^2,
               \qquad \mathbb E\big[\widehat{\operatorname{tr}\Sigma}\big]
               = \mathbb E\|x - \mathbb E x\|^2 = \sum_p \operatorname{Var}(x_p).

    The variance of a vector estimator "summed over parameters". Computed in float64.

    Args:
        samples: ``[M, P]`` float, ``M >= 2`` independent draws.

    Returns: a float.

    Chapter: 02_advantage_gae.
    """
    M = V.layout("M P", floating=True, samples=samples)["M"]
    V.int_in(M, "the number of samples samples.shape[0]", 2)
    x = samples.detach().to(torch.float64)
    return float(((x - x.mean(0)) ** 2).sum() / (x.shape[0] - 1))


@dataclass
class BiasVariance:
    r"""What :func:`gradient_bias_variance` measured (all floats except ``n``).

    Attributes:
        variance: :math:`\operatorname{tr}\operatorname{Cov}(\hat g)`, the expected squared
            distance of ONE estimate from its mean (summed over parameters).
        bias2: :math:`\|\mathbb E\hat g - g\|^2`, with the noise of the finite means subtracted
            (an unbiased estimate: it can come out slightly negative for an unbiased estimator).
        bias2_raw: :math:`\|\bar g - g_{\text{ref}}\|^2` before the correction.
        noise_floor: the correction that was subtracted.
        mse: ``bias2 + variance``, the expected squared error of one estimate.
        rel_bias: the bias along the reference direction :math:`u = g_{\text{ref}}/\|g_{\text{ref}}\|`,
            relative to its length, :math:`\langle \bar g - g_{\text{ref}}, u\rangle /
            \|g_{\text{ref}}\|` (-0.3: the estimates are 30 % too short along the true gradient).
        rel_std: the standard deviation of one estimate along :math:`u`, over
            :math:`\|g_{\text{ref}}\|`.
        cosine: cosine between the mean estimate and the reference.
        n: the number of estimates ``M``.
    """
    variance: float
    bias2: float
    bias2_raw: float
    noise_floor: float
    mse: float
    rel_bias: float
    rel_std: float
    cosine: float
    n: int


def gradient_bias_variance(estimates: Tensor, reference: Tensor, *, mean: Tensor | None = None,
                           mean_noise: float | None = None) -> BiasVariance:
    r"""Bias and variance of a vector estimator (a stochastic gradient) against a reference.

    With ``M`` independent estimates :math:`\hat g_1, \dots, \hat g_M \in \mathbb R^P` (e.g. one
    per batch of a few episodes):

    .. math::  \widehat{\operatorname{Var}} = \frac{1}{M-1}\sum_m \|\hat g_m - \bar g\|^2,
               \qquad \widehat{\text{bias}^2} = \|\bar g - g_{\text{ref}}\|^2 - \nu ,

    where :math:`\nu` is the expected squared noise of :math:`\bar g - g_{\text{ref}}`, so that
    :math:`\mathbb E[\widehat{\text{bias}^2}] = \|\mathbb E \hat g - g\|^2`:

    * default: :math:`\bar g` is the mean of ``estimates`` and :math:`\nu =
      \widehat{\operatorname{Var}}/M` (exact reference);
    * ``mean=`` and ``mean_noise=``: a better estimate of :math:`\mathbb E\hat g` computed
      elsewhere, and the noise :math:`\nu` of ``mean - reference``. Chapter 2 uses this for a
      *paired* measurement: ``mean`` and ``reference`` are the averages of the estimator and of an
      unbiased one over the SAME large set of episodes, so their common noise cancels and
      :math:`\nu = \operatorname{tr}\operatorname{Cov}(g_i - g^{\text{unb}}_i)/N` is small.

    Args:
        estimates: ``[M, P]`` float, ``M >= 2``.
        reference: ``[P]``, not all zero.
        mean: optional ``[P]`` estimate of :math:`\mathbb E\hat g` (requires ``mean_noise``).
        mean_noise: :math:`\nu \ge 0`.

    Returns: a :class:`BiasVariance`.

    Chapter: 02_advantage_gae.
    """
    sizes = V.layout("P", V.layout("M P", floating=True, estimates=estimates), floating=True, reference=reference)
    V.int_in(sizes["M"], "the number of estimates estimates.shape[0]", 2)
    variance = trace_covariance(estimates)
    est = estimates.detach().to(torch.float64)
    ref = reference.detach().to(device=est.device, dtype=torch.float64)
    ref_norm = V.real_in(float(ref.norm()), "the norm of reference", 0.0, lo_open=True)
    M = est.shape[0]
    if mean is None:
        V.unused(mean_noise, "mean_noise", "together with mean=")
        avg = est.mean(0)
        noise = variance / M
    else:
        V.layout("P", sizes, floating=True, mean=mean)
        V.given(mean_noise, "mean_noise", "mean= needs it (the expected squared noise of mean - reference)")
        noise = V.real_in(mean_noise, "mean_noise", 0.0)
        avg = mean.detach().to(device=est.device, dtype=torch.float64)
    u = ref / ref_norm
    bias2_raw = float(((avg - ref) ** 2).sum())
    proj_std = float((est @ u).std(unbiased=True))
    avg_norm = float(avg.norm())
    cosine = float(avg @ u) / avg_norm if avg_norm > 0 else 0.0
    bias2 = bias2_raw - noise
    return BiasVariance(variance=variance, bias2=bias2, bias2_raw=bias2_raw, noise_floor=noise,
                        mse=bias2 + variance, rel_bias=float((avg - ref) @ u) / ref_norm,
                        rel_std=proj_std / ref_norm, cosine=cosine, n=M)
