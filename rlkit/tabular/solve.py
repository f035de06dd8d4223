r"""Exact policy evaluation on a :class:`~rlkit.tabular.FiniteMDP`, by batched linear solves.

The state kernel :math:`P_\pi` and reward :math:`r_\pi` of a policy, :math:`V^\pi`, :math:`Q^\pi`,
:math:`A^\pi`, the return :math:`J(\pi)`, the normalised discounted visitation :math:`d_\pi`, the
per-state total-variation distance, the new policy's expected advantage, the surrogate
:math:`L_{\pi_k}(\pi)` and the performance difference lemma. Import the names from
:mod:`rlkit.tabular`.

Chapter: 09_single_policy_bound (eq-ch09-visitation, eq-ch09-surrogate, lem-ch09-pdl); the
bounds of chapters 9-11 (on the augmented MDP for mixtures) and the fixed-point checks of
16_offpolicy_multistep are computed with them.
"""
from __future__ import annotations

import torch

from .. import _validate
from .. import _validate as V  # q_value's argument V shadows the alias there: it uses _validate
from .mdp import FiniteMDP, GammaLike, as_gamma, check_policy

Tensor = torch.Tensor

__all__ = [
    "policy_transition",
    "policy_reward",
    "value",
    "q_value",
    "advantage",
    "performance",
    "visitation",
    "tv_distance",
    "expected_advantage",
    "surrogate",
    "performance_difference",
]


def policy_transition(mdp: FiniteMDP, pi: Tensor) -> Tensor:
    r"""The state-to-state kernel under :math:`\pi` (chapter 9):

    .. math::

        P_\pi(s, s') = \sum_a \pi(a\mid s)\,P(s'\mid s, a).

    Args:
        mdp: the MDPs.
        pi: ``[*B, S, A]``, rows are distributions.

    Returns:
        ``[*B, S, S]``, rows are distributions.
    """
    pi = check_policy(mdp, pi)
    return torch.einsum("...sa,...sat->...st", pi, mdp.P)


def policy_reward(mdp: FiniteMDP, pi: Tensor) -> Tensor:
    r"""The expected one-step reward under :math:`\pi` (chapter 9):
    :math:`r_\pi(s) = \sum_a \pi(a\mid s)\,R(s, a)`.

    Args:
        mdp: the MDPs.
        pi: ``[*B, S, A]``, rows are distributions.

    Returns:
        ``[*B, S]``.
    """
    pi = check_policy(mdp, pi)
    return (pi * mdp.R).sum(-1)


def eye_like(mdp: FiniteMDP) -> Tensor:
    return torch.eye(mdp.n_states, dtype=mdp.P.dtype, device=mdp.P.device)


def value(mdp: FiniteMDP, pi: Tensor) -> Tensor:
    r"""State values by one batched linear solve of the Bellman equation (chapter 9):

    .. math::

        V^\pi = r_\pi + \gamma P_\pi V^\pi
        \quad\Longleftrightarrow\quad
        V^\pi = (I - \gamma P_\pi)^{-1} r_\pi .

    Args:
        mdp: the MDPs.
        pi: ``[*B, S, A]``, rows are distributions.

    Returns:
        ``V[*B, S]``.
    """
    Ppi = policy_transition(mdp, pi)
    lhs = eye_like(mdp) - mdp.gamma[..., None, None] * Ppi
    return torch.linalg.solve(lhs, policy_reward(mdp, pi)[..., None])[..., 0]


def q_value(mdp: FiniteMDP, pi: Tensor, V: Tensor | None = None) -> Tensor:
    r"""Action values (chapter 9):

    .. math::

        Q^\pi(s, a) = R(s, a) + \gamma\sum_{s'} P(s'\mid s, a)\,V^\pi(s').

    Args:
        mdp: the MDPs.
        pi: ``[*B, S, A]``, rows are distributions.
        V: optional ``[*B, S]`` values :math:`V^\pi` (from :func:`value`), to avoid a second solve; the
            formula is applied to whatever ``V`` is passed.

    Returns:
        ``Q[*B, S, A]``.
    """
    if V is None:
        V = value(mdp, pi)
    else:
        check_policy(mdp, pi)
        _validate.exact_shape(_validate.float_tensor(V, "V"), "V", (*mdp.batch_shape, mdp.n_states), "[*B, S]")
        _validate.same_kind(V, "V", mdp.P, "mdp.P")
    return mdp.R + mdp.gamma[..., None, None] * torch.einsum("...sat,...t->...sa", mdp.P, V)


def advantage(mdp: FiniteMDP, pi: Tensor) -> Tensor:
    r"""Advantages :math:`A^\pi(s, a) = Q^\pi(s, a) - V^\pi(s)` (chapter 9); they average to zero under
    :math:`\pi` itself, :math:`\sum_a \pi(a\mid s)\,A^\pi(s, a) = 0`.

    Args:
        mdp: the MDPs.
        pi: ``[*B, S, A]``, rows are distributions.

    Returns:
        ``A[*B, S, A]``.
    """
    V = value(mdp, pi)
    return q_value(mdp, pi, V) - V[..., None]


def performance(mdp: FiniteMDP, pi: Tensor) -> Tensor:
    r"""The expected discounted return (chapter 9):

    .. math::

        J(\pi) = \mathbb E\Big[\sum_{t\ge0}\gamma^t r_t\Big] = d_0^\top V^\pi = \sum_s d_0(s)\,V^\pi(s).

    Args:
        mdp: the MDPs.
        pi: ``[*B, S, A]``, rows are distributions.

    Returns:
        ``J[*B]``.
    """
    v = value(mdp, pi)
    return (mdp.rho0 * v).sum(-1)


def visitation(mdp: FiniteMDP, pi: Tensor) -> Tensor:
    r"""The normalised discounted state visitation (chapter 9, eq-ch09-visitation):

    .. math::

        d_\pi(s) = (1-\gamma)\sum_{t\ge0}\gamma^t \Pr(s_t = s)
        \quad\Longleftrightarrow\quad
        d_\pi^\top = (1-\gamma)\,d_0^\top (I - \gamma P_\pi)^{-1},

    computed as the solution of the linear system :math:`(I - \gamma P_\pi)^\top d_\pi = (1-\gamma)\,d_0`.
    It sums to 1 over :math:`s`.

    Args:
        mdp, pi: as in :func:`value`.

    Returns:
        ``d[*B, S]``, a distribution over states for each batch index.
    """
    Ppi = policy_transition(mdp, pi)
    lhs = (eye_like(mdp) - mdp.gamma[..., None, None] * Ppi).transpose(-1, -2)
    rhs = ((1 - mdp.gamma)[..., None] * mdp.rho0)[..., None]
    return torch.linalg.solve(lhs, rhs)[..., 0]


def tv_distance(p: Tensor, q: Tensor) -> Tensor:
    r"""Per-state total-variation distance (chapter 9):

    .. math::

        D_{\mathrm{TV}}(p, q; s) = \tfrac12\sum_a \big|p(a\mid s) - q(a\mid s)\big| .

    Args:
        p, q: the same shape ``[..., A]``, the action distributions on the last dimension.

    Returns:
        ``[...]``, values in :math:`[0, 1]` when ``p`` and ``q`` are distributions.
    """
    V.matching_floats(p=p, q=q)
    return 0.5 * (p - q).abs().sum(-1)


def expected_advantage(pi_new: Tensor, adv: Tensor) -> Tensor:
    r"""The new policy's expected advantage in each state (chapter 9):

    .. math::

        \bar A(s) = \mathbb E_{a\sim\pi(\cdot\mid s)}\big[A(s, a)\big] = \sum_a \pi(a\mid s)\,A(s, a).

    With ``adv`` :math:`= A^{\pi_k}`, its largest absolute value over states is the constant
    :math:`\omega = C_{\pi,\pi_k} = \max_s|\bar A(s)|` of the single-policy bound
    (thm-ch09-single-policy).

    Args:
        pi_new: ``[..., S, A]``, the policy :math:`\pi` whose actions are averaged over.
        adv: ``[..., S, A]``, the advantages :math:`A(s, a)`.

    Returns:
        ``[..., S]``.
    """
    V.layout("... S A", floating=True, pi_new=pi_new, adv=adv)
    return (pi_new * adv).sum(-1)


def surrogate(d_old: Tensor, pi_new: Tensor, adv_old: Tensor, gamma: GammaLike) -> Tensor:
    r"""The surrogate objective (chapter 9, eq-ch09-surrogate):

    .. math::

        L_{\pi_k}(\pi) = \frac{1}{1-\gamma}\,
            \mathbb E_{s\sim d_{\pi_k},\ a\sim\pi_k(\cdot\mid s)}
            \Big[\frac{\pi(a\mid s)}{\pi_k(a\mid s)}\,A^{\pi_k}(s, a)\Big]
          = \frac{1}{1-\gamma}\sum_s d_{\pi_k}(s) \sum_a \pi(a\mid s)\,A^{\pi_k}(s, a)
          = \frac{1}{1-\gamma}\, d_{\pi_k}^\top \bar A ,

    with :math:`\bar A(s) = \sum_a \pi(a\mid s)\,A^{\pi_k}(s, a)` (:func:`expected_advantage`). The
    sum form is the one computed (it needs no support condition); it equals the importance-weighted
    form whenever :math:`\pi_k(a\mid s) > 0` wherever :math:`\pi(a\mid s) > 0`.
    Any visitation and advantages may be passed: with the new policy's visitation :math:`d_\pi` it
    is the exact improvement (:func:`performance_difference`).

    Args:
        d_old: ``[*B, S]``, the state distribution :math:`d_{\pi_k}`.
        pi_new: ``[*B, S, A]``, the policy :math:`\pi` being evaluated.
        adv_old: ``[*B, S, A]``, the advantages :math:`A^{\pi_k}`.
        gamma: :math:`\gamma\in[0, 1)`, a float or ``[*B]``.

    Returns:
        ``[*B]``.
    """
    V.layout("... S", V.layout("... S A", floating=True, pi_new=pi_new, adv_old=adv_old), floating=True, d_old=d_old)
    abar = expected_advantage(pi_new, adv_old)
    g = as_gamma(gamma, d_old.shape[:-1], d_old)
    return (d_old * abar).sum(-1) / (1 - g)


def performance_difference(mdp: FiniteMDP, pi_old: Tensor, pi_new: Tensor) -> Tensor:
    r"""The right-hand side of the performance difference lemma (chapter 9, lem-ch09-pdl, eq-ch09-pdl):

    .. math::

        J(\pi) - J(\pi_k) = \frac{1}{1-\gamma}\,
            \mathbb E_{s\sim d_\pi}\Big[\mathbb E_{a\sim\pi(\cdot\mid s)}\big[A^{\pi_k}(s, a)\big]\Big],

    computed from the NEW policy's visitation :math:`d_\pi` and the OLD policy's advantages
    :math:`A^{\pi_k}`: it is :func:`surrogate` with :math:`d_\pi` in place of :math:`d_{\pi_k}`.

    Args:
        mdp: the MDPs.
        pi_old: ``[*B, S, A]``, :math:`\pi_k`.
        pi_new: ``[*B, S, A]``, :math:`\pi`.

    Returns:
        ``[*B]``, equal to ``performance(mdp, pi_new) - performance(mdp, pi_old)``.
    """
    check_policy(mdp, pi_old, "pi_old")
    check_policy(mdp, pi_new, "pi_new")
    return surrogate(visitation(mdp, pi_new), pi_new, advantage(mdp, pi_old), mdp.gamma)
