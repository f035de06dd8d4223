r"""KL estimators from samples, and exact divergences between categorical distributions.

Sample-based estimators (Schulman, "Approximating KL divergence", 2020). For samples
:math:`x \sim p` and the log-ratio :math:`\ell = \log q(x) - \log p(x)`:

=========  ==========================================  ==========  ===================
estimator  per-sample value                            unbiased?   sign
=========  ==========================================  ==========  ===================
k1         :math:`-\ell`                               yes         can be negative
k2         :math:`\tfrac12 \ell^2`                     no          >= 0
k3         :math:`e^{\ell} - 1 - \ell`                 yes         >= 0 (always)
=========  ==========================================  ==========  ===================

k3 is unbiased because :math:`\mathbb E_p[e^\ell] = \mathbb E_p[q/p] = 1`, and non-negative because
:math:`e^\ell \ge 1 + \ell`. Its bias-free, low-variance behaviour near :math:`p \approx q` is why
GRPO uses it for the penalty to the reference model.

Exact versions for categorical distributions given by logits along the last dimension:
:func:`kl_categorical`, :func:`tv_categorical`, :func:`entropy_categorical`. Zero-probability
entries (``-inf`` logits, e.g. a masked vocabulary) are handled without NaN.

Chapter: 04_kl_trpo_ppo (KL, its estimators and why KL rather than cross-entropy), 07_tiny_llm
(the k3 penalty to the reference model), Part II (TV distance).
"""
from __future__ import annotations

import torch

from . import _validate as V
from .offpolicy import max_log_ratio

Tensor = torch.Tensor

__all__ = ["kl_k1", "kl_k2", "kl_k3", "kl_categorical", "tv_categorical", "entropy_categorical"]


def kl_k1(logp: Tensor, logq: Tensor) -> Tensor:
    r"""k1 estimator of KL(p || q): :math:`k_1 = \log p(x) - \log q(x)`, :math:`x \sim p`.

    Unbiased, high variance, negative for some samples.

    Args:
        logp: ``[...]`` log-probabilities of the samples under p (the sampling distribution).
        logq: ``[...]`` log-probabilities of the same samples under q.

    Returns:
        ``[...]`` per-sample estimates (average them yourself, e.g. with a mask).

    Chapter: 04_kl_trpo_ppo.
    """
    V.matching_floats(min_dim=0, logp=logp, logq=logq)
    return logp - logq


def kl_k2(logp: Tensor, logq: Tensor) -> Tensor:
    r"""k2 estimator of KL(p || q): :math:`k_2 = \tfrac12(\log q(x) - \log p(x))^2`, :math:`x \sim p`.

    Non-negative, biased: its mean :math:`\mathbb E_p[\tfrac12(\log q - \log p)^2]` agrees with KL
    to second order as q -> p, but it is not an f-divergence (:math:`f(t) = \tfrac12(\log t)^2` is
    not convex for :math:`t > e`). With the samples held fixed its gradient is
    :math:`(\log p - \log q)\,\nabla_\theta \log p`, whose mean under p is exactly
    :math:`\nabla_\theta \mathrm{KL}(p_\theta\,\|\,q)`: as a *loss*, k2 gives the right gradient
    even though as a *value* it is biased.

    Shapes as in :func:`kl_k1`. Chapter: 04_kl_trpo_ppo.
    """
    V.matching_floats(min_dim=0, logp=logp, logq=logq)
    ell = logq - logp
    return 0.5 * ell * ell


def kl_k3(logp: Tensor, logq: Tensor) -> Tensor:
    r"""k3 estimator of KL(p || q): :math:`k_3 = e^{\ell} - 1 - \ell`, :math:`\ell = \log q(x) - \log p(x)`.

    Unbiased and always :math:`\ge 0`. In GRPO, ``logp`` is the policy being trained (it
    generated the samples) and ``logq`` the reference model. Computed as ``expm1(l) - l``
    (accurate for small :math:`\ell`), with :math:`\ell` capped where :math:`e^{\ell}` would
    overflow the dtype: above :math:`\ell_{\max}` = 87.7 in float32 and bfloat16 (10.1 in
    float16, the range over which float16 works) the value stays at its value there and the
    gradient is 0, so values and gradients are finite for every finite input.

    Args:
        logp: ``[...]`` log-probabilities of the samples under p (the sampling distribution).
        logq: ``[...]`` log-probabilities of the same samples under q.

    Returns:
        ``[...]`` per-sample estimates.

    Chapter: 04_kl_trpo_ppo, 07_tiny_llm.
    """
    V.matching_floats(min_dim=0, logp=logp, logq=logq)
    ell = (logq - logp).clamp(max=max_log_ratio(logp.dtype))
    return torch.expm1(ell) - ell


def kl_categorical(logits_p: Tensor, logits_q: Tensor) -> Tensor:
    r"""Exact KL(p || q) between categorical distributions given by logits on the last dim.

    .. math::  \mathrm{KL}(p\,\|\,q) = \sum_a p(a)\,\big(\log p(a) - \log q(a)\big),

    with terms where :math:`p(a) = 0` taken as 0 (no NaN from ``-inf`` logits, in values or
    gradients). It is ``+inf`` when q gives zero probability to an action p can take.

    Args:
        logits_p, logits_q: ``[..., A]`` unnormalised log-probabilities (same shape), at least
            one category.

    Returns:
        ``[...]``.

    Chapter: 04_kl_trpo_ppo.
    """
    V.matching_floats(logits_p=logits_p, logits_q=logits_q)
    V.has_categories(logits_p, "logits_p")
    lp, lq = torch.log_softmax(logits_p, dim=-1), torch.log_softmax(logits_q, dim=-1)
    p = lp.exp()
    diff = torch.where(p > 0, lp - lq, torch.zeros((), dtype=lp.dtype, device=lp.device))
    # KL >= 0 (Gibbs); rounding can leave about -1e-9 when p and q nearly agree
    return (p * diff).sum(-1).clamp_min(0.0)


def tv_categorical(logits_p: Tensor, logits_q: Tensor) -> Tensor:
    r"""Exact total-variation distance :math:`\tfrac12 \sum_a |p(a) - q(a)|` along the last dim.

    Args:
        logits_p, logits_q: ``[..., A]`` logits, at least one category.

    Returns:
        ``[...]``, values in ``[0, 1]``.

    Chapter: Part II (the performance-difference bounds are stated in TV; lemma lem-ch11-ratio writes it as
    half the expected absolute ratio difference).
    """
    V.matching_floats(logits_p=logits_p, logits_q=logits_q)
    V.has_categories(logits_p, "logits_p")
    lp, lq = torch.log_softmax(logits_p, dim=-1), torch.log_softmax(logits_q, dim=-1)
    return 0.5 * (lp.exp() - lq.exp()).abs().sum(-1)


def entropy_categorical(logits: Tensor) -> Tensor:
    r"""Exact entropy :math:`H(p) = -\sum_a p(a) \log p(a)` along the last dim (0 log 0 = 0).

    Args:
        logits: ``[..., A]``, at least one category.

    Returns:
        ``[...]``.

    Chapter: 04_kl_trpo_ppo (entropy, KL and the learning rate as one system).
    """
    V.has_categories(logits, "logits")
    lp = torch.log_softmax(logits, dim=-1)
    p = lp.exp()
    safe = torch.where(p > 0, lp, torch.zeros((), dtype=lp.dtype, device=lp.device))
    return -(p * safe).sum(-1)
