"""Finite MDPs solved exactly, in batches, and the bounds of Part II checked on them.

Everything here is a dense linear-algebra computation in torch (float64 by default), batched over
any number of leading dimensions, so that thousands of MDP/policy pairs are solved in one call of
``torch.linalg.solve`` on a ``[B, S, S]`` tensor.

Shapes and conventions (``*B`` is any batch shape, the same for every argument of one call):

* transition kernel ``P[*B, s, a, s'] = Pr(s' | s, a)``, rewards ``R[*B, s, a]``, initial
  distribution ``rho0[*B, s]``, discount ``gamma`` (float or tensor ``[*B]``, in ``[0, 1)``);
* a policy is a tensor ``pi[*B, s, a] = pi(a | s)``;
* ``J(pi) = E[sum_t gamma^t r_t]`` (no ``1 - gamma`` factor in front);
* the discounted state visitation is NORMALISED:
  ``d_pi(s) = (1 - gamma) sum_t gamma^t Pr(s_t = s)``, so ``sum_s d_pi(s) = 1`` and
  ``J(pi) = E_{s ~ d_pi, a ~ pi}[R(s, a)] / (1 - gamma)``;
* ``D_TV(p, q; s) = 1/2 sum_a |p(a|s) - q(a|s)|``.

Mixtures of M policies live on the augmented state space ``S x I`` (Chapters 10 and 11); an
augmented state ``(s, i)`` has the flat index ``s * M + i``, so ``x.reshape(*B, S, M)`` recovers
the two coordinates of any per-augmented-state tensor ``x[*B, S * M]``.

Chapters: 9 (performance difference lemma, single-policy bound), 10 (static mixtures),
11 (dynamic mixing, U_k and S_k).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Optional, Sequence, Union

import torch

Tensor = torch.Tensor
GammaLike = Union[float, Tensor]

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
    "half_abs_ratio_diff",
    "estimate_update_and_staleness",
]

_ATOL = 1e-6  # tolerance for "this is a probability distribution" checks


# --------------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------------
def _check_tensor(x, name: str, min_dim: int) -> Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not torch.is_floating_point(x):
        raise TypeError(f"{name} must be a floating-point tensor (float64 recommended), got {x.dtype}")
    if x.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimensions, got shape {tuple(x.shape)}")
    return x


def _check_distribution(x: Tensor, name: str, what: str) -> None:
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or inf")
    if (x < -_ATOL).any():
        raise ValueError(f"{name} must be non-negative ({what})")
    err = (x.sum(-1) - 1).abs().max().item() if x.numel() else 0.0
    if err > _ATOL:
        raise ValueError(f"{name} must sum to 1 over its last dimension ({what}); max |sum - 1| = {err:.3g}")


def _check_policy(pi, name: str, batch_shape: torch.Size, n_states: int, n_actions: int) -> Tensor:
    pi = _check_tensor(pi, name, 2)
    expected = (*batch_shape, n_states, n_actions)
    if tuple(pi.shape) != expected:
        raise ValueError(f"{name} must have shape [*B, S, A] = {expected}, got {tuple(pi.shape)}")
    _check_distribution(pi, name, "pi[..., s, :] is a distribution over actions")
    return pi


def _as_gamma(gamma: GammaLike, batch_shape: torch.Size, like: Tensor) -> Tensor:
    if isinstance(gamma, (int, float)) and not isinstance(gamma, bool):
        g = torch.full(batch_shape, float(gamma), dtype=like.dtype, device=like.device)
    elif isinstance(gamma, torch.Tensor):
        if tuple(gamma.shape) not in ((), tuple(batch_shape)):
            raise ValueError(f"gamma must be a float, a 0-d tensor or a tensor of shape {tuple(batch_shape)}, "
                             f"got shape {tuple(gamma.shape)}")
        g = gamma.to(dtype=like.dtype, device=like.device).expand(batch_shape).clone()
    else:
        raise TypeError(f"gamma must be a float or a tensor, got {type(gamma).__name__}")
    if not ((g >= 0) & (g < 1)).all():
        raise ValueError("gamma must lie in [0, 1)")
    return g


# --------------------------------------------------------------------------------------------
# the MDP container
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FiniteMDP:
    """A batch of finite discounted MDPs (Chapter 9).

    Fields: ``P[*B, S, A, S]`` transition probabilities, ``R[*B, S, A]`` expected rewards,
    ``rho0[*B, S]`` initial state distribution, ``gamma[*B]`` discounts (a float is expanded).
    The constructor validates shapes and that ``P`` and ``rho0`` are distributions.
    """

    P: Tensor
    R: Tensor
    rho0: Tensor
    gamma: Tensor

    def __post_init__(self):
        P = _check_tensor(self.P, "P", 3)
        B, S, A = P.shape[:-3], P.shape[-3], P.shape[-2]
        if P.shape[-1] != S:
            raise ValueError(f"P must have shape [*B, S, A, S], got {tuple(P.shape)}")
        _check_distribution(P, "P", "P[..., s, a, :] is a distribution over next states")
        R = _check_tensor(self.R, "R", 2)
        if tuple(R.shape) != (*B, S, A):
            raise ValueError(f"R must have shape [*B, S, A] = {(*B, S, A)}, got {tuple(R.shape)}")
        if not torch.isfinite(R).all():
            raise ValueError("R contains NaN or inf")
        rho0 = _check_tensor(self.rho0, "rho0", 1)
        if tuple(rho0.shape) != (*B, S):
            raise ValueError(f"rho0 must have shape [*B, S] = {(*B, S)}, got {tuple(rho0.shape)}")
        _check_distribution(rho0, "rho0", "initial state distribution")
        for name, t in (("R", R), ("rho0", rho0)):
            if t.dtype != P.dtype or t.device != P.device:
                raise TypeError(f"{name} must have the dtype and device of P ({P.dtype}, {P.device}), "
                                f"got {t.dtype}, {t.device}")
        object.__setattr__(self, "gamma", _as_gamma(self.gamma, B, P))

    @property
    def batch_shape(self) -> torch.Size:
        return self.P.shape[:-3]

    @property
    def n_states(self) -> int:
        return self.P.shape[-3]

    @property
    def n_actions(self) -> int:
        return self.P.shape[-2]

    def to(self, *args, **kwargs) -> "FiniteMDP":
        return FiniteMDP(*(getattr(self, f.name).to(*args, **kwargs) for f in fields(self)))

    def __getitem__(self, index) -> "FiniteMDP":
        """Index the batch dimensions, e.g. ``mdp[3]`` or ``mdp[:10]``."""
        if not self.batch_shape:
            raise IndexError("this FiniteMDP has no batch dimension to index")
        return FiniteMDP(self.P[index], self.R[index], self.rho0[index], self.gamma[index])


def _gen_device(generator: Optional[torch.Generator]) -> torch.device:
    return generator.device if generator is not None else torch.device("cpu")


def _as_batch(batch) -> tuple:
    if isinstance(batch, int):
        batch = (batch,)
    batch = tuple(batch)
    if any((not isinstance(b, int)) or b < 1 for b in batch):
        raise ValueError(f"batch must be a positive int or a tuple of positive ints, got {batch}")
    return batch


def random_mdp(batch: Union[int, Sequence[int]], n_states: int, n_actions: int, gamma: GammaLike = 0.9, *,
               peakiness: float = 2.0, reward_scale: float = 1.0, generator: Optional[torch.Generator] = None,
               dtype: torch.dtype = torch.float64, device=None) -> FiniteMDP:
    """Sample a batch of random finite MDPs (Chapter 9).

    ``P(.|s, a) = softmax(peakiness * z)`` with ``z ~ N(0, I)``, so a large ``peakiness`` gives nearly
    deterministic transitions; ``R(s, a) ~ reward_scale * N(0, 1)``; ``rho0 = softmax(N(0, I))``.
    Shapes: ``P[*batch, S, A, S]``, ``R[*batch, S, A]``, ``rho0[*batch, S]``.
    Random numbers come from ``generator`` (on its own device), then move to ``device``.
    """
    batch = _as_batch(batch)
    if n_states < 1 or n_actions < 1:
        raise ValueError(f"n_states and n_actions must be >= 1, got {n_states}, {n_actions}")
    if peakiness < 0:
        raise ValueError(f"peakiness must be >= 0, got {peakiness}")
    gd = _gen_device(generator)
    z = torch.randn(*batch, n_states, n_actions, n_states, generator=generator, dtype=dtype, device=gd)
    P = torch.softmax(peakiness * z, dim=-1)
    R = reward_scale * torch.randn(*batch, n_states, n_actions, generator=generator, dtype=dtype, device=gd)
    rho0 = torch.softmax(torch.randn(*batch, n_states, generator=generator, dtype=dtype, device=gd), dim=-1)
    return FiniteMDP(P, R, rho0, gamma).to(device if device is not None else gd)


def random_policy(batch: Union[int, Sequence[int]], n_states: int, n_actions: int, *, temperature: float = 1.0,
                  generator: Optional[torch.Generator] = None, dtype: torch.dtype = torch.float64,
                  device=None) -> Tensor:
    """A batch of random softmax policies ``pi = softmax(z / temperature)``, ``z ~ N(0, I)`` (Chapter 9).

    Returns ``pi[*batch, S, A]``; every action has positive probability.
    """
    batch = _as_batch(batch)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    z = torch.randn(*batch, n_states, n_actions, generator=generator, dtype=dtype, device=_gen_device(generator))
    pi = torch.softmax(z / temperature, dim=-1)
    return pi.to(device) if device is not None else pi


def uniform_policy(mdp: FiniteMDP) -> Tensor:
    """The uniform policy ``pi(a|s) = 1/A`` with shape ``[*B, S, A]`` (Chapter 9)."""
    return torch.full((*mdp.batch_shape, mdp.n_states, mdp.n_actions), 1.0 / mdp.n_actions,
                      dtype=mdp.P.dtype, device=mdp.P.device)


def perturb_policy(pi: Tensor, step: Union[float, Tensor], *, generator: Optional[torch.Generator] = None) -> Tensor:
    """A nearby policy ``pi' = softmax(log pi + step * z)``, ``z ~ N(0, I)`` (Chapter 9).

    ``step`` (float, or tensor of shape ``pi.shape[:-2]`` for one size per batch element) sets how far
    the new policy moves; ``step = 0`` returns ``pi``. Log-probabilities are floored at -50 so that a
    deterministic ``pi`` does not produce NaN.
    """
    pi = _check_tensor(pi, "pi", 2)
    _check_distribution(pi, "pi", "pi[..., s, :] is a distribution over actions")
    if isinstance(step, torch.Tensor):
        if tuple(step.shape) not in ((), tuple(pi.shape[:-2])):
            raise ValueError(f"step must be a float or have shape {tuple(pi.shape[:-2])}, got {tuple(step.shape)}")
        step = step.to(dtype=pi.dtype, device=pi.device)[..., None, None]
    z = torch.randn(pi.shape, generator=generator, dtype=pi.dtype, device=_gen_device(generator)).to(pi.device)
    return torch.softmax(torch.log(pi).clamp_min(-50.0) + step * z, dim=-1)


# --------------------------------------------------------------------------------------------
# hand-built MDPs
# --------------------------------------------------------------------------------------------
def contextual_bandit(rho0: Tensor, R: Tensor, gamma: GammaLike = 0.9) -> FiniteMDP:
    """The single-turn LLM setting (Chapter 9): a prompt ``s ~ rho0``, one response ``a``, reward ``R[s, a]``,
    then a fresh prompt drawn from ``rho0`` whatever the response was: ``P(s'|s, a) = rho0(s')``.

    The state distribution does not depend on the policy (``d_pi = rho0`` for every ``pi``), so the
    surrogate is exact and every state-shift penalty is pure slack (Chapter 9).
    Shapes: ``rho0[*B, S]``, ``R[*B, S, A]``.
    """
    rho0 = _check_tensor(rho0, "rho0", 1)
    R = _check_tensor(R, "R", 2)
    S, A = R.shape[-2], R.shape[-1]
    if tuple(R.shape[:-1]) != tuple(rho0.shape):
        raise ValueError(f"R must have shape [*B, S, A] matching rho0 [*B, S] = {tuple(rho0.shape)}, "
                         f"got {tuple(R.shape)}")
    P = rho0[..., None, None, :].expand(*rho0.shape[:-1], S, A, S).clone()
    return FiniteMDP(P, R, rho0, gamma)


def tight_example(gamma: GammaLike = 0.9, switch: GammaLike = 0.3, eta: GammaLike = 1e-3, c: GammaLike = 1.0, *,
                  dtype: torch.dtype = torch.float64):
    """An MDP and two policies for which Theorem 2.2 of Chapter 9 is tight as ``eta -> 0``.

    States: 0 = start, 1 = X, 2 = Y. From the start, action 0 goes to X and action 1 goes to Y;
    X and Y are absorbing whatever the action. In X, action 0 pays ``1`` and action 1 pays ``1 - c``;
    in Y, action 0 pays ``1`` and action 1 pays ``1 + c / eta``.
    Old policy: go to Y, then always action 0 (so ``V(X) = V(Y)`` and nothing in the old policy's
    future prefers X). New policy: go to X with probability ``switch``, play the bad action 1 in X,
    and in Y play the jackpot action 1 with the tiny probability ``eta``.

    Then ``E_{pi'}[A(X, .)] = -c`` and ``E_{pi'}[A(Y, .)] = +c`` (so ``eps = c``), the visitation
    moves from Y to X, the surrogate is ``L = gamma c / (1 - gamma)``, the true improvement is
    ``gamma c (1 - 2 switch) / (1 - gamma)``, and the penalty of Theorem 2.2 is
    ``2 gamma c (switch + gamma eta / (1 - gamma)) / (1 - gamma)``: ``L - improvement`` and the
    penalty agree in the limit ``eta -> 0``, so no constant smaller than ``2 gamma / (1 - gamma)^2``
    can work. Lemma 2.1 is tight in the same limit.

    Each argument is a float or a 1-D tensor ``[B]`` (all tensors the same shape; floats are
    repeated). Returns ``(mdp, pi_old, pi_new)`` with ``S = 3``, ``A = 2`` and batch shape ``[]``
    (all floats) or ``[B]``.
    """
    vals = {"gamma": gamma, "switch": switch, "eta": eta, "c": c}
    shapes = {tuple(v.shape) for v in vals.values() if isinstance(v, torch.Tensor)}
    if len(shapes) > 1 or any(len(sh) > 1 for sh in shapes):
        raise ValueError(f"tight_example: tensor arguments must all be 1-D with one shape, got {shapes}")
    shape = shapes.pop() if shapes else ()
    t = {k: (v.to(dtype) if isinstance(v, torch.Tensor) else torch.full(shape, float(v), dtype=dtype))
         for k, v in vals.items()}
    g, sw, et, cc = t["gamma"], t["switch"], t["eta"], t["c"]
    if not (((g >= 0) & (g < 1)).all() and ((sw > 0) & (sw <= 1)).all() and ((et > 0) & (et < 1)).all()
            and (cc > 0).all()):
        raise ValueError("tight_example: need 0 <= gamma < 1, 0 < switch <= 1, 0 < eta < 1, c > 0")
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


def softmax_step(pi: Tensor, adv: Tensor, step: Union[float, Tensor]) -> Tensor:
    """One exact natural-policy-gradient (mirror-ascent) step for a tabular softmax policy (Chapter 9):

    ``pi'(a|s) proportional to pi(a|s) exp(step * A(s, a))``.
    For small ``step`` the surrogate rises by about ``step * E_d[Var_pi A] / (1 - gamma)``; this is
    the update a trainer would make, used in Chapters 9-11 to produce realistic new policies.
    Shapes: ``pi``, ``adv`` ``[*B, S, A]``; ``step`` float or ``[*B]``. Log-probabilities are floored
    at -50 so that zeros in ``pi`` stay (numerically) zero without NaN.
    """
    pi = _check_tensor(pi, "pi", 2)
    adv = _check_tensor(adv, "adv", 2)
    if pi.shape != adv.shape:
        raise ValueError(f"pi and adv must have the same shape [*B, S, A], got {tuple(pi.shape)} and {tuple(adv.shape)}")
    if isinstance(step, torch.Tensor):
        if tuple(step.shape) not in ((), tuple(pi.shape[:-2])):
            raise ValueError(f"step must be a float or have shape {tuple(pi.shape[:-2])}, got {tuple(step.shape)}")
        step = step.to(dtype=pi.dtype, device=pi.device)[..., None, None]
    return torch.softmax(torch.log(pi).clamp_min(-50.0) + step * adv, dim=-1)


# --------------------------------------------------------------------------------------------
# exact policy evaluation
# --------------------------------------------------------------------------------------------
def policy_transition(mdp: FiniteMDP, pi: Tensor) -> Tensor:
    """State-to-state kernel under ``pi``: ``P_pi[s, s'] = sum_a pi(a|s) P(s'|s, a)``; shape ``[*B, S, S]`` (Ch. 9)."""
    pi = _check_policy(pi, "pi", mdp.batch_shape, mdp.n_states, mdp.n_actions)
    return torch.einsum("...sa,...sat->...st", pi, mdp.P)


def policy_reward(mdp: FiniteMDP, pi: Tensor) -> Tensor:
    """Expected one-step reward ``r_pi(s) = sum_a pi(a|s) R(s, a)``; shape ``[*B, S]`` (Chapter 9)."""
    pi = _check_policy(pi, "pi", mdp.batch_shape, mdp.n_states, mdp.n_actions)
    return (pi * mdp.R).sum(-1)


def _eye_like(mdp: FiniteMDP) -> Tensor:
    return torch.eye(mdp.n_states, dtype=mdp.P.dtype, device=mdp.P.device)


def value(mdp: FiniteMDP, pi: Tensor) -> Tensor:
    """State values by one batched linear solve (Chapter 9):

    ``V_pi = (I - gamma P_pi)^{-1} r_pi``, i.e. the Bellman equation ``V = r_pi + gamma P_pi V``.
    Returns ``V[*B, S]``.
    """
    Ppi = policy_transition(mdp, pi)
    lhs = _eye_like(mdp) - mdp.gamma[..., None, None] * Ppi
    return torch.linalg.solve(lhs, policy_reward(mdp, pi)[..., None])[..., 0]


def q_value(mdp: FiniteMDP, pi: Tensor, V: Optional[Tensor] = None) -> Tensor:
    """Action values ``Q_pi(s, a) = R(s, a) + gamma sum_s' P(s'|s, a) V_pi(s')``; shape ``[*B, S, A]`` (Ch. 9).

    ``V`` may be passed to avoid a second solve (shape ``[*B, S]``).
    """
    if V is None:
        V = value(mdp, pi)
    elif tuple(V.shape) != (*mdp.batch_shape, mdp.n_states):
        raise ValueError(f"V must have shape {(*mdp.batch_shape, mdp.n_states)}, got {tuple(V.shape)}")
    return mdp.R + mdp.gamma[..., None, None] * torch.einsum("...sat,...t->...sa", mdp.P, V)


def advantage(mdp: FiniteMDP, pi: Tensor) -> Tensor:
    """Advantages ``A_pi(s, a) = Q_pi(s, a) - V_pi(s)``; shape ``[*B, S, A]``; ``sum_a pi A_pi = 0`` (Ch. 9)."""
    V = value(mdp, pi)
    return q_value(mdp, pi, V) - V[..., None]


def performance(mdp: FiniteMDP, pi: Tensor) -> Tensor:
    """Expected discounted return ``J(pi) = sum_s rho0(s) V_pi(s)``; shape ``[*B]`` (Chapter 9)."""
    return (mdp.rho0 * value(mdp, pi)).sum(-1)


def visitation(mdp: FiniteMDP, pi: Tensor) -> Tensor:
    """Normalised discounted state visitation (Chapter 9, the book's equation eq-ch09-visitation):

    ``d_pi(s) = (1 - gamma) sum_t gamma^t Pr(s_t = s)``, i.e. the solution of the linear system
    ``(I - gamma P_pi)^T d_pi = (1 - gamma) rho0``. Sums to 1 over ``s``. Returns ``d[*B, S]``.
    """
    Ppi = policy_transition(mdp, pi)
    lhs = (_eye_like(mdp) - mdp.gamma[..., None, None] * Ppi).transpose(-1, -2)
    rhs = ((1 - mdp.gamma)[..., None] * mdp.rho0)[..., None]
    return torch.linalg.solve(lhs, rhs)[..., 0]


def tv_distance(p: Tensor, q: Tensor) -> Tensor:
    """Per-state total variation ``D_TV(p, q; s) = 1/2 sum_a |p(a|s) - q(a|s)|`` (Chapter 9).

    ``p`` and ``q`` must have the same shape ``[..., A]``; returns shape ``[...]``, values in ``[0, 1]``.
    """
    p = _check_tensor(p, "p", 1)
    q = _check_tensor(q, "q", 1)
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    return 0.5 * (p - q).abs().sum(-1)


def expected_advantage(pi_new: Tensor, adv: Tensor) -> Tensor:
    """``abar(s) = E_{a ~ pi_new(.|s)}[A(s, a)] = sum_a pi_new(a|s) A(s, a)``; shape ``[..., S]`` (Chapter 9).

    Its maximum absolute value over states is the constant ``epsilon = C_{pi, pi_k}`` of Theorem 2.2.
    """
    pi_new = _check_tensor(pi_new, "pi_new", 2)
    adv = _check_tensor(adv, "adv", 2)
    if pi_new.shape != adv.shape:
        raise ValueError(f"pi_new and adv must have the same shape [..., S, A], got {tuple(pi_new.shape)} "
                         f"and {tuple(adv.shape)}")
    return (pi_new * adv).sum(-1)


def surrogate(d_old: Tensor, pi_new: Tensor, adv_old: Tensor, gamma: GammaLike) -> Tensor:
    """The surrogate objective of Theorem 2.2 (Chapter 9, eq-ch09-surrogate):

    ``L_{pi_k}(pi) = 1/(1 - gamma) E_{s ~ d_k, a ~ pi_k}[pi(a|s) / pi_k(a|s) A_k(s, a)]
                  = 1/(1 - gamma) sum_s d_k(s) sum_a pi(a|s) A_k(s, a)``.

    The second form is used (it needs no support condition); it equals the importance-weighted form
    whenever ``pi_k(a|s) > 0`` wherever ``pi(a|s) > 0``.
    Shapes: ``d_old[*B, S]``, ``pi_new[*B, S, A]``, ``adv_old[*B, S, A]``, ``gamma`` float or ``[*B]``;
    returns ``[*B]``.
    """
    d_old = _check_tensor(d_old, "d_old", 1)
    abar = expected_advantage(pi_new, adv_old)
    if d_old.shape != abar.shape:
        raise ValueError(f"d_old must have shape {tuple(abar.shape)} (= pi_new.shape[:-1]), got {tuple(d_old.shape)}")
    g = _as_gamma(gamma, d_old.shape[:-1], d_old)
    return (d_old * abar).sum(-1) / (1 - g)


def performance_difference(mdp: FiniteMDP, pi_old: Tensor, pi_new: Tensor) -> Tensor:
    """Right-hand side of the performance difference lemma (Chapter 9, Lemma eq-ch09-pdl):

    ``J(pi') - J(pi) = 1/(1 - gamma) E_{s ~ d_pi'} E_{a ~ pi'}[A_pi(s, a)]``,
    computed from ``d_pi'`` and ``A_pi``; returns ``[*B]``. (It is ``surrogate`` with the NEW
    policy's visitation.)
    """
    return surrogate(visitation(mdp, pi_new), pi_new, advantage(mdp, pi_old), mdp.gamma)


# --------------------------------------------------------------------------------------------
# Chapter 9: every term of Lemma 2.1 and Theorem 2.2
# --------------------------------------------------------------------------------------------
@dataclass
class SinglePolicyTerms:
    """All terms of the single-policy bound for a batch of (MDP, pi_old, pi_new) triples (Chapter 9).

    Every field has shape ``[*B]`` except ``d_old``, ``d_new``, ``tv`` (``[*B, S]``) and ``abar``
    (``[*B, S]``, the new policy's expected old advantage per state).
    """

    gamma: Tensor
    J_old: Tensor
    J_new: Tensor
    improvement: Tensor       # J(pi_new) - J(pi_old)
    surrogate: Tensor         # L_{pi_old}(pi_new)
    d_old: Tensor
    d_new: Tensor
    tv: Tensor                # D_TV(pi_new, pi_old; s)
    abar: Tensor              # E_{a~pi_new}[A_old(s, a)]
    eps: Tensor               # max_s |abar(s)|  (the article's C_{pi, pi_k})
    adv_max: Tensor           # max_{s,a} |A_old(s, a)|
    expected_tv: Tensor       # E_{s~d_old}[D_TV]
    expected_tv_new: Tensor   # E_{s~d_new}[D_TV]
    max_tv: Tensor            # max_s D_TV
    state_shift: Tensor       # ||d_new - d_old||_1
    lemma_bound: Tensor       # 2 gamma / (1 - gamma) * expected_tv  (Lemma 2.1)
    penalty: Tensor           # 2 gamma eps / (1 - gamma)^2 * expected_tv
    bound: Tensor             # surrogate - penalty  (Theorem 2.2)

    @property
    def slack(self) -> Tensor:
        """``improvement - bound``; the theorem says it is >= 0."""
        return self.improvement - self.bound

    @property
    def tightness(self) -> Tensor:
        """``(surrogate - improvement) / penalty`` in ``[-1, 1]`` when the two-sided bound holds; 1 = tight.

        NaN where the penalty is 0.
        """
        pen = self.penalty
        return torch.where(pen > 0, (self.surrogate - self.improvement) / pen.clamp_min(1e-300),
                           torch.full_like(pen, float("nan")))


def single_policy_terms(mdp: FiniteMDP, pi_old: Tensor, pi_new: Tensor) -> SinglePolicyTerms:
    """Solve both policies exactly and return every term of Lemma 2.1 and Theorem 2.2 (Chapter 9).

    Theorem 2.2 (Achiam et al. 2017, Corollary 1):
    ``J(pi') - J(pi) >= L_pi(pi') - 2 gamma eps / (1 - gamma)^2 * E_{s~d_pi}[D_TV(pi', pi; s)]``,
    ``eps = max_s |E_{a~pi'} A_pi(s, a)|``. Lemma 2.1:
    ``||d_pi' - d_pi||_1 <= 2 gamma / (1 - gamma) * E_{s~d_pi}[D_TV(pi', pi; s)]``.
    Shapes: ``pi_old``, ``pi_new`` are ``[*B, S, A]``; see :class:`SinglePolicyTerms`.
    """
    _check_policy(pi_old, "pi_old", mdp.batch_shape, mdp.n_states, mdp.n_actions)
    _check_policy(pi_new, "pi_new", mdp.batch_shape, mdp.n_states, mdp.n_actions)
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
    """Trajectory-level mixing: the index never changes, ``q(i'|i) = 1{i' = i}``; shape ``[M, M]`` (Ch. 10)."""
    if not isinstance(n_versions, int) or n_versions < 1:
        raise ValueError(f"n_versions must be a positive int, got {n_versions!r}")
    return torch.eye(n_versions, dtype=dtype, device=device)


def step_kernel(sigma: Tensor, kappa: Tensor) -> Tensor:
    """Step-level mixing (Chapter 11, eq-ch11-step-kernel):

    ``q(i'|i) = (1 - sigma(i)) 1{i' = i} + sigma(i) kappa(i'|i)``: after every step, the version
    in use is replaced with probability ``sigma(i)`` by a version drawn from ``kappa(.|i)``.
    Shapes: ``sigma[*B, M]`` in ``[0, 1]``, ``kappa[*B, M, M]`` (rows are distributions);
    returns ``q[*B, M, M]``.
    """
    sigma = _check_tensor(sigma, "sigma", 1)
    kappa = _check_tensor(kappa, "kappa", 2)
    M = sigma.shape[-1]
    if tuple(kappa.shape) != (*sigma.shape, M):
        raise ValueError(f"kappa must have shape {(*sigma.shape, M)} to match sigma {tuple(sigma.shape)}, "
                         f"got {tuple(kappa.shape)}")
    if ((sigma < 0) | (sigma > 1)).any():
        raise ValueError("sigma must lie in [0, 1]")
    _check_distribution(kappa, "kappa", "kappa[..., i, :] is a distribution over versions")
    eye = torch.eye(M, dtype=kappa.dtype, device=kappa.device)
    return (1 - sigma)[..., None] * eye + sigma[..., None] * kappa


def lift_policy(pi: Tensor, n_versions: int) -> Tensor:
    """An index-blind policy on ``S x I``: ``pi~(a | s, i) = pi(a | s)`` (Chapter 10).

    ``pi[*B, S, A]`` -> ``[*B, S * M, A]`` with augmented index ``s * M + i``.
    """
    pi = _check_tensor(pi, "pi", 2)
    if not isinstance(n_versions, int) or n_versions < 1:
        raise ValueError(f"n_versions must be a positive int, got {n_versions!r}")
    *B, S, A = pi.shape
    return pi[..., :, None, :].expand(*B, S, n_versions, A).reshape(*B, S * n_versions, A)


def _check_mixture(mdp: FiniteMDP, policies: Tensor, alpha: Tensor, kernel: Tensor):
    policies = _check_tensor(policies, "policies", 3)
    B, S, A = tuple(mdp.batch_shape), mdp.n_states, mdp.n_actions
    if tuple(policies.shape[:len(B)]) != B or tuple(policies.shape[len(B) + 1:]) != (S, A) \
            or policies.dim() != len(B) + 3:
        raise ValueError(f"policies must have shape [*B, M, S, A] = {(*B, 'M', S, A)}, got {tuple(policies.shape)}")
    M = policies.shape[len(B)]
    _check_distribution(policies, "policies", "policies[..., i, s, :] is a distribution over actions")
    alpha = _check_tensor(alpha, "alpha", 1)
    if tuple(alpha.shape) == (M,):
        alpha = alpha.expand(*B, M)
    elif tuple(alpha.shape) != (*B, M):
        raise ValueError(f"alpha must have shape [M] (shared) or [*B, M] = {(*B, M)}, got {tuple(alpha.shape)}")
    _check_distribution(alpha, "alpha", "mixture weights over versions")
    kernel = _check_tensor(kernel, "kernel", 2)
    if tuple(kernel.shape) == (M, M):
        kernel = kernel.expand(*B, M, M)
    elif tuple(kernel.shape) != (*B, M, M):
        raise ValueError(f"kernel must have shape [M, M] (shared) or [*B, M, M] = {(*B, M, M)}, "
                         f"got {tuple(kernel.shape)}")
    _check_distribution(kernel, "kernel", "kernel[..., i, :] = q(. | i) is a distribution over versions")
    for name, t in (("policies", policies), ("alpha", alpha), ("kernel", kernel)):
        if t.dtype != mdp.P.dtype or t.device != mdp.P.device:
            raise TypeError(f"{name} must have the dtype and device of the MDP ({mdp.P.dtype}, {mdp.P.device})")
    return policies, alpha, kernel, M


def augment(mdp: FiniteMDP, policies: Tensor, alpha: Tensor, kernel: Tensor):
    """The augmented MDP on ``S x I`` and the mixture behaviour policy (Chapter 10, eq-ch10-augmented).

    ``P~((s', i') | (s, i), a) = P(s'|s, a) q(i'|i)``, ``R~((s, i), a) = R(s, a)``,
    ``rho0~(s, i) = rho0(s) alpha_i``, and ``beta(a | s, i) = pi^(i)(a|s)``.
    The index is redrawn from ``q(.|i)`` after every step, so the first action of a trajectory is
    taken by ``pi^(I_0)``, ``I_0 ~ alpha``.
    Shapes: ``policies[*B, M, S, A]``; ``alpha[M]`` or ``[*B, M]``; ``kernel[M, M]`` or ``[*B, M, M]``
    (a shared ``alpha`` or ``kernel`` is expanded explicitly). Returns ``(mdp_aug, beta)`` with
    ``mdp_aug.P[*B, S*M, A, S*M]`` and ``beta[*B, S*M, A]``; the flat index of ``(s, i)`` is ``s*M + i``.
    """
    policies, alpha, kernel, M = _check_mixture(mdp, policies, alpha, kernel)
    *B, S, A = mdp.R.shape
    P = torch.einsum("...sat,...ij->...siatj", mdp.P, kernel).reshape(*B, S * M, A, S * M)
    R = mdp.R[..., :, None, :].expand(*B, S, M, A).reshape(*B, S * M, A)
    rho0 = (mdp.rho0[..., :, None] * alpha[..., None, :]).reshape(*B, S * M)
    beta = policies.movedim(-3, -2).reshape(*B, S * M, A)  # [*B, S, M, A] -> [*B, S*M, A]
    return FiniteMDP(P, R, rho0, mdp.gamma), beta


@dataclass
class StaticMixtureTerms:
    """Terms of Corollary 3.1 (trajectory-level mixture), from per-version quantities (Chapter 10).

    Shapes: ``J_versions``, ``surrogates``, ``eps``, ``expected_tv`` are ``[*B, M]``; the rest ``[*B]``.
    """

    alpha: Tensor
    J_new: Tensor
    J_versions: Tensor        # J(pi^(i))
    J_mix: Tensor             # sum_i alpha_i J(pi^(i))
    improvement: Tensor       # J_new - J_mix
    surrogates: Tensor        # L_{pi^(i)}(pi)
    eps: Tensor               # C_{pi, pi^(i)} = max_s |E_{a~pi} A^(i)(s, a)|
    expected_tv: Tensor       # E_{s~d^(i)}[D_TV(pi, pi^(i); s)]
    surrogate: Tensor         # sum_i alpha_i L_i
    penalty: Tensor           # 2 gamma max_i eps_i / (1 - gamma)^2 * sum_i alpha_i E TV_i
    bound: Tensor             # surrogate - penalty  (Corollary 3.1)
    bound_per_version: Tensor  # sum_i alpha_i (L_i - 2 gamma eps_i/(1-gamma)^2 E TV_i), a tighter valid bound

    @property
    def slack(self) -> Tensor:
        return self.improvement - self.bound


def static_mixture_terms(mdp: FiniteMDP, policies: Tensor, alpha: Tensor, pi_new: Tensor) -> StaticMixtureTerms:
    """Corollary 3.1 (Chapter 10): for a trajectory-level mixture with weights ``alpha``,

    ``J(pi) - sum_i alpha_i J(pi^(i)) >= sum_i alpha_i L_{pi^(i)}(pi)
      - 2 gamma max_i C_{pi, pi^(i)} / (1 - gamma)^2 * sum_i alpha_i E_{s~d^(i)}[D_TV(pi, pi^(i); s)]``,
    computed version by version (no augmented MDP). Shapes: ``policies[*B, M, S, A]``,
    ``alpha[M]`` or ``[*B, M]``, ``pi_new[*B, S, A]``.
    """
    policies = _check_tensor(policies, "policies", 3)
    if policies.dim() != len(mdp.batch_shape) + 3:
        raise ValueError(f"policies must have shape [*B, M, S, A] with *B = {tuple(mdp.batch_shape)}, "
                         f"got {tuple(policies.shape)}")
    M = policies.shape[len(mdp.batch_shape)]
    kernel = trajectory_kernel(M, dtype=mdp.P.dtype, device=mdp.P.device)
    policies, alpha, _, M = _check_mixture(mdp, policies, alpha, kernel)
    _check_policy(pi_new, "pi_new", mdp.batch_shape, mdp.n_states, mdp.n_actions)
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
    """Terms of Theorem 4.1 and Corollary 4.2 (Chapter 11), computed on the augmented MDP.

    All fields ``[*B]`` except ``d_beta`` (``[*B, S, M]``) and ``adv_beta`` (``[*B, S, M, A]``).
    """

    gamma: Tensor
    J_old: Tensor             # J(pi_k)
    J_new: Tensor             # J(pi_{k+1})
    J_mix: Tensor             # J(beta): the return of the mixture sampler
    improvement: Tensor       # J_new - J_old
    surrogate: Tensor         # L_beta(pi_{k+1})
    eps: Tensor               # C_{pi_{k+1}, beta} = max_{s,i} |E_{a~pi_{k+1}} A_beta((s,i), a)|
    adv_old_max: Tensor       # ||A_{pi_k}||_inf
    tv_new_behaviour: Tensor  # E_{(s,i)~d_beta}[D_TV(pi_{k+1}, pi^(i); s)]
    U: Tensor                 # E_{(s,i)~d_beta}[D_TV(pi_{k+1}, pi_k; s)]
    S: Tensor                 # E_{(s,i)~d_beta}[D_TV(pi_k, pi^(i); s)]
    mixture_gap: Tensor       # J_mix - J_old (exact)
    mixture_gap_bound: Tensor  # 2 ||A_k||_inf / (1 - gamma) * S  (its bound)
    bound_thm41: Tensor       # Theorem 4.1 right-hand side
    bound_cor42: Tensor       # Corollary 4.2 right-hand side
    d_beta: Tensor
    adv_beta: Tensor

    @property
    def c_update(self) -> Tensor:
        """Coefficient of U_k in Corollary 4.2: ``2 gamma eps / (1 - gamma)^2``."""
        return 2 * self.gamma * self.eps / (1 - self.gamma) ** 2

    @property
    def c_stale(self) -> Tensor:
        """Coefficient of S_k in Corollary 4.2: ``2 gamma eps / (1 - gamma)^2 + 2 ||A_k||_inf / (1 - gamma)``."""
        return self.c_update + 2 * self.adv_old_max / (1 - self.gamma)


def dynamic_mixture_terms(mdp: FiniteMDP, policies: Tensor, alpha: Tensor, kernel: Tensor, pi_old: Tensor,
                          pi_new: Tensor) -> DynamicMixtureTerms:
    """Theorem 4.1 and Corollary 4.2 (Chapter 11), solved exactly on the augmented MDP.

    ``J(pi_{k+1}) - J(pi_k) >= L_beta(pi_{k+1})
        - 2 gamma C / (1 - gamma)^2 E_{d_beta}[D_TV(pi_{k+1}, pi^(i))]
        - 2 ||A_{pi_k}||_inf / (1 - gamma) E_{d_beta}[D_TV(pi^(i), pi_k)]``   (Theorem 4.1)
    ``>= L_beta(pi_{k+1}) - 2 gamma C/(1 - gamma)^2 U_k - (2 gamma C/(1 - gamma)^2 + 2||A_k||_inf/(1 - gamma)) S_k``
    (Corollary 4.2), with ``L_beta(pi) = 1/(1-gamma) E_{(s,i)~d_beta, a~pi}[A_beta((s,i), a)]`` and
    ``C = max_{(s,i)} |E_{a~pi_{k+1}} A_beta((s,i), a)|``.
    Shapes: ``policies[*B, M, S, A]`` (the versions ``pi^(i)`` that sample), ``alpha[M]|[*B, M]``,
    ``kernel[M, M]|[*B, M, M]``, ``pi_old`` (= pi_k) and ``pi_new`` (= pi_{k+1}) ``[*B, S, A]``.
    """
    _check_policy(pi_old, "pi_old", mdp.batch_shape, mdp.n_states, mdp.n_actions)
    _check_policy(pi_new, "pi_new", mdp.batch_shape, mdp.n_states, mdp.n_actions)
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
# Chapter 11: U_k and S_k from samples (Lemma 5.1)
# --------------------------------------------------------------------------------------------
def sample_state_actions(d: Tensor, behaviour: Tensor, n: int, *, generator: Optional[torch.Generator] = None):
    """Draw ``n`` i.i.d. pairs ``s ~ d``, ``a ~ behaviour(.|s)`` per batch element (Chapter 11).

    ``d[*B, S]`` (a distribution over states, e.g. ``visitation(aug, beta)``), ``behaviour[*B, S, A]``.
    Returns ``(states, actions)``, both ``long[*B, n]``. Sampling happens on the generator's device.
    """
    d = _check_tensor(d, "d", 1)
    behaviour = _check_tensor(behaviour, "behaviour", 2)
    if tuple(behaviour.shape[:-1]) != tuple(d.shape):
        raise ValueError(f"behaviour must have shape [*B, S, A] with [*B, S] = {tuple(d.shape)}, "
                         f"got {tuple(behaviour.shape)}")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    _check_distribution(d, "d", "state distribution")
    _check_distribution(behaviour, "behaviour", "behaviour[..., s, :] is a distribution over actions")
    dev = _gen_device(generator)
    *B, S, A = behaviour.shape
    dd = d.clamp_min(0).reshape(-1, S).to(dev)
    states = torch.multinomial(dd, n, replacement=True, generator=generator)            # [b, n]
    probs = torch.gather(behaviour.clamp_min(0).reshape(-1, S, A).to(dev), 1,
                         states[..., None].expand(-1, n, A))                               # [b, n, A]
    actions = torch.multinomial(probs.reshape(-1, A), 1, generator=generator).reshape(-1, n)
    return states.reshape(*B, n).to(d.device), actions.reshape(*B, n).to(d.device)


def half_abs_ratio_diff(logp_a: Tensor, logp_b: Tensor, logp_behaviour: Tensor, mask: Optional[Tensor] = None,
                        dim=-1) -> Tensor:
    """Sample estimate of an expected TV distance by Lemma 5.1 (Chapter 11, eq-ch11-tv-ratio):

    ``E_{s~mu}[D_TV(pi_a, pi_b; s)] = 1/2 E_{s~mu, a~pi_1}|pi_a(a|s)/pi_1(a|s) - pi_b(a|s)/pi_1(a|s)|``
    when ``pi_1`` covers the supports of ``pi_a`` and ``pi_b``. Given log-probabilities of the sampled
    actions under ``pi_a``, ``pi_b`` and the behaviour ``pi_1`` (same shapes), returns the mean over
    ``dim`` of ``1/2 |exp(logp_a - logp_1) - exp(logp_b - logp_1)|``. With ``pi_a = pi_{k+1}``,
    ``pi_b = pi_k`` and ``pi_1 = pi^(i)`` this is ``U_k = 1/2 E|rho_{k+1} - rho_k|``; with
    ``pi_a = pi_k`` and ``pi_b = pi_1`` it is ``S_k = 1/2 E|rho_k - 1|``.
    Ratios are formed in log space (log-ratio differences of +-50 stay finite). ``mask`` (same shape,
    1 = keep) averages over the kept entries only.
    """
    for name, t in (("logp_a", logp_a), ("logp_b", logp_b), ("logp_behaviour", logp_behaviour)):
        _check_tensor(t, name, 1)
    if not (logp_a.shape == logp_b.shape == logp_behaviour.shape):
        raise ValueError(f"logp_a, logp_b, logp_behaviour must have the same shape, got {tuple(logp_a.shape)}, "
                         f"{tuple(logp_b.shape)}, {tuple(logp_behaviour.shape)}")
    diff = 0.5 * (torch.exp(logp_a - logp_behaviour) - torch.exp(logp_b - logp_behaviour)).abs()
    if mask is None:
        return diff.mean(dim)
    if mask.shape != diff.shape:
        raise ValueError(f"mask must have shape {tuple(diff.shape)}, got {tuple(mask.shape)}")
    m = mask.to(diff.dtype)
    return (diff * m).sum(dim) / m.sum(dim).clamp_min(1)


def estimate_update_and_staleness(mdp: FiniteMDP, policies: Tensor, alpha: Tensor, kernel: Tensor, pi_old: Tensor,
                                  pi_new: Tensor, n: int, *, generator: Optional[torch.Generator] = None):
    """Monte Carlo estimates of ``U_k`` and ``S_k`` from ``n`` sampled ``(s, i, a)`` (Chapter 11).

    Draws ``(s, i) ~ d_beta`` (the exact augmented visitation) and ``a ~ pi^(i)(.|s)``, then applies
    :func:`half_abs_ratio_diff`: ``U_hat = 1/2 mean|rho_{k+1} - rho_k|``, ``S_hat = 1/2 mean|rho_k - 1|``
    with ``rho_j = pi_j(a|s) / pi^(i)(a|s)``. Both are unbiased; their standard error shrinks like
    ``1/sqrt(n)``. Shapes as in :func:`dynamic_mixture_terms`; returns ``(U_hat, S_hat)``, each ``[*B]``.
    """
    _check_policy(pi_old, "pi_old", mdp.batch_shape, mdp.n_states, mdp.n_actions)
    _check_policy(pi_new, "pi_new", mdp.batch_shape, mdp.n_states, mdp.n_actions)
    aug, beta = augment(mdp, policies, alpha, kernel)
    M = aug.n_states // mdp.n_states
    d_b = visitation(aug, beta)
    states, actions = sample_state_actions(d_b, beta, n, generator=generator)

    def logp(pi_aug):
        rows = torch.gather(pi_aug, -2, states[..., None].expand(*states.shape, pi_aug.shape[-1]))
        return torch.log(torch.gather(rows, -1, actions[..., None])[..., 0])

    lb, lo, ln = logp(beta), logp(lift_policy(pi_old, M)), logp(lift_policy(pi_new, M))
    return half_abs_ratio_diff(ln, lo, lb), half_abs_ratio_diff(lo, lb, lb)
