r"""The single-policy bound, term by term.

:func:`~rlkit.tabular.single_policy_terms` solves an old and a new policy exactly and returns
every term of the state-shift lemma (lem-ch09-state-shift) and of the single-policy bound
(thm-ch09-single-policy); :func:`~rlkit.tabular.tight_example` builds the instance on which the
bound is attained. The ``slack`` of every record of a lower bound (here, in
:mod:`rlkit.tabular.finite_horizon` and in :mod:`rlkit.tabular.mixtures`) is defined here. Import
the names from :mod:`rlkit.tabular`.

Chapter: 09_single_policy_bound.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import _validate as V
from .mdp import FiniteMDP, GammaLike, check_policy
from .solve import expected_advantage, q_value, tv_distance, value, visitation

Tensor = torch.Tensor

__all__ = [
    "SinglePolicyTerms",
    "single_policy_terms",
    "tight_example",
]


class LowerBound:
    """``slack`` of a dataclass with ``improvement`` and its lower ``bound``."""

    @property
    def slack(self) -> Tensor:
        r"""``improvement - bound``; the bound says it is :math:`\ge 0`."""
        return self.improvement - self.bound


@dataclass
class SinglePolicyTerms(LowerBound):
    r"""Every term of the single-policy bound for a batch of :math:`(\text{MDP}, \pi_k, \pi)` triples
    (chapter 9: lem-ch09-state-shift and thm-ch09-single-policy), as returned by
    :func:`single_policy_terms`.

    Every field has shape ``[*B]`` except ``d_old``, ``d_new``, ``tv`` and ``abar``
    (``[*B, S]``). Below, :math:`\pi_k` is ``pi_old``, :math:`\pi` is ``pi_new`` and
    :math:`D_{\mathrm{TV}}(s) = D_{\mathrm{TV}}(\pi, \pi_k; s)`.

    Attributes:
        gamma: :math:`\gamma`.
        J_old: :math:`J(\pi_k)`.
        J_new: :math:`J(\pi)`.
        improvement: :math:`J(\pi) - J(\pi_k)`.
        surrogate: :math:`L_{\pi_k}(\pi)` (eq-ch09-surrogate).
        d_old: :math:`d_{\pi_k}`.
        d_new: :math:`d_\pi`.
        tv: :math:`D_{\mathrm{TV}}(\pi, \pi_k; s)` per state.
        abar: :math:`\bar A(s) = \mathbb E_{a\sim\pi(\cdot\mid s)}[A^{\pi_k}(s, a)]` per state.
        eps: :math:`\omega = C_{\pi,\pi_k} = \max_s|\bar A(s)|`.
        adv_max: :math:`\|A^{\pi_k}\|_\infty = \max_{s,a}|A^{\pi_k}(s, a)|`.
        expected_tv: :math:`\mathbb E_{s\sim d_{\pi_k}}[D_{\mathrm{TV}}(s)]`.
        expected_tv_new: :math:`\mathbb E_{s\sim d_\pi}[D_{\mathrm{TV}}(s)]` (the lemma's second form).
        max_tv: :math:`\max_s D_{\mathrm{TV}}(s)`.
        state_shift: :math:`\|d_\pi - d_{\pi_k}\|_1`.
        lemma_bound: :math:`\frac{2\gamma}{1-\gamma}\,\mathbb E_{d_{\pi_k}}[D_{\mathrm{TV}}]`, the
            right-hand side of eq-ch09-state-shift.
        penalty: :math:`\frac{2\gamma\omega}{(1-\gamma)^2}\,\mathbb E_{d_{\pi_k}}[D_{\mathrm{TV}}]`.
        bound: ``surrogate - penalty``, the lower bound of thm-ch09-single-policy.
    """

    gamma: Tensor
    J_old: Tensor
    J_new: Tensor
    improvement: Tensor
    surrogate: Tensor
    d_old: Tensor
    d_new: Tensor
    tv: Tensor
    abar: Tensor
    eps: Tensor
    adv_max: Tensor
    expected_tv: Tensor
    expected_tv_new: Tensor
    max_tv: Tensor
    state_shift: Tensor
    lemma_bound: Tensor
    penalty: Tensor
    bound: Tensor


    @property
    def tightness(self) -> Tensor:
        r""":math:`\tau = \big(L_{\pi_k}(\pi) - (J(\pi) - J(\pi_k))\big)/\text{penalty}`, in :math:`[-1, 1]`
        by the two-sided bound eq-ch09-bound; 1 means the lower bound is attained.

        NaN where the penalty is 0.
        """
        pen = self.penalty
        return torch.where(pen > 0, (self.surrogate - self.improvement) / pen.clamp_min(1e-300),
                           torch.full_like(pen, float("nan")))


def single_policy_terms(mdp: FiniteMDP, pi_old: Tensor, pi_new: Tensor) -> SinglePolicyTerms:
    r"""Solve both policies exactly and return every term of the state-shift lemma and the single-policy
    bound (chapter 9, lem-ch09-state-shift and thm-ch09-single-policy).

    The single-policy bound, eq-ch09-bound (two-sided; its lower half is the usual statement):

    .. math::

        \Big|\,J(\pi) - J(\pi_k) - L_{\pi_k}(\pi)\,\Big| \le
            \frac{2\gamma\,\omega}{(1-\gamma)^2}\,
            \mathbb E_{s\sim d_{\pi_k}}\big[D_{\mathrm{TV}}(\pi, \pi_k; s)\big],
        \qquad \omega = \max_s\big|\mathbb E_{a\sim\pi(\cdot\mid s)} A^{\pi_k}(s, a)\big| .

    The state-shift lemma, eq-ch09-state-shift (it also holds with the expectation under
    :math:`d_\pi`):

    .. math::

        \big\|d_\pi - d_{\pi_k}\big\|_1 \le \frac{2\gamma}{1-\gamma}\,
            \mathbb E_{s\sim d_{\pi_k}}\big[D_{\mathrm{TV}}(\pi, \pi_k; s)\big].

    Args:
        mdp: the MDPs.
        pi_old: ``[*B, S, A]``, the old policy :math:`\pi_k`.
        pi_new: ``[*B, S, A]``, the new policy :math:`\pi`.

    Returns:
        A :class:`SinglePolicyTerms`.
    """
    check_policy(mdp, pi_old, "pi_old")
    check_policy(mdp, pi_new, "pi_new")
    g = mdp.gamma
    V_old, V_new = value(mdp, pi_old), value(mdp, pi_new)
    A_old = q_value(mdp, pi_old, V_old) - V_old[..., None]
    J_old, J_new = (mdp.rho0 * V_old).sum(-1), (mdp.rho0 * V_new).sum(-1)
    d_old, d_new = visitation(mdp, pi_old), visitation(mdp, pi_new)
    tv = tv_distance(pi_new, pi_old)
    abar = expected_advantage(pi_new, A_old)
    eps = abar.abs().amax(-1)
    L = (d_old * abar).sum(-1) / (1 - g)
    etv = (d_old * tv).sum(-1)
    pen = 2 * g * eps / (1 - g) ** 2 * etv
    return SinglePolicyTerms(
        gamma=g, J_old=J_old, J_new=J_new, improvement=J_new - J_old, surrogate=L, d_old=d_old, d_new=d_new,
        tv=tv, abar=abar, eps=eps, adv_max=A_old.abs().amax((-1, -2)), expected_tv=etv,
        expected_tv_new=(d_new * tv).sum(-1), max_tv=tv.amax(-1), state_shift=(d_new - d_old).abs().sum(-1),
        lemma_bound=2 * g / (1 - g) * etv, penalty=pen, bound=L - pen)


def tight_example(gamma: GammaLike = 0.9, switch: GammaLike = 0.3, eta: GammaLike = 1e-3, c: GammaLike = 1.0, *,
                  dtype: torch.dtype = torch.float64):
    r"""An MDP and two policies on which the single-policy bound (chapter 9, thm-ch09-single-policy) is
    tight as :math:`\eta\to0`.

    States: 0 = start, 1 = :math:`X`, 2 = :math:`Y`. From the start, action 0 goes to :math:`X` and
    action 1 goes to :math:`Y`; :math:`X` and :math:`Y` are absorbing whatever the action. In
    :math:`X` action 0 pays 1 and action 1 pays :math:`1 - c`; in :math:`Y` action 0 pays 1 and action
    1 pays :math:`1 + c/\eta`. The old policy :math:`\pi_k` goes to :math:`Y`, then always plays
    action 0 (so :math:`V^{\pi_k}(X) = V^{\pi_k}(Y)`). The new policy :math:`\pi` goes to :math:`X`
    with probability :math:`p` (``switch``), plays the bad action 1 in :math:`X`, and in :math:`Y`
    plays the jackpot action 1 with the tiny probability :math:`\eta`. Then
    :math:`\bar A(X) = -c`, :math:`\bar A(Y) = +c` (so :math:`\omega = c`), and

    .. math::

        L_{\pi_k}(\pi) = \frac{\gamma c}{1-\gamma},\qquad
        J(\pi) - J(\pi_k) = \frac{\gamma c\,(1-2p)}{1-\gamma},\qquad
        \text{penalty} = \frac{2\gamma c}{1-\gamma}\Big(p + \frac{\gamma\eta}{1-\gamma}\Big).

    :math:`L - (J(\pi) - J(\pi_k))` and the penalty agree in the limit :math:`\eta\to0`, so no
    constant smaller than :math:`2\gamma/(1-\gamma)^2` can work. The state-shift lemma
    (lem-ch09-state-shift) is tight in the same limit:
    :math:`\|d_\pi - d_{\pi_k}\|_1 = 2\gamma p` against the bound
    :math:`2\gamma p + 2\gamma^2\eta/(1-\gamma)`.

    Each of ``gamma``, ``switch``, ``eta``, ``c`` is a float or a 1-D tensor ``[B]`` (all tensors the
    same length; floats are repeated).

    Args:
        gamma: :math:`\gamma\in[0, 1)`.
        switch: :math:`p\in(0, 1]`.
        eta: :math:`\eta\in(0, 1)`.
        c: :math:`c > 0`.
        dtype: a floating dtype.

    Returns:
        ``(mdp, pi_old, pi_new)`` with :math:`S = 3`, :math:`A = 2` and batch shape ``[]`` (all floats)
        or ``[B]``.
    """
    V.floating_dtype(dtype, "dtype")
    tensors = {k: v for k, v in dict(gamma=gamma, switch=switch, eta=eta, c=c).items()
               if isinstance(v, torch.Tensor) and v.dim() > 0}
    shape = V.layout("B", **tensors).get("B", ())           # the 1-D tensors share one length B
    shape = (shape,) if isinstance(shape, int) else shape
    like = torch.empty((), dtype=dtype)
    g = V.per_batch(gamma, "gamma", shape, like, 0.0, 1.0, hi_open=True)
    sw = V.per_batch(switch, "switch", shape, like, 0.0, 1.0, lo_open=True)
    et = V.per_batch(eta, "eta", shape, like, 0.0, 1.0, lo_open=True, hi_open=True)
    cc = V.per_batch(c, "c", shape, like, 0.0, lo_open=True)
    S, A = 3, 2
    P = torch.zeros(*shape, S, A, S, dtype=dtype)
    P[..., 0, 0, 1] = 1.0  # start --a0--> X
    P[..., 0, 1, 2] = 1.0  # start --a1--> Y
    P[..., 1, :, 1] = 1.0  # X absorbing
    P[..., 2, :, 2] = 1.0  # Y absorbing
    one, zero = torch.ones(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
    R = torch.stack([torch.stack([zero, zero], -1), torch.stack([one, 1 - cc], -1),
                     torch.stack([one, 1 + cc / et], -1)], -2)
    rho0 = torch.stack([one, zero, zero], -1)
    pi_old = torch.stack([torch.stack([zero, one], -1), torch.stack([one, zero], -1),
                          torch.stack([one, zero], -1)], -2)
    pi_new = torch.stack([torch.stack([sw, 1 - sw], -1), torch.stack([zero, one], -1),
                          torch.stack([1 - et, et], -1)], -2)
    return FiniteMDP(P, R, rho0, g), pi_old, pi_new
