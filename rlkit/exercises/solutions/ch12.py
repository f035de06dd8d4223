r"""Checkers for the exercises of chapter 12, ``lessons/12_clipping_staleness.ipynb``.

The chapter displays ``staleness_filter``, ``geppo_clip_radius`` and ``clipped_policy_loss``, which solved the
exercises these replace (``staleness_keep_mask``, ``geppo_radius``, ``adaptive_centre_loss``); each now asks for
a variant:

* ``stale_threshold_for_share(logp_prox, logp_behav, keep_share)``: the smallest staleness threshold whose
  filter keeps at least a share :math:`q` of the samples, the :math:`\lceil qN\rceil`-th smallest
  :math:`|\rho_k - 1|` (0-dim tensor).
* ``windowed_geppo_radius(eps, lag_probs, window)``: GePPO's radius for the data a version window of
  :math:`W` keeps, :math:`\epsilon / \mathbb E[i + 1 \mid i < W]`.
* ``adaptive_dual_clip_loss(logp_new, logp_prox, logp_behav, adv, eps, dual_clip)``: method 1 with a dual
  clip centred like its window: for :math:`A < 0` the objective is at least :math:`c\,\rho_k A`.
"""
from __future__ import annotations

import math

import torch

from rlkit import _validate as V
from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []
F64 = torch.float64


# --------------------------------------------------------------- 1. stale_threshold_for_share

def _thr_cases():
    g = torch.Generator().manual_seed(1201)
    lb = torch.log(torch.tensor([0.5, 0.2, 0.1, 0.4, 0.3, 0.25], dtype=F64))
    lk = torch.log(torch.tensor([0.55, 0.3, 0.02, 0.4, 0.2, 0.5], dtype=F64))  # rho = 1.1, 1.5, 0.2, 1, 0.667, 2
    big = 2.0 * torch.randn(6, 50, generator=g, dtype=F64)
    small = 0.3 * torch.randn(40, generator=g, dtype=F64)
    return [
        Case(args=(lk, lb, 0.5), label="ratios 1.1, 1.5, 0.2, 1, 0.67, 2; keep half of the 6 samples"),
        Case(args=(lk, lb, 1.0), label="keep everything: the largest |rho_k - 1|"),
        Case(args=(lk, lb, 0.4), label="keep 40% of 6 samples: 2.4 rounds up to 3"),
        Case(args=(lk, lb, 0.1), label="keep 10% of 6 samples: at least one"),
        Case(args=(big, torch.zeros_like(big), 0.755),
             label="6 x 50 tokens, log-ratios of scale 2, keep 75.5% (226.5 of 300)"),
        Case(args=(small, torch.zeros_like(small), 0.9), label="40 samples, keep 90% (36 of them)"),
        Case(args=(torch.tensor([60.0, -60.0, 0.01, 0.0], dtype=F64), torch.zeros(4, dtype=F64), 0.75),
             label="log-ratios of +-60 (no inf or NaN please), keep 3 of 4"),
    ]


def _kth(d, keep_share, rounding=math.ceil):
    flat = d.reshape(-1).sort().values
    k = max(1, rounding(keep_share * flat.numel() - 1e-9))
    return flat[k - 1]


@exercise(chapter=12, cases=_thr_cases, atol=0.0,
          description="The staleness-filter threshold that keeps a given share of the batch.")
def stale_threshold_for_share(logp_prox, logp_behav, keep_share):
    r"""The smallest :math:`\epsilon_{\text{stale}}` whose filter keeps at least ``keep_share`` of the samples:
    the :math:`\lceil qN\rceil`-th smallest :math:`|\rho_k - 1|` (a 0-dim tensor of the inputs' dtype)."""
    V.matching_floats(min_dim=1, logp_prox=logp_prox, logp_behav=logp_behav)
    keep_share = V.real_in(keep_share, "keep_share", 0.0, 1.0, lo_open=True)
    return _kth(torch.expm1(logp_prox - logp_behav).abs(), keep_share)


@mistake(stale_threshold_for_share, "an interpolated quantile (torch.quantile's default) lies between two samples' "
         "|rho_k - 1|, and the filter at that threshold keeps fewer samples than asked; take the ceil(q N)-th "
         "smallest value itself")
def _thr_quantile(logp_prox, logp_behav, keep_share):
    return torch.quantile(torch.expm1(logp_prox - logp_behav).abs().reshape(-1), keep_share)


@mistake(stale_threshold_for_share, "off by one: with k = floor(q N) the filter keeps fewer than the share asked "
         "whenever q N is not a whole number; k = ceil(q N)")
def _thr_floor(logp_prox, logp_behav, keep_share):
    return _kth(torch.expm1(logp_prox - logp_behav).abs(), keep_share, rounding=lambda x: int(math.floor(x + 1e-9)))


@mistake(stale_threshold_for_share, "the filter thresholds the ratio's distance from 1, |rho_k - 1|, not the "
         "log-ratio |log rho_k|")
def _thr_log(logp_prox, logp_behav, keep_share):
    return _kth((logp_prox - logp_behav).abs(), keep_share)


@mistake(stale_threshold_for_share, "the ratio is rho_k = pi_k / mu (current over behaviour), not mu / pi_k")
def _thr_inverted(logp_prox, logp_behav, keep_share):
    return _kth(torch.expm1(logp_behav - logp_prox).abs(), keep_share)


@mistake(stale_threshold_for_share, "that threshold DROPS the share asked: the kept samples are the ceil(q N) "
         "smallest |rho_k - 1|, so count from the smallest")
def _thr_from_top(logp_prox, logp_behav, keep_share):
    flat = torch.expm1(logp_prox - logp_behav).abs().reshape(-1).sort(descending=True).values
    return flat[max(1, math.ceil(keep_share * flat.numel() - 1e-9)) - 1]


# ------------------------------------------------------------- 2. windowed_geppo_radius

def _geppo_cases():
    return [
        Case(args=(0.2, [0.25, 0.25, 0.25, 0.25], 4), label="4 versions, uniform, a window of 4 keeps all: 2 eps / 5"),
        Case(args=(0.2, [0.25, 0.25, 0.25, 0.25], 2), label="the same with a window of 2: ages 0 and 1 kept"),
        Case(args=(0.3, [0.5, 0.0, 0.0, 0.5], 3),
             label="half fresh, half 3 versions old; the window drops the old half"),
        Case(args=(0.2, [0.1, 0.2, 0.3, 0.4], 3), label="weights rising with age, window 3"),
        Case(args=(0.2, [1.0 / 9] * 9, 3), label="the ablation of chapter 12: ages uniform on 0-8, window 3"),
        Case(args=(0.2, [0.6, 0.4], 1), label="a window of 1: fresh data only, the PPO radius"),
    ]


@exercise(chapter=12, cases=_geppo_cases, atol=1e-12,
          description="GePPO's clip radius for the data a version window keeps.")
def windowed_geppo_radius(eps, lag_probs, window):
    r""":math:`\epsilon / \mathbb E[i + 1 \mid i < W]` under ``lag_probs`` (index i = age); a 0-dim float64 tensor."""
    eps = V.real_in(eps, "eps", 0.0, lo_open=True)
    w = torch.tensor(V.real_list(lag_probs, "lag_probs"), dtype=F64)
    window = V.int_in(window, "window", 1)
    kept = w[:window]
    ages = torch.arange(kept.numel(), dtype=F64)
    return eps * kept.sum() / (kept * (ages + 1)).sum()


@mistake(windowed_geppo_radius, "the window is ignored: that is GePPO's radius for the whole lag distribution "
         "(rlkit.staleness.geppo_clip_radius); the update only sees the ages 0 .. W-1 the window keeps")
def _geppo_no_window(eps, lag_probs, window):
    w = torch.as_tensor(lag_probs, dtype=F64)
    return eps / (w * (torch.arange(w.numel(), dtype=F64) + 1)).sum()


@mistake(windowed_geppo_radius, "the kept shares were not renormalised: after the window the weights of ages "
         "0 .. W-1 must sum to 1 (divide by the kept share)")
def _geppo_not_renormalised(eps, lag_probs, window):
    w = torch.as_tensor(lag_probs, dtype=F64)[:window]
    return eps / (w * (torch.arange(w.numel(), dtype=F64) + 1)).sum()


@mistake(windowed_geppo_radius, "a window of W versions keeps ages 0 .. W-1: data of age exactly W are dropped too")
def _geppo_window_plus_one(eps, lag_probs, window):
    return windowed_geppo_radius(eps, lag_probs, window + 1) if window < len(lag_probs) else \
        windowed_geppo_radius(eps, lag_probs, window)


@mistake(windowed_geppo_radius, "data of age i are i + 1 updates away from the policy after this update (the "
         "current update counts too): weight by (i + 1), not i")
def _geppo_age(eps, lag_probs, window):
    w = torch.as_tensor(lag_probs, dtype=F64)[:window]
    return eps * w.sum() / (w * torch.arange(w.numel(), dtype=F64)).sum().clamp_min(1e-12)


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

    z = torch.log(torch.tensor([0.5, 0.5, 0.5, 0.5], dtype=F64))
    hand = (z + torch.log(torch.tensor([1.6, 0.7, 5.0, 2.0], dtype=F64)),
            z + torch.log(torch.tensor([1.3, 0.8, 1.2, 1.0], dtype=F64)), z,
            torch.tensor([1.0, -1.0, -1.0, 0.0], dtype=F64))
    return [
        Case(args=(*hand, 0.2, 3.0), label="rho_k = (1.3, 0.8, 1.2, 1), rho_new = (1.6, 0.7, 5, 2), "
             "A = (+1, -1, -1, 0), c = 3: the third is capped at -c rho_k = -3.6"),
        Case(args=(*data(200, 0.0, 0.3), 0.2, 3.0), label="fresh data (rho_k = 1): PPO's dual clip"),
        Case(args=(*data(200, 0.6, 0.6), 0.2, 3.0), label="stale data, large steps, 200 samples"),
        Case(args=(*data(200, 0.6, 0.6), 0.05, 1.5), label="a narrower window eps = 0.05 and c = 1.5"),
        Case(args=(*data(200, 0.6, 0.1), 0.2, 1000.0), label="c = 1000 never binds: method 1 itself"),
    ]


def _dual(logp_new, logp_prox, logp_behav, adv, eps, dual_clip, *, centre=True, both_signs=False, use_min=False):
    unclipped, clipped = _objectives(logp_new, logp_prox, logp_behav, adv, eps)
    obj = torch.minimum(unclipped, clipped)
    rho_k = torch.exp(logp_prox - logp_behav)
    floor = dual_clip * (rho_k if centre else torch.ones_like(rho_k)) * adv
    capped = torch.minimum(obj, floor) if use_min else torch.maximum(obj, floor)
    return -(capped if both_signs else torch.where(adv < 0, capped, obj)).mean()


@exercise(chapter=12, cases=_acl_cases, atol=1e-10, description="Method 1 with a dual clip centred on rho_k.")
def adaptive_dual_clip_loss(logp_new, logp_prox, logp_behav, adv, eps, dual_clip):
    r"""Method 1 with a dual clip (token mean): for :math:`A < 0` the objective
    :math:`\min(\rho_{k+1}A, \mathrm{clip}(\rho_{k+1}, \rho_k \pm \epsilon) A)` is raised to at least
    :math:`c\,\rho_k A`."""
    V.matching_floats(logp_new=logp_new, logp_prox=logp_prox, logp_behav=logp_behav, adv=adv)
    eps = V.real_in(eps, "eps", 0.0, lo_open=True)
    dual_clip = V.real_in(dual_clip, "dual_clip", 1.0, lo_open=True)
    return _dual(logp_new, logp_prox, logp_behav, adv, eps, dual_clip)


@mistake(adaptive_dual_clip_loss, "the dual clip is missing: that is method 1 itself (clipped_policy_loss("
         "'adaptive', ...)); for A < 0 the objective must not fall below c rho_k A")
def _acl_no_dual(logp_new, logp_prox, logp_behav, adv, eps, dual_clip):
    return -torch.minimum(*_objectives(logp_new, logp_prox, logp_behav, adv, eps)).mean()


@mistake(adaptive_dual_clip_loss, "the dual bound is centred like method 1's window: c rho_k A, not c A (that is "
         "standard PPO's dual clip, whose window is centred on 1)")
def _acl_dual_around_one(*a):
    return _dual(*a, centre=False)


@mistake(adaptive_dual_clip_loss, "the dual clip applies to negative advantages only; for A > 0 the objective is "
         "already bounded above by the clip")
def _acl_dual_both_signs(*a):
    return _dual(*a, both_signs=True)


@mistake(adaptive_dual_clip_loss, "the dual clip takes the MAX with c rho_k A (it bounds the objective from "
         "below); a min makes the loss larger still")
def _acl_dual_min(*a):
    return _dual(*a, use_min=True)


@mistake(adaptive_dual_clip_loss, "that is standard PPO with a dual clip: method 1 centres the clip window on rho_k, "
         "not on 1")
def _acl_standard_dual(logp_new, logp_prox, logp_behav, adv, eps, dual_clip):
    return _dual(logp_new, logp_behav, logp_behav, adv, eps, dual_clip, centre=False)
