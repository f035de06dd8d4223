r"""Checkers for the exercises of chapter 9, ``lessons/09_single_policy_bound.ipynb``.

* ``discounted_visitation(P_pi, rho0, gamma)``: the normalised discounted visitation by one linear
  solve, :math:`(I - \gamma P_\pi)^\top d = (1 - \gamma)\rho_0`.
* ``surrogate_objective(d_old, pi_old, pi_new, adv_old, gamma)``: the surrogate
  :math:`L = \frac{1}{1-\gamma} \mathbb E_{s \sim d_{old}, a \sim \pi_{old}}[\frac{\pi_{new}}{\pi_{old}} A_{old}]`.
* ``tv_penalty(d_old, pi_old, pi_new, adv_old, gamma)``: the penalty of Theorem 2.2,
  :math:`\frac{2\gamma\epsilon}{(1-\gamma)^2}\mathbb E_{s\sim d_{old}}[D_{TV}]`,
  :math:`\epsilon = \max_s |\mathbb E_{a\sim\pi_{new}} A_{old}(s,a)|`.

Shapes: ``P_pi[..., S, S]``, ``rho0``/``d_old[..., S]``, policies and advantages ``[..., S, A]``,
``gamma`` a float in [0, 1).
"""
from __future__ import annotations

import torch

from rlkit import tabular as T
from rlkit.exercises import Case, Exercise, Mistake, register, float_tensors

__all__: list[str] = []
F64 = torch.float64


def _check_gamma(gamma, fn):
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0 <= gamma < 1:
        raise ValueError(f"{fn}: gamma must be a float in [0, 1), got {gamma!r}")


# ------------------------------------------------------------------- 1. discounted_visitation

def _visitation(P_pi, rho0, gamma):
    r""":math:`d = (1-\gamma)\,(I - \gamma P_\pi)^{-\top} \rho_0`; ``P_pi[..., S, S]``, ``rho0[..., S]`` -> ``[..., S]``."""
    float_tensors("discounted_visitation", P_pi=P_pi, rho0=rho0)
    _check_gamma(gamma, "discounted_visitation")
    if P_pi.dim() < 2 or P_pi.shape[-1] != P_pi.shape[-2] or tuple(P_pi.shape[:-1]) != tuple(rho0.shape):
        raise ValueError(f"discounted_visitation: need P_pi [..., S, S] and rho0 [..., S], got "
                         f"{tuple(P_pi.shape)} and {tuple(rho0.shape)}")
    eye = torch.eye(P_pi.shape[-1], dtype=P_pi.dtype)
    lhs = (eye - gamma * P_pi).transpose(-1, -2)
    return torch.linalg.solve(lhs, ((1 - gamma) * rho0)[..., None])[..., 0]


def _vis_unnormalised(P_pi, rho0, gamma):
    eye = torch.eye(P_pi.shape[-1], dtype=P_pi.dtype)
    return torch.linalg.solve((eye - gamma * P_pi).transpose(-1, -2), rho0[..., None])[..., 0]


def _vis_not_transposed(P_pi, rho0, gamma):
    eye = torch.eye(P_pi.shape[-1], dtype=P_pi.dtype)
    return torch.linalg.solve(eye - gamma * P_pi, ((1 - gamma) * rho0)[..., None])[..., 0]


def _vis_from_t1(P_pi, rho0, gamma):
    return _visitation(P_pi, rho0, gamma) - (1 - gamma) * rho0


def _vis_undiscounted_weights(P_pi, rho0, gamma):
    # (1 - gamma) sum_t P^t rho0 with the gamma^t weights forgotten, truncated at 1/(1-gamma) steps
    H = int(round(1 / (1 - gamma)))
    mu, out = rho0.clone(), torch.zeros_like(rho0)
    for _ in range(H):
        out = out + mu / H
        mu = (mu[..., None, :] @ P_pi)[..., 0, :]
    return out


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


register(Exercise(
    name="discounted_visitation",
    chapter=9,
    reference=_visitation,
    cases=_vis_cases,
    mistakes=[
        Mistake(_vis_unnormalised, "the factor (1 - gamma) is missing: your d sums to 1/(1 - gamma) "
                "instead of 1. The book's d_pi is normalised, which is why J = E_d[r] / (1 - gamma)"),
        Mistake(_vis_not_transposed, "you solved (I - gamma P_pi) x = (1 - gamma) rho0, the system of a "
                "VALUE function; probability mass flows forward, d^T = (1 - gamma) rho0^T (I - gamma P_pi)^-1, "
                "so the matrix must be transposed"),
        Mistake(_vis_from_t1, "the t = 0 term (1 - gamma) rho0 is missing: the sum over time starts at the "
                "initial state, sum_{t >= 0} gamma^t Pr(s_t = s)"),
        Mistake(_vis_undiscounted_weights, "you averaged the state distribution over the first 1/(1 - gamma) "
                "steps with equal weights; the weights are (1 - gamma) gamma^t for every t"),
    ],
    atol=1e-9,
    description="Normalised discounted state visitation by one linear solve.",
))


# --------------------------------------------------------------------- 2. surrogate_objective

def _check_sur(d_old, pi_old, pi_new, adv_old, gamma, fn):
    float_tensors(fn, d_old=d_old, pi_old=pi_old, pi_new=pi_new, adv_old=adv_old)
    _check_gamma(gamma, fn)
    if not (pi_old.shape == pi_new.shape == adv_old.shape) or tuple(d_old.shape) != tuple(pi_old.shape[:-1]):
        raise ValueError(f"{fn}: need d_old [..., S] and pi_old, pi_new, adv_old [..., S, A]")


def _surrogate(d_old, pi_old, pi_new, adv_old, gamma):
    r""":math:`L = \frac{1}{1-\gamma}\sum_s d_{old}(s)\sum_a \pi_{old}(a|s)\frac{\pi_{new}(a|s)}{\pi_{old}(a|s)} A_{old}(s,a)`."""
    _check_sur(d_old, pi_old, pi_new, adv_old, gamma, "surrogate_objective")
    ratio = pi_new / pi_old
    return (d_old * (pi_old * ratio * adv_old).sum(-1)).sum(-1) / (1 - gamma)


def _sur_no_horizon(d_old, pi_old, pi_new, adv_old, gamma):
    return (d_old * (pi_new * adv_old).sum(-1)).sum(-1)


def _sur_old_weights(d_old, pi_old, pi_new, adv_old, gamma):
    return (d_old * (pi_old * adv_old).sum(-1)).sum(-1) / (1 - gamma)


def _sur_inverted_ratio(d_old, pi_old, pi_new, adv_old, gamma):
    return (d_old * (pi_old * (pi_old / pi_new) * adv_old).sum(-1)).sum(-1) / (1 - gamma)


def _sur_uniform_states(d_old, pi_old, pi_new, adv_old, gamma):
    return (pi_new * adv_old).sum(-1).mean(-1) / (1 - gamma)


def _sur_ratio_not_weighted(d_old, pi_old, pi_new, adv_old, gamma):
    # sums ratio * A over actions without the sampling probability pi_old
    return (d_old * ((pi_new / pi_old) * adv_old).sum(-1)).sum(-1) / (1 - gamma)


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


register(Exercise(
    name="surrogate_objective",
    chapter=9,
    reference=_surrogate,
    cases=lambda: _policy_cases(919),
    mistakes=[
        Mistake(_sur_no_horizon, "the factor 1/(1 - gamma) is missing: with a normalised visitation d "
                "the surrogate is (1/(1 - gamma)) E_{d, pi_old}[ratio * A]"),
        Mistake(_sur_old_weights, "you averaged the advantage under the OLD policy without the ratio: "
                "E_{a ~ pi_old}[A_old(s, a)] = 0 in every state, so this is always 0"),
        Mistake(_sur_inverted_ratio, "the ratio is upside down: it is pi_new / pi_old (the policy being "
                "evaluated over the policy that sampled)"),
        Mistake(_sur_uniform_states, "the states are weighted uniformly; they must be weighted by the old "
                "policy's visitation d_old(s)"),
        Mistake(_sur_ratio_not_weighted, "the sum over actions is missing the sampling probability "
                "pi_old(a|s): an expectation over a ~ pi_old is sum_a pi_old(a|s) * ratio * A"),
    ],
    atol=1e-9,
    description="The surrogate objective L_{pi_old}(pi_new) of Theorem 2.2.",
))


# ----------------------------------------------------------------------------- 3. tv_penalty

def _tv_penalty(d_old, pi_old, pi_new, adv_old, gamma):
    r""":math:`\frac{2\gamma\epsilon}{(1-\gamma)^2}\sum_s d_{old}(s) D_{TV}(\pi_{new},\pi_{old};s)`,
    :math:`\epsilon=\max_s|\sum_a \pi_{new}(a|s)A_{old}(s,a)|`."""
    _check_sur(d_old, pi_old, pi_new, adv_old, gamma, "tv_penalty")
    eps = (pi_new * adv_old).sum(-1).abs().amax(-1)
    tv = 0.5 * (pi_new - pi_old).abs().sum(-1)
    return 2 * gamma * eps / (1 - gamma) ** 2 * (d_old * tv).sum(-1)


def _pen_no_half(d_old, pi_old, pi_new, adv_old, gamma):
    return 2 * _tv_penalty(d_old, pi_old, pi_new, adv_old, gamma)


def _pen_eps_old(d_old, pi_old, pi_new, adv_old, gamma):
    eps = (pi_old * adv_old).sum(-1).abs().amax(-1)
    tv = 0.5 * (pi_new - pi_old).abs().sum(-1)
    return 2 * gamma * eps / (1 - gamma) ** 2 * (d_old * tv).sum(-1)


def _pen_max_tv(d_old, pi_old, pi_new, adv_old, gamma):
    eps = (pi_new * adv_old).sum(-1).abs().amax(-1)
    tv = 0.5 * (pi_new - pi_old).abs().sum(-1)
    return 2 * gamma * eps / (1 - gamma) ** 2 * tv.amax(-1)


def _pen_not_squared(d_old, pi_old, pi_new, adv_old, gamma):
    return (1 - gamma) * _tv_penalty(d_old, pi_old, pi_new, adv_old, gamma)


def _pen_eps_max_adv(d_old, pi_old, pi_new, adv_old, gamma):
    eps = adv_old.abs().amax((-1, -2))
    tv = 0.5 * (pi_new - pi_old).abs().sum(-1)
    return 2 * gamma * eps / (1 - gamma) ** 2 * (d_old * tv).sum(-1)


def _pen_eps_no_abs(d_old, pi_old, pi_new, adv_old, gamma):
    eps = (pi_new * adv_old).sum(-1).amax(-1)
    tv = 0.5 * (pi_new - pi_old).abs().sum(-1)
    return 2 * gamma * eps / (1 - gamma) ** 2 * (d_old * tv).sum(-1)


register(Exercise(
    name="tv_penalty",
    chapter=9,
    reference=_tv_penalty,
    cases=lambda: _policy_cases(929),
    mistakes=[
        Mistake(_pen_no_half, "the total variation distance is HALF the L1 distance: "
                "D_TV = 1/2 sum_a |pi_new - pi_old|; yours is twice too large"),
        Mistake(_pen_eps_old, "epsilon uses the old policy's actions: E_{a ~ pi_old}[A_old] = 0 everywhere, "
                "so the penalty vanishes. epsilon = max_s |E_{a ~ pi_new}[A_old(s, a)]|"),
        Mistake(_pen_max_tv, "you used the largest per-state TV; Theorem 2.2 uses its expectation under the "
                "old visitation d_old (the max gives a valid but looser bound)"),
        Mistake(_pen_not_squared, "the horizon factor is 1/(1 - gamma)^2: one 1/(1 - gamma) from the "
                "performance difference lemma, one from Lemma 2.1's amplification of the state shift"),
        Mistake(_pen_eps_max_adv, "epsilon is the largest EXPECTED advantage |E_{a ~ pi_new} A_old(s, a)| "
                "over states, not the largest |A_old(s, a)| over state-action pairs (that is valid but looser)"),
        Mistake(_pen_eps_no_abs, "epsilon needs the absolute value: max_s |E_{pi_new}[A_old(s, .)]|; "
                "a negative expected advantage can be the largest in size"),
    ],
    atol=1e-9,
    description="The state-shift penalty of Theorem 2.2.",
))
