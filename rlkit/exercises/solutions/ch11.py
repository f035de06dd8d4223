r"""Checkers for the exercises of chapter 11, ``lessons/11_dynamic_mixing.ipynb``.

The chapter displays ``step_kernel`` and ``half_abs_ratio_diff``, which solved the exercises these replace
(``step_level_kernel``, ``update_shift_estimate``); each now asks for a variant:

* ``version_shares(alpha, sigma, kappa, gamma)``: the share of the discounted visitation that each version
  generates under the step-level kernel :math:`q`, :math:`(1-\gamma)\,\alpha^\top(I-\gamma q)^{-1}`.
* ``update_shift_by_version(logp_new, logp_old, logp_behaviour, versions, n_versions)``: the sample estimate of
  :math:`U_k = \tfrac12\mathbb E|\rho_{k+1} - \rho_k|` (lem-ch11-ratio) for the samples of each behaviour version.
* ``corollary42_bound(surrogate, eps, adv_inf, U, S, gamma)``: the right-hand side of eq-ch11-cor
  (cor-ch11-split; the name keeps the article's numbering, Corollary 4.2).
"""
from __future__ import annotations

import torch

from rlkit import _validate as V
from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []
F64 = torch.float64


# ------------------------------------------------------------------------- 1. version_shares

def _kernel(sigma, kappa, swap=False):
    eye = torch.eye(sigma.shape[-1], dtype=kappa.dtype)
    stay, move = (sigma, 1 - sigma) if swap else (1 - sigma, sigma)
    return stay[..., :, None] * eye + move[..., :, None] * kappa


def _shares(alpha, sigma, kappa, gamma, *, transpose=True, normalise=True, swap=False):
    q = _kernel(sigma, kappa, swap)
    M = alpha.shape[-1]
    lhs = torch.eye(M, dtype=q.dtype) - gamma * q
    x = torch.linalg.solve(lhs.transpose(-1, -2) if transpose else lhs, alpha[..., None])[..., 0]
    return (1 - gamma) * x if normalise else x


def _vs_cases():
    g = torch.Generator().manual_seed(1110)
    fwd = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0]], dtype=F64)
    return [
        Case(args=(torch.tensor([0.5, 0.5], dtype=F64), torch.tensor([1.0, 0.0], dtype=F64),
                   torch.tensor([[0.0, 1.0], [0.0, 1.0]], dtype=F64), 0.9),
             label="the hand-over: half start with version 1, which hands over after one step; gamma = 0.9"),
        Case(args=(torch.softmax(torch.randn(4, generator=g, dtype=F64), -1), torch.rand(4, generator=g, dtype=F64),
                   torch.softmax(torch.randn(4, 4, generator=g, dtype=F64), -1), 0.8), label="4 versions, random"),
        Case(args=(torch.tensor([0.6, 0.3, 0.1], dtype=F64), torch.tensor([0.2, 0.2, 0.0], dtype=F64), fwd, 0.95),
             label="in-flight updates: versions move forward w.p. 0.2 per step, the newest stays"),
        Case(args=(torch.tensor([0.2, 0.8], dtype=F64), torch.zeros(2, dtype=F64),
                   torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=F64), 0.9),
             label="sigma = 0: trajectory-level mixing, the shares are alpha"),
        Case(args=(torch.softmax(torch.randn(3, 3, generator=g, dtype=F64), -1),
                   torch.rand(3, 3, generator=g, dtype=F64),
                   torch.softmax(torch.randn(3, 3, 3, generator=g, dtype=F64), -1), 0.5),
             label="a batch of 3 mixtures"),
    ]


@exercise(chapter=11, cases=_vs_cases, atol=1e-10,
          description="The share of the discounted visitation each version generates under step-level mixing.")
def version_shares(alpha, sigma, kappa, gamma):
    r""":math:`\sum_s d_{\beta}(s, i) = (1-\gamma)\,[\alpha^\top(I - \gamma q)^{-1}]_i` with the step-level kernel
    :math:`q`; ``alpha[..., M]``, ``sigma[..., M]``, ``kappa[..., M, M]`` -> ``[..., M]``."""
    sizes = V.layout("... M", floating=True, alpha=alpha, sigma=sigma)
    V.layout("... M M", sizes, floating=True, kappa=kappa)
    gamma = V.real_in(gamma, "gamma", 0.0, 1.0, hi_open=True)
    return _shares(alpha, sigma, kappa, gamma)


@mistake(version_shares, "the shares alpha only say which version takes the FIRST step; afterwards the kernel "
         "decides who acts, so the visitation's shares are (1 - gamma) alpha^T (I - gamma q)^{-1}")
def _vs_alpha(alpha, sigma, kappa, gamma):
    return alpha.clone()


@mistake(version_shares, "the factor (1 - gamma) is missing: the shares of the normalised visitation sum to 1")
def _vs_unnormalised(alpha, sigma, kappa, gamma):
    return _shares(alpha, sigma, kappa, gamma, normalise=False)


@mistake(version_shares, "you solved (I - gamma q) x = alpha; the shares are a ROW vector, alpha^T (I - gamma q)^{-1}, "
         "so the system has the transposed matrix (I - gamma q)^T")
def _vs_not_transposed(alpha, sigma, kappa, gamma):
    return _shares(alpha, sigma, kappa, gamma, transpose=False)


@mistake(version_shares, "the roles of sigma and 1 - sigma are swapped: sigma(i) is the probability of "
         "SWITCHING, so the identity gets weight 1 - sigma(i)")
def _vs_swapped(alpha, sigma, kappa, gamma):
    return _shares(alpha, sigma, kappa, gamma, swap=True)


# ------------------------------------------------------------- 2. update_shift_by_version

def _ub(logp_new, logp_old, logp_behaviour, versions, n_versions, *, half=0.5, pooled=False, fn=None):
    d = half * (torch.exp(logp_new - logp_behaviour) - torch.exp(logp_old - logp_behaviour)).abs() if fn is None \
        else fn(logp_new, logp_old, logp_behaviour)
    out = torch.full((n_versions,), float("nan"), dtype=logp_new.dtype)
    for v in range(n_versions):
        sel = versions == v
        if sel.any():
            out[v] = d.mean() if pooled else d[sel].mean()
    return out


def _ub_cases():
    g = torch.Generator().manual_seed(1120)

    def logs(n, n_versions, scale=0.5):
        lb = -torch.rand(n, generator=g, dtype=F64) * 3
        ver = torch.randint(0, n_versions, (n,), generator=g)
        lo = lb + scale * (ver + 1).to(F64) * torch.randn(n, generator=g, dtype=F64)   # older data, larger shift
        ln = lo + scale * torch.randn(n, generator=g, dtype=F64)
        return ln, lo, lb, ver, n_versions

    two = (torch.log(torch.tensor([1.0, 0.25, 0.5], dtype=F64)), torch.log(torch.tensor([0.5, 0.5, 0.5], dtype=F64)),
           torch.log(torch.tensor([0.5, 0.5, 0.25], dtype=F64)), torch.tensor([0, 0, 1]), 2)
    ln, lo, lb, ver, _ = logs(300, 3)
    return [
        Case(args=two, label="three samples: version 0 has ratios (2, 0.5) vs (1, 1), version 1 has 2 vs 2"),
        Case(args=logs(1000, 3), label="1000 samples of 3 versions"),
        Case(args=(ln, lo, lb, torch.where(ver == 1, torch.zeros_like(ver), ver), 3),
             label="300 samples, no sample of version 1 (NaN there)"),
        Case(args=logs(400, 5, scale=1.0), label="400 samples of 5 versions, larger shifts"),
    ]


@exercise(chapter=11, cases=_ub_cases, atol=1e-10, description="U_k per behaviour version (ratio lemma).")
def update_shift_by_version(logp_new, logp_old, logp_behaviour, versions, n_versions):
    r"""For each version :math:`v`: :math:`\tfrac12\,\mathrm{mean}_{\text{samples of } v}|\rho_{k+1} - \rho_k|`
    (NaN if none); 1-D inputs, ``versions`` an int tensor of the same length; returns ``[n_versions]``."""
    V.matching_floats(logp_new=logp_new, logp_old=logp_old, logp_behaviour=logp_behaviour)
    return _ub(logp_new, logp_old, logp_behaviour, versions, n_versions)


@mistake(update_shift_by_version, "the ratio lemma has a factor 1/2: D_TV is half the L1 distance")
def _ub_no_half(*a):
    return _ub(*a, half=1.0)


@mistake(update_shift_by_version, "you averaged over the whole batch, not over the samples of that version: each "
         "version's U_k is a mean over its own samples (the batch's U_k is their share-weighted average)")
def _ub_pooled(*a):
    return _ub(*a, pooled=True)


@mistake(update_shift_by_version, "you used the incremental ratio pi_{k+1}/pi_k alone; the samples come from "
         "pi^(i), so each |r - 1| must be weighted by rho_k: |rho_{k+1} - rho_k| = rho_k |r - 1|")
def _ub_incremental(*a):
    return _ub(*a, fn=lambda ln, lo, lb: 0.5 * (torch.exp(ln - lo) - 1).abs())


@mistake(update_shift_by_version, "the absolute value is missing: the mean of rho_{k+1} - rho_k estimates "
         "sum_a (pi_{k+1} - pi_k) = 0, not a distance")
def _ub_no_abs(*a):
    return _ub(*a, fn=lambda ln, lo, lb: 0.5 * (torch.exp(ln - lb) - torch.exp(lo - lb)))


@mistake(update_shift_by_version, "you averaged |log rho_{k+1} - log rho_k|: a log-ratio difference is not the "
         "ratio difference of the ratio lemma (form the log-ratios, then exponentiate before subtracting)")
def _ub_log_space(*a):
    return _ub(*a, fn=lambda ln, lo, lb: 0.5 * (ln - lo).abs())


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
