r"""Policy-gradient objectives, written as losses to MINIMISE.

Conventions: LLM tensors are ``[batch, tokens]`` (any leading dims work for token-level
quantities) with a ``mask`` of real tokens (bool or 0/1); log-probabilities of the sampled tokens
(``logp_*``) are ``[batch, tokens]``; advantages have the same shape (broadcast a per-sequence
advantage yourself with ``adv[:, None].expand_as(logp)``, rlkit never broadcasts silently).
Advantages and all ``logp`` except ``logp_new`` are treated as constants (detached).
Ratios are formed in log space and exponentiated at the last moment.

Contents

* :func:`aggregate` - ``token-mean``, ``seq-mean-token-mean``, ``seq-mean-token-sum-norm``.
* :func:`policy_gradient_loss` - REINFORCE / advantage actor-critic surrogate.
* :func:`ppo_clip_loss` - PPO-clip with asymmetric (clip-higher) and dual clipping.
* :class:`AdaptiveKLController` - the PPO-penalty coefficient: PPO paper, proportional
  (Ziegler et al. 2019) and the article's rule.
* :func:`geppo_loss` - clip around the previous ratio (method 1, GePPO style).
* :func:`decoupled_ppo_loss` - clip the ratio to the proximal policy, correct for the behaviour
  policy outside the clip (method 2, Hilton et al. 2022).
* :func:`grpo_advantages`, :func:`rloo_advantages`, :func:`normalize_advantages`.

Chapters: 01_policy_gradient, 04_kl_trpo_ppo, 07_tiny_llm, 12_clipping_staleness.
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch

from . import _validate as V

Tensor = torch.Tensor

__all__ = [
    "AGGREGATIONS",
    "aggregate",
    "policy_gradient_loss",
    "ppo_clip_loss",
    "AdaptiveKLController",
    "geppo_loss",
    "decoupled_ppo_loss",
    "grpo_advantages",
    "rloo_advantages",
    "normalize_advantages",
]

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


# ----------------------------------------------------------------------------------------------
# Aggregation
# ----------------------------------------------------------------------------------------------

def aggregate(loss_per_token: Tensor, mask: Optional[Tensor] = None, mode: str = "token-mean",
              max_len: Optional[int] = None) -> Tensor:
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
      the batch). Every token has the same constant weight, independent of its response's length
      and of the batch's token count.

    Sequences with no real token are left out of the sequence mean (and an all-zero mask gives a
    loss of 0, not NaN).

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
    if max_len is not None:
        if mode != "seq-mean-token-sum-norm":
            raise ValueError("max_len is only used by mode='seq-mean-token-sum-norm'")
        max_len = V.positive_int(max_len, "max_len")
    if mode == "token-mean":
        if m is None:
            return x.mean()
        return x.sum() / m.sum().clamp(min=1.0)
    T = x.shape[-1]
    n_seq_shape = x.shape[:-1]
    if mode == "seq-mean-token-mean":
        if m is None:
            return x.mean()
        count = m.sum(-1)
        per_seq = x.sum(-1) / count.clamp(min=1.0)
        n_seq = (count > 0).to(x.dtype).sum().clamp(min=1.0)
        return per_seq.sum() / n_seq
    # seq-mean-token-sum-norm
    L = T if max_len is None else max_len
    n_seq = max(1, math.prod(n_seq_shape))
    return x.sum() / (n_seq * L)


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------

def _check_logp(x, name: str, ref: Optional[Tensor] = None, ref_name: str = "logp_new") -> Tensor:
    V.float_tensor(x, name, min_dim=1)
    if ref is not None:
        V.same_layout(ref, ref_name, x, name)
    return x


def _zero(x: Tensor) -> Tensor:
    return torch.zeros((), dtype=x.dtype, device=x.device)


def _clean(x: Tensor, m: Optional[Tensor]) -> Tensor:
    """Zero the padding (so that garbage there cannot give NaN values or gradients)."""
    return x if m is None else torch.where(m > 0, x, _zero(x))


def _masked_mean(x: Tensor, m: Optional[Tensor]) -> Tensor:
    if m is None:
        return x.mean()
    return _clean(x, m).sum() / m.sum().clamp(min=1.0)


def _k3_from_log_ratio(log_ratio: Tensor) -> Tensor:
    # KL(pi_old || pi_new) estimated with samples from pi_old: exp(l) - 1 - l, l = log(new/old)
    return torch.expm1(log_ratio) - log_ratio


# ----------------------------------------------------------------------------------------------
# Losses
# ----------------------------------------------------------------------------------------------

def policy_gradient_loss(logp: Tensor, advantages: Tensor, mask: Optional[Tensor] = None,
                         aggregation: str = "token-mean") -> Tensor:
    r"""The score-function surrogate :math:`L = -\,\mathrm{agg}\big(\hat A_{i,t}\,\log\pi_\theta(a_{i,t}\mid s_{i,t})\big)`.

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
    _check_logp(logp, "logp")
    _check_logp(advantages, "advantages", logp, "logp")
    V.choice(aggregation, "aggregation", AGGREGATIONS)
    m = V.check_mask(mask, logp, "logp")
    return aggregate(-_clean(advantages.detach(), m) * _clean(logp, m), mask, aggregation)


def ppo_clip_loss(logp_new: Tensor, logp_old: Tensor, advantages: Tensor, eps: float = 0.2,
                  eps_high: Optional[float] = None, dual_clip: Optional[float] = None,
                  mask: Optional[Tensor] = None, aggregation: str = "token-mean"
                  ) -> Tuple[Tensor, Dict[str, Tensor]]:
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
        eps, eps_high: clip radii, ``eps`` in ``(0, 1)``, ``eps_high > 0``.
        dual_clip: ``None`` or a float ``> 1``.
        mask, aggregation: see :func:`aggregate`.

    Returns: ``(loss, stats)``; ``stats`` holds detached 0-dim tensors (masked token means):
    ``clip_fraction`` (tokens whose gradient the clip zeroes), ``dual_clip_fraction``,
    ``approx_kl`` (k3 estimate of KL(pi_old || pi_new) from the old policy's samples),
    ``approx_kl_k1`` and ``ratio_mean``.

    Finite for log-ratios up to about +-80 in float32 (tested at +-50).

    Chapter: 04_kl_trpo_ppo; dual clip and clip-higher in 12_clipping_staleness.
    """
    _check_logp(logp_new, "logp_new")
    _check_logp(logp_old, "logp_old", logp_new)
    _check_logp(advantages, "advantages", logp_new)
    eps = V.finite_float(eps, "eps", 0.0, 1.0, lo_open=True)
    eps_high = eps if eps_high is None else V.finite_float(eps_high, "eps_high", 0.0, lo_open=True)
    if dual_clip is not None:
        dual_clip = V.finite_float(dual_clip, "dual_clip", 1.0, lo_open=True)
    m = V.check_mask(mask, logp_new, "logp_new")
    V.choice(aggregation, "aggregation", AGGREGATIONS)

    adv = _clean(advantages.detach(), m)
    log_ratio = _clean(logp_new - logp_old.detach(), m)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - eps, 1.0 + eps_high)
    loss_tok = torch.maximum(loss_unclipped, loss_clipped)
    clipped = loss_clipped > loss_unclipped
    if dual_clip is not None:
        cap = -dual_clip * adv
        dual = (adv < 0) & (loss_tok > cap)
        loss_tok = torch.where(dual, cap, loss_tok)
    loss = aggregate(loss_tok, mask, aggregation)

    with torch.no_grad():
        f = lambda z: _masked_mean(z.to(log_ratio.dtype), m)
        stats = {
            "clip_fraction": f(clipped),
            "dual_clip_fraction": f(dual) if dual_clip is not None else _zero(log_ratio),
            "approx_kl": f(_k3_from_log_ratio(log_ratio)),
            "approx_kl_k1": f(-log_ratio),
            "ratio_mean": f(ratio),
        }
    return loss, stats


def geppo_loss(logp_new: Tensor, logp_prox: Tensor, logp_behav: Tensor, advantages: Tensor,
               eps: float = 0.2, mask: Optional[Tensor] = None, aggregation: str = "token-mean"
               ) -> Tuple[Tensor, Dict[str, Tensor]]:
    r"""Clipping around the previous ratio (method 1 of Part II, GePPO style; Queeney et al. 2021).

    The data come from a behaviour policy :math:`\mu` (an old policy version, possibly different
    per sample); :math:`\pi_k` is the policy at the start of this update (the *proximal*
    policy). With :math:`\rho_{k+1} = \pi_\theta/\mu` and :math:`\rho_k = \pi_k/\mu`,

    .. math::  \ell = -\min\big(\rho_{k+1}\hat A,\ \mathrm{clip}(\rho_{k+1},\ \rho_k-\epsilon,\ \rho_k+\epsilon)\,\hat A\big).

    The clip window is centred on where the ratio already is, not on 1, so a stale sample
    (:math:`\rho_k` far from 1) still gets a window of width :math:`2\epsilon` to move in, and
    the clip controls exactly the update shift :math:`U_k = \tfrac12\mathbb E|\rho_{k+1}-\rho_k|`
    of Lemma 5.1. With :math:`\mu = \pi_k` (on-policy data) it is standard PPO-clip.

    Args:
        logp_new: ``[B, T]`` log-probs under :math:`\pi_\theta` (with grad).
        logp_prox: ``[B, T]`` log-probs under :math:`\pi_k` (detached).
        logp_behav: ``[B, T]`` log-probs under the behaviour policy :math:`\mu` (detached).
        advantages: ``[B, T]`` advantage estimates for the behaviour data (detached).
        eps: clip radius ``> 0``.
        mask, aggregation: see :func:`aggregate`.

    Returns: ``(loss, stats)`` with ``clip_fraction``, ``update_shift`` (:math:`U_k` estimate,
    :math:`\tfrac12` masked mean of :math:`|\rho_{k+1}-\rho_k|`), ``staleness``
    (masked mean of :math:`|\rho_k - 1|`) and ``approx_kl`` (k3 of :math:`\log\pi_\theta/\pi_k`).

    Chapter: 12_clipping_staleness.
    """
    _check_logp(logp_new, "logp_new")
    _check_logp(logp_prox, "logp_prox", logp_new)
    _check_logp(logp_behav, "logp_behav", logp_new)
    _check_logp(advantages, "advantages", logp_new)
    eps = V.finite_float(eps, "eps", 0.0, lo_open=True)
    m = V.check_mask(mask, logp_new, "logp_new")
    V.choice(aggregation, "aggregation", AGGREGATIONS)

    adv = _clean(advantages.detach(), m)
    lb = logp_behav.detach()
    rho_new = torch.exp(_clean(logp_new - lb, m))
    rho_k = torch.exp(_clean(logp_prox.detach() - lb, m))
    loss_unclipped = -adv * rho_new
    loss_clipped = -adv * torch.clamp(rho_new, rho_k - eps, rho_k + eps)
    loss_tok = torch.maximum(loss_unclipped, loss_clipped)
    loss = aggregate(loss_tok, mask, aggregation)
    with torch.no_grad():
        lr = _clean(logp_new - logp_prox, m)
        f = lambda z: _masked_mean(z.to(lr.dtype), m)
        stats = {
            "clip_fraction": f(loss_clipped > loss_unclipped),
            "update_shift": 0.5 * f((rho_new - rho_k).abs()),
            "staleness": f((rho_k - 1.0).abs()),
            "approx_kl": f(_k3_from_log_ratio(lr)),
        }
    return loss, stats


def decoupled_ppo_loss(logp_new: Tensor, logp_prox: Tensor, logp_behav: Tensor,
                       advantages: Tensor, eps: float = 0.2,
                       behav_clip: Optional[float] = None, mask: Optional[Tensor] = None,
                       aggregation: str = "token-mean") -> Tuple[Tensor, Dict[str, Tensor]]:
    r"""Decoupled PPO (method 2 of Part II; Hilton, Cobbe and Schulman, 2022).

    The clip acts on the incremental ratio :math:`r = \pi_\theta/\pi_{\text{prox}}` and the
    behaviour correction :math:`w = \pi_{\text{prox}}/\mu` multiplies outside the clip:

    .. math::  \ell = -\,\bar w\,\min\big(r\hat A,\ \mathrm{clip}(r, 1-\epsilon, 1+\epsilon)\,\hat A\big),
               \qquad \bar w = \min(w, \bar c) \text{ (if ``behav_clip`` } = \bar c\text{)},

    with :math:`w` detached. Since :math:`w \ge 0` this is PPO-clip with the advantage
    :math:`\hat A' = w\hat A` (the article's :math:`\hat A = \rho_k A`). Without truncation the
    unclipped gradient equals that of :math:`(\pi_\theta/\mu)\hat A`, the importance-sampled
    policy gradient; the clip keeps the *update* small whatever the staleness, and the clip
    centre does not depend on the family of old policies. Truncating :math:`w` (like V-trace's
    :math:`\bar\rho`) trades a bias for bounded variance.

    Args:
        logp_new: ``[B, T]`` log-probs under :math:`\pi_\theta` (with grad).
        logp_prox: ``[B, T]`` log-probs under the proximal policy :math:`\pi_k` (detached).
        logp_behav: ``[B, T]`` log-probs under the behaviour policy :math:`\mu` (detached).
        advantages: ``[B, T]`` (detached).
        eps: clip radius in ``(0, 1)``.
        behav_clip: ``None`` or a float ``> 0`` truncating :math:`w`.
        mask, aggregation: see :func:`aggregate`.

    Returns: ``(loss, stats)`` with ``clip_fraction``, ``behav_weight_mean`` (:math:`\bar w`),
    ``behav_truncated_fraction``, ``update_shift`` (:math:`\tfrac12` masked mean of
    :math:`|\pi_\theta/\mu - \pi_k/\mu|`) and ``approx_kl`` (k3 of :math:`\log r`).

    Chapter: 12_clipping_staleness.
    """
    _check_logp(logp_new, "logp_new")
    _check_logp(logp_prox, "logp_prox", logp_new)
    _check_logp(logp_behav, "logp_behav", logp_new)
    _check_logp(advantages, "advantages", logp_new)
    eps = V.finite_float(eps, "eps", 0.0, 1.0, lo_open=True)
    if behav_clip is not None:
        behav_clip = V.finite_float(behav_clip, "behav_clip", 0.0, lo_open=True)
    m = V.check_mask(mask, logp_new, "logp_new")
    V.choice(aggregation, "aggregation", AGGREGATIONS)

    adv = _clean(advantages.detach(), m)
    lprox = logp_prox.detach()
    log_w = _clean(lprox - logp_behav.detach(), m)
    w = torch.exp(log_w)
    w_bar = w if behav_clip is None else w.clamp(max=behav_clip)
    log_r = _clean(logp_new - lprox, m)
    r = torch.exp(log_r)
    loss_unclipped = -adv * r
    loss_clipped = -adv * r.clamp(1.0 - eps, 1.0 + eps)
    loss_tok = w_bar * torch.maximum(loss_unclipped, loss_clipped)
    loss = aggregate(loss_tok, mask, aggregation)
    with torch.no_grad():
        f = lambda z: _masked_mean(z.to(log_r.dtype), m)
        stats = {
            "clip_fraction": f(loss_clipped > loss_unclipped),
            "behav_weight_mean": f(w_bar),
            "behav_truncated_fraction": f(w > behav_clip) if behav_clip is not None
            else _zero(log_r),
            "update_shift": 0.5 * f((w * (r - 1.0)).abs()),
            "approx_kl": f(_k3_from_log_ratio(log_r)),
        }
    return loss, stats


# ----------------------------------------------------------------------------------------------
# KL penalty coefficient
# ----------------------------------------------------------------------------------------------

class AdaptiveKLController:
    r"""Adapts the KL-penalty coefficient :math:`\beta` of PPO-penalty / RLHF toward a KL target.

    Three named rules, so that the book can compare them:

    * ``"ppo"`` (Schulman et al. 2017, sec. 4): after each update with measured KL :math:`d`,
      :math:`\beta \leftarrow 2\beta` if :math:`d > 1.5\,d_{\text{targ}}`, and
      :math:`\beta \leftarrow \beta/2` if :math:`d < d_{\text{targ}}/1.5`. The dead band
      :math:`[d_{\text{targ}}/1.5,\ 1.5\,d_{\text{targ}}]` is symmetric in log scale
      (factor 1.5 each way), so beta does not drift when KL sits near the target.
    * ``"article"``: the same doubling, but halving only when :math:`d < 0.5\,d_{\text{targ}}`.
      The dead band :math:`[0.5, 1.5]\,d_{\text{targ}}` reaches further down (factor 2 below,
      1.5 above), so beta is relaxed later and the policy is held tighter on average.
    * ``"proportional"`` (Ziegler et al. 2019): a smooth proportional controller in log space,
      :math:`e = \mathrm{clip}(d/d_{\text{targ}} - 1, -0.2, 0.2)`,
      :math:`\beta \leftarrow \beta\,(1 + K_\beta\, e\, n_{\text{steps}}/H)`. Each update moves
      beta by at most :math:`0.2 K_\beta n/H` (relative), with no dead band: it never jumps by
      2x, and it keeps nudging beta until KL sits on the target. (With ``k_beta=1`` and
      ``horizon=10000``, ``n_steps`` = samples per batch, this is TRL's implementation;
      the defaults ``k_beta=0.1, horizon=1, n_steps=1`` are the paper's per-update form.)

    Args:
        init_beta: initial coefficient ``> 0``.
        target: KL target ``> 0``.
        rule: ``"ppo"``, ``"article"`` or ``"proportional"``.
        k_beta, horizon: the proportional rule's gain and horizon (``> 0``).

    Use: ``beta = ctl.update(measured_kl, n_steps)`` after each policy update; ``ctl.beta``.

    Chapter: 04_kl_trpo_ppo.
    """

    RULES = ("ppo", "article", "proportional")

    def __init__(self, init_beta: float = 1.0, target: float = 0.01, rule: str = "ppo",
                 k_beta: float = 0.1, horizon: float = 1.0):
        self.beta = V.finite_float(init_beta, "init_beta", 0.0, lo_open=True)
        self.target = V.finite_float(target, "target", 0.0, lo_open=True)
        self.rule = V.choice(rule, "rule", self.RULES)
        self.k_beta = V.finite_float(k_beta, "k_beta", 0.0, lo_open=True)
        self.horizon = V.finite_float(horizon, "horizon", 0.0, lo_open=True)

    def update(self, kl, n_steps: int = 1) -> float:
        """Update beta from the measured KL (a number or 0-dim tensor); returns the new beta."""
        kl = V.finite_float(kl, "kl")
        n_steps = V.positive_int(n_steps, "n_steps")
        if self.rule == "proportional":
            err = min(max(kl / self.target - 1.0, -0.2), 0.2)
            self.beta *= 1.0 + self.k_beta * err * n_steps / self.horizon
        else:
            low = self.target / 1.5 if self.rule == "ppo" else 0.5 * self.target
            if kl > 1.5 * self.target:
                self.beta *= 2.0
            elif kl < low:
                self.beta /= 2.0
        return self.beta

    def __repr__(self) -> str:
        return (f"AdaptiveKLController(beta={self.beta:.4g}, target={self.target:.4g}, "
                f"rule={self.rule!r})")


# ----------------------------------------------------------------------------------------------
# Advantages without a critic (GRPO family) and normalisation
# ----------------------------------------------------------------------------------------------

def _groups(rewards, group_size: int, min_size: int = 1) -> Tuple[Tensor, int]:
    V.float_tensor(rewards, "rewards", min_dim=1)
    G = V.positive_int(group_size, "group_size", minimum=min_size)
    n = rewards.shape[-1]
    if n % G != 0:
        raise ValueError(f"rewards.shape[-1] = {n} is not a multiple of group_size = {G}; the "
                         f"last dim must hold consecutive groups of group_size completions")
    return rewards.reshape(*rewards.shape[:-1], n // G, G), G


def grpo_advantages(rewards: Tensor, group_size: int, scale: str = "std",
                    eps: float = 1e-6) -> Tensor:
    r"""Group-relative advantages (GRPO, Shao et al. 2024; ``scale="none"`` is Dr. GRPO).

    For the :math:`G` completions :math:`i` of one prompt,

    .. math::  \hat A_i = \frac{R_i - \mathrm{mean}_j R_j}{\mathrm{std}_j R_j + \varepsilon}
               \quad(\texttt{scale="std"}), \qquad
               \hat A_i = R_i - \mathrm{mean}_j R_j \quad(\texttt{scale="none"}),

    with the sample standard deviation (``n - 1``, as in common implementations; 0 when
    ``group_size == 1``). Dividing by the std gives prompts whose answers are almost all right
    or almost all wrong (small std) a *larger* weight; Dr. GRPO drops it to remove that
    difficulty bias. A group with identical rewards gets zero advantages either way.

    Args:
        rewards: ``[..., N]`` scalar rewards, ``N = n_prompts * group_size``, the completions of
            each prompt consecutive.
        group_size: ``G >= 1``.
        scale: ``"std"`` or ``"none"``.
        eps: ``> 0``, added to the std.

    Returns: ``[..., N]`` advantages (per sequence; expand over tokens yourself).

    Chapter: 07_tiny_llm.
    """
    g, G = _groups(rewards, group_size)
    V.choice(scale, "scale", ("std", "none"))
    eps = V.finite_float(eps, "eps", 0.0, lo_open=True)
    adv = g - g.mean(-1, keepdim=True)
    if scale == "std":
        std = g.std(-1, keepdim=True) if G > 1 else torch.zeros_like(adv)
        adv = adv / (std + eps)
    return adv.reshape(rewards.shape)


def rloo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    r"""REINFORCE leave-one-out advantages (Kool et al. 2019; Ahmadian et al. 2024).

    .. math::  \hat A_i = R_i - \frac{1}{G-1}\sum_{j\ne i} R_j = \frac{G}{G-1}\big(R_i - \bar R\big).

    The baseline for completion :math:`i` does not use :math:`R_i`, so it is independent of
    the action and the gradient estimate stays unbiased (GRPO's group mean includes
    :math:`R_i`, which shrinks the advantage by :math:`(G-1)/G`).

    Args:
        rewards: ``[..., N]``, consecutive groups of ``group_size``. group_size: ``G >= 2``.

    Returns: ``[..., N]``.

    Chapter: 07_tiny_llm.
    """
    g, G = _groups(rewards, group_size, min_size=2)
    total = g.sum(-1, keepdim=True)
    adv = g - (total - g) / (G - 1)
    return adv.reshape(rewards.shape)


def normalize_advantages(adv: Tensor, mask: Optional[Tensor] = None, eps: float = 1e-8) -> Tensor:
    r"""Whiten advantages over the batch: :math:`(\hat A - \mu)/(\sigma + \varepsilon)`.

    Mean and (sample, ``n - 1``) standard deviation are taken over the real entries only
    (``mask``); masked-out entries of the result are 0. Whitening changes the effective
    learning rate and removes a constant baseline; it does not change the sign structure
    within the batch.

    Args:
        adv: ``[...]`` float tensor. mask: optional, same shape. eps: ``> 0``.

    Returns: a tensor shaped like ``adv``.

    Chapter: 02_advantage_gae.
    """
    V.float_tensor(adv, "adv", min_dim=0)
    m = V.check_mask(mask, adv, "adv")
    eps = V.finite_float(eps, "eps", 0.0, lo_open=True)
    if m is None:
        n = adv.numel()
        mean = adv.mean()
        var = ((adv - mean) ** 2).sum() / max(n - 1, 1)
        return (adv - mean) / (var.sqrt() + eps)
    n = m.sum()
    mean = _clean(adv, m).sum() / n.clamp(min=1.0)
    var = _clean((adv - mean) ** 2, m).sum() / (n - 1).clamp(min=1.0)
    return _clean((adv - mean) / (var.sqrt() + eps), m)
