r"""Finite-horizon, undiscounted MDPs with time-indexed kernels and policies, and the token MDP.

The :class:`~rlkit.tabular.FiniteHorizonMDP` container, random instances, the token MDP of
autoregressive generation (:func:`~rlkit.tabular.token_mdp`), exact solutions (state
distributions forward, values by backward induction), every term of the finite-horizon
state-shift lemma and single-policy bound (:func:`~rlkit.tabular.finite_horizon_terms`) and the
instance on which that bound is attained. Import the names from :mod:`rlkit.tabular`.

Chapter: 09_single_policy_bound (prop-ch09-finite-horizon).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .. import _validate as V
from .bounds import LowerBound
from .mdp import GammaLike, as_batch, generator_device
from .solve import expected_advantage, tv_distance

Tensor = torch.Tensor

__all__ = [
    "FiniteHorizonMDP",
    "random_finite_horizon_mdp",
    "token_mdp",
    "finite_horizon_state_distributions",
    "finite_horizon_values",
    "finite_horizon_performance",
    "FiniteHorizonTerms",
    "finite_horizon_terms",
    "finite_horizon_tight_example",
]


@dataclass(frozen=True)
class FiniteHorizonMDP:
    r"""A batch of finite-horizon, undiscounted MDPs with time-indexed kernels (chapter 9,
    prop-ch09-finite-horizon).

    An episode has the steps :math:`t = 0, \dots, H-1`: :math:`s_0\sim d_0`, then
    :math:`a_t\sim\pi_t(\cdot\mid s_t)`, reward :math:`R_t(s_t, a_t)` and
    :math:`s_{t+1}\sim P_t(\cdot\mid s_t, a_t)`; the return is
    :math:`J(\pi) = \mathbb E\big[\sum_{t=0}^{H-1} R_t(s_t, a_t)\big]`. Policies are time-indexed,
    ``pi[*B, H, S, A]`` :math:`= \pi_t(a\mid s)`. States that are reachable only at some times (a
    prefix of length :math:`t` in the token MDP, :func:`token_mdp`) are ordinary states of one shared
    set :math:`\{0,\dots,S-1\}`; what happens in a state at a time it cannot be reached never matters.
    The kernel of the last step, ``P[..., H-1, :, :, :]``, is never used (there is no state
    :math:`s_H`), but it must hold distributions.

    Attributes:
        P: ``[*B, H, S, A, S]``, :math:`P_t(s'\mid s, a)`.
        R: ``[*B, H, S, A]``, :math:`R_t(s, a)`.
        rho0: ``[*B, S]``, the initial distribution :math:`d_0(s)` (``rho0`` in code, as in
            :class:`FiniteMDP`).
    """

    P: Tensor
    R: Tensor
    rho0: Tensor

    def __post_init__(self):
        P = V.float_tensor(self.P, "P", min_dim=4)
        sizes = V.layout("... H S A S", P=P)
        V.distribution(P, "P", "P[..., t, s, a, :] is a distribution over next states")
        V.layout("... H S A", sizes, floating=True, R=self.R)
        V.tensor_in(V.same_kind(self.R, "R", P, "P"), "R")
        V.layout("... S", sizes, floating=True, rho0=self.rho0)
        V.distribution(V.same_kind(self.rho0, "rho0", P, "P"), "rho0", "initial state distribution")

    @property
    def batch_shape(self) -> torch.Size:
        r"""The batch shape ``*B``."""
        return self.P.shape[:-4]

    @property
    def horizon(self) -> int:
        r"""The number of steps :math:`H`."""
        return self.P.shape[-4]

    @property
    def n_states(self) -> int:
        r"""The number of states :math:`S`."""
        return self.P.shape[-3]

    @property
    def n_actions(self) -> int:
        r"""The number of actions :math:`A`."""
        return self.P.shape[-2]

    @property
    def policy_shape(self) -> tuple:
        r"""``(*B, H, S, A)``, the shape of a time-indexed policy on this MDP."""
        return (*self.batch_shape, self.horizon, self.n_states, self.n_actions)

    def __getitem__(self, index) -> FiniteHorizonMDP:
        r"""Index the batch dimensions (``IndexError`` if there are none)."""
        if not self.batch_shape:
            raise IndexError("this FiniteHorizonMDP has no batch dimension to index")
        return FiniteHorizonMDP(self.P[index], self.R[index], self.rho0[index])


def random_finite_horizon_mdp(batch: int | Sequence[int], horizon: int, n_states: int, n_actions: int, *,
                              peakiness: float = 2.0, reward_scale: float = 1.0,
                              generator: torch.Generator | None = None,
                              dtype: torch.dtype = torch.float64) -> FiniteHorizonMDP:
    r"""Random finite-horizon MDPs (chapter 9): as :func:`random_mdp`, with an independent kernel
    :math:`P_t(\cdot\mid s, a) = \mathrm{softmax}(c\,z_{t,s,a})` and rewards
    :math:`R_t(s, a) = \sigma_R\,\xi_{t,s,a}` for every step :math:`t < H`, and
    :math:`d_0 = \mathrm{softmax}(\zeta)`.

    Args:
        batch: the batch shape, an int or a sequence of ints, each :math:`\ge 1`.
        horizon: :math:`H\ge1`.
        n_states, n_actions: :math:`S` and :math:`A`, each :math:`\ge 1`.
        peakiness: :math:`c\ge0`.
        reward_scale: :math:`\sigma_R`.
        generator, dtype: the source of randomness (on its device) and the dtype.

    Returns:
        A :class:`FiniteHorizonMDP` with ``P[*batch, H, S, A, S]``.
    """
    batch = as_batch(batch)
    H, S, A = (V.int_in(x, n) for x, n in ((horizon, "horizon"), (n_states, "n_states"),
                                                 (n_actions, "n_actions")))
    V.real_in(peakiness, "peakiness", 0.0)
    V.real_in(reward_scale, "reward_scale")
    gd = generator_device(generator)
    P = torch.softmax(peakiness * torch.randn(*batch, H, S, A, S, generator=generator, dtype=dtype, device=gd), -1)
    R = reward_scale * torch.randn(*batch, H, S, A, generator=generator, dtype=dtype, device=gd)
    rho0 = torch.softmax(torch.randn(*batch, S, generator=generator, dtype=dtype, device=gd), -1)
    return FiniteHorizonMDP(P, R, rho0)


def token_mdp(prompt_probs: Tensor, R: Tensor) -> FiniteHorizonMDP:
    r"""The token MDP of autoregressive generation as a :class:`FiniteHorizonMDP` (chapter 9).

    A prompt :math:`x\in\{0,\dots,X-1\}` is drawn from ``prompt_probs``; at step :math:`t` the state is
    the prefix :math:`(x, y_0, \dots, y_{t-1})`, the action is the next token
    :math:`y_t\in\{0,\dots,V-1\}`, and the transition appends it, deterministically. The prefix of
    length :math:`t` has the flat index :math:`s = xV^t + \sum_{u<t} y_u V^{t-1-u}`, so appending
    :math:`a` maps :math:`s` to :math:`sV + a` and all :math:`S = XV^{H-1}` states of the last step
    fit. A state :math:`s\ge XV^t` is unreachable at step :math:`t` and loops on itself.

    Args:
        prompt_probs: ``[*B, X]``, the prompt distribution (a distribution).
        R: ``[*B, H, X * V**(H-1), V]``, the reward :math:`R_t(s, a)` of appending token :math:`a` to
            prefix :math:`s` at step :math:`t` (a reward on the response alone lives at :math:`t = H-1`).

    Returns:
        A :class:`FiniteHorizonMDP` with :math:`S = XV^{H-1}` states and :math:`A = V` actions.
    """
    prompt_probs = V.float_tensor(prompt_probs, "prompt_probs", min_dim=1)
    R = V.float_tensor(R, "R", min_dim=3)
    sizes = V.layout("... X", prompt_probs=prompt_probs)
    V.layout("... H S A", sizes, R=R)
    V.distribution(prompt_probs, "prompt_probs", "a distribution over prompts")
    H, S, Vo = R.shape[-3], R.shape[-2], R.shape[-1]
    X = prompt_probs.shape[-1]
    if S != X * Vo ** (H - 1):
        raise ValueError(f"R has shape {tuple(R.shape)}: its state dimension must be X * V**(H-1) = "
                         f"{X} * {Vo}**{H - 1} = {X * Vo ** (H - 1)}, got {S}")
    s = torch.arange(S, device=R.device)
    nxt = torch.empty(H, S, Vo, dtype=torch.long, device=R.device)
    for t in range(H):
        append = (s[:, None] * Vo + torch.arange(Vo, device=R.device)) if t < H - 1 else s[:, None].expand(S, Vo)
        nxt[t] = torch.where((s < X * Vo ** t)[:, None] & (t < H - 1), append, s[:, None])
    P = torch.zeros(H, S, Vo, S, dtype=R.dtype, device=R.device)
    P.scatter_(-1, nxt[..., None], 1.0)
    B = tuple(prompt_probs.shape[:-1])
    rho0 = torch.zeros(*B, S, dtype=R.dtype, device=R.device)
    rho0[..., :X] = prompt_probs
    return FiniteHorizonMDP(P.expand(*B, H, S, Vo, S).clone(), R, rho0)


def _fh_check_policy(mdp: FiniteHorizonMDP, pi: Tensor, name: str) -> Tensor:
    V.instance_of(mdp, "mdp", FiniteHorizonMDP, "rlkit.tabular.FiniteHorizonMDP")
    return V.distribution(V.same_kind(V.float_tensor(pi, name, min_dim=3), name, mdp.P, "mdp.P"), name,
                          "pi[..., t, s, :] is a distribution over actions", shape=mdp.policy_shape)


def finite_horizon_state_distributions(mdp: FiniteHorizonMDP, pi: Tensor) -> Tensor:
    r"""The state distribution at every step (chapter 9, prop-ch09-finite-horizon):
    :math:`d_{\pi,0} = d_0` and :math:`d_{\pi,t+1}(s') = \sum_{s,a}d_{\pi,t}(s)\,\pi_t(a\mid s)\,P_t(s'\mid s, a)`,
    so :math:`d_{\pi,t}(s) = \Pr_\pi(s_t = s)`.

    Args:
        mdp: the MDPs.
        pi: ``[*B, H, S, A]``, time-indexed policies.

    Returns:
        ``mu[*B, H, S]``; every ``mu[..., t, :]`` is a distribution.
    """
    pi = _fh_check_policy(mdp, pi, "pi")
    Ppi = torch.einsum("...tsa,...tsaz->...tsz", pi, mdp.P)
    mu = [mdp.rho0]
    for t in range(mdp.horizon - 1):
        mu.append(torch.einsum("...s,...sz->...z", mu[-1], Ppi[..., t, :, :]))
    return torch.stack(mu, -2)


def finite_horizon_values(mdp: FiniteHorizonMDP, pi: Tensor) -> tuple[Tensor, Tensor]:
    r"""Values by backward induction (chapter 9, prop-ch09-finite-horizon):

    .. math::

        V^\pi_H = 0,\qquad Q^\pi_t(s, a) = R_t(s, a) + \sum_{s'} P_t(s'\mid s, a)\,V^\pi_{t+1}(s'),\qquad
        V^\pi_t(s) = \sum_a \pi_t(a\mid s)\,Q^\pi_t(s, a),

    so :math:`V^\pi_t(s)` is the expected reward still to come from step :math:`t`, and
    :math:`A^\pi_t = Q^\pi_t - V^\pi_t`.

    Args:
        mdp: the MDPs.
        pi: ``[*B, H, S, A]``.

    Returns:
        ``(V, Q)``: ``V[*B, H + 1, S]`` (the last row is 0) and ``Q[*B, H, S, A]``.
    """
    pi = _fh_check_policy(mdp, pi, "pi")
    Vs = [torch.zeros_like(mdp.rho0)]
    Qs = []
    for t in reversed(range(mdp.horizon)):
        Q = mdp.R[..., t, :, :] + torch.einsum("...saz,...z->...sa", mdp.P[..., t, :, :, :], Vs[0])
        Qs.insert(0, Q)
        Vs.insert(0, (pi[..., t, :, :] * Q).sum(-1))
    return torch.stack(Vs, -2), torch.stack(Qs, -3)


def finite_horizon_performance(mdp: FiniteHorizonMDP, pi: Tensor) -> Tensor:
    r"""The undiscounted return :math:`J(\pi) = \mathbb E\big[\sum_{t<H} R_t(s_t, a_t)\big] = \sum_s d_0(s)\,V^\pi_0(s)`
    (chapter 9).

    Args:
        mdp: the MDPs.
        pi: ``[*B, H, S, A]``.

    Returns:
        ``J[*B]``.
    """
    v = finite_horizon_values(mdp, pi)[0][..., 0, :]
    return (mdp.rho0 * v).sum(-1)


@dataclass
class FiniteHorizonTerms(LowerBound):
    r"""Every term of the finite-horizon state-shift lemma and single-policy bound (chapter 9,
    prop-ch09-finite-horizon), from :func:`finite_horizon_terms`.

    Per-step fields are ``[*B, H]`` (``mu_old``, ``mu_new``, ``tv``, ``abar``: ``[*B, H, S]``); the
    rest are ``[*B]``. Below, :math:`\pi_k` is ``pi_old``, :math:`\pi` is ``pi_new``,
    :math:`\mathrm{TV}_t = \mathbb E_{s\simd_{\pi_k,t}}[D_{\mathrm{TV}}(\pi_t, \pi_{k,t}; s)]` and
    :math:`\bar A_t(s) = \mathbb E_{a\sim\pi_t(\cdot\mid s)}[A^{\pi_k}_t(s, a)]`.

    Attributes:
        horizon: :math:`H` (a Python int).
        J_old, J_new: :math:`J(\pi_k)`, :math:`J(\pi)`.
        improvement: :math:`J(\pi) - J(\pi_k)`.
        surrogate: :math:`L_{\pi_k}(\pi) = \sum_t \mathbb E_{s\simd_{\pi_k,t}}[\bar A_t(s)]` (eq-ch09-fh-surrogate).
        mu_old, mu_new: :math:`d_{\pi_k,t}(s)`, :math:`d_{\pi,t}(s)`.
        tv: :math:`D_{\mathrm{TV}}(\pi_t, \pi_{k,t}; s)`.
        abar: :math:`\bar A_t(s)`.
        eps_t: :math:`\omega_t = \max_s|\bar A_t(s)|`.
        eps: :math:`\omega = \max_t\omega_t`.
        expected_tv_t: :math:`\mathrm{TV}_t`.
        expected_tv_new_t: :math:`\mathbb E_{s\simd_{\pi,t}}[D_{\mathrm{TV}}(\pi_t, \pi_{k,t}; s)]`.
        mean_tv: :math:`\overline{\mathrm{TV}} = \frac1H\sum_t\mathrm{TV}_t`, the expected TV under the normalised
            visitation :math:`d_{\pi_k}(t, s) = d_{\pi_k,t}(s)/H`.
        state_shift_t: :math:`\|d_{\pi,t} - d_{\pi_k,t}\|_1`.
        lemma_bound_t: :math:`2\sum_{u<t}\mathrm{TV}_u`, the right-hand side of eq-ch09-fh-shift.
        penalty_per_step: :math:`\sum_{t}\omega_t\cdot 2\sum_{u<t}\mathrm{TV}_u`, the sharpest form.
        penalty: :math:`2\omega\sum_{t=0}^{H-2}(H-1-t)\,\mathrm{TV}_t`, the penalty of eq-ch09-fh-bound.
        penalty_mean: :math:`2\omega H(H-1)\,\overline{\mathrm{TV}}`, the loosest form (one constant times the
            average TV, the analogue of
            :math:`\frac{2\gamma\omega}{(1-\gamma)^2}\mathbb E_{d_{\pi_k}}[D_{\mathrm{TV}}]`).
        bound: ``surrogate - penalty``.
    """

    horizon: int
    J_old: Tensor
    J_new: Tensor
    improvement: Tensor
    surrogate: Tensor
    mu_old: Tensor
    mu_new: Tensor
    tv: Tensor
    abar: Tensor
    eps_t: Tensor
    eps: Tensor
    expected_tv_t: Tensor
    expected_tv_new_t: Tensor
    mean_tv: Tensor
    state_shift_t: Tensor
    lemma_bound_t: Tensor
    penalty_per_step: Tensor
    penalty: Tensor
    penalty_mean: Tensor
    bound: Tensor

    @property
    def tightness(self) -> Tensor:
        r""":math:`\tau = \big(L_{\pi_k}(\pi) - (J(\pi) - J(\pi_k))\big)/\text{penalty}\in[-1, 1]`; 1 means
        the lower bound eq-ch09-fh-bound is attained. NaN where the penalty is 0."""
        pen = self.penalty
        return torch.where(pen > 0, (self.surrogate - self.improvement) / pen.clamp_min(1e-300),
                           torch.full_like(pen, float("nan")))


def finite_horizon_terms(mdp: FiniteHorizonMDP, pi_old: Tensor, pi_new: Tensor) -> FiniteHorizonTerms:
    r"""Solve both policies exactly and return every term of the finite-horizon bounds (chapter 9,
    prop-ch09-finite-horizon). The state-shift lemma, eq-ch09-fh-shift,

    .. math::

        \big\|d_{\pi,t} - d_{\pi_k,t}\big\|_1 \le 2\sum_{u<t}\mathrm{TV}_u,\qquad
        \mathrm{TV}_u = \mathbb E_{s\simd_{\pi_k,u}}\big[D_{\mathrm{TV}}(\pi_u, \pi_{k,u}; s)\big],

    and the single-policy bound, eq-ch09-fh-bound,

    .. math::

        \big|J(\pi) - J(\pi_k) - L_{\pi_k}(\pi)\big| \le 2\omega\sum_{t=0}^{H-2}(H-1-t)\,\mathrm{TV}_t
        \le 2\omega\,H(H-1)\,\overline{\mathrm{TV}},\qquad
        \omega = \max_{t,s}\big|\mathbb E_{a\sim\pi_t(\cdot\mid s)}A^{\pi_k}_t(s, a)\big|.

    Args:
        mdp: the MDPs.
        pi_old: ``[*B, H, S, A]``, :math:`\pi_k`.
        pi_new: ``[*B, H, S, A]``, :math:`\pi`.

    Returns:
        A :class:`FiniteHorizonTerms`.
    """
    pi_old = _fh_check_policy(mdp, pi_old, "pi_old")
    pi_new = _fh_check_policy(mdp, pi_new, "pi_new")
    H = mdp.horizon
    V_old, Q_old = finite_horizon_values(mdp, pi_old)
    A_old = Q_old - V_old[..., :H, :, None]
    mu_old = finite_horizon_state_distributions(mdp, pi_old)
    mu_new = finite_horizon_state_distributions(mdp, pi_new)
    J_old = (mdp.rho0 * V_old[..., 0, :]).sum(-1)
    J_new = finite_horizon_performance(mdp, pi_new)
    tv = tv_distance(pi_new, pi_old)
    abar = expected_advantage(pi_new, A_old)
    eps_t = abar.abs().amax(-1)
    eps = eps_t.amax(-1)
    delta = (mu_old * tv).sum(-1)
    before = torch.cumsum(delta, -1) - delta                        # sum_{u < t} delta_u
    weights = torch.arange(H - 1, -1, -1, dtype=delta.dtype, device=delta.device)   # H - 1 - t
    L = (mu_old * abar).sum((-1, -2))
    pen = 2 * eps * (weights * delta).sum(-1)
    return FiniteHorizonTerms(
        horizon=H, J_old=J_old, J_new=J_new, improvement=J_new - J_old, surrogate=L, mu_old=mu_old,
        mu_new=mu_new, tv=tv, abar=abar, eps_t=eps_t, eps=eps, expected_tv_t=delta,
        expected_tv_new_t=(mu_new * tv).sum(-1), mean_tv=delta.mean(-1),
        state_shift_t=(mu_new - mu_old).abs().sum(-1), lemma_bound_t=2 * before,
        penalty_per_step=(eps_t * 2 * before).sum(-1), penalty=pen,
        penalty_mean=2 * eps * H * (H - 1) * delta.mean(-1), bound=L - pen)


def finite_horizon_tight_example(horizon: int, switch: GammaLike = 0.3, eta: GammaLike = 1e-3,
                                 c: GammaLike = 1.0, *, switch_time: int = 0, dtype: torch.dtype = torch.float64):
    r"""The finite-horizon analogue of :func:`tight_example`, on which eq-ch09-fh-bound is attained as
    :math:`\eta\to0` for every switch time :math:`u` (chapter 9, prop-ch09-finite-horizon).

    States: 0 = start, 1 = :math:`X`, 2 = :math:`Y`, rewards and policies as in :func:`tight_example`
    (in :math:`X` action 1 pays :math:`1-c`, in :math:`Y` it pays :math:`1 + c/\eta`; both old and new
    policies play action 0 in the start state before step :math:`u`, which keeps it there). At step
    :math:`u` = ``switch_time`` the start state is left: action 0 leads to :math:`X`, action 1 to
    :math:`Y`; :math:`\pi_k` plays action 1, :math:`\pi` plays action 0 with probability :math:`p`.
    With :math:`n = H - 1 - u` steps left after the switch,

    .. math::

        L_{\pi_k}(\pi) = nc,\qquad J(\pi) - J(\pi_k) = nc\,(1-2p),\qquad
        \text{penalty} = 2c\Big(np + \eta\,\frac{n(n-1)}{2}\Big),

    so :math:`\tau = p/\big(p + \eta(n-1)/2\big)\to1`. The lemma is tight too:
    :math:`\|d_{\pi,t} - d_{\pi_k,t}\|_1 = 2p` for :math:`t > u`, against :math:`2p + 2(t-1-u)\eta`.

    Each of ``switch``, ``eta``, ``c`` is a float or a 1-D tensor ``[B]`` (tensors the same length).

    Args:
        horizon: :math:`H\ge2`.
        switch: :math:`p\in(0, 1]`.
        eta: :math:`\eta\in(0, 1)`.
        c: :math:`c > 0`.
        switch_time: :math:`u\in\{0,\dots,H-2\}`.
        dtype: a floating dtype.

    Returns:
        ``(mdp, pi_old, pi_new)``: a :class:`FiniteHorizonMDP` with :math:`S = 3`, :math:`A = 2`, and
        policies ``[*B, H, 3, 2]``.
    """
    V.floating_dtype(dtype, "dtype")
    H = V.int_in(horizon, "horizon", 2)
    u = V.int_in(switch_time, "switch_time", 0, H - 2)
    tensors = {k: v for k, v in dict(switch=switch, eta=eta, c=c).items()
               if isinstance(v, torch.Tensor) and v.dim() > 0}
    shape = V.layout("B", **tensors).get("B", ())
    shape = (shape,) if isinstance(shape, int) else shape
    like = torch.empty((), dtype=dtype)
    sw = V.per_batch(switch, "switch", shape, like, 0.0, 1.0, lo_open=True)
    et = V.per_batch(eta, "eta", shape, like, 0.0, 1.0, lo_open=True, hi_open=True)
    cc = V.per_batch(c, "c", shape, like, 0.0, lo_open=True)
    P = torch.zeros(*shape, H, 3, 2, 3, dtype=dtype)
    P[..., :, 1, :, 1] = 1.0                   # X absorbing
    P[..., :, 2, :, 2] = 1.0                   # Y absorbing
    P[..., :, 0, :, 0] = 1.0                   # the start state waits ...
    P[..., u, 0, :, :] = 0.0
    P[..., u, 0, 0, 1] = 1.0                   # ... until step u: action 0 -> X
    P[..., u, 0, 1, 2] = 1.0                   #                   action 1 -> Y
    one, zero = torch.ones(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
    R1 = torch.stack([torch.stack([zero, zero], -1), torch.stack([one, 1 - cc], -1),
                      torch.stack([one, 1 + cc / et], -1)], -2)
    R = R1[..., None, :, :].expand(*shape, H, 3, 2).clone()
    rho0 = torch.stack([one, zero, zero], -1)
    stay = torch.stack([one, zero], -1)
    old = torch.stack([stay, stay, stay], -2)[..., None, :, :].expand(*shape, H, 3, 2).clone()
    old[..., u, 0, :] = torch.stack([zero, one], -1)
    new = torch.stack([stay, torch.stack([zero, one], -1), torch.stack([1 - et, et], -1)], -2)
    new = new[..., None, :, :].expand(*shape, H, 3, 2).clone()
    new[..., u, 0, :] = torch.stack([sw, 1 - sw], -1)
    return FiniteHorizonMDP(P, R, rho0), old, new
