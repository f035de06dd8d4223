r"""Checkers for the exercises of chapter 12, ``lessons/12_clipping_staleness.ipynb``.

* ``staleness_keep_mask(logp_prox, logp_behav, eps_stale)``: the staleness filter's keep-mask,
  :math:`|\rho_k - 1| \le \epsilon_{\text{stale}}` with :math:`\rho_k = e^{\log\pi_k - \log\mu}` (bool tensor).
* ``geppo_radius(eps, version_weights)``: GePPO's clip radius for a mixture of ages,
  :math:`\epsilon / \sum_i \nu_i (i+1)`.
* ``adaptive_centre_loss(logp_new, logp_prox, logp_behav, adv, eps)``: method 1, PPO-clip around
  the previous ratio,
  :math:`-\mathrm{mean}\,\min(\rho_{k+1}A, \mathrm{clip}(\rho_{k+1}, \rho_k-\epsilon, \rho_k+\epsilon)A)`.
"""
from __future__ import annotations

import torch

from rlkit import _validate as V
from rlkit.exercises import Case, exercise, mistake
from rlkit.exercises.solutions.ch04 import clipped_surrogate_loss

__all__: list[str] = []
F64 = torch.float64


# ------------------------------------------------------------------ 1. staleness_keep_mask

def _keep_cases():
    g = torch.Generator().manual_seed(1201)
    lb = torch.log(torch.tensor([0.5, 0.2, 0.1, 0.4, 0.3], dtype=F64))
    lk = torch.log(torch.tensor([0.55, 0.3, 0.02, 0.4, 0.2], dtype=F64))   # rho = 1.1, 1.5, 0.2, 1, 0.667
    big = 2.0 * torch.randn(6, 50, generator=g, dtype=F64)
    return [
        Case(args=(lk, lb, 0.3), label="ratios 1.1, 1.5, 0.2, 1.0, 0.67 with eps_stale = 0.3"),
        Case(args=(big, torch.zeros_like(big), 0.5), label="6 x 50 tokens, log-ratios of scale 2"),
        Case(args=(torch.tensor([60.0, -60.0, 0.01], dtype=F64), torch.zeros(3, dtype=F64), 0.2),
             label="log-ratios of +-60 (no inf or NaN please)"),
    ]


@exercise(chapter=12, cases=_keep_cases, atol=0.0, description="The keep-mask of the staleness filter.")
def staleness_keep_mask(logp_prox, logp_behav, eps_stale):
    r"""``|exp(logp_prox - logp_behav) - 1| <= eps_stale``, elementwise (bool)."""
    V.matching_floats(min_dim=0, logp_prox=logp_prox, logp_behav=logp_behav)
    eps_stale = V.real_in(eps_stale, "eps_stale", 0.0, lo_open=True)
    return torch.expm1(logp_prox - logp_behav).abs() <= eps_stale


@mistake(staleness_keep_mask, "the filter thresholds the ratio's distance from 1, |rho_k - 1|, not the log-ratio "
         "|log rho_k| (they differ to second order, and a lot for large ratios)")
def _keep_log(logp_prox, logp_behav, eps_stale):
    return (logp_prox - logp_behav).abs() <= eps_stale


@mistake(staleness_keep_mask, "the ratio is rho_k = pi_k / mu (current over behaviour), not mu / pi_k")
def _keep_inverted(logp_prox, logp_behav, eps_stale):
    return staleness_keep_mask(logp_behav, logp_prox, eps_stale)


@mistake(staleness_keep_mask, "you returned the DROP mask: True must mean 'keep'")
def _keep_drop_mask(logp_prox, logp_behav, eps_stale):
    return ~staleness_keep_mask(logp_prox, logp_behav, eps_stale)


@mistake(staleness_keep_mask, "the absolute value is missing: a ratio far BELOW 1 is just as stale")
def _keep_one_sided(logp_prox, logp_behav, eps_stale):
    return torch.expm1(logp_prox - logp_behav) <= eps_stale


# ------------------------------------------------------------------------- 2. geppo_radius

def _geppo_cases():
    return [
        Case(args=(0.2, [1.0]), label="fresh data only: the PPO radius"),
        Case(args=(0.2, [0.25, 0.25, 0.25, 0.25]), label="4 versions, uniform weights: 2 eps / 5"),
        Case(args=(0.3, [0.5, 0.0, 0.0, 0.5]), label="half fresh, half 3 versions old"),
        Case(args=(0.2, [0.1, 0.2, 0.3, 0.4]), label="weights rising with age"),
    ]


@exercise(chapter=12, cases=_geppo_cases, atol=1e-12, description="GePPO's clip radius for a mixture of data ages.")
def geppo_radius(eps, version_weights):
    r""":math:`\epsilon / \sum_i \nu_i (i + 1)` (index i = age); returns a 0-dim float64 tensor."""
    eps = V.real_in(eps, "eps", 0.0, lo_open=True)
    w = torch.tensor(V.real_list(version_weights, "version_weights"), dtype=F64)
    return eps / (w * (torch.arange(w.numel(), dtype=F64) + 1)).sum()


@mistake(geppo_radius, "data of age i are i + 1 updates away from the policy after this update (the "
         "current update counts too): weight by (i + 1), not i")
def _geppo_age(eps, version_weights):
    w = torch.as_tensor(version_weights, dtype=F64)
    return eps / (w * torch.arange(w.numel(), dtype=F64)).sum().clamp_min(1e-12)


@mistake(geppo_radius, "the radius divides by the MEAN of (i + 1) under the weights, not by the number of "
         "versions")
def _geppo_count(eps, version_weights):
    return torch.tensor(eps / sum(w > 0 for w in version_weights), dtype=F64)


@mistake(geppo_radius, "2 eps / (M + 1) holds for uniform weights only; use the weights you are given")
def _geppo_uniform(eps, version_weights):
    return torch.tensor(2 * eps / (len(version_weights) + 1), dtype=F64)


# ------------------------------------------------------------------ 3. adaptive_centre_loss

def _objectives(logp_new, logp_prox, logp_behav, adv, eps):
    r"""Method 1's two objectives
    :math:`(\rho_{k+1}A,\ \mathrm{clip}(\rho_{k+1}, \rho_k - \epsilon, \rho_k + \epsilon)A)`,
    with :math:`\rho = e^{\log\pi - \log\mu}`."""
    rho_new = torch.exp(logp_new - logp_behav)
    rho_k = torch.exp(logp_prox - logp_behav)
    clipped = torch.minimum(torch.maximum(rho_new, rho_k - eps), rho_k + eps)
    return rho_new * adv, clipped * adv


def _acl_cases():
    g = torch.Generator().manual_seed(1203)

    def data(n, stale, step):
        lb = -torch.rand(n, generator=g, dtype=F64) * 2 - 0.1
        lk = lb + stale * torch.randn(n, generator=g, dtype=F64)
        ln = lk + step * torch.randn(n, generator=g, dtype=F64)
        return ln, lk, lb, torch.randn(n, generator=g, dtype=F64)

    z = torch.log(torch.tensor([0.5, 0.5], dtype=F64))
    return [
        Case(args=(z + torch.log(torch.tensor([1.6, 0.7], dtype=F64)),
                   z + torch.log(torch.tensor([1.3, 0.8], dtype=F64)), z, torch.tensor([1.0, -1.0], dtype=F64), 0.2),
             label="rho_k = (1.3, 0.8), rho_new = (1.6, 0.7), A = (+1, -1): the first is clipped at 1.5"),
        Case(args=(*data(200, 0.0, 0.3), 0.2), label="fresh data (rho_k = 1): the same as PPO-clip"),
        Case(args=(*data(200, 0.6, 0.3), 0.2), label="stale data, 200 samples"),
        Case(args=(*data(200, 0.6, 0.3), 0.05), label="stale data, a narrower window eps = 0.05"),
    ]


@exercise(chapter=12, cases=_acl_cases, atol=1e-10, description="Method 1: PPO-clip around the previous ratio.")
def adaptive_centre_loss(logp_new, logp_prox, logp_behav, adv, eps):
    r"""Method 1 (token mean):
    :math:`-\overline{\min(\rho_{k+1}A,\ \mathrm{clip}(\rho_{k+1}, \rho_k \pm \epsilon) A)}`."""
    V.matching_floats(logp_new=logp_new, logp_prox=logp_prox, logp_behav=logp_behav, adv=adv)
    eps = V.real_in(eps, "eps", 0.0, lo_open=True)
    return -torch.minimum(*_objectives(logp_new, logp_prox, logp_behav, adv, eps)).mean()


@mistake(adaptive_centre_loss, "that is standard PPO: method 1 centres the clip window on rho_k, not on 1")
def _acl_around_one(logp_new, logp_prox, logp_behav, adv, eps):
    return clipped_surrogate_loss(logp_new, logp_behav, adv, eps).mean()


@mistake(adaptive_centre_loss, "you clipped the incremental ratio pi_new / pi_k around 1 without the behaviour "
         "weight rho_k: that is neither method 1 nor method 2")
def _acl_incremental(logp_new, logp_prox, logp_behav, adv, eps):
    return clipped_surrogate_loss(logp_new, logp_prox, adv, eps).mean()


@mistake(adaptive_centre_loss, "PPO takes the MIN of the two surrogates (the pessimistic one), not the max")
def _acl_max(logp_new, logp_prox, logp_behav, adv, eps):
    return -torch.maximum(*_objectives(logp_new, logp_prox, logp_behav, adv, eps)).mean()


@mistake(adaptive_centre_loss, "the min with the unclipped term is missing, so the loss also 'rewards' moving "
         "against the advantage")
def _acl_no_min(logp_new, logp_prox, logp_behav, adv, eps):
    return -_objectives(logp_new, logp_prox, logp_behav, adv, eps)[1].mean()
