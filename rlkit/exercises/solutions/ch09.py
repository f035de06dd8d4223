r"""Checkers for the exercises of chapter 9, ``lessons/09_single_policy_bound.ipynb``.

* ``discounted_visitation(P_pi, rho0, gamma)``: the normalised discounted visitation by one linear
  solve, :math:`(I - \gamma P_\pi)^\top d = (1 - \gamma)d_0`.
* ``surrogate_objective(d_old, pi_old, pi_new, adv_old, gamma)``: the surrogate
  :math:`L = \frac{1}{1-\gamma} \mathbb E_{s \sim d_{old}, a \sim \pi_{old}}[\frac{\pi_{new}}{\pi_{old}} A_{old}]`.
* ``tv_penalty(d_old, pi_old, pi_new, adv_old, gamma)``: the penalty of the single-policy bound
  (thm-ch09-single-policy),
  :math:`\frac{2\gamma\omega}{(1-\gamma)^2}\mathbb E_{s\sim d_{old}}[D_{TV}]`,
  :math:`\omega = \max_s |\mathbb E_{a\sim\pi_{new}} A_{old}(s,a)|`.

Shapes: ``P_pi[..., S, S]``, ``rho0``/``d_old[..., S]``, policies and advantages ``[..., S, A]``,
``gamma`` a float in [0, 1).
"""
from __future__ import annotations

import torch

from rlkit import _validate as V
from rlkit import tabular as T
from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []
F64 = torch.float64


# ------------------------------------------------------------------- 1. discounted_visitation

def _vis_cases():
    g = torch.Generator().manual_seed(909)
    P2 = torch.tensor([[0.75, 0.25], [0.25, 0.75]], dtype=F64)
    mdp = T.random_mdp(4, 5, 3, 0.9, generator=g)
    Ppi = T.policy_transition(mdp, T.random_policy(4, 5, 3, generator=g))
    mdp2 = T.random_mdp((2, 3), 4, 2, 0.5, peakiness=5.0, generator=g)
    Ppi2 = T.policy_transition(mdp2, T.random_policy((2, 3), 4, 2, generator=g))
    return [
        Case(args=(P2, torch.tensor([1.0, 0.0], dtype=F64), 0.9),
             label="the two-state chain of the chapter: d = (13/22, 9/22)"),
        Case(args=(Ppi, mdp.rho0, 0.9), label="4 random MDPs, 5 states"),
        Case(args=(Ppi2, mdp2.rho0, 0.5), label="[2, 3] random MDPs, gamma = 0.5"),
    ]


@exercise(chapter=9, cases=_vis_cases, atol=1e-9,
          description="Normalised discounted state visitation by one linear solve.")
def discounted_visitation(P_pi, rho0, gamma):
    r""":math:`d = (1-\gamma)\,(I - \gamma P_\pi)^{-\top} d_0`;
    ``P_pi[..., S, S]``, ``rho0[..., S]`` -> ``[..., S]``."""
    sizes = V.layout("... S S", floating=True, P_pi=P_pi)
    V.layout("... S", sizes, floating=True, rho0=rho0)
    gamma = V.real_in(gamma, "gamma", 0.0, 1.0, hi_open=True)
    eye = torch.eye(P_pi.shape[-1], dtype=P_pi.dtype)
    lhs = (eye - gamma * P_pi).transpose(-1, -2)
    return torch.linalg.solve(lhs, ((1 - gamma) * rho0)[..., None])[..., 0]


@mistake(discounted_visitation, "the factor (1 - gamma) is missing: your d sums to 1/(1 - gamma) "
         "instead of 1. The book's d_pi is normalised, which is why J = E_d[r] / (1 - gamma)")
def _vis_unnormalised(P_pi, rho0, gamma):
    return discounted_visitation(P_pi, rho0, gamma) / (1 - gamma)


@mistake(discounted_visitation, "you solved (I - gamma P_pi) x = (1 - gamma) rho0, the system of a "
         "VALUE function; probability mass flows forward, d^T = (1 - gamma) rho0^T (I - gamma P_pi)^-1, "
         "so the matrix must be transposed")
def _vis_not_transposed(P_pi, rho0, gamma):
    return discounted_visitation(P_pi.transpose(-1, -2), rho0, gamma)


@mistake(discounted_visitation, "the t = 0 term (1 - gamma) rho0 is missing: the sum over time starts at the "
         "initial state, sum_{t >= 0} gamma^t Pr(s_t = s)")
def _vis_from_t1(P_pi, rho0, gamma):
    return discounted_visitation(P_pi, rho0, gamma) - (1 - gamma) * rho0


@mistake(discounted_visitation, "you averaged the state distribution over the first 1/(1 - gamma) "
         "steps with equal weights; the weights are (1 - gamma) gamma^t for every t")
def _vis_undiscounted_weights(P_pi, rho0, gamma):
    # (1 - gamma) sum_t P^t rho0 with the gamma^t weights forgotten, truncated at 1/(1-gamma) steps
    H = int(round(1 / (1 - gamma)))
    mu, out = rho0.clone(), torch.zeros_like(rho0)
    for _ in range(H):
        out = out + mu / H
        mu = (mu[..., None, :] @ P_pi)[..., 0, :]
    return out


# --------------------------------------------------------------------- 2. surrogate_objective

def _policy_cases(seed, with_mdp_gamma=(0.9, 0.6)):
    g = torch.Generator().manual_seed(seed)
    cases = []
    for k, (B, S, A, gam) in enumerate([(1, 2, 2, with_mdp_gamma[0]), (6, 5, 3, with_mdp_gamma[0]),
                                        (4, 4, 4, with_mdp_gamma[1])]):
        mdp = T.random_mdp(B, S, A, gam, peakiness=3.0, generator=g)
        old = T.random_policy(B, S, A, generator=g)
        new = T.perturb_policy(old, 1.0, generator=g)
        adv = T.advantage(mdp, old)
        d = T.visitation(mdp, old)
        if k == 0:
            d, old, new, adv = d[0], old[0], new[0], adv[0]
        cases.append(Case(args=(d, old, new, adv, gam), label=f"{'one MDP' if k == 0 else f'{B} MDPs'}, "
                                                               f"S={S}, A={A}, gamma={gam}"))
    return cases


@exercise(chapter=9, cases=lambda: _policy_cases(919), atol=1e-9,
          description="The surrogate objective L_{pi_old}(pi_new) (eq-ch09-surrogate).")
def surrogate_objective(d_old, pi_old, pi_new, adv_old, gamma):
    r"""The surrogate :math:`L = \frac{1}{1-\gamma}\sum_s d_{old}(s)\sum_a \pi_{old}(a|s)\,\rho(s, a)\,A_{old}(s,a)`
    with :math:`\rho = \pi_{new}(a|s)/\pi_{old}(a|s)`."""
    sizes = V.layout("... S A", floating=True, pi_old=pi_old, pi_new=pi_new, adv_old=adv_old)
    V.layout("... S", sizes, floating=True, d_old=d_old)
    gamma = V.real_in(gamma, "gamma", 0.0, 1.0, hi_open=True)
    ratio = pi_new / pi_old
    return (d_old * (pi_old * ratio * adv_old).sum(-1)).sum(-1) / (1 - gamma)


@mistake(surrogate_objective, "the factor 1/(1 - gamma) is missing: with a normalised visitation d "
         "the surrogate is (1/(1 - gamma)) E_{d, pi_old}[ratio * A]")
def _sur_no_horizon(d_old, pi_old, pi_new, adv_old, gamma):
    return (d_old * (pi_new * adv_old).sum(-1)).sum(-1)


@mistake(surrogate_objective, "you averaged the advantage under the OLD policy without the ratio: "
         "E_{a ~ pi_old}[A_old(s, a)] = 0 in every state, so this is always 0")
def _sur_old_weights(d_old, pi_old, pi_new, adv_old, gamma):
    return surrogate_objective(d_old, pi_old, pi_old, adv_old, gamma)


@mistake(surrogate_objective, "the ratio is upside down: it is pi_new / pi_old (the policy being "
         "evaluated over the policy that sampled)")
def _sur_inverted_ratio(d_old, pi_old, pi_new, adv_old, gamma):
    return surrogate_objective(d_old, pi_old, pi_old * pi_old / pi_new, adv_old, gamma)


@mistake(surrogate_objective, "the states are weighted uniformly; they must be weighted by the old "
         "policy's visitation d_old(s)")
def _sur_uniform_states(d_old, pi_old, pi_new, adv_old, gamma):
    return (pi_new * adv_old).sum(-1).mean(-1) / (1 - gamma)


@mistake(surrogate_objective, "the sum over actions is missing the sampling probability "
         "pi_old(a|s): an expectation over a ~ pi_old is sum_a pi_old(a|s) * ratio * A")
def _sur_ratio_not_weighted(d_old, pi_old, pi_new, adv_old, gamma):
    # sums ratio * A over actions without the sampling probability pi_old
    return surrogate_objective(d_old, pi_old, pi_new / pi_old, adv_old, gamma)


# ----------------------------------------------------------------------------- 3. tv_penalty

def _largest_expected_advantage(pi, adv):
    r""":math:`\max_s |\mathbb E_{a\sim\pi} A(s, a)|`."""
    return (pi * adv).sum(-1).abs().amax(-1)


def _tv(pi_new, pi_old):
    r""":math:`D_{TV}(\pi_{new}, \pi_{old}; s) = \tfrac12\sum_a|\pi_{new} - \pi_{old}|`, per state."""
    return 0.5 * (pi_new - pi_old).abs().sum(-1)


def _penalty(eps, expected_tv, gamma):
    r""":math:`\frac{2\gamma\omega}{(1-\gamma)^2}\,\mathbb E_{s\sim d_{old}}[D_{TV}]`."""
    return 2 * gamma * eps / (1 - gamma) ** 2 * expected_tv


@exercise(chapter=9, cases=lambda: _policy_cases(929), atol=1e-9,
          description="The state-shift penalty of the single-policy bound.")
def tv_penalty(d_old, pi_old, pi_new, adv_old, gamma):
    r""":math:`\frac{2\gamma\omega}{(1-\gamma)^2}\sum_s d_{old}(s) D_{TV}(\pi_{new},\pi_{old};s)`,
    :math:`\omega=\max_s|\sum_a \pi_{new}(a|s)A_{old}(s,a)|`."""
    sizes = V.layout("... S A", floating=True, pi_old=pi_old, pi_new=pi_new, adv_old=adv_old)
    V.layout("... S", sizes, floating=True, d_old=d_old)
    gamma = V.real_in(gamma, "gamma", 0.0, 1.0, hi_open=True)
    eps = _largest_expected_advantage(pi_new, adv_old)
    return _penalty(eps, (d_old * _tv(pi_new, pi_old)).sum(-1), gamma)


@mistake(tv_penalty, "the total variation distance is HALF the L1 distance: "
         "D_TV = 1/2 sum_a |pi_new - pi_old|; yours is twice too large")
def _pen_no_half(d_old, pi_old, pi_new, adv_old, gamma):
    return 2 * tv_penalty(d_old, pi_old, pi_new, adv_old, gamma)


@mistake(tv_penalty, "omega uses the old policy's actions: E_{a ~ pi_old}[A_old] = 0 everywhere, "
         "so the penalty vanishes. omega = max_s |E_{a ~ pi_new}[A_old(s, a)]|")
def _pen_eps_old(d_old, pi_old, pi_new, adv_old, gamma):
    return _penalty(_largest_expected_advantage(pi_old, adv_old), (d_old * _tv(pi_new, pi_old)).sum(-1), gamma)


@mistake(tv_penalty, "you used the largest per-state TV; the single-policy bound uses its expectation under the "
         "old visitation d_old (the max gives a valid but looser bound)")
def _pen_max_tv(d_old, pi_old, pi_new, adv_old, gamma):
    return _penalty(_largest_expected_advantage(pi_new, adv_old), _tv(pi_new, pi_old).amax(-1), gamma)


@mistake(tv_penalty, "the horizon factor is 1/(1 - gamma)^2: one 1/(1 - gamma) from the "
         "performance difference lemma, one from the state-shift lemma's amplification of a policy change")
def _pen_not_squared(d_old, pi_old, pi_new, adv_old, gamma):
    return (1 - gamma) * tv_penalty(d_old, pi_old, pi_new, adv_old, gamma)


@mistake(tv_penalty, "omega is the largest EXPECTED advantage |E_{a ~ pi_new} A_old(s, a)| "
         "over states, not the largest |A_old(s, a)| over state-action pairs (that is valid but looser)")
def _pen_eps_max_adv(d_old, pi_old, pi_new, adv_old, gamma):
    return _penalty(adv_old.abs().amax((-1, -2)), (d_old * _tv(pi_new, pi_old)).sum(-1), gamma)


@mistake(tv_penalty, "omega needs the absolute value: max_s |E_{pi_new}[A_old(s, .)]|; "
         "a negative expected advantage can be the largest in size")
def _pen_eps_no_abs(d_old, pi_old, pi_new, adv_old, gamma):
    return _penalty((pi_new * adv_old).sum(-1).amax(-1), (d_old * _tv(pi_new, pi_old)).sum(-1), gamma)
