r"""Checkers for the exercises of chapter 11, ``lessons/11_dynamic_mixing.ipynb``.

* ``step_level_kernel(sigma, kappa)``: :math:`q(i'|i) = (1-\sigma_i)\mathbf 1\{i'=i\} + \sigma_i\kappa(i'|i)`.
* ``update_shift_estimate(logp_new, logp_old, logp_behaviour)``: the sample estimate of
  :math:`U_k = \tfrac12\mathbb E|\rho_{k+1} - \rho_k|` (the ratio lemma, lem-ch11-ratio), mean over the last dimension.
* ``corollary42_bound(surrogate, eps, adv_inf, U, S, gamma)``: the right-hand side of eq-ch11-cor
  (cor-ch11-split; the name keeps the article's numbering, Corollary 4.2).
"""
from __future__ import annotations

import torch

from rlkit import _validate as V
from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []
F64 = torch.float64


# ---------------------------------------------------------------------- 1. step_level_kernel

def _sk_cases():
    g = torch.Generator().manual_seed(1110)
    return [
        Case(args=(torch.tensor([0.0, 0.5], dtype=F64), torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=F64)),
             label="2 versions: version 0 never switches, version 1 switches to 0 w.p. 1/2"),
        Case(args=(torch.rand(4, generator=g, dtype=F64),
                   torch.softmax(torch.randn(4, 4, generator=g, dtype=F64), -1)), label="4 versions, random"),
        Case(args=(torch.rand(3, 3, generator=g, dtype=F64),
                   torch.softmax(torch.randn(3, 3, 3, generator=g, dtype=F64), -1)), label="a batch of 3 kernels"),
    ]


@exercise(chapter=11, cases=_sk_cases, atol=1e-12, description="The step-level index kernel of a dynamic mixture.")
def step_level_kernel(sigma, kappa):
    r""":math:`q = (1-\sigma_i)\,I + \sigma_i\,\kappa(\cdot|i)`;
    ``sigma[..., M]``, ``kappa[..., M, M]`` -> ``[..., M, M]``."""
    sizes = V.layout("... M", floating=True, sigma=sigma)
    V.layout("... M M", sizes, floating=True, kappa=kappa)
    eye = torch.eye(sigma.shape[-1], dtype=kappa.dtype)
    return (1 - sigma)[..., :, None] * eye + sigma[..., :, None] * kappa


@mistake(step_level_kernel, "sigma is indexed by the CURRENT version i (the row): sigma[..., :, None], "
         "not sigma[..., None, :]; each row q(.|i) must sum to 1")
def _sk_columns(sigma, kappa):
    eye = torch.eye(sigma.shape[-1], dtype=kappa.dtype)
    return (1 - sigma)[..., None, :] * eye + sigma[..., None, :] * kappa


@mistake(step_level_kernel, "the roles of sigma and 1 - sigma are swapped: sigma(i) is the probability of "
         "SWITCHING, so the identity gets weight 1 - sigma(i)")
def _sk_swapped(sigma, kappa):
    eye = torch.eye(sigma.shape[-1], dtype=kappa.dtype)
    return sigma[..., :, None] * eye + (1 - sigma)[..., :, None] * kappa


@mistake(step_level_kernel, "a switch draws the next version from kappa(.|i), not uniformly")
def _sk_uniform(sigma, kappa):
    return step_level_kernel(sigma, torch.full_like(kappa, 1.0 / sigma.shape[-1]))


# ------------------------------------------------------------------ 2. update_shift_estimate

def _u_cases():
    g = torch.Generator().manual_seed(1120)

    def logs(*shape, scale=0.5):
        lb = -torch.rand(*shape, generator=g, dtype=F64) * 3
        lo = lb + scale * torch.randn(*shape, generator=g, dtype=F64)
        ln = lo + scale * torch.randn(*shape, generator=g, dtype=F64)
        return ln, lo, lb

    return [
        Case(args=(torch.log(torch.tensor([1.0, 0.25], dtype=F64)), torch.log(torch.tensor([0.5, 0.5], dtype=F64)),
                   torch.log(torch.tensor([0.5, 0.5], dtype=F64))),
             label="two samples: ratios (2, 0.5) vs (1, 1) -> 1/2 * mean(1, 0.5) = 0.375"),
        Case(args=logs(1000), label="1000 samples"),
        Case(args=logs(4, 250, scale=1.0), label="4 batches of 250 samples, larger shifts"),
    ]


@exercise(chapter=11, cases=_u_cases, atol=1e-10, description="U_k from samples (ratio lemma, lem-ch11-ratio).")
def update_shift_estimate(logp_new, logp_old, logp_behaviour):
    r"""Over the last dimension,
    :math:`\hat U = \frac12\,\mathrm{mean}\,|e^{\log\pi_{k+1}-\log\pi^{(i)}} - e^{\log\pi_k-\log\pi^{(i)}}|`."""
    V.matching_floats(logp_new=logp_new, logp_old=logp_old, logp_behaviour=logp_behaviour)
    rho_new = torch.exp(logp_new - logp_behaviour)
    rho_old = torch.exp(logp_old - logp_behaviour)
    return 0.5 * (rho_new - rho_old).abs().mean(-1)


@mistake(update_shift_estimate, "the ratio lemma has a factor 1/2: D_TV is half the L1 distance")
def _u_no_half(logp_new, logp_old, logp_behaviour):
    return 2 * update_shift_estimate(logp_new, logp_old, logp_behaviour)


@mistake(update_shift_estimate, "you used the incremental ratio pi_{k+1}/pi_k alone; the samples come from "
         "pi^(i), so each |r - 1| must be weighted by rho_k: |rho_{k+1} - rho_k| = rho_k |r - 1|")
def _u_incremental(logp_new, logp_old, logp_behaviour):
    return update_shift_estimate(logp_new, logp_old, logp_old)


@mistake(update_shift_estimate, "the absolute value is missing: the mean of rho_{k+1} - rho_k estimates "
         "sum_a (pi_{k+1} - pi_k) = 0, not a distance")
def _u_no_abs(logp_new, logp_old, logp_behaviour):
    return 0.5 * (torch.exp(logp_new - logp_behaviour) - torch.exp(logp_old - logp_behaviour)).mean(-1)


@mistake(update_shift_estimate, "you averaged |log rho_{k+1} - log rho_k|: a log-ratio difference is not the "
         "ratio difference of the ratio lemma (form the log-ratios, then exponentiate before subtracting)")
def _u_log_space(logp_new, logp_old, logp_behaviour):
    return 0.5 * (logp_new - logp_old).abs().mean(-1)


# ---------------------------------------------------------------------- 3. corollary42_bound

def _c42_cases():
    g = torch.Generator().manual_seed(1130)
    out = []
    for n, gam in [(1, 0.9), (6, 0.5)]:
        L = torch.rand(n, generator=g, dtype=F64)
        eps = 0.1 * torch.rand(n, generator=g, dtype=F64)
        ainf = 1 + torch.rand(n, generator=g, dtype=F64)
        U = 0.05 * torch.rand(n, generator=g, dtype=F64)
        S = 0.05 * torch.rand(n, generator=g, dtype=F64)
        out.append(Case(args=(L, eps, ainf, U, S, gam), label=f"{n} update(s), gamma={gam}"))
    return out


@exercise(chapter=11, cases=_c42_cases, atol=1e-10,
          description="The right-hand side of the U_k / S_k bound (cor-ch11-split, eq-ch11-cor).")
def corollary42_bound(surrogate, eps, adv_inf, U, S, gamma):
    r""":math:`L - C_1 U - (C_1 + C_2) S`, :math:`C_1 = \frac{2\gamma\omega}{(1-\gamma)^2}`,
    :math:`C_2 = \frac{2\|A_k\|_\infty}{1-\gamma}`; all inputs the same shape."""
    V.matching_floats(min_dim=0, surrogate=surrogate, eps=eps, adv_inf=adv_inf, U=U, S=S)
    gamma = V.real_in(gamma, "gamma", 0.0, 1.0, hi_open=True)
    c1 = 2 * gamma * eps / (1 - gamma) ** 2
    c2 = 2 * adv_inf / (1 - gamma)
    return surrogate - c1 * U - (c1 + c2) * S


@mistake(corollary42_bound, "S_k appears twice: once through the triangle inequality in the update penalty "
         "(coefficient C_1) and once in the mixture-gap term (C_2); its coefficient is C_1 + C_2")
def _c42_s_only_c2(surrogate, eps, adv_inf, U, S, gamma):
    return corollary42_bound(surrogate, eps, adv_inf, U, S, gamma) + 2 * gamma * eps / (1 - gamma) ** 2 * S


@mistake(corollary42_bound, "U_k and S_k are swapped: U_k (the update shift) has coefficient C_1 only, "
         "S_k (staleness) has C_1 + C_2")
def _c42_swapped(surrogate, eps, adv_inf, U, S, gamma):
    return corollary42_bound(surrogate, eps, adv_inf, S, U, gamma)


@mistake(corollary42_bound, "C_1 = 2 gamma eps / (1 - gamma)^2 (squared); C_2 = 2 ||A_k||_inf / (1 - gamma)")
def _c42_not_squared(surrogate, eps, adv_inf, U, S, gamma):
    return corollary42_bound(surrogate, eps * (1 - gamma), adv_inf, U, S, gamma)


@mistake(corollary42_bound, "C_2 = 2 ||A_k||_inf / (1 - gamma) has a factor 2: the mixture gap is bounded by "
         "sum_a |pi^(i) - pi_k| ||A_k||_inf = 2 D_TV ||A_k||_inf")
def _c42_c2_no_two(surrogate, eps, adv_inf, U, S, gamma):
    return corollary42_bound(surrogate, eps, adv_inf, U, S, gamma) + adv_inf / (1 - gamma) * S


@mistake(corollary42_bound, "the staleness term is missing: a stale batch is not on-policy data, and S_k enters "
         "with coefficient C_1 + C_2 (the phantom gain of the stale surrogate must be paid for)")
def _c42_no_staleness(surrogate, eps, adv_inf, U, S, gamma):
    return surrogate - 2 * gamma * eps / (1 - gamma) ** 2 * U
