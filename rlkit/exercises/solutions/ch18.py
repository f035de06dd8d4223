r"""Checkers for the exercises of chapter 18, ``lessons/18_safety_constraints.ipynb``.

* ``dual_step(lam, cost, budget, lr)``: one step of projected dual ascent,
  :math:`\nu \leftarrow [\nu + \eta(\hat J_C - C_{\max})]_+`, on tensors of the same shape
  (``lam`` is the multiplier :math:`\nu`, ``budget`` the cost budget :math:`C_{\max}`, ``lr`` the step :math:`\eta`).
* ``pid_lambdas(costs, budget, kp, ki, kd)``: the multipliers :math:`\nu_k` of the PID Lagrangian (Stooke
  et al. 2020, no smoothing) after each measured cost, with :math:`\Delta_k = J_k - C_{\max}` (``budget``),
  a ``[K]`` float64 tensor:
  :math:`I_k = (I_{k-1} + \Delta_k)_+`, :math:`\partial_k = (J_k - J_{k-1})_+` (:math:`\partial_1 = 0`),
  :math:`\nu_k = (K_P\Delta_k + K_I I_k + K_D\partial_k)_+`.
* ``lagrangian_policy(ref_probs, reward, cost, lam, beta)`` (``lam`` the multiplier :math:`\nu`): the maximiser of
  :math:`\mathbb E_\pi[r - \nu c] - \beta\,\mathrm{KL}(\pi\|\pi_{\text{ref}})`,
  :math:`\pi \propto \pi_{\text{ref}}\,e^{(r - \nu c)/\beta}`, ``[N, K]``.
* ``shielded_logprobs(logits, banned)``: the log-probabilities of the shielded sampler,
  :math:`\log q = \log\mathrm{softmax}(z)` renormalised over the allowed tokens, :math:`-\infty` at the
  banned ones (``banned`` a bool tensor like ``logits``).
"""
from __future__ import annotations

import torch

from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []


# ------------------------------------------------------------------- 1. dual_step

def _dual_cases():
    d = torch.float64
    lam = torch.tensor([0.0, 0.5, 2.0, 0.1, 3.0], dtype=d)
    cost = torch.tensor([0.02, 0.30, 0.05, 0.00, 0.50], dtype=d)
    return [
        Case(args=(torch.tensor([0.5], dtype=d), torch.tensor([0.3], dtype=d), 0.1, 2.0),
             label="hand case: nu 0.5, cost 0.3, budget 0.1, lr 2 -> 0.9"),
        Case(args=(lam, cost, 0.1, 5.0), label="five multipliers, some under the budget (the projection binds)"),
        Case(args=(lam, cost, 0.0, 0.5), label="budget 0: every cost is a violation"),
    ]


@exercise(chapter=18, cases=_dual_cases, atol=1e-10,
          description="one step of projected dual ascent on the Lagrange multiplier")
def dual_step(lam, cost, budget, lr):
    """[lam + lr (cost - budget)]_+ elementwise: lam is the multiplier nu, budget the cost budget C_max, lr the step."""
    return (lam + lr * (cost - budget)).clamp_min(0.0)


@mistake(dual_step, "the multiplier was not projected: nu must stay >= 0 (clamp after the step); a negative "
         "nu would REWARD cost")
def _dual_no_projection(lam, cost, budget, lr):
    return lam + lr * (cost - budget)


@mistake(dual_step, "the sign is flipped: nu must GROW when the cost exceeds the budget (gradient ascent on "
         "the violation, i.e. descent on the Lagrangian in nu)")
def _dual_sign(lam, cost, budget, lr):
    return (lam - lr * (cost - budget)).clamp_min(0.0)


@mistake(dual_step, "the step used the cost itself; it must use the violation cost - budget, or nu can only grow")
def _dual_no_budget(lam, cost, budget, lr):
    return (lam + lr * cost).clamp_min(0.0)


@mistake(dual_step, "the step is lr * sign(violation), what Adam does on a scalar: dual ascent's step is "
         "proportional to the size of the violation")
def _dual_sign_only(lam, cost, budget, lr):
    return (lam + lr * torch.sign(cost - budget)).clamp_min(0.0)


# ------------------------------------------------------------------- 2. pid_lambdas

def _pid_cases():
    d = torch.float64
    up_down = torch.tensor([0.30, 0.25, 0.15, 0.05, 0.00, 0.00, 0.02, 0.20], dtype=d)
    return [
        Case(args=(torch.tensor([0.3, 0.1], dtype=d), 0.1, 1.0, 2.0, 0.0),
             label="hand case: costs 0.3, 0.1, budget 0.1, K_P 1, K_I 2 -> [0.6, 0.4]"),
        Case(args=(up_down, 0.1, 0.0, 1.0, 0.0), label="integral only: projected dual ascent"),
        Case(args=(up_down, 0.1, 2.0, 0.5, 0.0), label="PI: the cost falls below the budget and comes back"),
        Case(args=(up_down, 0.1, 1.0, 0.5, 3.0), label="PID: the derivative term acts only while the cost rises"),
        Case(args=(torch.tensor([0.2, 0.0, 0.0, 0.0, 0.0, 0.3, 0.3], dtype=d), 0.1, 0.0, 1.0, 0.0),
             label="integral only: a long stretch under the budget, then the cost comes back"),
        Case(args=(up_down, 0.2, 1.0, 0.5, 1.0), label="PID with a budget of 0.2"),
    ]


def _pid(costs, budget, kp, ki, kd, project_i=True, one_sided=True, project=True):
    out = torch.zeros_like(costs)
    integral, prev = 0.0, None
    for k, c in enumerate(costs.tolist()):
        delta = c - budget
        integral = integral + delta
        if project_i:
            integral = max(integral, 0.0)
        deriv = 0.0 if prev is None else c - prev
        if one_sided:
            deriv = max(deriv, 0.0)
        lam = kp * delta + ki * integral + kd * deriv
        out[k] = max(lam, 0.0) if project else lam
        prev = c
    return out


@exercise(chapter=18, cases=_pid_cases, atol=1e-10,
          description="the PID Lagrangian's multiplier after each measured cost (Stooke et al. 2020)")
def pid_lambdas(costs, budget, kp, ki, kd):
    """nu_k = (K_P Delta_k + K_I I_k + K_D (J_k - J_{k-1})_+)_+ with I_k = (I_{k-1} + Delta_k)_+; [K] float64.

    Delta_k = costs[k] - budget, with budget the cost budget C_max; nu_k is the multiplier nu after cost k.
    """
    return _pid(costs, budget, kp, ki, kd)


@mistake(pid_lambdas, "the integral was not projected (I_k = max(I_{k-1} + Delta_k, 0)): without it the sum winds "
         "down below 0 while the cost is under the budget, and nu stays at 0 long after the cost comes back")
def _pid_windup(costs, budget, kp, ki, kd):
    return _pid(costs, budget, kp, ki, kd, project_i=False)


@mistake(pid_lambdas, "the derivative term must act only while the cost RISES, (J_k - J_{k-1})_+; a two-sided "
         "derivative also lowers nu whenever the cost falls")
def _pid_two_sided(costs, budget, kp, ki, kd):
    return _pid(costs, budget, kp, ki, kd, one_sided=False)


@mistake(pid_lambdas, "nu itself was not projected onto >= 0: the proportional term can be negative under "
         "the budget, and a negative multiplier rewards cost")
def _pid_unprojected(costs, budget, kp, ki, kd):
    return _pid(costs, budget, kp, ki, kd, project=False)


# ------------------------------------------------------------------- 3. lagrangian_policy

def _lp_cases():
    d = torch.float64
    ref = torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.25, 0.25]], dtype=d)
    r = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.5]], dtype=d)
    c = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]], dtype=d)
    return [
        Case(args=(torch.tensor([[0.5, 0.5]], dtype=d), torch.tensor([[1.0, 0.0]], dtype=d),
                   torch.tensor([[1.0, 0.0]], dtype=d), 1.0, 0.5),
             label="hand case: nu = 1 makes reward and cost cancel -> the reference [0.5, 0.5]"),
        Case(args=(ref, r, c, 2.0, 0.5), label="two prompts, nu 2, beta 0.5"),
        Case(args=(ref, r, c, 0.3, 2.0), label="nu 0.3, beta 2 (close to the reference)"),
    ]


@exercise(chapter=18, cases=_lp_cases, atol=1e-10,
          description="the maximiser of E[r - nu c] - beta KL(pi || pi_ref) over a finite response set")
def lagrangian_policy(ref_probs, reward, cost, lam, beta):
    """pi(y|x) proportional to ref(y|x) exp((r - lam c)/beta), normalised per row; [N, K]. lam is the multiplier nu."""
    return torch.softmax(ref_probs.log() + (reward - lam * cost) / beta, dim=-1)


@mistake(lagrangian_policy, "the cost entered with the wrong sign: the Lagrangian reward is r - nu c")
def _lp_sign(ref_probs, reward, cost, lam, beta):
    return torch.softmax(ref_probs.log() + (reward + lam * cost) / beta, dim=-1)


@mistake(lagrangian_policy, "the exponent was multiplied by beta; it is (r - nu c) / beta (a large KL "
         "coefficient keeps the policy CLOSE to the reference)")
def _lp_times_beta(ref_probs, reward, cost, lam, beta):
    return torch.softmax(ref_probs.log() + (reward - lam * cost) * beta, dim=-1)


@mistake(lagrangian_policy, "the reference policy was left out: the KL term tilts pi_ref, it does not replace it "
         "with a uniform prior")
def _lp_no_ref(ref_probs, reward, cost, lam, beta):
    return torch.softmax((reward - lam * cost) / beta, dim=-1)


@mistake(lagrangian_policy, "the tilted weights were not normalised over each prompt's responses")
def _lp_unnormalised(ref_probs, reward, cost, lam, beta):
    return ref_probs * torch.exp((reward - lam * cost) / beta)


# ------------------------------------------------------------------- 4. shielded_logprobs

def _sh_cases():
    g = torch.Generator().manual_seed(18)
    logits = torch.randn(3, 6, generator=g, dtype=torch.float64) * 2
    banned = torch.zeros(3, 6, dtype=torch.bool)
    banned[0, 2] = True
    banned[1, [0, 4]] = True
    return [
        Case(args=(torch.log(torch.tensor([[0.5, 0.25, 0.25]], dtype=torch.float64)),
                   torch.tensor([[False, True, False]])),
             label="hand case: p = [0.5, 0.25, 0.25], ban the second -> q = [2/3, 0, 1/3]"),
        Case(args=(logits, banned), label="three positions, one banned token, two banned, none banned"),
    ]


@exercise(chapter=18, cases=_sh_cases, atol=1e-10,
          description="log-probabilities of the shielded sampler: banned tokens removed, the rest renormalised")
def shielded_logprobs(logits, banned):
    """log_softmax over the allowed tokens, -inf at the banned ones; [N, V]."""
    return torch.log_softmax(logits.masked_fill(banned, float("-inf")), dim=-1)


@mistake(shielded_logprobs, "the banned tokens kept their probability mass: q must be renormalised over the "
         "allowed tokens (log p is NOT the behaviour log-prob of a shielded sampler)")
def _sh_no_renorm(logits, banned):
    return torch.log_softmax(logits, dim=-1).masked_fill(banned, float("-inf"))


@mistake(shielded_logprobs, "the banned logits were set to 0, not -inf: a zero logit is an ordinary token that can "
         "still be sampled")
def _sh_zero(logits, banned):
    return torch.log_softmax(logits.masked_fill(banned, 0.0), dim=-1)


@mistake(shielded_logprobs, "you returned the unshielded log p: the ratio of PPO must use the distribution that "
         "really sampled the tokens")
def _sh_unshielded(logits, banned):
    return torch.log_softmax(logits, dim=-1)
