r"""Off-policy corrections: importance ratios, V-trace, and the Retrace / Tree-Backup family.

Conventions as in :mod:`rlkit.returns`: time is the last dimension; ``rewards[..., t]``,
``values[..., t]`` = :math:`V(s_t)`, ``next_values[..., t]`` = value of :math:`s_{t+1}`,
``discounts[..., t]`` = :math:`\gamma_t`, ``lam`` a float or a per-step tensor that is 0 where a
trace must stop. Probabilities enter as log-probabilities; ``log_rhos[..., t]`` =
:math:`\log \pi(a_t\mid s_t) - \log \mu(a_t\mid s_t)` for the target policy :math:`\pi` and the
behaviour policy :math:`\mu` that produced the data.

The Q-value targets share one recursion (Munos et al. 2016, as organised in rlax):

.. math::  G_t = r_t + \gamma_t\Big[\mathbb E_{a\sim\pi} Q(s_{t+1}, a)
           + \lambda_t\, c_{t+1}\big(G_{t+1} - Q(s_{t+1}, a_{t+1})\big)\Big],

and the methods differ only in the trace coefficient :math:`c` of the next action
(:func:`trace_coefficients`): importance sampling :math:`c=\pi/\mu`; Q(lambda) :math:`c=1`;
Tree-Backup :math:`c=\pi(a)`; Retrace :math:`c=\min(1, \pi/\mu)`.

Ratios are formed from log-ratios at the last moment, by ``_exp_ratio``, which saturates
where :math:`e^{\ell}` would overflow the dtype instead of returning ``inf``.

Chapters: 03_importance_sampling (ratios), Part II (sequence-level ratios in LLM training),
Part III (V-trace, Retrace and Tree-Backup with asynchronous actors).
"""
from __future__ import annotations

import math

import torch

from . import _validate as V
from .returns import blocked_scan_pays, per_step, reverse_scan

Tensor = torch.Tensor
FloatOrTensor = float | Tensor

__all__ = [
    "importance_ratio",
    "vtrace",
    "trace_coefficients",
    "off_policy_q_returns",
    "retrace",
    "tree_backup",
]


def max_log_ratio(dtype: torch.dtype) -> float:
    """The largest log-ratio whose exponential (and ``expm1``) is finite in ``dtype``, with a
    margin of 1: 87.7 for float32 and bfloat16, 708.8 for float64, 10.1 for float16."""
    return math.log(torch.finfo(dtype).max) - 1.0


def _exp_ratio(log_ratio: Tensor) -> Tensor:
    r"""A ratio :math:`e^{\ell}` from its log, saturating where it would overflow the dtype.

    .. math::  \text{exp\_ratio}(\ell) = e^{\min(\ell,\ \ell_{\max})}, \qquad
               \ell_{\max} = \log(\text{largest finite number}) - 1,

    i.e. :math:`\ell_{\max}` = 87.7 in float32 and bfloat16 (ratios up to about
    :math:`10^{38}`), 708.8 in float64 and 10.1 in float16 (ratios up to about 24,000; the range
    over which float16 works). Above :math:`\ell_{\max}` the value stays finite and the gradient
    is 0, like a clip, where :math:`e^{\ell}` would be ``inf`` (and a gradient through it NaN).

    Used for every ratio of this module and by :func:`rlkit.divergences.kl_k3`.
    """
    return torch.exp(log_ratio.clamp(max=max_log_ratio(log_ratio.dtype)))


def importance_ratio(logp_new: Tensor, logp_old: Tensor, mask: Tensor | None = None,
                     level: str = "token", log: bool = False) -> Tensor:
    r"""Importance ratios between two policies, formed in log space.

    * ``"token"``: :math:`r_{i,t} = \exp(\log\pi_{\text{new}} - \log\pi_{\text{old}})`, shape
      ``[B, T]``; masked-out tokens get ratio 1 (log-ratio 0).
    * ``"sequence"``: the ratio of a whole response, the product of its token ratios,
      :math:`r_i = \exp\big(\sum_t m_{i,t}(\log\pi_{\text{new}} - \log\pi_{\text{old}})\big)`,
      shape ``[B]``. Heavy-tailed for long responses: a per-token log-ratio of only 0.01 over
      2000 tokens is a factor :math:`e^{20}`.
    * ``"geometric"``: the per-token geometric mean of the sequence ratio (GSPO),
      :math:`r_i = \exp\big(\frac{1}{|o_i|}\sum_t m_{i,t}(\log\pi_{\text{new}} - \log\pi_{\text{old}})\big)`,
      shape ``[B]`` (1 for an empty sequence).

    Masked-out tokens never reach the result, in values or gradients, even when they hold NaN
    or ``inf``. The exponential is ``_exp_ratio``: it saturates (gradient 0) above a log-ratio
    of 87.7 in float32 and bfloat16, 10.1 in float16, instead of overflowing to ``inf``.

    Args:
        logp_new, logp_old: ``[B, T]`` (any leading dims) log-probs of the sampled tokens.
        mask: optional bool / 0-1 mask of real tokens, same shape.
        level: ``"token"``, ``"sequence"`` or ``"geometric"``.
        log: return the log-ratio instead (recommended for sequence level, where the ratio
            itself saturates once the sum exceeds 87.7 in float32).

    Returns:
        ``[B, T]`` (token level) or ``[B]`` ratios (or log-ratios). Gradients flow into both
        arguments (detach ``logp_old`` yourself if it has a graph).

    Chapter: 03_importance_sampling (token level), 08_why_offpolicy (sequence level).
    """
    V.matching_floats(logp_new=logp_new, logp_old=logp_old)
    V.choice(level, "level", ("token", "sequence", "geometric"))
    m = V.check_mask(mask, logp_new, "logp_new")
    lr = logp_new - logp_old
    if m is not None:
        lr = torch.where(m > 0, lr, torch.zeros((), dtype=lr.dtype, device=lr.device))
    if level == "sequence":
        lr = lr.sum(-1)
    elif level == "geometric":
        n = lr.new_full(lr.shape[:-1], lr.shape[-1]) if m is None else m.sum(-1)
        lr = lr.sum(-1) / n.clamp(min=1.0)
    return lr if log else _exp_ratio(lr)


def vtrace(log_rhos: Tensor, rewards: Tensor, values: Tensor, next_values: Tensor,
           discounts: Tensor, clip_rho: float = 1.0, clip_c: float = 1.0,
           lam: FloatOrTensor = 1.0) -> tuple[Tensor, Tensor]:
    r"""V-trace targets and policy-gradient advantages (Espeholt et al., 2018, IMPALA).

    With :math:`\rho_t = \pi(a_t|s_t)/\mu(a_t|s_t)`, :math:`\bar\rho_t = \min(\bar\rho, \rho_t)`,
    :math:`c_t = \lambda_t \min(\bar c, \rho_t)` and
    :math:`\delta_t = \bar\rho_t\,(r_t + \gamma_t V(s_{t+1}) - V(s_t))`:

    .. math::  v_t - V(s_t) = \delta_t + \gamma_t\, c_t\,\big(v_{t+1} - V(s_{t+1})\big),
               \qquad v_T - V(s_T) = 0,

    i.e. :math:`v_t = V(s_t) + \sum_{k\ge t}\big(\prod_{i=t}^{k-1}\gamma_i c_i\big)\delta_k`, and

    .. math::  A^{\text{pg}}_t = \bar\rho_t\,\big(r_t + \gamma_t\, v_{t+1} - V(s_t)\big),

    where :math:`v_{t+1}` is ``next_values[..., t]`` plus the next step's correction
    :math:`v_{t+1} - V(s_{t+1})` (so :math:`v_T` = ``next_values[..., -1]``). Zeros in a
    per-step ``lam`` tensor mark trajectory cuts (a truncation, see
    :func:`rlkit.returns.from_gymnasium`): at such a step both the trace and the
    :math:`v_{t+1}` of the advantage stop at ``next_values[..., t]``. A scalar ``lam`` cuts
    nothing (``lam=0`` gives one-step targets with IMPALA's :math:`v_{t+1}` in the advantage).

    On-policy (:math:`\pi=\mu`) with clips :math:`\ge 1`, :math:`v_t` is the lambda-return and
    :math:`A^{\text{pg}}` the one-step advantage with a lambda-return bootstrap. The clipped
    ratios are formed in log space, so any finite or ``+inf`` log-ratio gives finite targets.

    Args:
        log_rhos: ``[..., T]`` :math:`\log\pi - \log\mu` of the taken actions (detached inside).
        rewards, values, next_values, discounts: ``[..., T]``.
        clip_rho: finite :math:`\bar\rho > 0` (IMPALA uses 1; the article 1 to 2).
        clip_c: finite :math:`\bar c > 0` (usually 1; take :math:`\bar c \le \bar\rho`).
        lam: float or ``[..., T]`` tensor in ``[0, 1]``.

    Returns:
        ``(vs, pg_advantages)``, both ``[..., T]`` and without gradient (targets).

    Chapter: Part III, "V-trace, Retrace and Tree-Backup with asynchronous actors".
    """
    V.matching_floats(rewards=rewards, log_rhos=log_rhos, values=values,
                      next_values=next_values, discounts=discounts)
    V.tensor_in(discounts, "discounts", 0.0, 1.0)
    clip_rho = V.real_in(clip_rho, "clip_rho", 0.0, lo_open=True)
    clip_c = V.real_in(clip_c, "clip_c", 0.0, lo_open=True)
    lam = V.scalar_or_like(lam, "lam", rewards, "rewards")
    with torch.no_grad():
        rho = _exp_ratio(log_rhos)                                  # pi / mu, finite
        if blocked_scan_pays(rewards):
            return _vtrace_blocked(rho, rewards, values, next_values, discounts, clip_rho,
                                   clip_c, lam)
        rho_bar, c = rho.clamp(max=clip_rho), per_step(lam, rewards) * rho.clamp(max=clip_c)
        follow = (lam > 0).to(c.dtype) if isinstance(lam, Tensor) else torch.ones_like(c)
        vs, pg_advantages = torch.zeros_like(values), torch.zeros_like(values)
        acc = values.new_zeros(values.shape[:-1])                  # v_T - V(s_T) = 0
        for t in reversed(range(rewards.shape[-1])):
            td = rewards[..., t] + discounts[..., t] * next_values[..., t] - values[..., t]
            # v_{t+1} = V(s_{t+1}) + acc, unless the trajectory is cut after step t
            pg_advantages[..., t] = rho_bar[..., t] * (td + discounts[..., t] * follow[..., t] * acc)
            acc = rho_bar[..., t] * td + discounts[..., t] * c[..., t] * acc
            vs[..., t] = values[..., t] + acc
    return vs, pg_advantages


_TRACES = ("retrace", "tree_backup", "q_lambda", "is")


def trace_coefficients(kind: str, log_rhos: Tensor | None = None,
                       logp_target: Tensor | None = None) -> Tensor:
    r"""Trace coefficients :math:`c_t` of the taken actions for the named off-policy methods.

    ================= ============================================ ===============================
    ``kind``          :math:`c_t`                                  needs
    ================= ============================================ ===============================
    ``"is"``          :math:`\pi(a_t|s_t)/\mu(a_t|s_t)`            ``log_rhos`` (unbiased,
                                                                   variance grows without bound)
    ``"q_lambda"``    :math:`1`                                    ``log_rhos`` for the shape
                                                                   (safe only when
                                                                   :math:`\pi \approx \mu`)
    ``"tree_backup"`` :math:`\pi(a_t|s_t)`                         ``logp_target`` (never needs
                                                                   :math:`\mu`; cuts on-policy
                                                                   traces)
    ``"retrace"``     :math:`\min(1, \pi(a_t|s_t)/\mu(a_t|s_t))`   ``log_rhos`` (safe and
                                                                   efficient)
    ================= ============================================ ===============================

    Args:
        kind: one of the names above.
        log_rhos: ``[..., T]`` :math:`\log\pi(a_t|s_t) - \log\mu(a_t|s_t)`.
        logp_target: ``[..., T]`` :math:`\log\pi(a_t|s_t) \le 0` (``-inf`` allowed; a positive value or
            NaN raises ``ValueError``, since a Tree-Backup trace is a probability).

    Returns:
        A ``[..., T]`` tensor (no gradient). Ratios come from ``_exp_ratio``: finite. (The
        products of unclipped ``"is"`` traces in :func:`off_policy_q_returns` can still
        overflow for large log-ratios: that is the variance of importance sampling showing.)

    Chapter: Part III.
    """
    V.choice(kind, "kind", _TRACES)
    if kind == "tree_backup":
        V.given(logp_target, "logp_target", "kind='tree_backup' needs log pi of the taken actions")
        V.float_tensor(logp_target, "logp_target", min_dim=1)
        lp = logp_target.detach()
        if lp.numel() and not bool((lp <= 0).all()):       # NaN fails too; -inf (pi = 0) gives a trace of 0
            found = "NaN" if bool(lp.isnan().any()) else f"values up to {float(lp.max())}"
            raise ValueError(f"logp_target must hold log-probabilities, <= 0 (-inf allowed), found {found}: "
                             f"a Tree-Backup trace pi(a|s) lies in [0, 1]")
        return lp.exp()
    V.given(log_rhos, "log_rhos", f"kind={kind!r} needs log pi - log mu of the taken actions")
    V.float_tensor(log_rhos, "log_rhos", min_dim=1)
    lr = log_rhos.detach()
    if kind == "is":
        return _exp_ratio(lr)
    if kind == "q_lambda":
        return torch.ones_like(lr)
    return lr.clamp(max=0.0).exp()   # min(1, rho) computed in log space


def off_policy_q_returns(traces: Tensor, rewards: Tensor, q_taken: Tensor, next_values: Tensor,
                         discounts: Tensor, lam: FloatOrTensor = 1.0) -> Tensor:
    r"""General multi-step Q-value targets with trace coefficients ``traces``.

    .. math::  G_t = r_t + \gamma_t\Big[\bar V_{t+1} + \lambda_t\, c_{t+1}
               \big(G_{t+1} - Q(s_{t+1}, a_{t+1})\big)\Big], \qquad t < T-1,

    .. math::  G_{T-1} = r_{T-1} + \gamma_{T-1}\bar V_T,

    where :math:`\bar V_{t+1} = \mathbb E_{a\sim\pi}Q(s_{t+1}, a)` = ``next_values[..., t]``,
    :math:`Q(s_{t+1}, a_{t+1})` = ``q_taken[..., t+1]`` and :math:`c_{t+1}` = ``traces[..., t+1]``:
    **the trace coefficient of step t+1's action multiplies step t+1's correction in step t's
    target**, together with :math:`\lambda_t` (which is 0 where the trajectory is cut after
    step t). ``q_taken[..., 0]`` and ``traces[..., 0]`` are not used. Unrolled:
    :math:`G_t = Q(s_t,a_t) + \sum_{k\ge t}\gamma_t\cdots\gamma_{k-1}\,
    (\lambda_t c_{t+1})\cdots(\lambda_{k-1} c_k)\,\delta_k` with the expected TD error
    :math:`\delta_k = r_k + \gamma_k \bar V_{k+1} - Q(s_k, a_k)`.

    ``lam = 0`` gives the one-step expected-SARSA target for any trace; with ``traces = 1``
    and a greedy target policy that took the logged actions, the Monte Carlo return.

    Args:
        traces: ``[..., T]`` :math:`c_t`, from :func:`trace_coefficients` or your own.
        rewards, discounts: ``[..., T]``.
        q_taken: ``[..., T]`` :math:`Q(s_t, a_t)` for the logged actions (target network).
        next_values: ``[..., T]`` :math:`\sum_a \pi(a|s_{t+1}) Q(s_{t+1}, a)`.
        lam: float or ``[..., T]`` tensor in ``[0, 1]``.

    Returns:
        ``[..., T]`` targets for :math:`Q(s_t, a_t)` (no gradient).

    Chapter: Part III.
    """
    V.matching_floats(rewards=rewards, traces=traces, q_taken=q_taken, next_values=next_values,
                      discounts=discounts)
    V.tensor_in(discounts, "discounts", 0.0, 1.0)
    V.tensor_in(traces, "traces")
    lam = V.scalar_or_like(lam, "lam", rewards, "rewards")
    with torch.no_grad():
        if blocked_scan_pays(rewards):
            return _q_returns_blocked(traces, rewards, q_taken, next_values, discounts, lam)
        lam, T = per_step(lam, rewards), rewards.shape[-1]
        returns = torch.zeros_like(rewards)
        G = rewards.new_zeros(rewards.shape[:-1])
        for t in reversed(range(T)):
            # the correction of step t+1, weighted by lam_t c_{t+1}; none after the last step
            c = lam[..., t] * traces[..., t + 1] if t + 1 < T else 0.0
            q_next = q_taken[..., t + 1] if t + 1 < T else 0.0
            G = rewards[..., t] + discounts[..., t] * (next_values[..., t] + c * (G - q_next))
            returns[..., t] = G
    return returns


def retrace(log_rhos: Tensor, rewards: Tensor, q_taken: Tensor, next_values: Tensor,
            discounts: Tensor, lam: FloatOrTensor = 1.0) -> Tensor:
    r"""Retrace(lambda) targets (Munos et al., 2016): :func:`off_policy_q_returns` with
    :math:`c_t = \min(1, \pi(a_t|s_t)/\mu(a_t|s_t))`,

    .. math::  G_t = r_t + \gamma_t\Big[\mathbb E_\pi Q(s_{t+1},\cdot) + \lambda_t
               \min(1, \rho_{t+1})\big(G_{t+1} - Q(s_{t+1}, a_{t+1})\big)\Big].

    Truncating at 1 keeps the product of traces bounded (low variance) while still using full
    traces when the data are near-on-policy; the fixed point is :math:`Q^\pi` for any
    :math:`\mu`.

    Args:
        log_rhos: ``[..., T]`` :math:`\log\pi(a_t|s_t) - \log\mu(a_t|s_t)`.
        rewards, q_taken, next_values, discounts, lam: as in :func:`off_policy_q_returns`.

    Returns:
        ``[..., T]`` (no gradient).

    Chapter: Part III.
    """
    V.matching_floats(rewards=rewards, log_rhos=log_rhos)
    return off_policy_q_returns(trace_coefficients("retrace", log_rhos=log_rhos), rewards,
                                q_taken, next_values, discounts, lam)


def tree_backup(logp_target: Tensor, rewards: Tensor, q_taken: Tensor, next_values: Tensor,
                discounts: Tensor, lam: FloatOrTensor = 1.0) -> Tensor:
    r"""Tree-Backup(lambda) targets (Precup et al., 2000): :func:`off_policy_q_returns` with
    :math:`c_t = \pi(a_t|s_t)`,

    .. math::  G_t = r_t + \gamma_t\Big[\mathbb E_\pi Q(s_{t+1},\cdot) + \lambda_t
               \pi(a_{t+1}|s_{t+1})\big(G_{t+1} - Q(s_{t+1}, a_{t+1})\big)\Big].

    Needs no behaviour probabilities at all; the price is that traces shrink even on-policy.

    Args:
        logp_target: ``[..., T]`` :math:`\log\pi(a_t|s_t)` of the logged actions (``<= 0``).
        rewards, q_taken, next_values, discounts, lam: as in :func:`off_policy_q_returns`.

    Returns:
        ``[..., T]`` (no gradient).

    Chapter: Part III.
    """
    V.matching_floats(rewards=rewards, logp_target=logp_target)
    return off_policy_q_returns(trace_coefficients("tree_backup", logp_target=logp_target),
                                rewards, q_taken, next_values, discounts, lam)


# ----------------------------------------------------------------------------------------------
# Fast paths (no autograd; see rlkit.returns.blocked_scan_pays): the recursions above, vectorised in
# time by the blocked scan, written with few full-size temporaries.
# ----------------------------------------------------------------------------------------------

def _vtrace_blocked(rho, rewards, values, next_values, discounts, clip_rho, clip_c, lam):
    c = rho.clamp(max=clip_c)                                      # min(c-bar, rho_t)
    rho_bar = rho.clamp_(max=clip_rho)                             # min(rho-bar, rho_t)
    c.mul_(discounts)
    if isinstance(lam, Tensor) or lam != 1.0:
        c.mul_(lam)                                                # gamma_t c_t (with lam)
    td = torch.addcmul(rewards, discounts, next_values).sub_(values)
    delta = rho_bar * td                                           # rho-bar_t * TD error
    acc = reverse_scan(c, delta, delta.new_zeros(delta.shape[:-1]), out=delta)
    vs = acc + values
    nxt = c                                                        # reuse the buffer
    nxt[..., :-1] = acc[..., 1:]
    nxt[..., -1] = 0.0
    if isinstance(lam, Tensor):
        nxt.masked_fill_(lam == 0, 0.0)
    pg_adv = torch.addcmul(td, discounts, nxt, out=nxt).mul_(rho_bar)
    return vs, pg_adv


def _q_returns_blocked(traces, rewards, q_taken, next_values, discounts, lam):
    pad = rewards.new_zeros(rewards.shape[:-1] + (1,))
    c_next = torch.cat([traces[..., 1:], pad], dim=-1)             # c_{t+1}, 0 after the end
    q_next = torch.cat([q_taken[..., 1:], pad], dim=-1)            # Q(s_{t+1}, a_{t+1})
    a = discounts * lam * c_next
    b = rewards + discounts * next_values - a * q_next
    return reverse_scan(a, b, pad[..., 0], out=b)
