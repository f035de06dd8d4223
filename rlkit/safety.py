r"""Safety as a constraint: Lagrange multipliers and the exact KL-regularised constrained optimum.

Chapter: 18_safety_constraints.

A policy :math:`\pi` earns reward :math:`J_R(\pi) = \mathbb E_\pi[r]` and pays a cost
:math:`J_C(\pi) = \mathbb E_\pi[c]` (a violation rate when :math:`c \in \{0, 1\}`). Safety as a
*constraint* asks for

.. math::

    \max_\pi\; J_R(\pi) - \beta\,\mathrm{KL}(\pi\,\|\,\pi_{\text{ref}})
    \quad\text{subject to}\quad J_C(\pi) \le C_{\max},

with budget :math:`C_{\max}`. Its Lagrangian and the saddle point a Lagrangian method looks for are

.. math::

    L(\pi, \nu) = J_R(\pi) - \beta\,\mathrm{KL}(\pi\,\|\,\pi_{\text{ref}}) - \nu\,\big(J_C(\pi) - C_{\max}\big),
    \qquad \max_\pi \min_{\nu \ge 0} L(\pi, \nu).

The policy ascends :math:`L` in :math:`\pi` (an RL step on the reward :math:`r - \nu c`); the
multiplier descends it in :math:`\nu`, i.e. ascends the violation, projected onto
:math:`\nu \ge 0`:

.. math::

    \nu_{k+1} = \big[\nu_k + \eta_\nu\,(\hat J_C(\pi_k) - C_{\max})\big]_+ ,

with :math:`\hat J_C` measured on the *current* policy (:class:`LagrangeMultiplier`). Two variants
show what goes wrong and how to damp it: Adam on the scalar :math:`\nu`, whose first step is
:math:`\eta_\nu\,\mathrm{sign}(\hat J_C - C_{\max})` whatever the size of the violation (the same
option in :class:`LagrangeMultiplier`), and the PID Lagrangian of Stooke et al. (2020)
(:class:`PIDLagrangian`), of which projected dual ascent is the pure-integral case.

For a finite response set (one bandit per prompt) the constrained optimum is exact:
for fixed :math:`\nu` the maximiser of :math:`L` is the tilted reference policy

.. math::

    \pi_\nu(y \mid x) = \frac{\pi_{\text{ref}}(y \mid x)\, e^{(r(x,y) - \nu c(x,y))/\beta}}{Z_\nu(x)}

(:func:`tilted_policy`), the dual function is
:math:`g(\nu) = \mathbb E_x[\beta \log Z_\nu(x)] + \nu C_{\max}` (:func:`dual_function`),
convex, and :math:`\min_{\nu\ge0} g` equals the constrained optimum (strong duality: the problem is
concave in :math:`\pi` with a linear constraint). :func:`constrained_optimum` finds :math:`\nu^\star` by
bisection on :math:`J_C(\pi_\nu)`, which falls as :math:`\nu` grows
(:math:`\partial_\nu \mathbb E_{\pi_\nu}[c] = -\mathrm{Var}_{\pi_\nu}(c)/\beta`). By the
envelope theorem the slope of the optimal value in the budget is the multiplier,
:math:`\mathrm d F^\star / \mathrm d C_{\max} = \nu^\star(C_{\max})`: the price of a unit of cost.
:func:`lagrangian_dynamics` runs the two-player game exactly (exact policy gradients, any
multiplier), to watch dual ascent oscillate and PID damp it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import _validate as V

__all__ = [
    "LAMBDA_OPTIMIZERS",
    "LagrangeMultiplier",
    "PIDLagrangian",
    "lagrangian_advantages",
    "tilted_policy",
    "policy_values",
    "dual_function",
    "ConstrainedOptimum",
    "constrained_optimum",
    "lagrangian_dynamics",
]

#: The update rules of :class:`LagrangeMultiplier`.
LAMBDA_OPTIMIZERS = ("sgd", "adam")
_BISECT_MAX = 2200      # halvings of a float64 interval until its ends are adjacent floats: at most ~2100


def _max_value(max_value, name="max_value") -> float:
    return math.inf if max_value is None else V.real_in(max_value, name, 0.0, lo_open=True)


class LagrangeMultiplier:
    r"""A multiplier :math:`\nu \ge 0` for the constraint :math:`J_C \le C_{\max}`, updated by dual ascent.

    ``update(cost)`` takes the measured cost :math:`\hat J_C` of the current policy and moves
    :math:`\nu` against the gradient of the multiplier's loss
    :math:`\ell(\nu) = -\nu\,(\hat J_C - C_{\max})`, whose gradient is
    :math:`g = -(\hat J_C - C_{\max})`:

    * ``optimizer="sgd"`` (the default): projected gradient descent,

      .. math:: \nu \leftarrow \min\big(\nu_{\max},\ \big[\nu + \eta\,(\hat J_C - C_{\max})\big]_+\big),

      so the step is proportional to the violation;
    * ``optimizer="adam"``: Adam on the scalar (moments :math:`m, v`, bias corrections), then the
      same projection,

      .. math:: m \leftarrow \beta_1 m + (1-\beta_1) g,\quad v \leftarrow \beta_2 v + (1-\beta_2) g^2,\quad
                \nu \leftarrow \Big[\nu - \eta\,
                \frac{m/(1-\beta_1^k)}{\sqrt{v/(1-\beta_2^k)} + \varepsilon}\Big]_+ .

      The PITFALL: Adam divides by the gradient's own running scale, and a scalar has nothing
      else to normalise against, so the first step is :math:`\eta\,g/(|g| + \varepsilon) \approx \pm\eta` for a
      violation of 0.01 and of 1 alike, and later steps stay near :math:`\pm\eta` as long as the
      sign holds. The multiplier then moves at a fixed speed, blind to how far off the constraint is.
      (OmniSafe and safety-starter-agents use Adam on :math:`\nu`; the projection onto
      :math:`\nu \ge 0` is a clamp after the step.)

    Args:
        budget: the cost budget :math:`C_{\max}`, a finite number.
        lr: :math:`\eta > 0`.
        init: the initial multiplier :math:`\nu_0 \ge 0` (at most ``max_value``).
        optimizer: ``"sgd"`` or ``"adam"``.
        max_value: an upper bound :math:`\nu_{\max} > 0`, or None (no bound).
        betas, eps: Adam's :math:`(\beta_1, \beta_2)` in ``[0, 1)`` and :math:`\varepsilon > 0`.

    Attributes:
        value: the current multiplier :math:`\nu`.
        history: one dict per update: ``cost``, ``violation`` (:math:`\hat J_C - C_{\max}`), ``step``
            (the change of :math:`\nu`), ``value`` (after the update).

    Chapter: 18_safety_constraints.
    """

    def __init__(self, budget: float, lr: float, init: float = 0.0, optimizer: str = "sgd",
                 max_value: float | None = None, betas: tuple = (0.9, 0.999), eps: float = 1e-8):
        self.budget = V.real_in(budget, "budget")
        self.lr = V.real_in(lr, "lr", 0.0, lo_open=True)
        self.optimizer = V.choice(optimizer, "optimizer", LAMBDA_OPTIMIZERS)
        self.max_value = _max_value(max_value)
        self.value = V.real_in(init, "init", 0.0, self.max_value)
        betas = V.tuple_of(betas, "betas", (int, float), "number")
        if len(betas) != 2:
            raise ValueError(f"betas must be a pair (beta1, beta2), got {betas}")
        self.betas = tuple(V.real_in(b, f"betas[{i}]", 0.0, 1.0, hi_open=True) for i, b in enumerate(betas))
        self.eps = V.real_in(eps, "eps", 0.0, lo_open=True)
        self._m = self._v = 0.0
        self._k = 0
        self.history: list[dict] = []

    def __repr__(self) -> str:
        return (f"LagrangeMultiplier(budget={self.budget}, lr={self.lr}, optimizer={self.optimizer!r}, "
                f"value={self.value:.4g})")

    def __float__(self) -> float:
        return float(self.value)

    def update(self, cost) -> float:
        r"""Move :math:`\nu` after measuring ``cost`` (:math:`\hat J_C`, a finite number); return the new value."""
        cost = V.real_in(cost, "cost")
        violation = cost - self.budget
        old = self.value
        if self.optimizer == "sgd":
            new = old + self.lr * violation
        else:
            g = -violation
            b1, b2 = self.betas
            self._k += 1
            self._m = b1 * self._m + (1 - b1) * g
            self._v = b2 * self._v + (1 - b2) * g * g
            m_hat = self._m / (1 - b1 ** self._k)
            v_hat = self._v / (1 - b2 ** self._k)
            new = old - self.lr * m_hat / (math.sqrt(v_hat) + self.eps)
        self.value = min(max(new, 0.0), self.max_value)
        self.history.append(dict(cost=cost, violation=violation, step=self.value - old, value=self.value))
        return self.value


class PIDLagrangian:
    r"""The PID Lagrangian multiplier of Stooke, Achiam and Abbeel (2020), Algorithm 2.

    With :math:`\Delta_k = \hat J_C(\pi_k) - C_{\max}` the violation of update :math:`k`,

    .. math::

        I_k = \mathrm{clip}\big(I_{k-1} + \Delta_k,\ 0,\ I_{\max}\big),\qquad
        \partial_k = \big(\bar J_k - \bar J_{k-1}\big)_+ ,\qquad
        \nu_k = \min\big(\nu_{\max},\ \big[K_P\,\bar\Delta_k + K_I\, I_k + K_D\,\partial_k\big]_+\big),

    where :math:`\bar\Delta, \bar J` are exponential moving averages of the violation and the cost
    with weight ``ema`` on the past (0: the raw measurements), :math:`\partial_0 = 0`, and
    :math:`I_{\max} = \nu_{\max}/K_I` (anti-windup; no bound without ``max_value``). The integral
    term is projected dual ascent: with :math:`K_P = K_D = 0` this *is*
    :class:`LagrangeMultiplier` with ``lr`` :math:`= K_I` (same :math:`\nu` at every step).
    The proportional term reacts to the violation now, so :math:`\nu` drops as soon as the
    cost falls under the budget instead of waiting for the integral to unwind (the overshoot of
    plain dual ascent); the derivative term pushes back while the cost is rising.

    Args:
        budget: the cost budget :math:`C_{\max}`, a finite number.
        kp, ki, kd: the gains :math:`K_P, K_I, K_D \ge 0`, not all 0.
        init: the multiplier :math:`\nu` before the first update (the integral starts at ``init / ki``;
            with ``ki = 0``, ``init`` must be 0).
        ema: weight in ``[0, 1)`` of the past in the moving averages.
        max_value: :math:`\nu_{\max} > 0` or None.

    Attributes:
        value, history: as :class:`LagrangeMultiplier` (``history`` adds ``p``, ``i``, ``d``: the three
            terms :math:`K_P\bar\Delta`, :math:`K_I I`, :math:`K_D\partial`).

    Chapter: 18_safety_constraints.
    """

    def __init__(self, budget: float, kp: float = 0.0, ki: float = 0.0, kd: float = 0.0, init: float = 0.0,
                 ema: float = 0.0, max_value: float | None = None):
        self.budget = V.real_in(budget, "budget")
        self.kp, self.ki, self.kd = (V.real_in(k, n, 0.0) for k, n in ((kp, "kp"), (ki, "ki"), (kd, "kd")))
        if self.kp == self.ki == self.kd == 0.0:
            raise ValueError("PIDLagrangian needs at least one of kp, ki, kd > 0 (all three are 0)")
        self.ema = V.real_in(ema, "ema", 0.0, 1.0, hi_open=True)
        self.max_value = _max_value(max_value)
        init = V.real_in(init, "init", 0.0, self.max_value)
        if self.ki == 0.0 and init != 0.0:
            raise ValueError(f"PIDLagrangian: init={init} needs ki > 0 (the integral term holds the initial value)")
        self._i_max = self.max_value / self.ki if self.ki > 0 else math.inf
        self._integral = init / self.ki if self.ki > 0 else 0.0
        self._delta = None          # moving average of the violation
        self._cost = None           # moving average of the cost
        self.value = init
        self.history: list[dict] = []

    def __repr__(self) -> str:
        return f"PIDLagrangian(budget={self.budget}, kp={self.kp}, ki={self.ki}, kd={self.kd}, value={self.value:.4g})"

    def __float__(self) -> float:
        return float(self.value)

    def update(self, cost) -> float:
        r"""Move :math:`\nu` after measuring ``cost`` (:math:`\hat J_C`, a finite number); return the new value."""
        cost = V.real_in(cost, "cost")
        violation = cost - self.budget
        a = self.ema
        self._integral = min(max(self._integral + violation, 0.0), self._i_max)
        self._delta = violation if self._delta is None else a * self._delta + (1 - a) * violation
        prev = self._cost
        self._cost = cost if prev is None else a * prev + (1 - a) * cost
        deriv = 0.0 if prev is None else max(self._cost - prev, 0.0)
        p, i, d = self.kp * self._delta, self.ki * self._integral, self.kd * deriv
        old = self.value
        self.value = min(max(p + i + d, 0.0), self.max_value)
        self.history.append(dict(cost=cost, violation=violation, step=self.value - old, value=self.value,
                                 p=p, i=i, d=d))
        return self.value


def lagrangian_advantages(adv_reward: torch.Tensor, adv_cost: torch.Tensor, lam,
                          mask: torch.Tensor | None = None, scale: str = "one_plus_lambda") -> torch.Tensor:
    r"""The advantage of the Lagrangian reward :math:`r - \nu c`, optionally rescaled.

    .. math:: \hat A = \frac{\hat A_R - \nu\,\hat A_C}{1 + \nu}\quad(\texttt{scale="one\_plus\_lambda"}),
              \qquad \hat A = \hat A_R - \nu\,\hat A_C\quad(\texttt{scale="none"}).

    Advantages are linear in the reward, so :math:`\hat A_R - \nu\hat A_C` is the advantage of
    :math:`r - \nu c` when both come from the same estimator (GAE with the same
    :math:`\gamma` and trace parameter :math:`\lambda`). Dividing by :math:`1 + \nu` (safety-starter-agents,
    OmniSafe, Safe RLHF) keeps the advantage's size bounded as :math:`\nu` grows without
    changing its direction; an optimiser that normalises the step (Adam) or whitening afterwards
    makes it nearly irrelevant.

    Args:
        adv_reward, adv_cost: float tensors of the same shape (any shape).
        lam: the multiplier :math:`\nu`, a finite number :math:`\ge 0`.
        mask: optional, same shape; the result is 0 where it is 0 (padding may hold NaN).
        scale: ``"one_plus_lambda"`` or ``"none"``.

    Returns:
        a tensor shaped like ``adv_reward``. Chapter: 18_safety_constraints.
    """
    V.float_tensor(adv_reward, "adv_reward", min_dim=0)
    V.float_tensor(adv_cost, "adv_cost", min_dim=0)
    V.same_layout(adv_reward, "adv_reward", adv_cost, "adv_cost")
    lam = V.real_in(lam, "lam", 0.0)
    V.choice(scale, "scale", ("one_plus_lambda", "none"))
    m = V.check_mask(mask, adv_reward, "adv_reward", as_bool=True)
    out = adv_reward - lam * adv_cost
    if scale == "one_plus_lambda":
        out = out / (1.0 + lam)
    if m is not None:
        out = torch.where(m, out, torch.zeros((), dtype=out.dtype, device=out.device))
    return out


# ------------------------------------------------------------------------- the exact optimum

def _bandit(ref_probs, reward, cost, weights):
    V.distribution(ref_probs, "ref_probs", "over the responses of each prompt", min_dim=2)
    if ref_probs.dim() != 2 or ref_probs.shape[0] == 0:
        raise ValueError(f"ref_probs must have shape [prompts N >= 1, responses K], got {tuple(ref_probs.shape)}")
    V.float_tensor(reward, "reward")
    V.float_tensor(cost, "cost")
    V.same_layout(ref_probs, "ref_probs", reward, "reward")
    V.same_layout(ref_probs, "ref_probs", cost, "cost")
    V.tensor_in(reward, "reward")
    V.tensor_in(cost, "cost")
    N = ref_probs.shape[0]
    if weights is None:
        weights = torch.full((N,), 1.0 / N, dtype=ref_probs.dtype, device=ref_probs.device)
    else:
        V.distribution(weights, "weights", "over the prompts", shape=(N,))
        weights = V.same_kind(weights, "weights", ref_probs, "ref_probs")
    return weights


def _tilt_logits(ref_probs, reward, cost, lam, beta):
    logits = (reward - lam * cost) / beta
    return torch.where(ref_probs > 0, ref_probs.log() + logits, torch.full_like(logits, -math.inf))


def tilted_policy(ref_probs: torch.Tensor, reward: torch.Tensor, cost: torch.Tensor, lam, beta) -> torch.Tensor:
    r"""The maximiser of the Lagrangian for a fixed :math:`\nu`, the tilted reference policy.

    .. math:: \pi_\nu(y\mid x) = \frac{\pi_{\text{ref}}(y\mid x)\,e^{(r(x,y) - \nu c(x,y))/\beta}}
                                          {\sum_{y'}\pi_{\text{ref}}(y'\mid x)\,e^{(r(x,y') - \nu c(x,y'))/\beta}}

    (computed in log space; responses with :math:`\pi_{\text{ref}} = 0` keep probability 0).

    Args:
        ref_probs: ``[N, K]`` float, one distribution over ``K`` responses per prompt.
        reward, cost: ``[N, K]``, finite.
        lam: the multiplier :math:`\nu \ge 0`. beta: :math:`\beta > 0` (the KL coefficient).

    Returns:
        ``[N, K]`` probabilities. Chapter: 18_safety_constraints.
    """
    _bandit(ref_probs, reward, cost, None)
    lam = V.real_in(lam, "lam", 0.0)
    beta = V.real_in(beta, "beta", 0.0, lo_open=True)
    return torch.softmax(_tilt_logits(ref_probs, reward, cost, lam, beta), dim=-1)


def policy_values(probs: torch.Tensor, ref_probs: torch.Tensor, reward: torch.Tensor, cost: torch.Tensor,
                  weights: torch.Tensor | None = None) -> dict:
    r"""Reward, cost and KL of a policy on a bandit, averaged over prompts with ``weights``.

    .. math:: J_R = \sum_x w_x \sum_y \pi(y\mid x)\,r(x,y),\quad J_C = \sum_x w_x\sum_y\pi(y\mid x)\,c(x,y),\quad
              \mathrm{KL} = \sum_x w_x \sum_y \pi(y\mid x)\log\frac{\pi(y\mid x)}{\pi_{\text{ref}}(y\mid x)}

    (:math:`0\log0 = 0`; a policy that puts mass where :math:`\pi_{\text{ref}} = 0` has KL :math:`+\infty`).

    Args:
        probs, ref_probs: ``[N, K]`` distributions; reward, cost: ``[N, K]``; weights: ``[N]`` or None (uniform).

    Returns:
        ``{"reward", "cost", "kl"}`` as floats. Chapter: 18_safety_constraints.
    """
    w = _bandit(ref_probs, reward, cost, weights)
    V.distribution(probs, "probs", "over the responses of each prompt", shape=tuple(ref_probs.shape))
    pos = probs > 0
    if bool((pos & (ref_probs <= 0)).any()):
        kl = math.inf
    else:
        terms = torch.where(pos, probs * (probs.clamp_min(1e-300).log() - ref_probs.clamp_min(1e-300).log()),
                            torch.zeros_like(probs))
        kl = float((w * terms.sum(-1)).sum())
    return {"reward": float((w * (probs * reward).sum(-1)).sum()),
            "cost": float((w * (probs * cost).sum(-1)).sum()), "kl": kl}


def dual_function(lam, ref_probs: torch.Tensor, reward: torch.Tensor, cost: torch.Tensor, budget, beta,
                  weights: torch.Tensor | None = None) -> float:
    r"""The Lagrange dual :math:`g(\nu) = \max_\pi L(\pi, \nu)` of the KL-regularised constrained problem.

    .. math:: g(\nu) = \sum_x w_x\,\beta\log\sum_y \pi_{\text{ref}}(y\mid x)\,
              e^{(r(x,y) - \nu c(x,y))/\beta}\ +\ \nu\,C_{\max} .

    It is convex in :math:`\nu`; every :math:`g(\nu)`, :math:`\nu\ge0`, bounds the constrained
    optimum from above (weak duality), and :math:`\min_{\nu\ge0} g` equals it (strong duality).

    Args:
        lam: the multiplier :math:`\nu \ge 0`. ref_probs, reward, cost: ``[N, K]``. budget: the cost budget
            :math:`C_{\max}`.
        beta: :math:`\beta > 0`. weights: ``[N]`` prompt weights or None (uniform).

    Returns:
        :math:`g(\nu)`, a float. Chapter: 18_safety_constraints.
    """
    w = _bandit(ref_probs, reward, cost, weights)
    lam = V.real_in(lam, "lam", 0.0)
    budget = V.real_in(budget, "budget")
    beta = V.real_in(beta, "beta", 0.0, lo_open=True)
    logz = torch.logsumexp(_tilt_logits(ref_probs, reward, cost, lam, beta), dim=-1)
    return float((w * beta * logz).sum()) + lam * budget


@dataclass
class ConstrainedOptimum:
    r"""What :func:`constrained_optimum` returns.

    ``lam`` (:math:`\nu^\star`), ``probs`` (``[N, K]``, :math:`\pi_{\nu^\star}`), ``reward``,
    ``cost``, ``kl`` (of :math:`\pi_{\nu^\star}`), ``objective``
    (:math:`J_R - \beta\,\mathrm{KL}`, the primal value) and ``dual`` (:math:`g(\nu^\star)`, equal
    to ``objective`` up to the bisection tolerance when the constraint binds).
    """

    lam: float
    probs: torch.Tensor
    reward: float
    cost: float
    kl: float
    objective: float
    dual: float


def constrained_optimum(ref_probs: torch.Tensor, reward: torch.Tensor, cost: torch.Tensor, budget, beta,
                        weights: torch.Tensor | None = None, tol: float = 1e-10) -> ConstrainedOptimum:
    r"""Solve :math:`\max_\pi J_R - \beta\,\mathrm{KL}(\pi\|\pi_{\text{ref}})` s.t. :math:`J_C \le C_{\max}` exactly.

    The optimum is :math:`\pi_{\nu^\star}` (:func:`tilted_policy`) with :math:`\nu^\star = 0` if
    :math:`J_C(\pi_0) \le C_{\max}` (the constraint is slack), else the root of
    :math:`J_C(\pi_\nu) = C_{\max}`, found by bisection (:math:`J_C(\pi_\nu)` is continuous and
    non-increasing in :math:`\nu`) to ``tol`` in :math:`\nu` (relative to :math:`\max(1, \nu)`), or until
    the bracket's ends are adjacent floats, whichever comes first (``tol=0``: to full float precision).
    These are the KKT conditions:
    :math:`\nu^\star \ge 0`, :math:`J_C \le C_{\max}`, :math:`\nu^\star (J_C - C_{\max}) = 0`.

    Args:
        ref_probs: ``[N, K]`` distributions; reward, cost: ``[N, K]``; budget: the cost budget :math:`C_{\max}`;
        beta: :math:`\beta > 0`; weights: ``[N]`` or None (uniform); tol: a finite number ``>= 0``.

    Returns:
        a :class:`ConstrainedOptimum`. A budget below the least cost any policy with the reference's
        support can reach (:math:`\sum_x w_x \min_{y:\,\pi_{\text{ref}}>0} c`) raises ``ValueError``; a
        budget equal to it gives the limit :math:`\nu^\star = \infty`, the tilted reference restricted to
        each prompt's cheapest responses.
        Chapter: 18_safety_constraints.
    """
    w = _bandit(ref_probs, reward, cost, weights)
    budget = V.real_in(budget, "budget")
    beta = V.real_in(beta, "beta", 0.0, lo_open=True)
    tol = V.real_in(tol, "tol", 0.0)

    def cost_at(lam):
        p = torch.softmax(_tilt_logits(ref_probs, reward, cost, lam, beta), dim=-1)
        return float((w * (p * cost).sum(-1)).sum())

    least = torch.where(ref_probs > 0, cost, torch.full_like(cost, math.inf)).amin(-1, keepdim=True)
    floor = float((w * least[:, 0]).sum())
    if cost_at(0.0) <= budget:
        lam = 0.0
    elif budget < floor - 1e-12:
        raise ValueError(f"budget {budget} is infeasible: the least cost a policy with the reference's support "
                         f"can reach is {floor:.6g}")
    elif budget <= floor + 1e-12:
        # the limit nu -> infinity: the reference conditioned on each prompt's cheapest responses
        keep = (ref_probs > 0) & (cost <= least)
        probs = torch.where(keep, ref_probs * torch.exp((reward - reward.amax(-1, keepdim=True)) / beta),
                            torch.zeros_like(ref_probs))
        probs = probs / probs.sum(-1, keepdim=True)
        vals = policy_values(probs, ref_probs, reward, cost, w)
        obj = vals["reward"] - beta * vals["kl"]
        return ConstrainedOptimum(lam=math.inf, probs=probs, reward=vals["reward"], cost=vals["cost"],
                                  kl=vals["kl"], objective=obj, dual=obj)
    else:
        lo, hi = 0.0, 1.0
        while cost_at(hi) > budget:
            lo, hi = hi, 2.0 * hi
            if hi > 1e12:
                raise ValueError(f"budget {budget}: no multiplier nu below 1e12 reaches it "
                                 f"(least cost {floor:.6g})")
        for _ in range(_BISECT_MAX):                     # ends when lo and hi are adjacent floats at the latest
            mid = 0.5 * (lo + hi)
            if hi - lo <= tol * max(1.0, hi) or not lo < mid < hi:
                break
            lo, hi = (mid, hi) if cost_at(mid) > budget else (lo, mid)
        lam = hi
    probs = torch.softmax(_tilt_logits(ref_probs, reward, cost, lam, beta), dim=-1)
    vals = policy_values(probs, ref_probs, reward, cost, w)
    return ConstrainedOptimum(lam=lam, probs=probs, reward=vals["reward"], cost=vals["cost"], kl=vals["kl"],
                              objective=vals["reward"] - beta * vals["kl"],
                              dual=dual_function(lam, ref_probs, reward, cost, budget, beta, w))


def lagrangian_dynamics(ref_probs: torch.Tensor, reward: torch.Tensor, cost: torch.Tensor, multiplier, beta,
                        steps: int, policy_lr: float, weights: torch.Tensor | None = None) -> dict:
    r"""The Lagrangian game played exactly: one policy-gradient step, then one multiplier update, repeated.

    The policy is a softmax over logits :math:`\theta` (one row per prompt), started at
    :math:`\pi_{\text{ref}}`. Step :math:`k` measures the exact :math:`J_C(\pi_{\theta_k})`, updates the
    multiplier with it (``multiplier.update``), then takes one gradient-ascent step on
    :math:`L(\pi_\theta, \nu_{k+1}) = J_R - \beta\,\mathrm{KL} - \nu_{k+1}(J_C - C_{\max})` with the exact
    gradient in :math:`\theta` and step ``policy_lr``. This is what a Lagrangian RL trainer does with
    infinitely large batches: what remains is the lag between :math:`\nu` and the policy.

    Args:
        ref_probs: ``[N, K]`` distributions with full support (all > 0); reward, cost: ``[N, K]``.
        multiplier: anything with ``update(cost) -> float`` and ``value`` (:class:`LagrangeMultiplier`,
            :class:`PIDLagrangian`); it is updated in place.
        beta: :math:`\beta \ge 0`. steps: an int >= 1. policy_lr: ``> 0``. weights: ``[N]`` or None.

    Returns:
        ``{"lam", "cost", "reward", "kl"}``, each a float64 tensor ``[steps]`` (``cost`` is the cost
        measured at step :math:`k`, before the policy moved; ``lam`` the multiplier :math:`\nu_{k+1}` it produced).
        Chapter: 18_safety_constraints.
    """
    w = _bandit(ref_probs, reward, cost, weights)
    if bool((ref_probs <= 0).any()):
        raise ValueError("ref_probs must be > 0 everywhere (the softmax policy starts at the reference)")
    V.has_method(multiplier, "multiplier", "update")
    beta = V.real_in(beta, "beta", 0.0)
    steps = V.int_in(steps, "steps")
    policy_lr = V.real_in(policy_lr, "policy_lr", 0.0, lo_open=True)
    ref, r, c, w = (x.detach().double() for x in (ref_probs, reward, cost, w))
    log_ref = ref.log()
    theta = log_ref.clone().requires_grad_(True)
    out = {k: torch.zeros(steps, dtype=torch.float64) for k in ("lam", "cost", "reward", "kl")}
    for k in range(steps):
        logp = torch.log_softmax(theta, -1)
        p = logp.exp()
        jr, jc = (w * (p * r).sum(-1)).sum(), (w * (p * c).sum(-1)).sum()
        kl = (w * (p * (logp - log_ref)).sum(-1)).sum()
        lam = float(multiplier.update(float(jc.detach())))
        for key, val in (("lam", lam), ("cost", jc), ("reward", jr), ("kl", kl)):
            out[key][k] = float(val.detach()) if isinstance(val, torch.Tensor) else val
        obj = jr - beta * kl - lam * jc
        (g,) = torch.autograd.grad(obj, theta)
        with torch.no_grad():
            theta += policy_lr * g
    return out
