r"""The finite discounted MDP and the policies on it: the :class:`~rlkit.tabular.FiniteMDP` container,
random MDPs and policies, the single-turn LLM setting as an MDP
(:func:`~rlkit.tabular.contextual_bandit`) and the exact natural-gradient step
:func:`~rlkit.tabular.softmax_step`.

Shapes and conventions are those of :mod:`rlkit.tabular`; import the names from there
(``import rlkit.tabular as T``). The helpers at the top (the policy check's message, ``gamma`` as a
``[*B]`` tensor, the batch shape, the generator's device) are shared with the sibling submodules.

Chapter: 09_single_policy_bound introduces them; 10_static_mixtures, 11_dynamic_mixing and
16_offpolicy_multistep build their test benches with them.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from .. import _validate as V

Tensor = torch.Tensor
GammaLike = float | Tensor

__all__ = [
    "FiniteMDP",
    "random_mdp",
    "random_policy",
    "perturb_policy",
    "uniform_policy",
    "contextual_bandit",
    "softmax_step",
]


POLICY = "pi[..., s, :] is a distribution over actions"


def check_policy(mdp: FiniteMDP, pi: Tensor, name: str = "pi", what: str = POLICY) -> Tensor:
    """``pi`` checked as a policy on ``mdp``: a floating ``[*B, S, A]`` tensor with ``mdp.P``'s dtype and
    device whose rows are distributions (``what`` says over what); errors name ``name``."""
    V.instance_of(mdp, "mdp", FiniteMDP, "rlkit.tabular.FiniteMDP")
    V.distribution(pi, name, what, shape=mdp.policy_shape)
    return V.same_kind(pi, name, mdp.P, "mdp.P")


def as_gamma(gamma: GammaLike, batch_shape: torch.Size, like: Tensor) -> Tensor:
    """``gamma`` (a number or one per batch element) as a ``[*B]`` tensor in ``[0, 1)``."""
    return V.per_batch(gamma, "gamma", batch_shape, like, 0.0, 1.0, hi_open=True)


def generator_device(generator: torch.Generator | None) -> torch.device:
    """The device random numbers from ``generator`` are drawn on (the CPU for the default generator)."""
    return generator.device if generator is not None else torch.device("cpu")


def as_batch(batch) -> tuple:
    """``batch`` (an int or a tuple of ints, each >= 1) as a tuple."""
    if not isinstance(batch, (list, tuple)):
        return (V.int_in(batch, "batch"),)
    return tuple(V.int_in(b, f"batch[{i}]") for i, b in enumerate(batch))


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
        V.tensor_in(V.same_kind(self.R, "R", P, "P"), "R")
        V.layout("... S", sizes, floating=True, rho0=self.rho0)
        V.distribution(V.same_kind(self.rho0, "rho0", P, "P"), "rho0", "initial state distribution")
        object.__setattr__(self, "gamma", as_gamma(self.gamma, sizes["..."], P))

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


# --------------------------------------------------------------------------------------------
# random MDPs and policies
# --------------------------------------------------------------------------------------------
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
    batch = as_batch(batch)
    V.int_in(n_states, "n_states")
    V.int_in(n_actions, "n_actions")
    V.real_in(peakiness, "peakiness", 0.0)
    V.real_in(reward_scale, "reward_scale")
    gd = generator_device(generator)
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
    batch = as_batch(batch)
    V.int_in(n_states, "n_states")
    V.int_in(n_actions, "n_actions")
    V.real_in(temperature, "temperature", 0.0, lo_open=True)
    z = torch.randn(*batch, n_states, n_actions, generator=generator, dtype=dtype, device=generator_device(generator))
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
    z = torch.randn(pi.shape, generator=generator, dtype=pi.dtype, device=generator_device(generator)).to(pi.device)
    return torch.softmax(torch.log(pi).clamp_min(-50.0) + step * z, dim=-1)


# --------------------------------------------------------------------------------------------
# hand-built MDPs and the natural-gradient step
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
