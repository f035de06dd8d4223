r"""Mixtures of :math:`M` policy versions on the augmented state space
:math:`\tilde{\mathcal S} = \mathcal S\times\mathcal I`, and the bounds of a mixed batch.

Index kernels (trajectory- and step-level), index-blind policies, the augmented MDP with its
behaviour policy (:func:`~rlkit.tabular.augment`), the static-mixture bound and the instance on
which it is attained (chapter 10), the dynamic-mixing bounds and the current-advantage bound of a
mixed batch, both solved exactly on the augmented MDP, and Monte Carlo estimates of
:math:`U_k` and :math:`S_k` (chapter 11). An augmented state :math:`(s, i)` has the flat index
:math:`sM + i`. Import the names from :mod:`rlkit.tabular`.

Chapters: 10_static_mixtures, 11_dynamic_mixing.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import _validate as V
from ..staleness import half_abs_ratio_diff
from .bounds import LowerBound, single_policy_terms, tight_example
from .mdp import FiniteMDP, GammaLike, check_policy, generator_device
from .solve import expected_advantage, performance, q_value, tv_distance, value, visitation

Tensor = torch.Tensor

__all__ = [
    "trajectory_kernel",
    "step_kernel",
    "lift_policy",
    "augment",
    "StaticMixtureTerms",
    "static_mixture_terms",
    "tight_mixture_example",
    "MixedBatchTerms",
    "mixed_batch_terms",
    "DynamicMixtureTerms",
    "dynamic_mixture_terms",
    "CurrentAdvantageTerms",
    "current_advantage_terms",
    "sample_state_actions",
    "estimate_update_and_staleness",
]


# --------------------------------------------------------------------------------------------
# the augmented MDP (chapter 10)
# --------------------------------------------------------------------------------------------
def trajectory_kernel(n_versions: int, *, dtype: torch.dtype = torch.float64, device=None) -> Tensor:
    r"""Trajectory-level mixing (chapter 10; :math:`q_{\text{traj}}` of eq-ch11-step-kernel): the
    index never changes, :math:`q(i'\mid i) = \mathbf 1\{i' = i\}`.

    Args:
        n_versions: :math:`M\ge1`.
        dtype, device: of the result.

    Returns:
        ``q[M, M]``, the identity.
    """
    return torch.eye(V.int_in(n_versions, "n_versions"), dtype=dtype, device=device)


def step_kernel(sigma: Tensor, kappa: Tensor) -> Tensor:
    r"""Step-level mixing (chapter 11, eq-ch11-step-kernel):

    .. math::

        q(i'\mid i) = \big(1 - \sigma(i)\big)\,\mathbf 1\{i' = i\} + \sigma(i)\,\kappa(i'\mid i):

    after every step, the version in use is replaced with probability :math:`\sigma(i)` by a version
    drawn from :math:`\kappa(\cdot\mid i)`.

    Args:
        sigma: ``[*B, M]``, switching probabilities in :math:`[0, 1]`.
        kappa: ``[*B, M, M]``, switching targets; row :math:`i` is :math:`\kappa(\cdot\mid i)`.

    Returns:
        ``q[*B, M, M]``; row :math:`i` is :math:`q(\cdot\mid i)`.
    """
    sigma = V.float_tensor(sigma, "sigma", min_dim=1)
    kappa = V.float_tensor(kappa, "kappa", min_dim=2)
    M = sigma.shape[-1]
    V.layout("... M M", V.layout("... M", sigma=sigma), kappa=kappa)
    V.tensor_in(sigma, "sigma", 0.0, 1.0)
    V.distribution(kappa, "kappa", "kappa[..., i, :] is a distribution over versions")
    eye = torch.eye(M, dtype=kappa.dtype, device=kappa.device)
    return (1 - sigma)[..., None] * eye + sigma[..., None] * kappa


def lift_policy(pi: Tensor, n_versions: int) -> Tensor:
    r"""An index-blind policy on :math:`\mathcal S\times\mathcal I` (chapter 10, prop-ch10-index-blind):
    :math:`\tilde\pi(a\mid s, i) = \pi(a\mid s)`.

    Args:
        pi: ``[*B, S, A]``.
        n_versions: :math:`M\ge1`.

    Returns:
        ``[*B, S * M, A]``; the augmented state :math:`(s, i)` has the flat index :math:`sM + i`.
    """
    pi = V.float_tensor(pi, "pi", min_dim=2)
    V.int_in(n_versions, "n_versions")
    *B, S, A = pi.shape
    return pi[..., :, None, :].expand(*B, S, n_versions, A).reshape(*B, S * n_versions, A)


def _check_mixture(mdp: FiniteMDP, policies: Tensor, alpha: Tensor, kernel: Tensor):
    """Check a mixture of ``M`` policies against ``mdp``; return ``(policies, alpha, kernel, M)`` with a
    shared ``alpha [M]`` / ``kernel [M, M]`` expanded to the batch."""
    V.instance_of(mdp, "mdp", FiniteMDP, "rlkit.tabular.FiniteMDP")
    B = tuple(mdp.batch_shape)
    sizes = {"...": B, "S": mdp.n_states, "A": mdp.n_actions}
    M = V.layout("... M S A", sizes, floating=True, policies=policies)["M"]
    V.distribution(V.same_kind(policies, "policies", mdp.P, "mdp.P"), "policies",
                   "policies[..., i, s, :] is a distribution over actions")
    alpha = V.shared_or_batched(V.float_tensor(alpha, "alpha"), "alpha", B, (M,), "[M] (shared) or [*B, M]")
    V.distribution(V.same_kind(alpha, "alpha", mdp.P, "mdp.P"), "alpha", "mixture weights over versions")
    kernel = V.shared_or_batched(V.float_tensor(kernel, "kernel"), "kernel", B, (M, M), "[M, M] (shared) or [*B, M, M]")
    V.distribution(V.same_kind(kernel, "kernel", mdp.P, "mdp.P"), "kernel",
                   "kernel[..., i, :] = q(. | i) is a distribution over versions")
    return policies, alpha, kernel, M


def augment(mdp: FiniteMDP, policies: Tensor, alpha: Tensor, kernel: Tensor):
    r"""The augmented MDP on :math:`\mathcal S\times\mathcal I` and the mixture behaviour policy
    (chapter 10, eq-ch10-augmented):

    .. math::

        \tilde P\big((s', i')\mid (s, i), a\big) = P(s'\mid s, a)\,q(i'\mid i),\qquad
        \tilde R\big((s, i), a\big) = R(s, a),\qquad
        \tilded_0(s, i) = d_0(s)\,\alpha_i,

    and :math:`\beta(a\mid s, i) = \pi^{(i)}(a\mid s)`. The index is redrawn from
    :math:`q(\cdot\mid i)` after every step, so the first action of a trajectory is taken by
    :math:`\pi^{(I_0)}`, :math:`I_0\sim\alpha`. A shared ``alpha`` or ``kernel`` is expanded to the
    batch explicitly.

    Args:
        mdp: the MDPs, batch shape ``*B``.
        policies: ``[*B, M, S, A]``, the versions :math:`\pi^{(1)}, \dots, \pi^{(M)}`.
        alpha: ``[M]`` or ``[*B, M]``, the shares :math:`\alpha_i` (a distribution).
        kernel: ``[M, M]`` or ``[*B, M, M]``, the index kernel; row :math:`i` is :math:`q(\cdot\mid i)`.

    Returns:
        ``(mdp_aug, beta)``: a :class:`FiniteMDP` with ``P[*B, S*M, A, S*M]`` and the behaviour
        policy ``beta[*B, S*M, A]``; the flat index of :math:`(s, i)` is :math:`sM + i`.
    """
    policies, alpha, kernel, M = _check_mixture(mdp, policies, alpha, kernel)
    *B, S, A = mdp.R.shape
    P = torch.einsum("...sat,...ij->...siatj", mdp.P, kernel).reshape(*B, S * M, A, S * M)
    R = mdp.R[..., :, None, :].expand(*B, S, M, A).reshape(*B, S * M, A)
    rho0 = (mdp.rho0[..., :, None] * alpha[..., None, :]).reshape(*B, S * M)
    beta = policies.movedim(-3, -2).reshape(*B, S * M, A)  # [*B, S, M, A] -> [*B, S*M, A]
    return FiniteMDP(P, R, rho0, mdp.gamma), beta


# --------------------------------------------------------------------------------------------
# Chapter 10: static mixtures (cor-ch10-static)
# --------------------------------------------------------------------------------------------
@dataclass
class StaticMixtureTerms(LowerBound):
    r"""The terms of the static-mixture bound (chapter 10, cor-ch10-static), computed from per-version
    quantities by :func:`static_mixture_terms`.

    ``J_versions``, ``surrogates``, ``eps`` and ``expected_tv`` are ``[*B, M]``, one entry per
    version :math:`\pi^{(i)}`; the other fields are ``[*B]``. Below, :math:`\pi` is ``pi_new``.

    Attributes:
        alpha: the shares :math:`\alpha_i`, ``[*B, M]``.
        J_new: :math:`J(\pi)`.
        J_versions: :math:`J(\pi^{(i)})`.
        J_mix: :math:`\sum_i \alpha_i J(\pi^{(i)})`.
        improvement: ``J_new - J_mix``.
        surrogates: :math:`L_{\pi^{(i)}}(\pi)`.
        eps: :math:`\omega_i = C_{\pi,\pi^{(i)}} = \max_s\big|\mathbb E_{a\sim\pi(\cdot\mid s)}
            A^{\pi^{(i)}}(s, a)\big|`.
        expected_tv: :math:`\mathbb E_{s\sim d_{\pi^{(i)}}}\big[D_{\mathrm{TV}}(\pi, \pi^{(i)}; s)\big]`.
        surrogate: :math:`\sum_i \alpha_i L_{\pi^{(i)}}(\pi)`.
        penalty: :math:`\frac{2\gamma\max_i\omega_i}{(1-\gamma)^2}\sum_i\alpha_i\,
            \mathbb E_{d_{\pi^{(i)}}}\big[D_{\mathrm{TV}}(\pi, \pi^{(i)})\big]`.
        bound: ``surrogate - penalty``, the right-hand side of eq-ch10-static-bound.
        bound_per_version: :math:`\sum_i\alpha_i\big(L_{\pi^{(i)}}(\pi) - \frac{2\gamma\omega_i}{(1-\gamma)^2}\,
            \mathbb E_{d_{\pi^{(i)}}}[D_{\mathrm{TV}}(\pi, \pi^{(i)})]\big)`, the right-hand side of
            eq-ch10-per-version: also valid, and never smaller than ``bound``.
    """

    alpha: Tensor
    J_new: Tensor
    J_versions: Tensor
    J_mix: Tensor
    improvement: Tensor
    surrogates: Tensor
    eps: Tensor
    expected_tv: Tensor
    surrogate: Tensor
    penalty: Tensor
    bound: Tensor
    bound_per_version: Tensor


def static_mixture_terms(mdp: FiniteMDP, policies: Tensor, alpha: Tensor, pi_new: Tensor) -> StaticMixtureTerms:
    r"""The static-mixture bound (chapter 10, cor-ch10-static, eq-ch10-static-bound): for a
    trajectory-level mixture with shares :math:`\alpha_i`,

    .. math::

        J(\pi) - \sum_i \alpha_i J(\pi^{(i)}) \ge \sum_i \alpha_i L_{\pi^{(i)}}(\pi)
          - \frac{2\gamma \max_i \omega_i}{(1-\gamma)^2}
            \sum_i \alpha_i\, \mathbb E_{s\sim d_{\pi^{(i)}}}\big[D_{\mathrm{TV}}(\pi, \pi^{(i)}; s)\big],
        \qquad \omega_i = \max_s\big|\mathbb E_{a\sim\pi(\cdot\mid s)} A^{\pi^{(i)}}(s, a)\big|,

    and its sharper per-version form eq-ch10-per-version (field ``bound_per_version``). Computed
    version by version with :func:`single_policy_terms` (no augmented MDP).

    Args:
        mdp: the MDPs, batch shape ``*B``.
        policies: ``[*B, M, S, A]``, the versions :math:`\pi^{(i)}`.
        alpha: ``[M]`` or ``[*B, M]``, the shares :math:`\alpha_i`.
        pi_new: ``[*B, S, A]``, the new policy :math:`\pi`.

    Returns:
        A :class:`StaticMixtureTerms`.
    """
    V.instance_of(mdp, "mdp", FiniteMDP, "rlkit.tabular.FiniteMDP")
    sizes = {"...": tuple(mdp.batch_shape), "S": mdp.n_states, "A": mdp.n_actions}
    M = V.layout("... M S A", sizes, floating=True, policies=policies)["M"]
    kernel = trajectory_kernel(M, dtype=mdp.P.dtype, device=mdp.P.device)
    policies, alpha, _, M = _check_mixture(mdp, policies, alpha, kernel)
    check_policy(mdp, pi_new, "pi_new")
    # put the version axis in the batch: an MDP per version
    mdp_m = FiniteMDP(*(t.unsqueeze(len(mdp.batch_shape)).expand(*mdp.batch_shape, M, *t.shape[len(mdp.batch_shape):])
                        for t in (mdp.P, mdp.R, mdp.rho0, mdp.gamma)))
    new_m = pi_new.unsqueeze(-3).expand_as(policies)
    t = single_policy_terms(mdp_m, policies, new_m)
    g = mdp.gamma
    L = (alpha * t.surrogate).sum(-1)
    etv = (alpha * t.expected_tv).sum(-1)
    pen = 2 * g * t.eps.amax(-1) / (1 - g) ** 2 * etv
    J_new = t.J_new[..., 0]
    J_mix = (alpha * t.J_old).sum(-1)
    per = (alpha * (t.surrogate - 2 * g[..., None] * t.eps / (1 - g[..., None]) ** 2 * t.expected_tv)).sum(-1)
    return StaticMixtureTerms(alpha=alpha, J_new=J_new, J_versions=t.J_old, J_mix=J_mix, improvement=J_new - J_mix,
                              surrogates=t.surrogate, eps=t.eps, expected_tv=t.expected_tv, surrogate=L, penalty=pen,
                              bound=L - pen, bound_per_version=per)


def tight_mixture_example(gamma: GammaLike = 0.9, switch: GammaLike = 0.3, old_switches: Tensor | None = None,
                          eta: GammaLike = 1e-3, c: GammaLike = 1.0, *, dtype: torch.dtype = torch.float64):
    r"""Versions and a new policy on which the static-mixture bound (chapter 10, cor-ch10-static) is
    tight as :math:`\eta\to0`.

    The MDP of :func:`tight_example` with one change: in :math:`X`, action 1 pays :math:`1 - c/\eta`
    (an anti-jackpot), and the new policy :math:`\pi` plays it with probability :math:`\eta`, so that
    :math:`\bar A(X) = -c` at a per-state TV of only :math:`\eta`. Version :math:`i` goes from the start
    to :math:`X` with probability :math:`q_i` (``old_switches``) and to :math:`Y` otherwise, then plays
    action 0; :math:`\pi` goes to :math:`X` with probability :math:`p\ge q_i` (``switch``). Every version
    has :math:`V^{\pi^{(i)}}(X) = V^{\pi^{(i)}}(Y)`, :math:`\omega_i = c`, and

    .. math::

        L_{\pi^{(i)}}(\pi) - \big(J(\pi) - J(\pi^{(i)})\big) = \frac{2\gamma c\,(p - q_i)}{1-\gamma},\qquad
        \mathbb E_{d_{\pi^{(i)}}}\big[D_{\mathrm{TV}}(\pi, \pi^{(i)})\big] = (1-\gamma)(p - q_i) + \gamma\eta,

    so each version's penalty :math:`\frac{2\gamma c}{(1-\gamma)^2}\big((1-\gamma)(p-q_i) + \gamma\eta\big)`
    tends to its surrogate's error, and so does their :math:`\alpha`-average, for any shares.

    Args:
        gamma: :math:`\gamma\in[0, 1)`, a float or ``[B]``.
        switch: :math:`p\in(0, 1]`, a float or ``[B]``.
        old_switches: ``[M]`` or ``[B, M]``, the :math:`q_i\in[0, p]`; default ``[0, p/2]``.
        eta: :math:`\eta\in(0, 1)`, a float or ``[B]``.
        c: :math:`c > 0`, a float or ``[B]``.
        dtype: a floating dtype.

    Returns:
        ``(mdp, policies, pi_new)``: a :class:`FiniteMDP` with :math:`S = 3`, :math:`A = 2`, the versions
        ``[*B, M, 3, 2]`` and the new policy ``[*B, 3, 2]``, ready for :func:`static_mixture_terms`.
    """
    mdp, _, new = tight_example(gamma, switch, eta, c, dtype=dtype)
    B = tuple(mdp.batch_shape)
    p, et = new[..., 0, 0], new[..., 2, 1]
    cc = V.per_batch(c, "c", B, p, 0.0, lo_open=True)
    q = torch.stack([torch.zeros_like(p), p / 2], -1) if old_switches is None else \
        V.float_tensor(old_switches, "old_switches").to(dtype)
    q = V.shared_or_batched(q, "old_switches", B, (q.shape[-1],), "[M] (shared) or [B, M]")
    V.tensor_in(q, "old_switches", 0.0, 1.0)
    if bool((q > p[..., None] + 1e-12).any()):
        raise ValueError("old_switches must be <= switch (q_i <= p): a version that goes to X more often "
                         "than the new policy makes the surrogate err upwards, and the lower bound is loose")
    R = mdp.R.clone()
    R[..., 1, 1] = 1 - cc / et
    new = new.clone()
    new[..., 1, :] = torch.stack([1 - et, et], -1)
    one, zero = torch.ones_like(q), torch.zeros_like(q)
    pols = torch.stack([torch.stack([q, 1 - q], -1), torch.stack([one, zero], -1),
                        torch.stack([one, zero], -1)], -2)                       # [*B, M, 3, 2]
    return FiniteMDP(mdp.P, R, mdp.rho0, mdp.gamma), pols, new


# --------------------------------------------------------------------------------------------
# Chapter 11: the bounds of a mixed batch (thm-ch11-dynamic, prop-ch11-current-advantage)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MixedBatchTerms:
    r"""What both bounds of a mixed batch compute first (:func:`~rlkit.tabular.dynamic_mixture_terms`,
    :func:`~rlkit.tabular.current_advantage_terms`), from :func:`mixed_batch_terms`.

    Attributes:
        aug: the augmented :class:`~rlkit.tabular.FiniteMDP` (``P[*B, S*M, A, S*M]``).
        beta: ``[*B, S*M, A]``, the behaviour policy :math:`\beta(a\mid s, i) = \pi^{(i)}(a\mid s)`.
        n_versions: :math:`M`.
        d_beta: ``[*B, S*M]``, the augmented visitation :math:`d_\beta(s, i)`.
        new_lifted: ``[*B, S*M, A]``, :math:`\pi_{k+1}` lifted to the augmented states.
        tv_new_behaviour: :math:`\mathbb E_{d_\beta}\big[D_{\mathrm{TV}}(\pi_{k+1}, \pi^{(i)}; s)\big]`.
        U: :math:`U_k = \mathbb E_{d_\beta}\big[D_{\mathrm{TV}}(\pi_{k+1}, \pi_k; s)\big]`.
        S: :math:`S_k = \mathbb E_{d_\beta}\big[D_{\mathrm{TV}}(\pi_k, \pi^{(i)}; s)\big]`.
        adv_old: ``[*B, S, A]``, :math:`A^{\pi_k}` on the original MDP.
        J_old: :math:`J(\pi_k)`.
        J_new: :math:`J(\pi_{k+1})`.
    """

    aug: FiniteMDP
    beta: Tensor
    n_versions: int
    d_beta: Tensor
    new_lifted: Tensor
    tv_new_behaviour: Tensor
    U: Tensor
    S: Tensor
    adv_old: Tensor
    J_old: Tensor
    J_new: Tensor


def mixed_batch_terms(mdp: FiniteMDP, policies: Tensor, alpha: Tensor, kernel: Tensor, pi_old: Tensor,
                      pi_new: Tensor) -> MixedBatchTerms:
    r"""Check ``pi_old`` and ``pi_new``, build the augmented MDP (:func:`~rlkit.tabular.augment`), solve
    :math:`d_\beta` on it and :math:`\pi_k` on ``mdp``, and return the terms both bounds of chapter 11
    share (eq-ch11-uk-sk)."""
    check_policy(mdp, pi_old, "pi_old")
    check_policy(mdp, pi_new, "pi_new")
    aug, beta = augment(mdp, policies, alpha, kernel)
    M = aug.n_states // mdp.n_states
    d_b = visitation(aug, beta)                                   # [*B, S*M]
    new_l, old_l = lift_policy(pi_new, M), lift_policy(pi_old, M)
    V_old = value(mdp, pi_old)
    return MixedBatchTerms(
        aug=aug, beta=beta, n_versions=M, d_beta=d_b, new_lifted=new_l,
        tv_new_behaviour=(d_b * tv_distance(new_l, beta)).sum(-1), U=(d_b * tv_distance(new_l, old_l)).sum(-1),
        S=(d_b * tv_distance(old_l, beta)).sum(-1), adv_old=q_value(mdp, pi_old, V_old) - V_old[..., None],
        J_old=(mdp.rho0 * V_old).sum(-1), J_new=performance(mdp, pi_new))


@dataclass
class DynamicMixtureTerms:
    r"""The terms of the dynamic-mixing bounds (chapter 11, thm-ch11-dynamic and cor-ch11-split),
    computed on the augmented MDP by :func:`dynamic_mixture_terms`.

    All fields are ``[*B]`` except ``d_beta`` (``[*B, S, M]``) and ``adv_beta`` (``[*B, S, M, A]``).
    Below, :math:`\pi_k` is ``pi_old``, :math:`\pi_{k+1}` is ``pi_new`` and the expectations are over
    :math:`(s, i)\sim d_\beta`.

    Attributes:
        gamma: :math:`\gamma`.
        J_old: :math:`J(\pi_k)`.
        J_new: :math:`J(\pi_{k+1})`.
        J_mix: :math:`J(\beta)`, the return of the mixture sampler.
        improvement: :math:`J(\pi_{k+1}) - J(\pi_k)`.
        surrogate: :math:`L_\beta(\pi_{k+1})` (eq-ch11-surrogate).
        eps: :math:`\omega = C_{\pi_{k+1},\beta} = \max_{(s,i)}\big|\mathbb E_{a\sim\pi_{k+1}}
            A^\beta((s, i), a)\big|`.
        adv_old_max: :math:`\|A^{\pi_k}\|_\infty = \max_{s,a}|A^{\pi_k}(s, a)|`.
        tv_new_behaviour: :math:`\mathbb E_{d_\beta}\big[D_{\mathrm{TV}}(\pi_{k+1}, \pi^{(i)}; s)\big]`.
        U: the update shift :math:`U_k = \mathbb E_{d_\beta}\big[D_{\mathrm{TV}}(\pi_{k+1}, \pi_k; s)\big]`
            (eq-ch11-uk-sk).
        S: the sampling staleness :math:`S_k = \mathbb E_{d_\beta}\big[D_{\mathrm{TV}}(\pi_k, \pi^{(i)}; s)\big]`
            (eq-ch11-uk-sk).
        mixture_gap: :math:`J(\beta) - J(\pi_k)`, exact.
        mixture_gap_bound: :math:`C_2 S_k` with :math:`C_2 = \frac{2\|A^{\pi_k}\|_\infty}{1-\gamma}`,
            the bound on :math:`|J(\beta) - J(\pi_k)|` from the proof of thm-ch11-dynamic.
        bound_thm41: the right-hand side of eq-ch11-thm (the article's Theorem 4.1, hence the name).
        bound_cor42: the right-hand side of eq-ch11-cor (the article's Corollary 4.2).
        d_beta: :math:`d_\beta(s, i)`, ``[*B, S, M]``.
        adv_beta: :math:`A^\beta((s, i), a)`, ``[*B, S, M, A]``.
    """

    gamma: Tensor
    J_old: Tensor
    J_new: Tensor
    J_mix: Tensor
    improvement: Tensor
    surrogate: Tensor
    eps: Tensor
    adv_old_max: Tensor
    tv_new_behaviour: Tensor
    U: Tensor
    S: Tensor
    mixture_gap: Tensor
    mixture_gap_bound: Tensor
    bound_thm41: Tensor
    bound_cor42: Tensor
    d_beta: Tensor
    adv_beta: Tensor

    @property
    def c_update(self) -> Tensor:
        r"""The coefficient of :math:`U_k` in eq-ch11-cor, :math:`C_1 = 2\gamma\omega/(1-\gamma)^2`."""
        return 2 * self.gamma * self.eps / (1 - self.gamma) ** 2

    @property
    def c_stale(self) -> Tensor:
        r"""The coefficient of :math:`S_k` in eq-ch11-cor,
        :math:`C_1 + C_2 = 2\gamma\omega/(1-\gamma)^2 + 2\|A^{\pi_k}\|_\infty/(1-\gamma)`.
        """
        return self.c_update + 2 * self.adv_old_max / (1 - self.gamma)


def dynamic_mixture_terms(mdp: FiniteMDP, policies: Tensor, alpha: Tensor, kernel: Tensor, pi_old: Tensor,
                          pi_new: Tensor) -> DynamicMixtureTerms:
    r"""The dynamic-mixing bounds (chapter 11, thm-ch11-dynamic and cor-ch11-split), solved exactly on
    the augmented MDP. For any index kernel, eq-ch11-thm:

    .. math::

        J(\pi_{k+1}) - J(\pi_k) \ge L_\beta(\pi_{k+1})
            - \frac{2\gamma\omega}{(1-\gamma)^2}\,
              \mathbb E_{(s,i)\sim d_\beta}\big[D_{\mathrm{TV}}(\pi_{k+1}, \pi^{(i)}; s)\big]
            - \frac{2\|A^{\pi_k}\|_\infty}{1-\gamma}\,
              \mathbb E_{(s,i)\sim d_\beta}\big[D_{\mathrm{TV}}(\pi^{(i)}, \pi_k; s)\big],

    and, by the triangle inequality through :math:`\pi_k`, eq-ch11-cor:

    .. math::

        J(\pi_{k+1}) - J(\pi_k) \ge L_\beta(\pi_{k+1}) - C_1\,U_k - (C_1 + C_2)\,S_k,
        \qquad C_1 = \frac{2\gamma\omega}{(1-\gamma)^2},\quad C_2 = \frac{2\|A^{\pi_k}\|_\infty}{1-\gamma},

    with the surrogate of the mixed batch (eq-ch11-surrogate)
    :math:`L_\beta(\pi) = \frac{1}{1-\gamma}\,\mathbb E_{(s,i)\sim d_\beta,\ a\sim\pi(\cdot\mid s)}[A^\beta((s,i), a)]`,
    :math:`\omega = \max_{(s,i)}|\mathbb E_{a\sim\pi_{k+1}} A^\beta((s,i), a)|`,
    :math:`\|A^{\pi_k}\|_\infty = \max_{s,a}|A^{\pi_k}(s, a)|`, and :math:`U_k`, :math:`S_k` of
    eq-ch11-uk-sk.

    Args:
        mdp: the MDPs, batch shape ``*B``.
        policies: ``[*B, M, S, A]``, the versions :math:`\pi^{(i)}` that sampled.
        alpha: ``[M]`` or ``[*B, M]``, the shares :math:`\alpha_i`.
        kernel: ``[M, M]`` or ``[*B, M, M]``, the index kernel :math:`q`.
        pi_old: ``[*B, S, A]``, the current policy :math:`\pi_k`.
        pi_new: ``[*B, S, A]``, the updated policy :math:`\pi_{k+1}`.

    Returns:
        A :class:`DynamicMixtureTerms`.
    """
    mb = mixed_batch_terms(mdp, policies, alpha, kernel, pi_old, pi_new)
    aug, beta, d_b, M = mb.aug, mb.beta, mb.d_beta, mb.n_versions
    tv_nb, U, Sk, J_old, J_new = mb.tv_new_behaviour, mb.U, mb.S, mb.J_old, mb.J_new
    *B, S, A = mdp.R.shape
    g = mdp.gamma
    V_b = value(aug, beta)
    A_b = q_value(aug, beta, V_b) - V_b[..., None]
    abar = expected_advantage(mb.new_lifted, A_b)
    eps = abar.abs().amax(-1)
    L = (d_b * abar).sum(-1) / (1 - g)
    a_inf = mb.adv_old.abs().amax((-1, -2))
    J_mix = (aug.rho0 * V_b).sum(-1)
    c1 = 2 * g * eps / (1 - g) ** 2
    c_inf = 2 * a_inf / (1 - g)
    return DynamicMixtureTerms(
        gamma=g, J_old=J_old, J_new=J_new, J_mix=J_mix, improvement=J_new - J_old, surrogate=L, eps=eps,
        adv_old_max=a_inf, tv_new_behaviour=tv_nb, U=U, S=Sk, mixture_gap=J_mix - J_old,
        mixture_gap_bound=c_inf * Sk, bound_thm41=L - c1 * tv_nb - c_inf * Sk,
        bound_cor42=L - c1 * U - (c1 + c_inf) * Sk, d_beta=d_b.reshape(*B, S, M),
        adv_beta=A_b.reshape(*B, S, M, A))


@dataclass
class CurrentAdvantageTerms(LowerBound):
    r"""The terms of the current-advantage bound (chapter 11, prop-ch11-current-advantage), computed on
    the augmented MDP by :func:`current_advantage_terms`.

    All fields are ``[*B]`` except ``abar`` (``[*B, S]``) and ``d_beta`` (``[*B, S, M]``). Below,
    :math:`\pi_k` is ``pi_old``, :math:`\pi_{k+1}` is ``pi_new`` and the expectations are over
    :math:`(s, i)\sim d_\beta`.

    Attributes:
        gamma: :math:`\gamma`.
        J_old: :math:`J(\pi_k)`.
        J_new: :math:`J(\pi_{k+1})`.
        improvement: :math:`J(\pi_{k+1}) - J(\pi_k)`.
        abar: :math:`\bar A_k(s) = \mathbb E_{a\sim\pi_{k+1}(\cdot\mid s)}\big[A^{\pi_k}(s, a)\big]` per state.
        surrogate: :math:`L^{\pi_k}_\beta(\pi_{k+1}) = \frac1{1-\gamma}\,\mathbb E_{(s,i)\sim d_\beta,\
            a\sim\pi^{(i)}}\big[\frac{\pi_{k+1}(a\mid s)}{\pi^{(i)}(a\mid s)}A^{\pi_k}(s, a)\big]`
            (eq-ch11-current-surrogate); 0 when :math:`\pi_{k+1} = \pi_k`.
        eps: :math:`\omega_k = \max_s|\bar A_k(s)|`, which is at most
            :math:`2\|A^{\pi_k}\|_\infty\max_s D_{\mathrm{TV}}(\pi_{k+1}, \pi_k; s)`.
        tv_new_behaviour: :math:`\mathbb E_{d_\beta}\big[D_{\mathrm{TV}}(\pi_{k+1}, \pi^{(i)}; s)\big]`.
        U: :math:`U_k = \mathbb E_{d_\beta}\big[D_{\mathrm{TV}}(\pi_{k+1}, \pi_k; s)\big]`.
        S: :math:`S_k = \mathbb E_{d_\beta}\big[D_{\mathrm{TV}}(\pi_k, \pi^{(i)}; s)\big]`.
        coef: :math:`C_k = 2\gamma\omega_k/(1-\gamma)^2`.
        penalty: :math:`C_k\,\mathbb E_{d_\beta}\big[D_{\mathrm{TV}}(\pi_{k+1}, \pi^{(i)}; s)\big]`.
        bound: ``surrogate - penalty``, the right-hand side of eq-ch11-current.
        bound_split: :math:`L^{\pi_k}_\beta(\pi_{k+1}) - C_k\,(U_k + S_k)`, the right-hand side of
            eq-ch11-current-split (never larger than ``bound``).
        d_beta: :math:`d_\beta(s, i)`, ``[*B, S, M]``.
    """

    gamma: Tensor
    J_old: Tensor
    J_new: Tensor
    improvement: Tensor
    abar: Tensor
    surrogate: Tensor
    eps: Tensor
    tv_new_behaviour: Tensor
    U: Tensor
    S: Tensor
    coef: Tensor
    penalty: Tensor
    bound: Tensor
    bound_split: Tensor
    d_beta: Tensor

    @property
    def tightness(self) -> Tensor:
        r""":math:`\tau = \big(L^{\pi_k}_\beta(\pi_{k+1}) - (J(\pi_{k+1}) - J(\pi_k))\big)/\text{penalty}`,
        at most 1 by eq-ch11-current; 1 means the bound is attained. NaN where the penalty is 0."""
        pen = self.penalty
        return torch.where(pen > 0, (self.surrogate - self.improvement) / pen.clamp_min(1e-300),
                           torch.full_like(pen, float("nan")))


def current_advantage_terms(mdp: FiniteMDP, policies: Tensor, alpha: Tensor, kernel: Tensor, pi_old: Tensor,
                            pi_new: Tensor) -> CurrentAdvantageTerms:
    r"""The current-advantage bound on a mixed batch (chapter 11, prop-ch11-current-advantage), solved
    exactly on the augmented MDP. For any index kernel, eq-ch11-current and eq-ch11-current-split:

    .. math::

        J(\pi_{k+1}) - J(\pi_k) \ \ge\ L^{\pi_k}_\beta(\pi_{k+1})
            - \frac{2\gamma\omega_k}{(1-\gamma)^2}\,
              \mathbb E_{(s,i)\sim d_\beta}\big[D_{\mathrm{TV}}(\pi_{k+1}, \pi^{(i)}; s)\big]
        \ \ge\ L^{\pi_k}_\beta(\pi_{k+1}) - \frac{2\gamma\omega_k}{(1-\gamma)^2}\,(U_k + S_k),

    with the surrogate built on the CURRENT policy's advantage, reweighted to the batch,

    .. math::

        L^{\pi_k}_\beta(\pi) = \frac{1}{1-\gamma}\,
            \mathbb E_{(s,i)\sim d_\beta,\ a\sim\pi^{(i)}(\cdot\mid s)}
            \Big[\frac{\pi(a\mid s)}{\pi^{(i)}(a\mid s)}\,A^{\pi_k}(s, a)\Big]
          = \frac{1}{1-\gamma}\sum_{s,i} d_\beta(s, i)\,\bar A_k(s),

    :math:`\bar A_k(s) = \sum_a\pi_{k+1}(a\mid s)\,A^{\pi_k}(s, a)` and
    :math:`\omega_k = \max_s|\bar A_k(s)|`. The sum form is the one computed (no support condition).
    Unlike :func:`dynamic_mixture_terms` there is no term :math:`\frac{2\|A^{\pi_k}\|_\infty}{1-\gamma}S_k`:
    both the surrogate and the penalty vanish when :math:`\pi_{k+1} = \pi_k`, whatever the staleness.

    Args:
        mdp: the MDPs, batch shape ``*B``.
        policies: ``[*B, M, S, A]``, the versions :math:`\pi^{(i)}` that sampled.
        alpha: ``[M]`` or ``[*B, M]``, the shares :math:`\alpha_i`.
        kernel: ``[M, M]`` or ``[*B, M, M]``, the index kernel :math:`q`.
        pi_old: ``[*B, S, A]``, the current policy :math:`\pi_k`.
        pi_new: ``[*B, S, A]``, the updated policy :math:`\pi_{k+1}`.

    Returns:
        A :class:`CurrentAdvantageTerms`.
    """
    mb = mixed_batch_terms(mdp, policies, alpha, kernel, pi_old, pi_new)
    d_b, M = mb.d_beta, mb.n_versions                             # d_b: [*B, S*M]
    tv_nb, U, Sk, J_old, J_new = mb.tv_new_behaviour, mb.U, mb.S, mb.J_old, mb.J_new
    *B, S, A = mdp.R.shape
    g = mdp.gamma
    abar = expected_advantage(pi_new, mb.adv_old)                 # [*B, S]
    d_s = d_b.reshape(*B, S, M).sum(-1)                           # the state marginal of d_beta
    L = (d_s * abar).sum(-1) / (1 - g)
    eps = abar.abs().amax(-1)
    coef = 2 * g * eps / (1 - g) ** 2
    return CurrentAdvantageTerms(
        gamma=g, J_old=J_old, J_new=J_new, improvement=J_new - J_old, abar=abar, surrogate=L, eps=eps,
        tv_new_behaviour=tv_nb, U=U, S=Sk, coef=coef, penalty=coef * tv_nb, bound=L - coef * tv_nb,
        bound_split=L - coef * (U + Sk), d_beta=d_b.reshape(*B, S, M))


# --------------------------------------------------------------------------------------------
# Chapter 11: U_k and S_k from samples (lem-ch11-ratio)
# --------------------------------------------------------------------------------------------
def sample_state_actions(d: Tensor, behaviour: Tensor, n: int, *, generator: torch.Generator | None = None):
    r"""Draw ``n`` i.i.d. pairs :math:`s\sim d`, :math:`a\sim\text{behaviour}(\cdot\mid s)` per batch
    element (chapter 11). Sampling happens on the generator's device.

    Args:
        d: ``[*B, S]``, a distribution over states (e.g. ``visitation(aug, beta)``).
        behaviour: ``[*B, S, A]``, rows are distributions.
        n: the number of pairs, :math:`\ge 1`.
        generator: the source of randomness.

    Returns:
        ``(states, actions)``, both ``long[*B, n]``, on ``d``'s device.
    """
    V.layout("... S A", V.layout("... S", floating=True, d=d), floating=True, behaviour=behaviour)
    V.int_in(n, "n")
    V.distribution(d, "d", "state distribution")
    V.distribution(behaviour, "behaviour", "behaviour[..., s, :] is a distribution over actions")
    dev = generator_device(generator)
    *B, S, A = behaviour.shape
    dd = d.clamp_min(0).reshape(-1, S).to(dev)
    states = torch.multinomial(dd, n, replacement=True, generator=generator)            # [b, n]
    probs = torch.gather(behaviour.clamp_min(0).reshape(-1, S, A).to(dev), 1,
                         states[..., None].expand(-1, n, A))                               # [b, n, A]
    actions = torch.multinomial(probs.reshape(-1, A), 1, generator=generator).reshape(-1, n)
    return states.reshape(*B, n).to(d.device), actions.reshape(*B, n).to(d.device)


def estimate_update_and_staleness(mdp: FiniteMDP, policies: Tensor, alpha: Tensor, kernel: Tensor, pi_old: Tensor,
                                  pi_new: Tensor, n: int, *, generator: torch.Generator | None = None):
    r"""Monte Carlo estimates of :math:`U_k` and :math:`S_k` from ``n`` sampled :math:`(s, i, a)`
    (chapter 11, lem-ch11-ratio, eq-ch11-estimators).

    Draws :math:`(s, i)\sim d_\beta` (the exact augmented visitation) and
    :math:`a\sim\pi^{(i)}(\cdot\mid s)`, then applies :func:`rlkit.staleness.half_abs_ratio_diff`:

    .. math::

        \hat U_k = \tfrac12\,\overline{\big|\rho_{k+1} - \rho_k\big|},\qquad
        \hat S_k = \tfrac12\,\overline{\big|\rho_k - 1\big|},\qquad
        \rho_{k+1} = \frac{\pi_{k+1}(a\mid s)}{\pi^{(i)}(a\mid s)},\quad
        \rho_k = \frac{\pi_k(a\mid s)}{\pi^{(i)}(a\mid s)},

    the bars being means over the ``n`` samples. Both are unbiased when every :math:`\pi^{(i)}` covers
    the supports of :math:`\pi_k` and :math:`\pi_{k+1}`; their standard error shrinks like
    :math:`1/\sqrt n`.

    Args:
        mdp, policies, alpha, kernel, pi_old, pi_new: as in :func:`dynamic_mixture_terms`.
        n: samples per batch element, :math:`\ge 1`.
        generator: the source of randomness.

    Returns:
        ``(U_hat, S_hat)``, each ``[*B]``.
    """
    check_policy(mdp, pi_old, "pi_old")
    check_policy(mdp, pi_new, "pi_new")
    aug, beta = augment(mdp, policies, alpha, kernel)
    M = aug.n_states // mdp.n_states
    d_b = visitation(aug, beta)
    states, actions = sample_state_actions(d_b, beta, n, generator=generator)

    def logp(pi_aug):
        rows = torch.gather(pi_aug, -2, states[..., None].expand(*states.shape, pi_aug.shape[-1]))
        return torch.log(torch.gather(rows, -1, actions[..., None])[..., 0])

    lb, lo, ln = logp(beta), logp(lift_policy(pi_old, M)), logp(lift_policy(pi_new, M))
    return half_abs_ratio_diff(ln, lo, lb, dim=-1), half_abs_ratio_diff(lo, lb, lb, dim=-1)
