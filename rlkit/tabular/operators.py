r"""Exact fixed points of the off-policy multi-step operators (V-trace, Retrace, Tree-Backup,
Q(lambda), IS) on a :class:`~rlkit.tabular.FiniteMDP`.

Each expected operator is written as an affine map :math:`\mathcal R V = \mathcal A V + b` (or on
:math:`Q`), whose modulus and fixed point come from one linear solve; the fixed point of V-trace
is the value of the truncated policy (:func:`~rlkit.tabular.truncated_policy`). These are the
tabular twins of the sample-based targets of :mod:`rlkit.offpolicy`. Import the names from
:mod:`rlkit.tabular`; :data:`TRACE_KINDS` is documented here.

Chapter: 16_offpolicy_multistep.
"""
from __future__ import annotations

import torch

from .. import _validate as V
from .mdp import POLICY, FiniteMDP, check_policy
from .solve import eye_like

Tensor = torch.Tensor

__all__ = [
    "TRACE_KINDS",
    "truncated_policy",
    "trace_table",
    "vtrace_affine",
    "vtrace_fixed_point",
    "q_trace_affine",
    "q_trace_fixed_point",
]


#: The trace coefficients :func:`~rlkit.tabular.trace_table` knows (the tabular twins of
#: :func:`rlkit.offpolicy.trace_coefficients`).
TRACE_KINDS = ("retrace", "tree_backup", "q_lambda", "is")


def _clip_level(x, name: str) -> float:
    """A truncation level in ``(0, inf]`` (``math.inf`` means no truncation)."""
    if isinstance(x, (int, float)) and x == float("inf"):
        return float("inf")
    return V.real_in(x, name, 0.0, lo_open=True)


def _pair(mdp: FiniteMDP, pi: Tensor, mu: Tensor) -> tuple[Tensor, Tensor]:
    pi = check_policy(mdp, pi, "pi")
    mu = check_policy(mdp, mu, "mu", "mu[..., s, :] is the behaviour policy's distribution over actions")
    return pi, mu


def _truncated_weights(pi: Tensor, mu: Tensor, level: float) -> Tensor:
    r""":math:`\mu(a\mid s)\min(\bar x, \pi/\mu) = \min(\bar x\,\mu, \pi)` (0 where :math:`\mu = 0`)."""
    return pi.clone() if level == float("inf") else torch.minimum(level * mu, pi)


def truncated_policy(pi: Tensor, mu: Tensor, rho_bar: float) -> Tensor:
    r"""The policy whose value V-trace learns: the :math:`\bar\rho`-truncated target (chapter 16).

    .. math::

        \pi_{\bar\rho}(a\mid s) = \frac{\min\big(\bar\rho\,\mu(a\mid s),\ \pi(a\mid s)\big)}
        {\sum_b \min\big(\bar\rho\,\mu(b\mid s),\ \pi(b\mid s)\big)} .

    :math:`\bar\rho = \infty` gives :math:`\pi` (where :math:`\mu` covers :math:`\pi`); :math:`\bar\rho \to 0`
    gives :math:`\mu`; :math:`\bar\rho \ge \max_a \pi/\mu` gives :math:`\pi` exactly.

    Args:
        pi: ``[*B, S, A]`` target policy :math:`\pi`.
        mu: ``[*B, S, A]`` behaviour policy :math:`\mu`.
        rho_bar: :math:`\bar\rho \in (0, \infty]`.

    Returns:
        ``[*B, S, A]``, rows are distributions. ``ValueError`` if in some state :math:`\pi` and
        :math:`\mu` share no action (the truncated weights are all 0 there).

    Chapter: 16_offpolicy_multistep, eq-ch16-truncated-policy.
    """
    V.matching_floats(min_dim=2, pi=pi, mu=mu)
    V.distribution(pi, "pi", POLICY)
    V.distribution(mu, "mu", "mu[..., s, :] is a distribution over actions")
    m = _truncated_weights(pi, mu, _clip_level(rho_bar, "rho_bar"))
    z = m.sum(-1, keepdim=True)
    if bool((z <= 0).any()):
        raise ValueError("truncated_policy: in some state pi and mu share no action "
                         "(min(rho_bar * mu, pi) is 0 for every action), so pi_rho_bar is undefined there")
    return m / z


def trace_table(kind: str, pi: Tensor, mu: Tensor, lam: float = 1.0) -> Tensor:
    r"""The trace coefficient :math:`c(s, a)` of every state-action pair, for the named methods.

    ================= =====================================
    ``kind``          :math:`c(s, a)`
    ================= =====================================
    ``"retrace"``     :math:`\lambda\min(1, \pi/\mu)`
    ``"tree_backup"`` :math:`\lambda\,\pi(a\mid s)`
    ``"q_lambda"``    :math:`\lambda`
    ``"is"``          :math:`\lambda\,\pi/\mu`
    ================= =====================================

    The tabular twin of :func:`rlkit.offpolicy.trace_coefficients` (which gives :math:`c` of the
    sampled actions only). Where :math:`\mu(a\mid s) = 0` the action is never taken and :math:`c` is
    set to 0 (only :math:`\mu\,c` enters the operators).

    Args:
        kind: one of :data:`~rlkit.tabular.operators.TRACE_KINDS`.
        pi, mu: ``[*B, S, A]`` target and behaviour policies.
        lam: :math:`\lambda \in [0, 1]`.

    Returns:
        ``[*B, S, A]``, finite and :math:`\ge 0`.

    Chapter: 16_offpolicy_multistep, eq-ch16-retrace-operator.
    """
    V.choice(kind, "kind", TRACE_KINDS)
    V.matching_floats(min_dim=2, pi=pi, mu=mu)
    V.distribution(pi, "pi", POLICY)
    V.distribution(mu, "mu", "mu[..., s, :] is a distribution over actions")
    lam = V.real_in(lam, "lam", 0.0, 1.0)
    pos = mu > 0
    ratio = torch.where(pos, pi / torch.where(pos, mu, torch.ones_like(mu)), torch.zeros_like(mu))
    if kind == "retrace":
        c = ratio.clamp(max=1.0)
    elif kind == "tree_backup":
        c = pi.clone()
    elif kind == "q_lambda":
        c = torch.ones_like(pi)
    else:
        c = ratio
    return lam * torch.where(pos, c, torch.zeros_like(c))


def vtrace_affine(mdp: FiniteMDP, pi: Tensor, mu: Tensor, rho_bar: float = 1.0, c_bar: float = 1.0,
                  lam: float = 1.0) -> tuple[Tensor, Tensor]:
    r"""The expected V-trace operator as an affine map :math:`\mathcal R V = \mathcal A V + b` (chapter 16).

    With data from :math:`\mu`, :math:`\bar\rho(s,a) = \min(\bar\rho, \pi/\mu)` and
    :math:`c(s,a) = \lambda\min(\bar c, \pi/\mu)`, the V-trace target
    :math:`v_s = V(s) + \sum_{t\ge 0}\gamma^t\big(\prod_{i<t}c_i\big)\bar\rho_t\,\delta_t` has expectation

    .. math::

        \mathcal R V = V + (I - \gamma C)^{-1}\big(r_m + \gamma P_m V - D_m V\big),

    with :math:`m(a\mid s) = \min(\bar\rho\mu, \pi)`, :math:`r_m(s) = \sum_a m\,R`,
    :math:`P_m(s,s') = \sum_a m\,P(s'\mid s,a)`, :math:`D_m = \operatorname{diag}(\sum_a m)` and the
    expected trace kernel :math:`C(s,s') = \sum_a \lambda\min(\bar c\mu, \pi)\,P(s'\mid s,a)`. So
    :math:`\mathcal A = I + (I-\gamma C)^{-1}(\gamma P_m - D_m)` and :math:`b = (I-\gamma C)^{-1}r_m`.
    Its sup-norm modulus is ``A.abs().sum(-1).amax(-1)``; for :math:`\bar c \le \bar\rho`,
    :math:`\mathcal A \ge 0` and the modulus is :math:`1 - (1-\gamma)\min_s[(I-\gamma C)^{-1}D_m\mathbf 1](s)`.

    Args:
        mdp: the MDPs, batch shape ``*B``.
        pi, mu: ``[*B, S, A]`` target and behaviour policies.
        rho_bar: :math:`\bar\rho \in (0, \infty]`.
        c_bar: :math:`\bar c \in (0, \infty]`.
        lam: :math:`\lambda \in [0, 1]`.

    Returns:
        ``(A, b)``: ``[*B, S, S]`` and ``[*B, S]``.

    Chapter: 16_offpolicy_multistep, eq-ch16-vtrace-operator.
    """
    pi, mu = _pair(mdp, pi, mu)
    rho_bar, c_bar = _clip_level(rho_bar, "rho_bar"), _clip_level(c_bar, "c_bar")
    lam = V.real_in(lam, "lam", 0.0, 1.0)
    g = mdp.gamma[..., None, None]
    eye = eye_like(mdp)
    m = _truncated_weights(pi, mu, rho_bar)
    C = lam * torch.einsum("...sa,...sat->...st", _truncated_weights(pi, mu, c_bar), mdp.P)
    Pm = torch.einsum("...sa,...sat->...st", m, mdp.P)
    N_lhs = eye - g * C
    A = eye + torch.linalg.solve(N_lhs, g * Pm - torch.diag_embed(m.sum(-1)))
    b = torch.linalg.solve(N_lhs, (m * mdp.R).sum(-1)[..., None])[..., 0]
    return A, b


def vtrace_fixed_point(mdp: FiniteMDP, pi: Tensor, mu: Tensor, rho_bar: float = 1.0, c_bar: float = 1.0,
                       lam: float = 1.0) -> Tensor:
    r"""The fixed point of the expected V-trace operator, by one linear solve (chapter 16).

    Solves :math:`(I - \mathcal A)V = b` for the map of :func:`vtrace_affine`. Since
    :math:`I - \mathcal A = (I-\gamma C)^{-1}(D_m - \gamma P_m)`, the fixed point solves
    :math:`\sum_a m(a\mid s)\big(R(s,a) + \gamma\sum_{s'}P(s'\mid s,a)V(s') - V(s)\big) = 0`, i.e. it is
    :math:`V^{\pi_{\bar\rho}}` (:func:`truncated_policy`) whatever :math:`\bar c` and :math:`\lambda`
    are: :math:`\bar c` and :math:`\lambda` change only how fast iteration gets there.

    Args:
        mdp, pi, mu, rho_bar, c_bar, lam: as in :func:`vtrace_affine`.

    Returns:
        ``V[*B, S]``.

    Chapter: 16_offpolicy_multistep, prop-ch16-vtrace-fixed-point.
    """
    A, b = vtrace_affine(mdp, pi, mu, rho_bar, c_bar, lam)
    return torch.linalg.solve(eye_like(mdp) - A, b[..., None])[..., 0]


def _sa_kernels(mdp: FiniteMDP, weights: Tensor) -> Tensor:
    r"""``[*B, S*A, S*A]`` with entry :math:`((s,a),(s',a')) = P(s'\mid s,a)\,w(a'\mid s')`."""
    *B, S, A = weights.shape
    return (mdp.P[..., :, None] * weights[..., None, None, :, :]).reshape(*B, S * A, S * A)


def q_trace_affine(mdp: FiniteMDP, pi: Tensor, mu: Tensor, traces: Tensor) -> tuple[Tensor, Tensor]:
    r"""The expected multi-step Q operator with traces :math:`c`, as an affine map on :math:`Q \in \mathbb R^{SA}`.

    The target of :func:`rlkit.offpolicy.off_policy_q_returns` (Retrace, Tree-Backup, Q(lambda), IS:
    :func:`trace_table`), :math:`G = Q(s_0,a_0) + \sum_{t\ge0}\gamma^t(c_1\cdots c_t)\,\delta_t` with
    :math:`\delta_t = r_t + \gamma\,\mathbb E_{a\sim\pi}Q(s_{t+1},a) - Q(s_t,a_t)` and later actions from
    :math:`\mu`, has expectation

    .. math::

        \mathcal R Q = Q + (I - \gamma K)^{-1}\big(R + \gamma P\Pi_\pi Q - Q\big),

    with :math:`(P\Pi_\pi)((s,a),(s',a')) = P(s'\mid s,a)\,\pi(a'\mid s')` and the trace kernel
    :math:`K((s,a),(s',a')) = P(s'\mid s,a)\,\mu(a'\mid s')\,c(s',a')`. Flat index :math:`sA + a`.
    So :math:`\mathcal A = I + (I-\gamma K)^{-1}(\gamma P\Pi_\pi - I)`, :math:`b = (I-\gamma K)^{-1}R`; for
    any traces the fixed point is :math:`Q^\pi` (:func:`q_trace_fixed_point`), and with
    :math:`0 \le c \le \pi/\mu` (Retrace, Tree-Backup) :math:`\mathcal A \ge 0` with modulus at most
    :math:`\gamma` (Munos et al., 2016).

    Args:
        mdp: the MDPs.
        pi, mu: ``[*B, S, A]`` target and behaviour policies.
        traces: ``[*B, S, A]`` finite :math:`c(s,a) \ge 0` (:func:`trace_table`).

    Returns:
        ``(A, b)``: ``[*B, S*A, S*A]`` and ``[*B, S*A]``.

    Chapter: 16_offpolicy_multistep, eq-ch16-retrace-operator.
    """
    pi, mu = _pair(mdp, pi, mu)
    traces = V.float_tensor(traces, "traces", min_dim=0)
    traces = V.exact_shape(V.same_kind(traces, "traces", mdp.P, "mdp.P"), "traces", mdp.policy_shape, "[*B, S, A]")
    V.tensor_in(traces, "traces", 0.0)
    g = mdp.gamma[..., None, None]
    n = mdp.n_states * mdp.n_actions
    eye = torch.eye(n, dtype=mdp.P.dtype, device=mdp.P.device)
    lhs = eye - g * _sa_kernels(mdp, mu * traces)
    A = eye + torch.linalg.solve(lhs, g * _sa_kernels(mdp, pi) - eye)
    b = torch.linalg.solve(lhs, mdp.R.reshape(*mdp.batch_shape, n)[..., None])[..., 0]
    return A, b


def q_trace_fixed_point(mdp: FiniteMDP, pi: Tensor, mu: Tensor, traces: Tensor) -> Tensor:
    r"""The fixed point of :func:`q_trace_affine`'s operator by one linear solve, as ``Q[*B, S, A]``.

    :math:`I - \mathcal A = (I-\gamma K)^{-1}(I - \gamma P\Pi_\pi)`, so the fixed point solves
    :math:`Q = R + \gamma P\Pi_\pi Q`: it is :math:`Q^\pi` for every choice of traces (Retrace,
    Tree-Backup, Q(lambda), IS). What the traces decide is whether and how fast iteration
    converges there (the modulus of :math:`\mathcal A`): with :math:`\pi` and :math:`\mu` far apart and
    :math:`\lambda` large, Q(lambda)'s operator is no longer a sup-norm contraction.

    Args:
        mdp, pi, mu, traces: as in :func:`q_trace_affine`.

    Returns:
        ``Q[*B, S, A]``.

    Chapter: 16_offpolicy_multistep, prop-ch16-retrace-fixed-point.
    """
    A, b = q_trace_affine(mdp, pi, mu, traces)
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    return torch.linalg.solve(eye - A, b[..., None])[..., 0].reshape(mdp.policy_shape)
