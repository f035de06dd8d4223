r"""Offline RL from logged data, and off-policy evaluation (OPE): the generic tensor math.

Chapter: 21_offline_rl_ope.

A log is a set of tuples :math:`(x_i, y_i, \log\mu(y_i\mid x_i), r_i)` written by a behaviour policy
:math:`\mu` that we can no longer query. Two questions are asked of it.

**Learning from it.** Every method here is a *weighted* maximum likelihood on logged actions, or a
value fit that keeps off actions the log never took:

* :func:`awr_weights`, the advantage-weighted regression / AWAC weight
  :math:`\min(e^{A/\beta}, w_{\max})` of a logged action (the closed-form maximiser of
  :math:`\mathbb E_\pi[A] - \beta\,\mathrm{KL}(\pi\|\mu)` is :math:`\mu\,e^{A/\beta}/Z`);
* :func:`expectile_loss`, IQL's asymmetric square :math:`|\kappa - \mathbf 1[u<0]|\,u^2`, whose
  minimiser is the :math:`\kappa`-expectile (an upper one for :math:`\kappa > 1/2`);
* :func:`cql_penalty`, CQL's :math:`\log\sum_a e^{Q(s,a)} - Q(s,a_{\mathcal D})`, exact over a
  finite action set (a vocabulary).

**Evaluating a new policy** :math:`\pi` with it, without running :math:`\pi` in the world
(sequence ratio :math:`\rho_i = \pi(y_i\mid x_i)/\mu(y_i\mid x_i)`, reward model :math:`\hat r`,
its value under the target :math:`\hat v^\pi(x) = \mathbb E_{y\sim\pi}\hat r(x, y)`):

* :func:`ope_is` (importance sampling), :func:`ope_wis` (self-normalised), :func:`ope_dm` (direct
  method) and :func:`ope_dr` (doubly robust); :func:`sequence_log_ratios` sums per-token
  log-ratios into :math:`\log\rho_i`.

Everything works on log-ratios and takes exponentials at the last moment, so sequence log-ratios
of :math:`\pm 500` give finite answers.
"""
from __future__ import annotations

import math

import torch

from . import _validate as V

Tensor = torch.Tensor

__all__ = ["expectile_loss", "awr_weights", "cql_penalty", "sequence_log_ratios", "ope_is", "ope_wis",
           "ope_dm", "ope_dr"]


def _masked_mean(x: Tensor, m: Tensor | None) -> Tensor:
    if m is None:
        return x.mean() if x.numel() else x.new_zeros(())
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    return torch.where(m, x, zero).sum() / m.sum().clamp_min(1).to(x.dtype)


def expectile_loss(diff: Tensor, kappa: float = 0.7, mask: Tensor | None = None) -> Tensor:
    r"""IQL's expectile regression loss, averaged over the real entries.

    .. math::  L_\kappa(u) = \big|\kappa - \mathbf 1[u < 0]\big|\,u^2, \qquad u = \mathrm{target} - \mathrm{prediction},

    so a prediction below its target (:math:`u > 0`) costs :math:`\kappa` and one above costs
    :math:`1-\kappa`. The constant minimising :math:`\mathbb E\,L_\kappa(X - v)` is the
    :math:`\kappa`-expectile of :math:`X`: the mean for :math:`\kappa = 1/2`, tending to
    :math:`\max X` as :math:`\kappa \to 1`. IQL fits :math:`V(s)` to :math:`Q(s, a_{\mathcal D})`
    this way with :math:`\kappa = 0.7` (eq. ``eq-ch21-expectile``).

    Args:
        diff: ``[...]`` floating tensor :math:`u` (the gradient flows into it).
        kappa: the expectile level :math:`\kappa \in (0, 1)`.
        mask: optional bool / 0-1 tensor of ``diff``'s shape; padding may hold anything, even NaN.

    Returns: a 0-dim tensor; 0 for an empty tensor or an all-false mask.

    Chapter: 21_offline_rl_ope.
    """
    V.float_tensor(diff, "diff", min_dim=0)
    kappa = V.real_in(kappa, "kappa", 0.0, 1.0, lo_open=True, hi_open=True)
    m = V.check_mask(mask, diff, "diff", as_bool=True)
    zero = torch.zeros((), dtype=diff.dtype, device=diff.device)
    u = diff if m is None else torch.where(m, diff, zero)
    w = torch.where(u < 0, torch.full((), 1.0 - kappa, dtype=u.dtype, device=u.device),
                    torch.full((), kappa, dtype=u.dtype, device=u.device))
    return _masked_mean(w * u * u, m)


def awr_weights(advantages: Tensor, beta: float = 1.0, max_weight: float = 100.0,
                mask: Tensor | None = None) -> Tensor:
    r"""Advantage weights of AWR / AWAC / IQL's policy extraction, clipped above.

    .. math::  w = \min\big(e^{A/\beta},\ w_{\max}\big),

    the weight of a logged action in :math:`\max_\theta \mathbb E_{\mathcal D}[w\,\log\pi_\theta(a\mid s)]`.
    It is the tilt of the KL-regularised optimum :math:`\pi^\star \propto \mu\, e^{A/\beta}` (eq.
    ``eq-ch21-awr``) without its per-state normaliser :math:`Z(s) = \mathbb E_\mu[e^{A/\beta}]`, which the
    exact projection onto a policy divides by; dropping it, as AWR and AWAC do, is exact only when
    :math:`Z` is the same in every state. :math:`\beta` is the coefficient of the implicit KL to the
    behaviour policy (IQL writes :math:`e^{\beta_{\rm IQL} A}` with :math:`\beta_{\rm IQL} = 1/\beta`; CORL clips at
    :math:`w_{\max} = 100`). :math:`\beta \to \infty` gives behaviour cloning (all weights 1), small
    :math:`\beta` keeps only the best logged actions. The weight is computed as
    ``exp(min(A / beta, log w_max, L))`` with :math:`L` just below the log of the dtype's largest finite
    number (88.72 in float32, 709.78 in float64), so it never overflows, even with ``max_weight=inf``
    or a ``max_weight`` beyond the dtype's range: there the weights saturate at about ``finfo.max``.

    Args:
        advantages: ``[...]`` floating tensor :math:`A` (treated as a constant: no gradient).
        beta: the temperature :math:`\beta > 0`.
        max_weight: :math:`w_{\max} > 0`, or ``math.inf`` for no clip but the dtype's range.
        mask: optional bool / 0-1 tensor of ``advantages``' shape; masked entries get weight 0.

    Returns: ``[...]`` weights, detached, finite.

    Chapter: 21_offline_rl_ope.
    """
    V.float_tensor(advantages, "advantages", min_dim=0)
    beta = V.real_in(beta, "beta", 0.0, lo_open=True)
    max_weight = V.real_in(max_weight, "max_weight", 0.0, lo_open=True, allow_inf=True)
    m = V.check_mask(mask, advantages, "advantages", as_bool=True)
    a = advantages.detach()
    zero = torch.zeros((), dtype=a.dtype, device=a.device)
    if m is not None:
        a = torch.where(m, a, zero)
    V.tensor_in(a, "advantages (at real entries)")
    info = torch.finfo(a.dtype)
    top = math.log(info.max) * (1.0 - 4.0 * info.eps)                  # its exp is finite once rounded to the dtype
    w = torch.exp(torch.clamp(a / beta, max=min(math.log(max_weight), top)))
    return w if m is None else torch.where(m, w, zero)


def cql_penalty(q_values: Tensor, actions: Tensor, mask: Tensor | None = None, temperature: float = 1.0) -> Tensor:
    r"""CQL's conservative penalty over a finite action set (a vocabulary), averaged over states.

    .. math::  \mathcal R_{\rm CQL}(s) = T\log\sum_{a\in\mathcal A} e^{Q(s,a)/T} \;-\; Q(s, a_{\mathcal D}),

    added as :math:`\alpha_{\rm CQL}\,\hat{\mathbb E}_{\mathcal D}[\mathcal R_{\rm CQL}]` to the critic's TD loss
    (eq. ``eq-ch21-cql``). Its gradient pushes :math:`Q` down on every action in proportion to
    :math:`\mathrm{softmax}(Q/T)` and up on the logged one, so actions the log never took cannot
    keep high values. Over tokens the log-sum-exp is exact: no sampled actions. The penalty is
    :math:`\ge 0` (the soft maximum is at least any one term) and, with :math:`T = 1`, it is exactly
    the cross-entropy of :math:`\mathrm{softmax}(Q)` on the logged action: with :math:`Q` read as
    logits, CQL's regulariser *is* behaviour cloning.

    Args:
        q_values: ``[..., A]`` floating tensor of action values (``A >= 1``).
        actions: ``[...]`` int64 logged actions in ``[0, A)`` (padding may hold any index in range).
        mask: optional bool / 0-1 ``[...]`` tensor of the real states.
        temperature: :math:`T > 0` (CORL's ``cql_temp``, default 1).

    Returns: a 0-dim tensor; 0 for no state.

    Chapter: 21_offline_rl_ope.
    """
    V.has_categories(q_values, "q_values")
    n_act = q_values.shape[-1]
    V.index_tensor(actions, "actions", shape=tuple(q_values.shape[:-1]))
    try:
        V.index_tensor(actions, "actions", n=n_act)
    except ValueError as e:          # an index one too large usually means q_values lacks an action
        raise ValueError(f"{e}, but q_values has shape {tuple(q_values.shape)}, {n_act} actions along its last "
                         f"dimension: q_values and actions disagree on the number of actions") from None
    temperature = V.real_in(temperature, "temperature", 0.0, lo_open=True)
    ref = q_values[..., 0]
    m = V.check_mask(mask, ref, "q_values[..., 0]", as_bool=True)
    q = q_values if m is None else torch.where(m[..., None], q_values, torch.zeros((), dtype=q_values.dtype,
                                                                                  device=q_values.device))
    soft = temperature * torch.logsumexp(q / temperature, dim=-1)
    taken = q.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    return _masked_mean(soft - taken, m)


def sequence_log_ratios(target_logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor) -> Tensor:
    r"""Log of the sequence importance ratio of each response, from per-token log-probabilities.

    .. math::  \log\rho_i = \sum_t m_{i,t}\,\big(\log\pi(y_{i,t}\mid h_{i,t}) - \log\mu(y_{i,t}\mid h_{i,t})\big)
               = \log\frac{\pi(y_i\mid x_i)}{\mu(y_i\mid x_i)} .

    Args:
        target_logprobs, behaviour_logprobs: ``[N, T]`` log-probs of the logged tokens under the
            target :math:`\pi` and the behaviour :math:`\mu` (the distribution that really sampled
            them: temperature and filters included). Padding may hold anything.
        mask: ``[N, T]`` bool / 0-1, the real tokens.

    Returns: ``[N]`` log-ratios (0 for a row without real tokens).

    Chapter: 21_offline_rl_ope.
    """
    V.matching_floats(target_logprobs=target_logprobs, behaviour_logprobs=behaviour_logprobs, min_dim=2)
    if target_logprobs.dim() != 2:
        raise ValueError(f"target_logprobs must be [N, T], got shape {tuple(target_logprobs.shape)}")
    m = V.check_mask(mask, target_logprobs, "target_logprobs", as_bool=True)
    if m is None:
        raise TypeError("mask must be a tensor of real tokens, got None")
    zero = torch.zeros((), dtype=target_logprobs.dtype, device=target_logprobs.device)
    d = torch.where(m, target_logprobs - behaviour_logprobs, zero)
    V.tensor_in(torch.where(m, behaviour_logprobs, zero), "behaviour_logprobs (at real tokens)", hi=0.0)
    if bool(torch.isnan(d).any()) or bool(torch.isposinf(d).any()):
        raise ValueError("target_logprobs must be finite or -inf (a token the target never emits) at real tokens")
    return d.sum(-1)


def _ope_args(log_ratios: Tensor, rewards: Tensor) -> None:
    V.matching_floats(log_ratios=log_ratios, rewards=rewards)
    if log_ratios.dim() != 1:
        raise ValueError(f"log_ratios must be 1-D [N] (one per logged response), got shape {tuple(log_ratios.shape)}")
    if log_ratios.numel() and (bool(torch.isnan(log_ratios).any()) or bool(torch.isposinf(log_ratios).any())):
        raise ValueError("log_ratios must not hold NaN or +inf (-inf, a zero weight, is fine)")
    V.tensor_in(rewards, "rewards")


def ope_is(log_ratios: Tensor, rewards: Tensor) -> Tensor:
    r"""Importance-sampling (inverse propensity) estimate of the target's mean reward.

    .. math::  \hat V_{\rm IS} = \frac1n\sum_{i=1}^n \rho_i\, r_i ,

    unbiased for :math:`V^\pi = \mathbb E_{x}\mathbb E_{y\sim\pi(\cdot\mid x)}[r]` whenever :math:`\mu > 0`
    wherever :math:`\pi > 0` (eq. ``eq-ch21-is``); its variance grows with :math:`\mathbb E_\mu[\rho^2]`,
    which for a sequence is a product over tokens.

    Args:
        log_ratios: ``[N]`` :math:`\log\rho_i` (:func:`sequence_log_ratios`); ``-inf`` allowed.
        rewards: ``[N]`` finite rewards, same dtype and device.

    Returns: a 0-dim tensor; 0 for ``N = 0``.

    Chapter: 21_offline_rl_ope.
    """
    _ope_args(log_ratios, rewards)
    if log_ratios.numel() == 0:
        return log_ratios.new_zeros(())
    return (torch.exp(log_ratios) * rewards).mean()


def ope_wis(log_ratios: Tensor, rewards: Tensor) -> Tensor:
    r"""Weighted (self-normalised) importance-sampling estimate.

    .. math::  \hat V_{\rm WIS} = \frac{\sum_i \rho_i\, r_i}{\sum_i \rho_i},

    computed with the weights :math:`e^{\log\rho_i - \max_j\log\rho_j}` (the common factor cancels),
    so it is finite for any log-ratios. Biased for finite :math:`n` (it is a ratio of two
    unbiased sums) but consistent, always inside the range of the rewards, and usually far less
    variable than :func:`ope_is` (eq. ``eq-ch21-is``).

    Args:
        log_ratios: ``[N]`` :math:`\log\rho_i`. rewards: ``[N]``.

    Returns: a 0-dim tensor; 0 for ``N = 0`` or when every weight is 0.

    Chapter: 21_offline_rl_ope.
    """
    _ope_args(log_ratios, rewards)
    if log_ratios.numel() == 0 or bool(torch.isneginf(log_ratios).all()):
        return log_ratios.new_zeros(())
    w = torch.exp(log_ratios - log_ratios.max())
    return (w * rewards).sum() / w.sum()


def ope_dm(target_values: Tensor) -> Tensor:
    r"""Direct-method estimate: the reward model's value under the target, averaged over logged prompts.

    .. math::  \hat V_{\rm DM} = \frac1n\sum_{i=1}^n \hat v^\pi(x_i), \qquad
               \hat v^\pi(x) = \mathbb E_{y\sim\pi(\cdot\mid x)}\,\hat r(x, y),

    no importance weights, so low variance, but biased by exactly the error of :math:`\hat r` under
    :math:`\pi` (eq. ``eq-ch21-dm``). For a language model :math:`\hat v^\pi(x)` is estimated by
    sampling from :math:`\pi`, which needs no new reward labels.

    Args:
        target_values: ``[N]`` finite :math:`\hat v^\pi(x_i)`.

    Returns: a 0-dim tensor; 0 for ``N = 0``.

    Chapter: 21_offline_rl_ope.
    """
    V.float_tensor(target_values, "target_values")
    if target_values.dim() != 1:
        raise ValueError(f"target_values must be 1-D [N], got shape {tuple(target_values.shape)}")
    V.tensor_in(target_values, "target_values")
    return target_values.mean() if target_values.numel() else target_values.new_zeros(())


def ope_dr(log_ratios: Tensor, rewards: Tensor, reward_hat: Tensor, target_values: Tensor,
           self_normalise: bool = False) -> Tensor:
    r"""Doubly robust estimate: the direct method plus an importance-weighted correction of its error.

    .. math::  \hat V_{\rm DR} = \frac1n\sum_{i=1}^n\Big[\hat v^\pi(x_i) + \rho_i\big(r_i - \hat r(x_i, y_i)\big)\Big]

    (eq. ``eq-ch21-dr``; Dudík et al. 2011). Unbiased when the ratios are right, whatever
    :math:`\hat r` is (the correction has mean :math:`V^\pi - \mathbb E\,\hat v^\pi`), and of low
    variance when :math:`\hat r` is good (the weighted term is only the residual); with exact
    :math:`\hat v^\pi` it is unbiased even with wrong ratios. ``self_normalise=True`` divides the
    correction by :math:`\frac1n\sum_i\rho_i` instead of 1 (SNDR): biased but steadier.

    Args:
        log_ratios: ``[N]`` :math:`\log\rho_i`. rewards: ``[N]`` logged :math:`r_i`.
        reward_hat: ``[N]`` :math:`\hat r(x_i, y_i)` on the LOGGED responses.
        target_values: ``[N]`` :math:`\hat v^\pi(x_i)`, the model's value under the target.
        self_normalise: the SNDR variant.

    Returns: a 0-dim tensor; 0 for ``N = 0``.

    Chapter: 21_offline_rl_ope.
    """
    _ope_args(log_ratios, rewards)
    V.same_layout(log_ratios, "log_ratios", reward_hat, "reward_hat")
    V.same_layout(log_ratios, "log_ratios", target_values, "target_values")
    V.tensor_in(reward_hat, "reward_hat")
    V.tensor_in(target_values, "target_values")
    V.boolean(self_normalise, "self_normalise")
    n = log_ratios.numel()
    if n == 0:
        return log_ratios.new_zeros(())
    resid = rewards - reward_hat
    if self_normalise:
        if bool(torch.isneginf(log_ratios).all()):
            return target_values.mean()
        w = torch.exp(log_ratios - log_ratios.max())
        corr = (w * resid).sum() / w.sum()
    else:
        corr = (torch.exp(log_ratios) * resid).mean()
    return target_values.mean() + corr
