r"""Checkers for the exercises of the prerequisite appendix, ``lessons/00_prerequisites.ipynb``.

* ``action_values(P, R, pi, gamma)``: :math:`Q^\pi` by one linear solve over state-action pairs,
  :math:`(I - \gamma\bar P_\pi)q = R` with :math:`\bar P_\pi[(s,a),(s',a')] = P(s'\mid s,a)\pi(a'\mid s')`.
* ``modified_policy_iteration(P, R, gamma, n_eval, n_iters)``: from :math:`V = 0`, ``n_iters`` times a
  greedy step (first maximal action) followed by ``n_eval`` sweeps of :math:`\mathcal T^\pi`, warm-started
  from the current :math:`V`; returns :math:`V`.
* ``finite_horizon_value(P, R, pi, H)``: backward induction with :math:`\gamma = 1`,
  :math:`V_H = 0`, :math:`V_t = r_\pi + P_\pi V_{t+1}`; returns ``[H + 1, S]``.

Shapes: ``P[S, A, S]``, ``R[S, A]``, ``pi[S, A]``, float64; ``gamma`` a float in [0, 1).
"""
from __future__ import annotations

import torch

from rlkit import _validate as V
from rlkit import tabular as T
from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []
F64 = torch.float64


def _mdps(seed: int, specs):
    """One random MDP and policy per ``(S, A, gamma, temperature)``: ``(P, R, pi, gamma)``."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for S, A, gamma, temperature in specs:
        mdp = T.random_mdp(1, S, A, gamma, peakiness=3.0, generator=g)[0]
        pi = T.random_policy(1, S, A, temperature=temperature, generator=g)[0]
        out.append((mdp.P, mdp.R, pi, gamma))
    return out


def _check_mdp(P, R, pi=None):
    sizes = V.layout("S A S", floating=True, P=P)
    V.layout("S A", sizes, floating=True, R=R)
    if pi is not None:
        V.layout("S A", sizes, floating=True, pi=pi)


# ------------------------------------------------------------------------- 1. action_values

def _q_cases():
    (P1, R1, pi1, _), (P2, R2, pi2, _), (P3, R3, pi3, _) = _mdps(1000, [(4, 3, 0.9, 1.0), (6, 2, 0.99, 0.3),
                                                                     (3, 3, 0.5, 1.0)])
    det = torch.nn.functional.one_hot(torch.tensor([1, 0, 2]), 3).to(F64)     # a deterministic policy
    return [
        Case(args=(P1, R1, pi1, 0.9), label="4 states, 3 actions, gamma = 0.9"),
        Case(args=(P2, R2, pi2, 0.99), label="6 states, 2 actions, gamma = 0.99, a peaked policy"),
        Case(args=(P3, R3, det, 0.5), label="a deterministic policy, gamma = 0.5"),
        Case(args=(P3, R3, pi3, 0.0), label="gamma = 0: Q = R"),
    ]


@exercise(chapter=0, cases=_q_cases, atol=1e-9,
          description="Q^pi by one linear solve over state-action pairs (exercise ex-ch00-q-solve).")
def action_values(P, R, pi, gamma):
    r""":math:`q = (I - \gamma\bar P_\pi)^{-1}R` with :math:`\bar P_\pi[(s,a),(s',a')] = P(s'\mid s,a)\,\pi(a'\mid s')`;
    ``P[S, A, S]``, ``R[S, A]``, ``pi[S, A]`` -> ``Q[S, A]``."""
    _check_mdp(P, R, pi)
    gamma = V.real_in(gamma, "gamma", 0.0, 1.0, hi_open=True)
    S, A = R.shape
    P_sa = torch.einsum("sat,tb->satb", P, pi).reshape(S * A, S * A)
    q = torch.linalg.solve(torch.eye(S * A, dtype=P.dtype) - gamma * P_sa, R.reshape(S * A))
    return q.reshape(S, A)


@mistake(action_values, "the next action is drawn in the NEXT state: the kernel is P(s'|s,a) pi(a'|s'), "
         "and you used pi(a'|s), the policy of the current state")
def _q_policy_of_current_state(P, R, pi, gamma):
    S, A = R.shape
    P_sa = torch.einsum("sat,sb->satb", P, pi).reshape(S * A, S * A)
    q = torch.linalg.solve(torch.eye(S * A, dtype=P.dtype) - gamma * P_sa, R.reshape(S * A))
    return q.reshape(S, A)


@mistake(action_values, "you solved with the transposed kernel: a row of the matrix is the pair (s, a) "
         "you start from and its columns the pairs (s', a') that follow, so Q = R + gamma P_sa Q, not "
         "R + gamma P_sa^T Q (the transpose belongs to a visitation, which flows forward)")
def _q_transposed(P, R, pi, gamma):
    S, A = R.shape
    P_sa = torch.einsum("sat,tb->satb", P, pi).reshape(S * A, S * A)
    q = torch.linalg.solve(torch.eye(S * A, dtype=P.dtype) - gamma * P_sa.T, R.reshape(S * A))
    return q.reshape(S, A)


@mistake(action_values, "you looked one step ahead only, R + gamma P r_pi: Q must satisfy its own "
         "Bellman equation at every step, which takes a linear solve (or the infinite sum)")
def _q_one_step(P, R, pi, gamma):
    r_pi = (pi * R).sum(-1)
    return R + gamma * torch.einsum("sat,t->sa", P, r_pi)


# ------------------------------------------------------------- 2. modified_policy_iteration

def _mpi_cases():
    (P1, R1, _, _), (P2, R2, _, _), (P3, R3, _, _) = _mdps(1001, [(5, 3, 0.95, 1.0), (4, 2, 0.9, 1.0),
                                                               (6, 4, 0.8, 1.0)])
    return [
        Case(args=(P1, R1, 0.95, 1, 40), label="n_eval = 1 (value iteration), 40 iterations"),
        Case(args=(P1, R1, 0.95, 5, 8), label="n_eval = 5, 8 iterations"),
        Case(args=(P2, R2, 0.9, 3, 1), label="a single iteration"),
        Case(args=(P3, R3, 0.8, 20, 4), label="n_eval = 20, 4 iterations, 4 actions"),
        Case(args=(_LURE_P, _LURE_R, 0.9, 20, 1), label="a lure: the first greedy policy takes the reward "
                                                        "of 1 in state 0 and forgoes the 2 per step of state 1"),
        Case(args=(_LURE_P, _LURE_R, 0.9, 20, 3), label="the lure, 3 iterations"),
    ]


# state 0: action 0 pays 1 and stays, action 1 pays 0 and moves to state 1, which pays 2 per step forever
_LURE_P = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [0.0, 1.0]]], dtype=F64)
_LURE_R = torch.tensor([[1.0, 0.0], [2.0, 2.0]], dtype=F64)


@exercise(chapter=0, cases=_mpi_cases, atol=1e-8,
          description="Modified policy iteration with n_eval sweeps per evaluation (exercise ex-ch00-modified-pi).")
def modified_policy_iteration(P, R, gamma, n_eval, n_iters):
    r"""From :math:`V = 0`, ``n_iters`` times: :math:`\pi` greedy for :math:`R + \gamma PV` (the first
    maximal action), then ``n_eval`` sweeps :math:`V \leftarrow r_\pi + \gamma P_\pi V`; returns ``V[S]``."""
    _check_mdp(P, R)
    gamma = V.real_in(gamma, "gamma", 0.0, 1.0, hi_open=True)
    n_eval = V.int_in(n_eval, "n_eval")
    n_iters = V.int_in(n_iters, "n_iters")
    return _mpi(P, R, gamma, n_eval, n_iters)


def _mpi(P, R, gamma, n_eval, n_iters, cold_start=False):
    """Modified policy iteration; with ``cold_start`` each evaluation restarts from V = 0 (a mistake)."""
    S, A = R.shape
    v = torch.zeros(S, dtype=P.dtype)
    for _ in range(n_iters):
        Q = R + gamma * torch.einsum("sat,t->sa", P, v)
        pi = torch.nn.functional.one_hot(Q.argmax(-1), A).to(P.dtype)
        P_pi, r_pi = torch.einsum("sa,sat->st", pi, P), (pi * R).sum(-1)
        if cold_start:
            v = torch.zeros(S, dtype=P.dtype)
        for _ in range(n_eval):
            v = r_pi + gamma * P_pi @ v
    return v


@mistake(modified_policy_iteration, "each evaluation restarts from V = 0: warm-start the sweeps from the "
         "current V, otherwise n_eval sweeps never get further than n_eval steps of look-ahead")
def _mpi_cold_start(P, R, gamma, n_eval, n_iters):
    return _mpi(P, R, gamma, n_eval, n_iters, cold_start=True)


@mistake(modified_policy_iteration, "the greedy step looks at the immediate reward R only; it must "
         "maximise Q = R + gamma P V over the actions")
def _mpi_greedy_on_reward(P, R, gamma, n_eval, n_iters):
    S, A = R.shape
    v = torch.zeros(S, dtype=P.dtype)
    pi = torch.nn.functional.one_hot(R.argmax(-1), A).to(P.dtype)
    P_pi, r_pi = torch.einsum("sa,sat->st", pi, P), (pi * R).sum(-1)
    for _ in range(n_iters * n_eval):
        v = r_pi + gamma * P_pi @ v
    return v


@mistake(modified_policy_iteration, "inside an evaluation the policy is fixed: the sweeps apply "
         "T^pi = r_pi + gamma P_pi V, and you took the max over actions (T*) in every sweep, which is "
         "plain value iteration")
def _mpi_max_in_every_sweep(P, R, gamma, n_eval, n_iters):
    v = torch.zeros(R.shape[0], dtype=P.dtype)
    for _ in range(n_iters * n_eval):
        v = (R + gamma * torch.einsum("sat,t->sa", P, v)).amax(-1)
    return v


# ------------------------------------------------------------------ 3. finite_horizon_value

def _fh_cases():
    (P1, R1, pi1, _), (P2, R2, pi2, _) = _mdps(1002, [(4, 3, 0.9, 1.0), (5, 2, 0.9, 0.5)])
    return [
        Case(args=(P1, R1, pi1, 6), label="4 states, horizon 6"),
        Case(args=(P2, R2, pi2, 1), label="horizon 1: V_0 = r_pi"),
        Case(args=(P2, R2, pi2, 12), label="5 states, horizon 12"),
    ]


@exercise(chapter=0, cases=_fh_cases, atol=1e-10,
          description="Backward induction with gamma = 1 (exercise ex-ch00-backward).")
def finite_horizon_value(P, R, pi, H):
    r""":math:`V_H = 0`, :math:`V_t = r_\pi + P_\pi V_{t+1}` for :math:`t = H-1,\dots,0`;
    ``P[S, A, S]``, ``R[S, A]``, ``pi[S, A]`` -> ``V[H + 1, S]`` with ``V[t]`` :math:`= V^\pi_t`."""
    _check_mdp(P, R, pi)
    H = V.int_in(H, "H", 0)
    P_pi, r_pi = torch.einsum("sa,sat->st", pi, P), (pi * R).sum(-1)
    out = [torch.zeros(R.shape[0], dtype=P.dtype)]
    for _ in range(H):
        out.insert(0, r_pi + P_pi @ out[0])
    return torch.stack(out)


@mistake(finite_horizon_value, "the rows are in the wrong order: V[t] is the value at step t, so V[0] "
         "has H steps to go and V[H] = 0 is the last row")
def _fh_reversed(P, R, pi, H):
    return finite_horizon_value(P, R, pi, H).flip(0)


@mistake(finite_horizon_value, "one step is missing: V[0] must collect the rewards of the H steps "
         "t = 0, ..., H-1, that is H applications of the recursion")
def _fh_one_short(P, R, pi, H):
    out = finite_horizon_value(P, R, pi, H - 1)
    return torch.cat([out[:1], out])


@mistake(finite_horizon_value, "the recursion multiplies by P_pi transposed: the value of s averages the "
         "values of its successors, V_t(s) = r_pi(s) + sum_s' P_pi(s, s') V_{t+1}(s')")
def _fh_transposed(P, R, pi, H):
    P_pi, r_pi = torch.einsum("sa,sat->st", pi, P), (pi * R).sum(-1)
    out = [torch.zeros(R.shape[0], dtype=P.dtype)]
    for _ in range(H):
        out.insert(0, r_pi + P_pi.T @ out[0])
    return torch.stack(out)
