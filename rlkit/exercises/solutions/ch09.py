r"""Checkers for the exercises of chapter 9, ``lessons/09_single_policy_bound.ipynb``.

* ``horizon_state_distributions(P_pi, rho0)``: the per-step state distributions :math:`d_{\pi,t}` of the
  chapter's finite-horizon section, :math:`d_{\pi,t+1}^\top = d_{\pi,t}^\top P_{\pi,t}` from
  :math:`d_{\pi,0} = d_0`, for
  time-indexed kernels ``P_pi[..., H-1, S, S]`` (the chapter displays ``visitation``, the discounted one by a
  linear solve, which solved the exercise this replaces, ``discounted_visitation``).
* ``surrogate_objective(d_old, pi_old, pi_new, adv_old, gamma)``: the surrogate
  :math:`L = \frac{1}{1-\gamma} \mathbb E_{s \sim d_{old}, a \sim \pi_{old}}[\frac{\pi_{new}}{\pi_{old}} A_{old}]`.
* ``tv_penalty(d_old, pi_old, pi_new, adv_old, gamma)``: the penalty of the single-policy bound
  (thm-ch09-single-policy),
  :math:`\frac{2\gamma\omega}{(1-\gamma)^2}\mathbb E_{s\sim d_{old}}[D_{TV}]`,
  :math:`\omega = \max_s |\mathbb E_{a\sim\pi_{new}} A_{old}(s,a)|`.

Shapes: ``rho0``/``d_old[..., S]``, policies and advantages ``[..., S, A]``,
``gamma`` a float in [0, 1).
"""
from __future__ import annotations

import torch

from rlkit import _validate as V
from rlkit import tabular as T
from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []
F64 = torch.float64


# ---------------------------------------------------------- 1. horizon_state_distributions

def discounted_visitation_reference(P_pi, rho0, gamma):
    r""":math:`d = (1-\gamma)\,(I - \gamma P_\pi)^{-\top} d_0` (eq-ch09-visitation; chapter 10's checkers use it)."""
    eye = torch.eye(P_pi.shape[-1], dtype=P_pi.dtype)
    lhs = (eye - gamma * P_pi).transpose(-1, -2)
    return torch.linalg.solve(lhs, ((1 - gamma) * rho0)[..., None])[..., 0]


def _hsd_cases():
    g = torch.Generator().manual_seed(909)
    P2 = torch.tensor([[[0.75, 0.25], [0.25, 0.75]], [[0.0, 1.0], [1.0, 0.0]]], dtype=F64)

    def kernels(*shape):
        return torch.softmax(3 * torch.randn(*shape, generator=g, dtype=F64), -1)

    return [
        Case(args=(P2, torch.tensor([1.0, 0.0], dtype=F64)),
             label="H = 3 on two states: the chapter's chain, then a swap: (1, 0), (3/4, 1/4), (1/4, 3/4)"),
        Case(args=(kernels(5, 4, 4), torch.softmax(torch.randn(4, generator=g, dtype=F64), -1)),
             label="H = 6, 4 states, a fresh kernel at every step"),
        Case(args=(kernels(2, 3, 3, 5, 5), torch.softmax(torch.randn(2, 5, generator=g, dtype=F64), -1)[:, None]
                   .expand(2, 3, 5)), label="a [2, 3] batch of policies, H = 4, 5 states"),
        Case(args=(torch.zeros(0, 3, 3, dtype=F64), torch.tensor([0.2, 0.3, 0.5], dtype=F64)),
             label="H = 1: no step at all, d_0 only"),
    ]


def _hsd(P_pi, rho0, *, transpose=False, first_only=False, reverse=False):
    H = P_pi.shape[-3] + 1
    out = [rho0]
    for t in range(H - 1):
        k = 0 if first_only else (H - 2 - t if reverse else t)
        Pt = P_pi[..., k, :, :]
        if transpose:
            Pt = Pt.transpose(-1, -2)
        out.append((out[-1][..., None, :] @ Pt)[..., 0, :])
    return torch.stack(out, -2)


@exercise(chapter=9, cases=_hsd_cases, atol=1e-12,
          description="The per-step state distributions of a finite-horizon MDP, by forward propagation.")
def horizon_state_distributions(P_pi, rho0):
    r""":math:`d_{\pi,0} = d_0`, :math:`d_{\pi,t+1}^\top = d_{\pi,t}^\top P_{\pi,t}`;
    ``P_pi[..., H-1, S, S]`` (the kernel of each step), ``rho0[..., S]`` -> ``[..., H, S]``."""
    sizes = V.layout("... K S S", floating=True, P_pi=P_pi)
    V.layout("... S", {"S": sizes["S"]}, floating=True, rho0=rho0)
    return _hsd(P_pi, rho0)


@mistake(horizon_state_distributions, "probability mass flows forward: d_{t+1}^T = d_t^T P_{pi,t} (a row vector "
         "times the kernel); P_{pi,t} d_t is the backward step of a value recursion")
def _hsd_transposed(P_pi, rho0):
    return _hsd(P_pi, rho0, transpose=True)


@mistake(horizon_state_distributions, "every step has its own kernel P_{pi,t} (the policy is time-indexed and so is "
         "the MDP); you used the first one at every step")
def _hsd_first_only(P_pi, rho0):
    return _hsd(P_pi, rho0, first_only=True)


@mistake(horizon_state_distributions, "the kernels were applied in reverse order: step t's distribution goes "
         "through P_{pi,0}, then P_{pi,1}, ..., P_{pi,t-1}")
def _hsd_reversed(P_pi, rho0):
    return _hsd(P_pi, rho0, reverse=True)


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
