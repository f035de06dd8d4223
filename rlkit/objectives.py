r"""Policy-gradient objectives, written as losses to MINIMISE.

Conventions: LLM tensors are ``[batch, tokens]`` (any leading dims work for token-level
quantities) with a ``mask`` of real tokens (bool or 0/1); log-probabilities of the sampled tokens
(``logp_*``) are ``[batch, tokens]``; advantages have the same shape (broadcast a per-sequence
advantage yourself with ``adv[:, None].expand_as(logp)``, rlkit never broadcasts silently).
Advantages and all ``logp`` except ``logp_new`` are treated as constants (detached).
Ratios are formed in log space and exponentiated at the last moment. The clip radii of the three
clipped losses are a float or a tensor of per-sample radii shaped like ``logp_new``.

Numerics: losses and gradients are finite, and the gradient is exactly 0 where a clip binds, for
log-ratios up to :data:`LOG_RATIO_CAP` (60) in float32 and bfloat16. Beyond it a ratio is held at
:math:`e^{60}` (its gradient too), so a log-ratio whose exponential would overflow still gives a
finite loss and gradient. float16 (whose exponential overflows above a log-ratio of 11) is refused
with a ``TypeError``. Masked-out padding may hold NaN or inf: it never reaches a value or a gradient.

Contents

* :func:`aggregate` - ``token-mean``, ``seq-mean-token-mean``, ``seq-mean-token-sum-norm``.
* :func:`policy_gradient_loss` - REINFORCE / advantage actor-critic surrogate.
* :func:`ppo_clip_loss` - PPO-clip with asymmetric (clip-higher) and dual clipping.
* :func:`geppo_loss` - clip around the previous ratio (method 1, GePPO style).
* :func:`decoupled_ppo_loss` - clip the ratio to the proximal policy, correct for the behaviour
  policy outside the clip (method 2, Hilton et al. 2022).
* :func:`clipped_policy_loss` - the one dispatcher over those three (``method`` = ``"standard"``,
  ``"adaptive"``, ``"decoupled"``) that the stale trainers call.
* :func:`grpo_advantages`, :func:`rloo_advantages`, :func:`normalize_advantages`.

Chapters: 01_policy_gradient, 04_kl_trpo_ppo, 07_tiny_llm, 12_clipping_staleness.
"""
from __future__ import annotations

import math

import torch

from . import _validate as V
from .staleness import half_abs_ratio_diff
from .utils import masked_mean

Tensor = torch.Tensor
FloatOrTensor = float | Tensor

__all__ = [
    "AGGREGATIONS",
    "aggregate",
    "policy_gradient_loss",
    "ppo_clip_loss",
    "geppo_loss",
    "decoupled_ppo_loss",
    "CLIP_METHODS",
    "clipped_policy_loss",
    "LOG_RATIO_CAP",
    "grpo_advantages",
    "rloo_advantages",
    "normalize_advantages",
]

#: The loss aggregations of :func:`aggregate` (how per-token losses become one number).
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
#: The clipped objectives of :func:`clipped_policy_loss` (standard PPO, method 1, method 2).
CLIP_METHODS = ("standard", "adaptive", "decoupled")
#: Log-ratios are clamped to this before ``exp`` where the clip makes the gradient 0 anyway.
LOG_RATIO_CAP = 60.0   # e^60 ~ 1e26: finite in float32 and bfloat16, with room for |A| up to 1e12


# ----------------------------------------------------------------------------------------------
# Aggregation
# ----------------------------------------------------------------------------------------------

def aggregate(loss_per_token: Tensor, mask: Tensor | None = None, mode: str = "token-mean",
              max_len: int | None = None) -> Tensor:
    r"""Reduce a ``[batch, tokens]`` per-token loss to a scalar; the choice changes the gradient.

    With :math:`m_{i,t}` the mask, :math:`|o_i| = \sum_t m_{i,t}` the length of response
    :math:`i`, :math:`B` the number of sequences and :math:`\ell_{i,t}` the per-token loss:

    * ``"token-mean"``: :math:`\frac{1}{\sum_i |o_i|}\sum_{i,t} m_{i,t}\,\ell_{i,t}`.
      Every real token in the batch has the same weight; a long response contributes more
      tokens, so more gradient, than a short one (DAPO's choice).
    * ``"seq-mean-token-mean"``: :math:`\frac1B \sum_i \frac{1}{|o_i|} \sum_t m_{i,t}\ell_{i,t}`.
      Every *sequence* has the same weight, so a token of a short response weighs more than a
      token of a long one. With a negative advantage this pushes less against long wrong answers
      per token, the length bias Dr. GRPO points out in the original GRPO loss.
    * ``"seq-mean-token-sum-norm"`` (Dr. GRPO): :math:`\frac{1}{B\,L}\sum_{i,t} m_{i,t}\ell_{i,t}`
      with a constant :math:`L` = ``max_len`` (default: the padded length
      ``loss_per_token.shape[-1]``; pass the generation budget to make the scale independent of
      the batch). ``max_len`` below the longest response (its real tokens under ``mask``, else
      the padded length) raises ``ValueError``. Every token has the same constant weight,
      independent of its response's length and of the batch's token count.

    Sequences with no real token are left out of the sequence mean; an all-zero mask or an empty
    batch (``B = 0`` or ``T = 0``) gives a loss of 0, not NaN. Padding may hold NaN or inf.

    Args:
        loss_per_token: ``[..., T]`` float tensor (leading dims index sequences).
        mask: ``None`` or bool / 0-1 tensor of the same shape.
        mode: one of :data:`AGGREGATIONS`.
        max_len: positive int, only for ``"seq-mean-token-sum-norm"``.

    Returns: a 0-dim tensor.

    Chapter: 07_tiny_llm (the GRPO family and its aggregation choices).
    """
    V.float_tensor(loss_per_token, "loss_per_token", min_dim=1)
    V.choice(mode, "mode", AGGREGATIONS)
    m = V.check_mask(mask, loss_per_token, "loss_per_token")
    # torch.where, not a product: padding may hold inf/NaN, which must not leak into the loss
    x = loss_per_token if m is None else torch.where(m > 0, loss_per_token, _zero(loss_per_token))
    if mode != "seq-mean-token-sum-norm":
        V.unused(max_len, "max_len", "by mode='seq-mean-token-sum-norm'")
    elif max_len is not None:
        max_len = V.int_in(max_len, "max_len")
        longest = x.shape[-1] if m is None else int(m.sum(-1).max()) if m.numel() else 0
        if max_len < longest:
            raise ValueError(f"max_len ({max_len}) must be at least the longest response, {longest} "
                             f"{'tokens (the padded length, no mask)' if m is None else 'real tokens'}: "
                             f"the constant L of 'seq-mean-token-sum-norm' bounds every response's length")
    if mode in ("token-mean", "seq-mean-token-mean") and m is None:
        return masked_mean(x)
    if mode == "token-mean":
        return masked_mean(x, m)
    T = x.shape[-1]
    n_seq_shape = x.shape[:-1]
    if mode == "seq-mean-token-mean":
        count = m.sum(-1)
        per_seq = x.sum(-1) / count.clamp(min=1.0)
        n_seq = (count > 0).to(x.dtype).sum().clamp(min=1.0)
        return per_seq.sum() / n_seq
    # seq-mean-token-sum-norm
    L = T if max_len is None else max_len
    n_seq = max(1, math.prod(n_seq_shape))
    return x.sum() / (n_seq * max(1, L))


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------

def _check_logps(ref_name: str, ref, **others) -> Tensor:
    """``ref`` and every tensor in ``others``: floating (not float16), >= 1 dim, one layout."""
    V.no_float16(V.float_tensor(ref, ref_name, min_dim=1), ref_name)
    for name, x in others.items():
        V.float_tensor(x, name, min_dim=1)
        V.same_layout(ref, ref_name, x, name)
    return ref


def _zero(x: Tensor) -> Tensor:
    return torch.zeros((), dtype=x.dtype, device=x.device)


def _clean(x: Tensor, m: Tensor | None) -> Tensor:
    """Zero the padding (so that garbage there cannot give NaN values or gradients)."""
    return x if m is None else torch.where(m > 0, x, _zero(x))


def _ratio(log_ratio: Tensor) -> Tensor:
    r""":math:`e^{\log r}`, held at :math:`e^{60}` (value and gradient) above :data:`LOG_RATIO_CAP`.

    Where a clip binds, the loss's gradient is 0 times the ratio's: with the ratio finite that is
    an exact 0, never :math:`0\cdot\infty = \text{NaN}`.
    """
    over = log_ratio > LOG_RATIO_CAP
    return torch.exp(torch.where(over, log_ratio - log_ratio.detach() + LOG_RATIO_CAP, log_ratio))


def _radius_bounds(eps, eps_high):
    """``(1 - eps, 1 + eps_high)``: floats stay floats; per-sample radii are added in float64 (then
    cast back), so that a tensor radius gives the same bounds, to the last bit, as a float."""
    def one(sign, e):
        if isinstance(e, Tensor):
            return (1.0 + sign * e.double()).to(e.dtype)
        return 1.0 + sign * e
    return one(-1.0, eps), one(1.0, eps_high)


def _k3_from_log_ratio(log_ratio: Tensor) -> Tensor:
    # KL(pi_old || pi_new) estimated with samples from pi_old: exp(l) - 1 - l, l = log(new/old)
    return torch.expm1(log_ratio) - log_ratio


# ----------------------------------------------------------------------------------------------
# Losses
# ----------------------------------------------------------------------------------------------

def policy_gradient_loss(logp: Tensor, advantages: Tensor, mask: Tensor | None = None,
                         aggregation: str = "token-mean") -> Tensor:
    r"""The score-function surrogate
    :math:`L = -\,\mathrm{agg}\big(\hat A_{i,t}\,\log\pi_\theta(a_{i,t}\mid s_{i,t})\big)`.

    Its gradient is :math:`-\,\mathrm{agg}(\hat A\,\nabla_\theta \log \pi_\theta)`, the policy
    gradient estimate (REINFORCE when :math:`\hat A` is the return, actor-critic when it is an
    advantage). The value of the loss means nothing by itself; only its gradient does.

    Args:
        logp: ``[B, T]`` log-probabilities of the taken actions/tokens (with grad).
        advantages: ``[B, T]``, treated as constants (detached).
        mask: optional ``[B, T]`` bool / 0-1 mask of real tokens.
        aggregation: see :func:`aggregate`.

    Returns: 0-dim loss.

    Chapter: 01_policy_gradient.
    """
    _check_logps("logp", logp, advantages=advantages)
    V.choice(aggregation, "aggregation", AGGREGATIONS)
    m = V.check_mask(mask, logp, "logp")
    return aggregate(-_clean(advantages.detach(), m) * _clean(logp, m), mask, aggregation)


def ppo_clip_loss(logp_new: Tensor, logp_old: Tensor, advantages: Tensor, eps: FloatOrTensor = 0.2,
                  eps_high: FloatOrTensor | None = None, dual_clip: float | None = None,
                  mask: Tensor | None = None, aggregation: str = "token-mean"
                  ) -> tuple[Tensor, dict[str, Tensor]]:
    r"""PPO-clip loss (Schulman et al., 2017) with clip-higher and dual clipping.

    With :math:`r = \exp(\log\pi_\theta - \log\pi_{\text{old}})` per token,

    .. math::  \ell = -\min\big(r\hat A,\ \mathrm{clip}(r, 1-\epsilon, 1+\epsilon_{\text{high}})\,\hat A\big),

    and, when ``dual_clip`` :math:`= c > 1` is given, for :math:`\hat A < 0` the loss is also
    capped: :math:`\ell = \min(\ell, -c\hat A)` (Ye et al., 2020), so a token whose ratio has
    exploded cannot dominate the batch. ``eps_high`` defaults to ``eps``; a larger value is
    DAPO's "clip-higher". Where the clipped branch is selected the token's gradient is zero.

    Args:
        logp_new: ``[B, T]`` log-probs under the policy being optimised (with grad).
        logp_old: ``[B, T]`` log-probs under the policy that sampled the data (detached).
        advantages: ``[B, T]`` (detached).
        eps, eps_high: clip radii, ``eps`` in ``(0, 1]``, ``eps_high > 0``: each a float or a
            tensor of per-sample radii shaped like ``logp_new``.
        dual_clip: ``None`` or a float ``> 1``.
        mask, aggregation: see :func:`aggregate`.

    Returns: ``(loss, stats)``; ``stats`` holds detached 0-dim tensors (masked token means):
    ``clip_fraction`` (tokens whose gradient the clip zeroes), ``dual_clip_fraction``,
    ``approx_kl`` (k3 estimate of KL(pi_old || pi_new) from the old policy's samples),
    ``approx_kl_k1`` and ``ratio_mean``.

    Finite, with a zero gradient where a clip binds, for any log-ratio (see the module notes).

    Chapter: 04_kl_trpo_ppo; dual clip and clip-higher in 12_clipping_staleness.
    """
    _check_logps("logp_new", logp_new, logp_old=logp_old, advantages=advantages)
    eps = V.radius(eps, "eps", logp_new, "logp_new", hi=1.0)
    eps_high = eps if eps_high is None else V.radius(eps_high, "eps_high", logp_new, "logp_new")
    if dual_clip is not None:
        dual_clip = V.real_in(dual_clip, "dual_clip", 1.0, lo_open=True)
    m = V.check_mask(mask, logp_new, "logp_new")
    V.choice(aggregation, "aggregation", AGGREGATIONS)

    adv = _clean(advantages.detach(), m)
    log_ratio = _clean(logp_new - logp_old.detach(), m)
    ratio = _ratio(log_ratio)
    lo, hi = _radius_bounds(eps, eps_high)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(lo, hi)
    loss_tok = torch.maximum(loss_unclipped, loss_clipped)
    clipped = loss_clipped > loss_unclipped
    if dual_clip is not None:
        cap = -dual_clip * adv
        dual = (adv < 0) & (loss_tok > cap)
        loss_tok = torch.where(dual, cap, loss_tok)
    loss = aggregate(loss_tok, mask, aggregation)

    with torch.no_grad():
        f = lambda z: masked_mean(z.to(log_ratio.dtype), m)
        stats = {
            "clip_fraction": f(clipped),
            "dual_clip_fraction": f(dual) if dual_clip is not None else _zero(log_ratio),
            "approx_kl": f(_k3_from_log_ratio(log_ratio)),
            "approx_kl_k1": f(-log_ratio),
            "ratio_mean": f(ratio),
        }
    return loss, stats


def geppo_loss(logp_new: Tensor, logp_prox: Tensor, logp_behav: Tensor, advantages: Tensor,
               eps: FloatOrTensor = 0.2, mask: Tensor | None = None, aggregation: str = "token-mean"
               ) -> tuple[Tensor, dict[str, Tensor]]:
    r"""Clipping around the previous ratio (method 1 of Part II, GePPO style; Queeney et al. 2021).

    The data come from a behaviour policy :math:`\mu` (an old policy version, possibly different
    per sample); :math:`\pi_k` is the policy at the start of this update (the *proximal*
    policy). With :math:`\rho_{k+1} = \pi_\theta/\mu` and :math:`\rho_k = \pi_k/\mu`,

    .. math::

        \ell = -\min\big(\rho_{k+1}\hat A,\
                \mathrm{clip}(\rho_{k+1},\ \rho_k-\epsilon,\ \rho_k+\epsilon)\,\hat A\big).

    The clip window is centred on where the ratio already is, not on 1, so a stale sample
    (:math:`\rho_k` far from 1) still gets a window of width :math:`2\epsilon` to move in, and
    the clip controls exactly the update shift :math:`U_k = \tfrac12\mathbb E|\rho_{k+1}-\rho_k|`
    of lemma lem-ch11-ratio. With :math:`\mu = \pi_k` (on-policy data) it is standard PPO-clip.

    Args:
        logp_new: ``[B, T]`` log-probs under :math:`\pi_\theta` (with grad).
        logp_prox: ``[B, T]`` log-probs under :math:`\pi_k` (detached).
        logp_behav: ``[B, T]`` log-probs under the behaviour policy :math:`\mu` (detached).
        advantages: ``[B, T]`` advantage estimates for the behaviour data (detached).
        eps: clip radius ``> 0``, a float or a tensor of per-sample radii shaped like ``logp_new``.
        mask, aggregation: see :func:`aggregate`.

    Returns: ``(loss, stats)`` with ``clip_fraction``, ``update_shift`` (:math:`\hat U_k =
    \tfrac12\,\overline{|\rho_{k+1} - \rho_k|}`, :func:`rlkit.staleness.update_shift`), ``staleness``
    (:math:`\hat S_k = \tfrac12\,\overline{|\rho_k - 1|}`, :func:`rlkit.staleness.staleness`; both
    means are over the ``mask`` and carry the :math:`\tfrac12` of lemma lem-ch11-ratio, so they
    estimate expected TV distances in :math:`[0, 1]`) and ``approx_kl`` (k3 of
    :math:`\log\pi_\theta/\pi_k`).

    Chapter: 12_clipping_staleness.
    """
    _check_logps("logp_new", logp_new, logp_prox=logp_prox, logp_behav=logp_behav, advantages=advantages)
    eps = V.radius(eps, "eps", logp_new, "logp_new")
    m = V.check_mask(mask, logp_new, "logp_new")
    V.choice(aggregation, "aggregation", AGGREGATIONS)

    adv = _clean(advantages.detach(), m)
    lb = logp_behav.detach()
    rho_new = _ratio(_clean(logp_new - lb, m))
    rho_k = _ratio(_clean(logp_prox.detach() - lb, m))
    loss_unclipped = -adv * rho_new
    loss_clipped = -adv * torch.clamp(rho_new, rho_k - eps, rho_k + eps)
    loss_tok = torch.maximum(loss_unclipped, loss_clipped)
    loss = aggregate(loss_tok, mask, aggregation)
    with torch.no_grad():
        lr = _clean(logp_new - logp_prox, m)
        stats = {
            "clip_fraction": masked_mean((loss_clipped > loss_unclipped).to(lr.dtype), m),
            "update_shift": half_abs_ratio_diff(logp_new, logp_prox, logp_behav, m),
            "staleness": half_abs_ratio_diff(logp_prox, logp_behav, logp_behav, m),
            "approx_kl": masked_mean(_k3_from_log_ratio(lr), m),
        }
    return loss, stats


def decoupled_ppo_loss(logp_new: Tensor, logp_prox: Tensor, logp_behav: Tensor,
                       advantages: Tensor, eps: FloatOrTensor = 0.2,
                       behav_clip: float | None = None, mask: Tensor | None = None,
                       aggregation: str = "token-mean") -> tuple[Tensor, dict[str, Tensor]]:
    r"""Decoupled PPO (method 2 of Part II; Hilton, Cobbe and Schulman, 2022).

    The clip acts on the incremental ratio :math:`r = \pi_\theta/\pi_{\text{prox}}` and the
    behaviour correction :math:`w = \pi_{\text{prox}}/\mu` multiplies outside the clip:

    .. math::  \ell = -\,\bar w\,\min\big(r\hat A,\ \mathrm{clip}(r, 1-\epsilon, 1+\epsilon)\,\hat A\big),
               \qquad \bar w = \min(w, \bar c) \text{ (if ``behav_clip`` } = \bar c\text{)},

    with :math:`w` detached. Since :math:`w \ge 0` this is PPO-clip with the advantage
    :math:`\hat A' = w\hat A` (the article's :math:`\hat A = \rho_k A`). Without truncation the
    unclipped gradient equals that of :math:`(\pi_\theta/\mu)\hat A`, the importance-sampled
    policy gradient; the clip keeps the *update* small whatever the staleness, and the clip
    centre does not depend on the family of old policies.

    **Truncation, not masking.** With ``behav_clip`` :math:`=\bar c`, rlkit *truncates* the
    behaviour weight: a token with :math:`w > \bar c` still contributes, with weight :math:`\bar c`
    (as V-trace's :math:`\bar\rho` and truncated importance sampling do). AReaL's decoupled loss
    (``behav_imp_weight_cap``) instead *masks* such a token: its weight becomes 0 (and it still counts
    in the token-mean's denominator). rlkit truncates because masking is a one-sided staleness filter,
    a selection on :math:`\rho_k = \pi_k/\mu` that removes exactly the tokens whose probability the
    learner has raised most since they were sampled, and a selection on the ratio biases the kept batch
    (chapter 12, the staleness filter). Truncation keeps every token's gradient direction and bounds its weight,
    trading a bias (tokens with :math:`w > \bar c` are under-weighted) for bounded variance. To
    reproduce AReaL's masking exactly, pass ``behav_clip=None`` and advantages multiplied by
    :math:`\mathbf 1\{\log\pi_k - \log\mu \le \log\bar c\}`.

    Args:
        logp_new: ``[B, T]`` log-probs under :math:`\pi_\theta` (with grad).
        logp_prox: ``[B, T]`` log-probs under the proximal policy :math:`\pi_k` (detached).
        logp_behav: ``[B, T]`` log-probs under the behaviour policy :math:`\mu` (detached).
        advantages: ``[B, T]`` (detached).
        eps: clip radius in ``(0, 1]``, a float or a tensor of per-sample radii shaped like
            ``logp_new``.
        behav_clip: ``None`` or a float ``> 0`` truncating :math:`w` to :math:`\min(w, \bar c)`
            (not masking it; see above).
        mask, aggregation: see :func:`aggregate`.

    Returns: ``(loss, stats)`` with ``clip_fraction``, ``behav_weight_mean`` (:math:`\bar w`),
    ``behav_truncated_fraction``, ``update_shift`` (:math:`\tfrac12` masked mean of
    :math:`|\pi_\theta/\mu - \pi_k/\mu|`) and ``approx_kl`` (k3 of :math:`\log r`).

    Chapter: 12_clipping_staleness.
    """
    _check_logps("logp_new", logp_new, logp_prox=logp_prox, logp_behav=logp_behav, advantages=advantages)
    eps = V.radius(eps, "eps", logp_new, "logp_new", hi=1.0)
    if behav_clip is not None:
        behav_clip = V.real_in(behav_clip, "behav_clip", 0.0, lo_open=True)
    m = V.check_mask(mask, logp_new, "logp_new")
    V.choice(aggregation, "aggregation", AGGREGATIONS)

    adv = _clean(advantages.detach(), m)
    lprox = logp_prox.detach()
    w = _ratio(_clean(lprox - logp_behav.detach(), m))
    w_bar = w if behav_clip is None else w.clamp(max=behav_clip)
    log_r = _clean(logp_new - lprox, m)
    r = _ratio(log_r)
    lo, hi = _radius_bounds(eps, eps)
    loss_unclipped = -adv * r
    loss_clipped = -adv * r.clamp(lo, hi)
    loss_tok = w_bar * torch.maximum(loss_unclipped, loss_clipped)
    loss = aggregate(loss_tok, mask, aggregation)
    with torch.no_grad():
        f = lambda z: masked_mean(z.to(log_r.dtype), m)
        stats = {
            "clip_fraction": f(loss_clipped > loss_unclipped),
            "behav_weight_mean": f(w_bar),
            "behav_truncated_fraction": f(w > behav_clip) if behav_clip is not None
            else _zero(log_r),
            "update_shift": half_abs_ratio_diff(logp_new, logp_prox, logp_behav, m),
            "approx_kl": f(_k3_from_log_ratio(log_r)),
        }
    return loss, stats


def clipped_policy_loss(method: str, logp_new: Tensor, logp_prox: Tensor, logp_behav: Tensor,
                        advantages: Tensor, eps: FloatOrTensor, *, behav_clip: float | None = None,
                        mask: Tensor | None = None, aggregation: str = "token-mean"
                        ) -> tuple[Tensor, dict[str, Tensor]]:
    r"""The clipped policy loss of a stale-data trainer, one of three named choices (Part II).

    With :math:`\mu` the behaviour version that sampled each token and :math:`\pi_k` the policy
    at the start of the update:

    * ``"standard"``: :func:`ppo_clip_loss` of :math:`\pi_\theta/\mu`, clipped to :math:`1\pm\epsilon`
      (``logp_prox`` is not used);
    * ``"adaptive"`` (method 1): :func:`geppo_loss`, the window :math:`[\rho_k-\epsilon, \rho_k+\epsilon]`;
    * ``"decoupled"`` (method 2): :func:`decoupled_ppo_loss`, :math:`r = \pi_\theta/\pi_k` clipped to
      :math:`1\pm\epsilon`, times :math:`\rho_k = \pi_k/\mu`, truncated to :math:`\min(\rho_k, \bar c)`
      with ``behav_clip`` :math:`=\bar c` (truncated, where AReaL masks the token; why:
      :func:`decoupled_ppo_loss`).

    Per-sample radii (an age-dependent schedule, :func:`rlkit.staleness.age_clip_radius`) are
    passed to the losses as they are; each token is clipped with its own radius, so the loss is
    the aggregation of the per-token losses, not a mean of per-radius groups.

    Args:
        method: one of :data:`CLIP_METHODS`.
        logp_new, logp_prox, logp_behav, advantages: ``[B]`` (one sample each, e.g. CartPole
            steps) or ``[B, T]`` (tokens) tensors of one shape.
        eps: the clip radius: a float, a tensor shaped like ``logp_new`` (one per sample or
            token), or, for ``[B, T]`` tensors, a ``[B]`` tensor (one per response, used for all
            of its tokens).
        behav_clip: ``None`` or a float ``> 0``; ``method="decoupled"`` only. It truncates the
            behaviour weight, it does not drop tokens.
        mask, aggregation: see :func:`aggregate`.

    Returns: ``(loss, stats)``, the chosen loss's (all three have ``clip_fraction``).

    Chapter: 12_clipping_staleness (the CartPole and tiny-LLM stale trainers).
    """
    V.choice(method, "method", CLIP_METHODS)
    # checked here under the caller's names ("standard" passes logp_behav as ppo_clip_loss's logp_old)
    _check_logps("logp_new", logp_new, logp_prox=logp_prox, logp_behav=logp_behav, advantages=advantages)
    if method != "decoupled":
        V.unused(behav_clip, "behav_clip", "by method='decoupled' (it truncates the behaviour weight)")
    if isinstance(eps, Tensor) and logp_new.dim() >= 2 and tuple(eps.shape) == tuple(logp_new.shape[:-1]):
        eps = eps[..., None].expand(logp_new.shape)        # one radius per response, for all its tokens
    kw = dict(mask=mask, aggregation=aggregation)
    if method == "standard":
        return ppo_clip_loss(logp_new, logp_behav, advantages, eps=eps, **kw)
    if method == "adaptive":
        return geppo_loss(logp_new, logp_prox, logp_behav, advantages, eps=eps, **kw)
    return decoupled_ppo_loss(logp_new, logp_prox, logp_behav, advantages, eps=eps, behav_clip=behav_clip, **kw)


# ----------------------------------------------------------------------------------------------
# Advantages without a critic (GRPO family) and normalisation
# ----------------------------------------------------------------------------------------------

def _groups(rewards, group_size: int, min_size: int = 1) -> tuple[Tensor, int]:
    V.float_tensor(rewards, "rewards", min_dim=1)
    G = V.int_in(group_size, "group_size", min_size)
    n = rewards.shape[-1]
    V.divisible(n, "rewards.shape[-1] (consecutive groups of group_size completions)", G, "group_size")
    return rewards.reshape(*rewards.shape[:-1], n // G, G), G


def _centred(x: Tensor, mean: Tensor, constant: Tensor) -> Tensor:
    """``x - mean``, exactly 0 where ``constant`` (all values equal): a float mean of identical
    values can miss them by an ulp, and a later division by a tiny std would blow that up."""
    return torch.where(constant, _zero(x), x - mean)


def grpo_advantages(rewards: Tensor, group_size: int, scale: str = "std",
                    eps: float = 1e-6) -> Tensor:
    r"""Group-relative advantages (GRPO, Shao et al. 2024; ``scale="none"`` is Dr. GRPO).

    For the :math:`m` completions :math:`i` of one prompt,

    .. math::  \hat A_i = \frac{r_i - \mathrm{mean}_j r_j}{\mathrm{std}_j r_j + \zeta}
               \quad(\texttt{scale="std"}), \qquad
               \hat A_i = r_i - \mathrm{mean}_j r_j \quad(\texttt{scale="none"}),

    with the sample standard deviation (``n - 1``, as in common implementations; 0 when
    ``group_size == 1``; :math:`\zeta` is ``eps``). Dividing by the std gives prompts whose answers
    are almost all right or almost all wrong (small std) a *larger* weight; Dr. GRPO drops it to remove that
    difficulty bias. A group with identical rewards gets advantages of exactly 0 either way
    (in any dtype). An empty ``rewards`` gives an empty result.

    Args:
        rewards: ``[..., N]`` scalar rewards, ``N = n_prompts * group_size``, the completions of
            each prompt consecutive.
        group_size: :math:`m \ge 1`.
        scale: ``"std"`` or ``"none"``.
        eps: :math:`\zeta > 0`, added to the std.

    Returns: ``[..., N]`` advantages (per sequence; expand over tokens yourself).

    Chapter: 07_tiny_llm.
    """
    g, G = _groups(rewards, group_size)
    V.choice(scale, "scale", ("std", "none"))
    eps = V.real_in(eps, "eps", 0.0, lo_open=True)
    adv = _centred(g, g.mean(-1, keepdim=True), (g.amax(-1, keepdim=True) == g.amin(-1, keepdim=True)))
    if scale == "std":
        std = g.std(-1, keepdim=True) if G > 1 else torch.zeros_like(adv)
        adv = adv / (std + eps)
    return adv.reshape(rewards.shape)


def rloo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    r"""REINFORCE leave-one-out advantages (Kool et al. 2019; Ahmadian et al. 2024).

    .. math::  \hat A_i = r_i - \frac{1}{m-1}\sum_{j\ne i} r_j = \frac{G}{m-1}\big(r_i - \bar r\big).

    The baseline for completion :math:`i` does not use :math:`r_i`, so it is independent of
    the action and the gradient estimate stays unbiased (GRPO's group mean includes
    :math:`r_i`, which shrinks the advantage by :math:`(m-1)/m`).

    Args:
        rewards: ``[..., N]``, consecutive groups of ``group_size``. group_size: :math:`m \ge 2`.

    Returns: ``[..., N]``.

    Chapter: 07_tiny_llm.
    """
    g, G = _groups(rewards, group_size, min_size=2)
    total = g.sum(-1, keepdim=True)
    adv = g - (total - g) / (G - 1)
    return adv.reshape(rewards.shape)


def normalize_advantages(adv: Tensor, mask: Tensor | None = None, eps: float = 1e-8) -> Tensor:
    r"""Whiten advantages over the batch: :math:`(\hat A - \mu)/(\sigma + \varepsilon)`.

    Mean and (sample, ``n - 1``) standard deviation are taken over the real entries only
    (``mask``); masked-out entries of the result are 0 (padding may hold NaN or inf). A constant
    batch gives exactly 0; an empty one an empty result. Whitening changes the effective
    learning rate and removes a constant baseline; it does not change the sign structure
    within the batch.

    Args:
        adv: ``[...]`` float tensor. mask: optional, same shape. eps: ``> 0``.

    Returns: a tensor shaped like ``adv``.

    Chapter: 02_advantage_gae.
    """
    V.float_tensor(adv, "adv", min_dim=0)
    m = V.check_mask(mask, adv, "adv")
    eps = V.real_in(eps, "eps", 0.0, lo_open=True)
    if adv.numel() == 0:
        return adv.clone()
    if m is None:
        n = adv.numel()
        mean = adv.mean()
        var = ((adv - mean) ** 2).sum() / max(n - 1, 1)
        return _centred(adv, mean, adv.amax() == adv.amin()) / (var.sqrt() + eps)
    n = m.sum()
    mean = _clean(adv, m).sum() / n.clamp(min=1.0)
    var = _clean((adv - mean) ** 2, m).sum() / (n - 1).clamp(min=1.0)
    real = m > 0
    inf = torch.tensor(math.inf, dtype=adv.dtype, device=adv.device)
    constant = torch.where(real, adv, -inf).amax() == torch.where(real, adv, inf).amin()
    return _clean(_centred(adv, mean, constant) / (var.sqrt() + eps), m)
