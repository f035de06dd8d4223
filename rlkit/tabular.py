r"""Finite MDPs solved exactly, in batches, and the bounds of Part II checked on them.

Everything here is a dense linear-algebra computation in torch (float64 by default), batched over
any number of leading dimensions, so that thousands of MDP/policy pairs are solved in one call of
``torch.linalg.solve`` on a ``[B, S, S]`` tensor.

Shapes and conventions (``*B`` is any batch shape, the same for every argument of one call; the
symbols are the book's, chapter 9):

* transition kernel ``P[*B, s, a, s']`` :math:`= P(s'\mid s, a)`, rewards ``R[*B, s, a]``
  :math:`= R(s, a)`, initial distribution ``rho0[*B, s]`` :math:`= d_0(s)`, discount
  ``gamma`` :math:`= \gamma \in [0, 1)` (a float or a tensor ``[*B]``);
* a policy is a tensor ``pi[*B, s, a]`` :math:`= \pi(a\mid s)`;
* the return has no :math:`1-\gamma` factor in front:
  :math:`J(\pi) = \mathbb E\big[\sum_{t\ge0}\gamma^t r_t\big]`, :math:`s_0\simd_0`;
* the discounted state visitation is NORMALISED (chapter 9, eq-ch09-visitation and eq-ch09-J-d):

  .. math::

      d_\pi(s) = (1-\gamma)\sum_{t\ge0}\gamma^t \Pr(s_t = s),\qquad \sum_s d_\pi(s) = 1,\qquad
      J(\pi) = \frac{1}{1-\gamma}\,\mathbb E_{s\sim d_\pi,\ a\sim\pi(\cdot\mid s)}\big[R(s, a)\big];

* the total-variation distance is taken per state, with its factor one half:
  :math:`D_{\mathrm{TV}}(p, q; s) = \tfrac12\sum_a |p(a\mid s) - q(a\mid s)|`.

Mixtures of :math:`M` policies live on the augmented state space
:math:`\tilde{\mathcal S} = \mathcal S\times\mathcal I` (chapters 10 and 11); an augmented state
:math:`(s, i)` has the flat index :math:`sM + i`, so ``x.reshape(*B, S, M)`` recovers the two
coordinates of any per-augmented-state tensor ``x[*B, S * M]``.

Chapters: 09_single_policy_bound (performance difference lemma, single-policy bound),
10_static_mixtures (static mixtures), 11_dynamic_mixing (dynamic mixing, :math:`U_k` and
:math:`S_k`).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from . import _validate
from . import _validate as V  # q_value's argument V shadows the alias there: it uses _validate
from .staleness import half_abs_ratio_diff

Tensor = torch.Tensor
GammaLike = float | Tensor

__all__ = [
    "FiniteMDP",
    "random_mdp",
    "random_policy",
    "perturb_policy",
    "uniform_policy",
    "contextual_bandit",
    "tight_example",
    "softmax_step",
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
    "SinglePolicyTerms",
    "single_policy_terms",
    "trajectory_kernel",
    "step_kernel",
    "lift_policy",
    "augment",
    "StaticMixtureTerms",
    "static_mixture_terms",
    "DynamicMixtureTerms",
    "dynamic_mixture_terms",
    "sample_state_actions",
    "estimate_update_and_staleness",
    "FiniteHorizonMDP",
    "random_finite_horizon_mdp",
    "token_mdp",
    "finite_horizon_state_distributions",
    "finite_horizon_values",
    "finite_horizon_performance",
    "FiniteHorizonTerms",
    "finite_horizon_terms",
    "finite_horizon_tight_example",
    "tight_mixture_example",
    "CurrentAdvantageTerms",
    "current_advantage_terms",
    "TRACE_KINDS",
    "truncated_policy",
    "trace_table",
    "vtrace_affine",
    "vtrace_fixed_point",
    "q_trace_affine",
    "q_trace_fixed_point",
]



_POLICY = "pi[..., s, :] is a distribution over actions"


def _as_gamma(gamma: GammaLike, batch_shape: torch.Size, like: Tensor) -> Tensor:
    """``gamma`` (a number or one per batch element) as a ``[*B]`` tensor in ``[0, 1)``."""
    return V.per_batch(gamma, "gamma", batch_shape, like, 0.0, 1.0, hi_open=True)


# --------------------------------------------------------------------------------------------
# the MDP container
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FiniteMDP:
    r"""A batch of finite discounted MDPs (chapter 9).

    The constructor validates the shapes and that ``P`` and ``rho0`` are distributions; a float
    ``gamma`` is expanded to the batch shape.

    Attributes:
        P: ``[*B, S, A, S]`` transition probabilities :math:`P(s'\mid s, a)`.
        R: ``[*B, S, A]`` expected rewards :math:`R(s, a)`.
        rho0: ``[*B, S]`` initial-state distribution :math:`d_0(s)`.
        gamma: ``[*B]`` discounts :math:`\gamma\in[0, 1)`.
    """

    P: Tensor
    R: Tensor
    rho0: Tensor
    gamma: Tensor

    def __post_init__(self):
        P = V.float_tensor(self.P, "P", min_dim=3)
        sizes = V.layout("... S A S", P=P)
        V.distribution(P, "P", "P[..., s, a, :] is a distribution over next states")
        V.layout("... S A", sizes, floating=True, R=self.R)
        V.all_finite(V.same_kind(self.R, "R", P, "P"), "R")
        V.layout("... S", sizes, floating=True, rho0=self.rho0)
        V.distribution(V.same_kind(self.rho0, "rho0", P, "P"), "rho0", "initial state distribution")
        object.__setattr__(self, "gamma", _as_gamma(self.gamma, sizes["..."], P))

    @property
    def batch_shape(self) -> torch.Size:
        r"""The batch shape ``*B`` (``torch.Size([])`` for a single MDP)."""
        return self.P.shape[:-3]

    @property
    def policy_shape(self) -> tuple:
        r"""``(*B, S, A)``, the shape of a policy on this MDP."""
        return (*self.batch_shape, self.n_states, self.n_actions)

    @property
    def n_states(self) -> int:
        r"""The number of states :math:`S = |\mathcal S|`."""
        return self.P.shape[-3]

    @property
    def n_actions(self) -> int:
        r"""The number of actions :math:`A = |\mathcal A|`."""
        return self.P.shape[-2]

    def to(self, *args, **kwargs) -> FiniteMDP:
        r"""A copy with every field moved by ``Tensor.to(*args, **kwargs)`` (a device, a dtype), validated."""
        return FiniteMDP(*(getattr(self, f.name).to(*args, **kwargs) for f in fields(self)))

    def __getitem__(self, index) -> FiniteMDP:
        r"""Index the batch dimensions, e.g. ``mdp[3]`` or ``mdp[:10]`` (``IndexError`` if there are none)."""
        if not self.batch_shape:
            raise IndexError("this FiniteMDP has no batch dimension to index")
        return FiniteMDP(self.P[index], self.R[index], self.rho0[index], self.gamma[index])


def _gen_device(generator: torch.Generator | None) -> torch.device:
    return generator.device if generator is not None else torch.device("cpu")


def _as_batch(batch) -> tuple:
    """``batch`` (an int or a tuple of ints, each >= 1) as a tuple."""
    if not isinstance(batch, (list, tuple)):
        return (V.positive_int(batch, "batch"),)
    return tuple(V.positive_int(b, f"batch[{i}]") for i, b in enumerate(batch))


def random_mdp(batch: int | Sequence[int], n_states: int, n_actions: int, gamma: GammaLike = 0.9, *,
               peakiness: float = 2.0, reward_scale: float = 1.0, generator: torch.Generator | None = None,
               dtype: torch.dtype = torch.float64, device=None) -> FiniteMDP:
    r"""Sample a batch of random finite MDPs (chapter 9).

    .. math::

        P(\cdot\mid s, a) = \mathrm{softmax}(c\, z_{s,a}),\qquad
        R(s, a) = \sigma_R\,\xi_{s,a},\qquad
        d_0 = \mathrm{softmax}(\zeta),

    with :math:`c` = ``peakiness``, :math:`\sigma_R` = ``reward_scale``, and independent
    :math:`z_{s,a}\sim\mathcal N(0, I_S)`, :math:`\xi_{s,a}\sim\mathcal N(0, 1)`,
    :math:`\zeta\sim\mathcal N(0, I_S)`; a large ``peakiness`` gives nearly deterministic
    transitions. Random numbers come from ``generator`` (on its own device), then move
    to ``device``.

    Args:
        batch: the batch shape, an int or a sequence of ints, each :math:`\ge 1`.
        n_states, n_actions: :math:`S` and :math:`A`, each :math:`\ge 1`.
        gamma: the discount :math:`\gamma\in[0, 1)`, a float or a tensor of shape ``batch``.
        peakiness: :math:`\ge 0`; 0 gives uniform transitions.
        reward_scale: standard deviation of the rewards.
        generator, dtype, device: where the random numbers come from, their dtype, the result's device.

    Returns:
        A :class:`FiniteMDP` with ``P[*batch, S, A, S]``, ``R[*batch, S, A]``, ``rho0[*batch, S]``.
    """
    batch = _as_batch(batch)
    V.positive_int(n_states, "n_states")
    V.positive_int(n_actions, "n_actions")
    V.real_in(peakiness, "peakiness", 0.0)
    V.real_in(reward_scale, "reward_scale")
    gd = _gen_device(generator)
    z = torch.randn(*batch, n_states, n_actions, n_states, generator=generator, dtype=dtype, device=gd)
    P = torch.softmax(peakiness * z, dim=-1)
    R = reward_scale * torch.randn(*batch, n_states, n_actions, generator=generator, dtype=dtype, device=gd)
    rho0 = torch.softmax(torch.randn(*batch, n_states, generator=generator, dtype=dtype, device=gd), dim=-1)
    return FiniteMDP(P, R, rho0, gamma).to(device if device is not None else gd)


def random_policy(batch: int | Sequence[int], n_states: int, n_actions: int, *, temperature: float = 1.0,
                  generator: torch.Generator | None = None, dtype: torch.dtype = torch.float64,
                  device=None) -> Tensor:
    r"""A batch of random softmax policies (chapter 9).

    .. math::

        \pi(\cdot\mid s) = \mathrm{softmax}(z_s/\text{temperature}),\qquad z_s\sim\mathcal N(0, I_A).

    Args:
        batch: the batch shape, an int or a sequence of ints, each :math:`\ge 1`.
        n_states, n_actions: :math:`S` and :math:`A`, each :math:`\ge 1`.
        temperature: :math:`> 0`; small values give nearly deterministic policies.
        generator, dtype, device: as in :func:`random_mdp`.

    Returns:
        ``pi[*batch, S, A]``; every action has positive probability.
    """
    batch = _as_batch(batch)
    V.positive_int(n_states, "n_states")
    V.positive_int(n_actions, "n_actions")
    V.real_in(temperature, "temperature", 0.0, lo_open=True)
    z = torch.randn(*batch, n_states, n_actions, generator=generator, dtype=dtype, device=_gen_device(generator))
    pi = torch.softmax(z / temperature, dim=-1)
    return pi.to(device) if device is not None else pi


def uniform_policy(mdp: FiniteMDP) -> Tensor:
    r"""The uniform policy :math:`\pi(a\mid s) = 1/A`, shape ``[*B, S, A]`` (chapter 9)."""
    return torch.full((*mdp.batch_shape, mdp.n_states, mdp.n_actions), 1.0 / mdp.n_actions,
                      dtype=mdp.P.dtype, device=mdp.P.device)


def perturb_policy(pi: Tensor, step: float | Tensor, *, generator: torch.Generator | None = None) -> Tensor:
    r"""A nearby random policy (chapter 9).

    .. math::

        \pi'(\cdot\mid s) = \mathrm{softmax}\big(\log\pi(\cdot\mid s) + \text{step}\cdot z_s\big),
        \qquad z_s\sim\mathcal N(0, I_A),

    so ``step = 0`` returns ``pi``. Log-probabilities are floored at -50, so that a deterministic
    ``pi`` does not produce NaN.

    Args:
        pi: ``[*B, S, A]``, rows are distributions.
        step: how far the new policy moves: a float, or a tensor of shape ``pi.shape[:-2]`` (one size
            per batch element).
        generator: the source of :math:`z`.

    Returns:
        ``[*B, S, A]``.
    """
    pi = V.float_tensor(pi, "pi", min_dim=2)
    V.distribution(pi, "pi", "pi[..., s, :] is a distribution over actions")
    step = V.per_batch(step, "step", pi.shape[:-2], pi)[..., None, None]
    z = torch.randn(pi.shape, generator=generator, dtype=pi.dtype, device=_gen_device(generator)).to(pi.device)
    return torch.softmax(torch.log(pi).clamp_min(-50.0) + step * z, dim=-1)


# --------------------------------------------------------------------------------------------
# hand-built MDPs
# --------------------------------------------------------------------------------------------
def contextual_bandit(rho0: Tensor, R: Tensor, gamma: GammaLike = 0.9) -> FiniteMDP:
    r"""The single-turn LLM setting as an MDP (chapter 9): a prompt :math:`s\simd_0`, one response
    :math:`a`, reward :math:`R(s, a)`, then a fresh prompt whatever the response was,

    .. math::

        P(s'\mid s, a) = d_0(s').

    The state distribution does not depend on the policy (:math:`d_\pi = d_0` for every
    :math:`\pi`), so the surrogate is exact (eq-ch09-surrogate-error vanishes) and every state-shift
    penalty is pure slack.

    Args:
        rho0: ``[*B, S]``, the prompt distribution :math:`d_0`.
        R: ``[*B, S, A]``.
        gamma: :math:`\gamma\in[0, 1)`, a float or ``[*B]``.

    Returns:
        A :class:`FiniteMDP`.
    """
    rho0 = V.float_tensor(rho0, "rho0", min_dim=1)
    R = V.float_tensor(R, "R", min_dim=2)
    S, A = R.shape[-2], R.shape[-1]
    V.layout("... S A", V.layout("... S", rho0=rho0), R=R)
    P = rho0[..., None, None, :].expand(*rho0.shape[:-1], S, A, S).clone()
    return FiniteMDP(P, R, rho0, gamma)


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


def softmax_step(pi: Tensor, adv: Tensor, step: float | Tensor) -> Tensor:
    r"""One exact natural-policy-gradient (mirror-ascent) step for a tabular softmax policy (chapter 9):

    .. math::

        \pi'(a\mid s) \propto \pi(a\mid s)\,\exp\big(\text{step}\cdot A(s, a)\big).

    With ``adv`` :math:`= A^\pi`, the surrogate :math:`L_\pi(\pi')` rises for small ``step`` by
    about :math:`\text{step}\cdot\mathbb E_{s\sim d_\pi}[\operatorname{Var}_{a\sim\pi}A^\pi(s, a)]/(1-\gamma)`;
    this is the update a trainer would make, used in chapters 9-11 to produce realistic new
    policies. Log-probabilities are floored at -50 so that zeros in ``pi`` stay (numerically) zero
    without NaN.

    Args:
        pi: ``[*B, S, A]``.
        adv: ``[*B, S, A]``, the advantages :math:`A(s, a)` to step along.
        step: a float or ``[*B]``.

    Returns:
        ``[*B, S, A]``.
    """
    V.layout("... S A", floating=True, pi=pi, adv=adv)
    step = V.per_batch(step, "step", pi.shape[:-2], pi)[..., None, None]
    return torch.softmax(torch.log(pi).clamp_min(-50.0) + step * adv, dim=-1)


# --------------------------------------------------------------------------------------------
# exact policy evaluation
# --------------------------------------------------------------------------------------------
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
    pi = V.distribution(pi, "pi", _POLICY, shape=mdp.policy_shape)
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
    pi = V.distribution(pi, "pi", _POLICY, shape=mdp.policy_shape)
    return (pi * mdp.R).sum(-1)


def _eye_like(mdp: FiniteMDP) -> Tensor:
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
    lhs = _eye_like(mdp) - mdp.gamma[..., None, None] * Ppi
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
        _validate.exact_shape(_validate.float_tensor(V, "V"), "V", (*mdp.batch_shape, mdp.n_states), "[*B, S]")
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
    return (mdp.rho0 * value(mdp, pi)).sum(-1)


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
    lhs = (_eye_like(mdp) - mdp.gamma[..., None, None] * Ppi).transpose(-1, -2)
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
    g = _as_gamma(gamma, d_old.shape[:-1], d_old)
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
    return surrogate(visitation(mdp, pi_new), pi_new, advantage(mdp, pi_old), mdp.gamma)


# --------------------------------------------------------------------------------------------
# Chapter 9: every term of the state-shift lemma and the single-policy bound
# --------------------------------------------------------------------------------------------

class _LowerBound:
    """``slack`` of a dataclass with ``improvement`` and its lower ``bound``."""

    @property
    def slack(self) -> Tensor:
        r"""``improvement - bound``; the bound says it is :math:`\ge 0`."""
        return self.improvement - self.bound


@dataclass
class SinglePolicyTerms(_LowerBound):
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
    V.distribution(pi_old, "pi_old", _POLICY, shape=mdp.policy_shape)
    V.distribution(pi_new, "pi_new", _POLICY, shape=mdp.policy_shape)
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


# --------------------------------------------------------------------------------------------
# Chapters 10-11: mixtures of M policies on the augmented state space S x I
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
    return torch.eye(V.positive_int(n_versions, "n_versions"), dtype=dtype, device=device)


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
    V.positive_int(n_versions, "n_versions")
    *B, S, A = pi.shape
    return pi[..., :, None, :].expand(*B, S, n_versions, A).reshape(*B, S * n_versions, A)


def _check_mixture(mdp: FiniteMDP, policies: Tensor, alpha: Tensor, kernel: Tensor):
    """Check a mixture of ``M`` policies against ``mdp``; return ``(policies, alpha, kernel, M)`` with a
    shared ``alpha [M]`` / ``kernel [M, M]`` expanded to the batch."""
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


@dataclass
class StaticMixtureTerms(_LowerBound):
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
    sizes = {"...": tuple(mdp.batch_shape), "S": mdp.n_states, "A": mdp.n_actions}
    M = V.layout("... M S A", sizes, floating=True, policies=policies)["M"]
    kernel = trajectory_kernel(M, dtype=mdp.P.dtype, device=mdp.P.device)
    policies, alpha, _, M = _check_mixture(mdp, policies, alpha, kernel)
    V.distribution(pi_new, "pi_new", _POLICY, shape=mdp.policy_shape)
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
    V.distribution(pi_old, "pi_old", _POLICY, shape=mdp.policy_shape)
    V.distribution(pi_new, "pi_new", _POLICY, shape=mdp.policy_shape)
    aug, beta = augment(mdp, policies, alpha, kernel)
    M = aug.n_states // mdp.n_states
    *B, S, A = mdp.R.shape
    g = mdp.gamma
    new_l, old_l = lift_policy(pi_new, M), lift_policy(pi_old, M)
    V_b = value(aug, beta)
    A_b = q_value(aug, beta, V_b) - V_b[..., None]
    d_b = visitation(aug, beta)
    abar = expected_advantage(new_l, A_b)
    eps = abar.abs().amax(-1)
    L = (d_b * abar).sum(-1) / (1 - g)
    tv_nb = (d_b * tv_distance(new_l, beta)).sum(-1)
    U = (d_b * tv_distance(new_l, old_l)).sum(-1)
    Sk = (d_b * tv_distance(old_l, beta)).sum(-1)
    V_old = value(mdp, pi_old)
    A_old = q_value(mdp, pi_old, V_old) - V_old[..., None]
    a_inf = A_old.abs().amax((-1, -2))
    J_old = (mdp.rho0 * V_old).sum(-1)
    J_new = performance(mdp, pi_new)
    J_mix = (aug.rho0 * V_b).sum(-1)
    c1 = 2 * g * eps / (1 - g) ** 2
    c_inf = 2 * a_inf / (1 - g)
    return DynamicMixtureTerms(
        gamma=g, J_old=J_old, J_new=J_new, J_mix=J_mix, improvement=J_new - J_old, surrogate=L, eps=eps,
        adv_old_max=a_inf, tv_new_behaviour=tv_nb, U=U, S=Sk, mixture_gap=J_mix - J_old,
        mixture_gap_bound=c_inf * Sk, bound_thm41=L - c1 * tv_nb - c_inf * Sk,
        bound_cor42=L - c1 * U - (c1 + c_inf) * Sk, d_beta=d_b.reshape(*B, S, M),
        adv_beta=A_b.reshape(*B, S, M, A))


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
    V.positive_int(n, "n")
    V.distribution(d, "d", "state distribution")
    V.distribution(behaviour, "behaviour", "behaviour[..., s, :] is a distribution over actions")
    dev = _gen_device(generator)
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
    V.distribution(pi_old, "pi_old", _POLICY, shape=mdp.policy_shape)
    V.distribution(pi_new, "pi_new", _POLICY, shape=mdp.policy_shape)
    aug, beta = augment(mdp, policies, alpha, kernel)
    M = aug.n_states // mdp.n_states
    d_b = visitation(aug, beta)
    states, actions = sample_state_actions(d_b, beta, n, generator=generator)

    def logp(pi_aug):
        rows = torch.gather(pi_aug, -2, states[..., None].expand(*states.shape, pi_aug.shape[-1]))
        return torch.log(torch.gather(rows, -1, actions[..., None])[..., 0])

    lb, lo, ln = logp(beta), logp(lift_policy(pi_old, M)), logp(lift_policy(pi_new, M))
    return half_abs_ratio_diff(ln, lo, lb, dim=-1), half_abs_ratio_diff(lo, lb, lb, dim=-1)


# --------------------------------------------------------------------------------------------
# Chapter 9: finite horizon, no discount (prop-ch09-finite-horizon); the token MDP
# --------------------------------------------------------------------------------------------
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
        V.all_finite(V.same_kind(self.R, "R", P, "P"), "R")
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
    batch = _as_batch(batch)
    H, S, A = (V.positive_int(x, n) for x, n in ((horizon, "horizon"), (n_states, "n_states"),
                                                 (n_actions, "n_actions")))
    V.real_in(peakiness, "peakiness", 0.0)
    V.real_in(reward_scale, "reward_scale")
    gd = _gen_device(generator)
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
    V.layout("... H S A", {"...": sizes["..."]}, R=R)
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
    return V.distribution(V.same_kind(V.float_tensor(pi, name, min_dim=3), name, mdp.P, "mdp.P"), name,
                          "pi[..., t, s, :] is a distribution over actions", shape=mdp.policy_shape)


def finite_horizon_state_distributions(mdp: FiniteHorizonMDP, pi: Tensor) -> Tensor:
    r"""The state distribution at every step (chapter 9, prop-ch09-finite-horizon):
    :math:`\mu^\pi_0 = d_0` and :math:`\mu^\pi_{t+1}(s') = \sum_{s,a}\mu^\pi_t(s)\,\pi_t(a\mid s)\,P_t(s'\mid s, a)`,
    so :math:`\mu^\pi_t(s) = \Pr_\pi(s_t = s)`.

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
    return (mdp.rho0 * finite_horizon_values(mdp, pi)[0][..., 0, :]).sum(-1)


@dataclass
class FiniteHorizonTerms(_LowerBound):
    r"""Every term of the finite-horizon state-shift lemma and single-policy bound (chapter 9,
    prop-ch09-finite-horizon), from :func:`finite_horizon_terms`.

    Per-step fields are ``[*B, H]`` (``mu_old``, ``mu_new``, ``tv``, ``abar``: ``[*B, H, S]``); the
    rest are ``[*B]``. Below, :math:`\pi_k` is ``pi_old``, :math:`\pi` is ``pi_new``,
    :math:`\delta_t = \mathbb E_{s\sim\mu^{\pi_k}_t}[D_{\mathrm{TV}}(\pi_t, \pi_{k,t}; s)]` and
    :math:`\bar A_t(s) = \mathbb E_{a\sim\pi_t(\cdot\mid s)}[A^{\pi_k}_t(s, a)]`.

    Attributes:
        horizon: :math:`H` (a Python int).
        J_old, J_new: :math:`J(\pi_k)`, :math:`J(\pi)`.
        improvement: :math:`J(\pi) - J(\pi_k)`.
        surrogate: :math:`L_{\pi_k}(\pi) = \sum_t \mathbb E_{s\sim\mu^{\pi_k}_t}[\bar A_t(s)]` (eq-ch09-fh-surrogate).
        mu_old, mu_new: :math:`\mu^{\pi_k}_t(s)`, :math:`\mu^\pi_t(s)`.
        tv: :math:`D_{\mathrm{TV}}(\pi_t, \pi_{k,t}; s)`.
        abar: :math:`\bar A_t(s)`.
        eps_t: :math:`\omega_t = \max_s|\bar A_t(s)|`.
        eps: :math:`\omega = \max_t\omega_t`.
        expected_tv_t: :math:`\delta_t`.
        expected_tv_new_t: :math:`\mathbb E_{s\sim\mu^\pi_t}[D_{\mathrm{TV}}(\pi_t, \pi_{k,t}; s)]`.
        mean_tv: :math:`\bar\delta = \frac1H\sum_t\delta_t`, the expected TV under the normalised
            visitation :math:`d_{\pi_k}(t, s) = \mu^{\pi_k}_t(s)/H`.
        state_shift_t: :math:`\|\mu^\pi_t - \mu^{\pi_k}_t\|_1`.
        lemma_bound_t: :math:`2\sum_{u<t}\delta_u`, the right-hand side of eq-ch09-fh-shift.
        penalty_per_step: :math:`\sum_{t}\omega_t\cdot 2\sum_{u<t}\delta_u`, the sharpest form.
        penalty: :math:`2\omega\sum_{t=0}^{H-2}(H-1-t)\,\delta_t`, the penalty of eq-ch09-fh-bound.
        penalty_mean: :math:`2\omega H(H-1)\,\bar\delta`, the loosest form (one constant times the
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

        \big\|\mu^\pi_t - \mu^{\pi_k}_t\big\|_1 \le 2\sum_{u<t}\delta_u,\qquad
        \delta_u = \mathbb E_{s\sim\mu^{\pi_k}_u}\big[D_{\mathrm{TV}}(\pi_u, \pi_{k,u}; s)\big],

    and the single-policy bound, eq-ch09-fh-bound,

    .. math::

        \big|J(\pi) - J(\pi_k) - L_{\pi_k}(\pi)\big| \le 2\omega\sum_{t=0}^{H-2}(H-1-t)\,\delta_t
        \le 2\omega\,H(H-1)\,\bar\delta,\qquad
        \omega = \max_{t,s}\big|\mathbb E_{a\sim\pi_t(\cdot\mid s)}A^{\pi_k}_t(s, a)\big|.

    Args:
        mdp: the MDPs.
        pi_old: ``[*B, H, S, A]``, :math:`\pi_k`.
        pi_new: ``[*B, H, S, A]``, :math:`\pi`.

    Returns:
        A :class:`FiniteHorizonTerms`.
    """
    H = mdp.horizon
    V_old, Q_old = finite_horizon_values(mdp, pi_old)
    pi_new = _fh_check_policy(mdp, pi_new, "pi_new")
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
    :math:`\|\mu^\pi_t - \mu^{\pi_k}_t\|_1 = 2p` for :math:`t > u`, against :math:`2p + 2(t-1-u)\eta`.

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
    H = V.positive_int(horizon, "horizon", minimum=2)
    u = V.int_in_range(switch_time, "switch_time", 0, H - 2)
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
# Chapter 11: the current policy's advantage on the mixed batch (prop-ch11-current-advantage)
# --------------------------------------------------------------------------------------------
@dataclass
class CurrentAdvantageTerms(_LowerBound):
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
    V.distribution(pi_old, "pi_old", _POLICY, shape=mdp.policy_shape)
    V.distribution(pi_new, "pi_new", _POLICY, shape=mdp.policy_shape)
    aug, beta = augment(mdp, policies, alpha, kernel)
    M = aug.n_states // mdp.n_states
    *B, S, A = mdp.R.shape
    g = mdp.gamma
    d_b = visitation(aug, beta)                                   # [*B, S*M]
    new_l, old_l = lift_policy(pi_new, M), lift_policy(pi_old, M)
    V_old = value(mdp, pi_old)
    A_old = q_value(mdp, pi_old, V_old) - V_old[..., None]
    abar = expected_advantage(pi_new, A_old)                      # [*B, S]
    d_s = d_b.reshape(*B, S, M).sum(-1)                           # the state marginal of d_beta
    L = (d_s * abar).sum(-1) / (1 - g)
    eps = abar.abs().amax(-1)
    tv_nb = (d_b * tv_distance(new_l, beta)).sum(-1)
    U = (d_b * tv_distance(new_l, old_l)).sum(-1)
    Sk = (d_b * tv_distance(old_l, beta)).sum(-1)
    coef = 2 * g * eps / (1 - g) ** 2
    J_old = (mdp.rho0 * V_old).sum(-1)
    J_new = performance(mdp, pi_new)
    return CurrentAdvantageTerms(
        gamma=g, J_old=J_old, J_new=J_new, improvement=J_new - J_old, abar=abar, surrogate=L, eps=eps,
        tv_new_behaviour=tv_nb, U=U, S=Sk, coef=coef, penalty=coef * tv_nb, bound=L - coef * tv_nb,
        bound_split=L - coef * (U + Sk), d_beta=d_b.reshape(*B, S, M))


# --------------------------------------------------------------------------------------------
# chapter 16: exact fixed points of the off-policy multi-step operators (V-trace, Retrace, ...)
# --------------------------------------------------------------------------------------------
#: The trace coefficients :func:`trace_table` knows (the tabular twins of
#: :func:`rlkit.offpolicy.trace_coefficients`).
TRACE_KINDS = ("retrace", "tree_backup", "q_lambda", "is")


def _clip_level(x, name: str) -> float:
    """A truncation level in ``(0, inf]`` (``math.inf`` means no truncation)."""
    if isinstance(x, (int, float)) and x == float("inf"):
        return float("inf")
    return V.real_in(x, name, 0.0, lo_open=True)


def _pair(mdp: FiniteMDP, pi: Tensor, mu: Tensor) -> tuple[Tensor, Tensor]:
    pi = V.distribution(V.same_kind(pi, "pi", mdp.P, "mdp.P"), "pi", _POLICY, shape=mdp.policy_shape)
    mu = V.distribution(V.same_kind(mu, "mu", mdp.P, "mdp.P"), "mu", "mu[..., s, :] is the behaviour "
                        "policy's distribution over actions", shape=mdp.policy_shape)
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
    V.distribution(pi, "pi", _POLICY)
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
        kind: one of :data:`TRACE_KINDS`.
        pi, mu: ``[*B, S, A]`` target and behaviour policies.
        lam: :math:`\lambda \in [0, 1]`.

    Returns:
        ``[*B, S, A]``, finite and :math:`\ge 0`.

    Chapter: 16_offpolicy_multistep, eq-ch16-retrace-operator.
    """
    V.choice(kind, "kind", TRACE_KINDS)
    V.matching_floats(min_dim=2, pi=pi, mu=mu)
    V.distribution(pi, "pi", _POLICY)
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
    eye = _eye_like(mdp)
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
    return torch.linalg.solve(_eye_like(mdp) - A, b[..., None])[..., 0]


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
    traces = V.exact_shape(V.same_kind(traces, "traces", mdp.P, "mdp.P"), "traces", mdp.policy_shape, "[*B, S, A]")
    V.tensor_in(V.all_finite(traces, "traces"), "traces", 0.0)
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
