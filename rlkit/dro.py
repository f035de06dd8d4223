r"""Distributionally robust objectives over a finite set of prompts (or groups of prompts).

Chapter: 19_robust_prompts.

Every function here answers one question: given a value :math:`v_i` for each of :math:`n` points
(a prompt's or a group's reward, or accuracy; **lower is worse**) and a base distribution
:math:`p` over them (the training mix), what is the worst expected value over an uncertainty set
around :math:`p`, and which distribution attains it?

.. math::  \mathcal R(v) = \min_{q \in \mathcal U(p)} \; \sum_i q_i v_i .

The sets, with the dual that each function solves (a one-dimensional concave maximisation, done
by bisection on its derivative, so the answer is exact to floating point):

* :func:`kl_dro`: :math:`\mathrm{KL}(q\,\|\,p) \le \delta`; value
  :math:`\sup_{\nu>0}\{-\nu\log\mathbb E_p e^{-v/\nu} - \nu\delta\}`.
* :func:`chi2_dro`: :math:`\tfrac12\mathbb E_p[(q/p-1)^2] \le \delta`; value
  :math:`\mathbb E_p v - \sqrt{2\delta\,\mathrm{Var}_p v}` while no weight hits 0.
* :func:`cvar`: :math:`q_i \le p_i/\alpha`; value :math:`\sup_\eta\{\eta - \tfrac1\alpha\mathbb E_p(\eta - v)_+\}`
  (Rockafellar--Uryasev).
* :func:`tv_dro`: :math:`\tfrac12\sum_i|q_i-p_i| \le \delta`; value
  :math:`(1-\delta)\,\mathrm{CVaR}_{1-\delta}(v) + \delta\min_i v_i`.
* :func:`wasserstein_dro`: :math:`\min_\pi\{\langle\pi,C\rangle: \pi\mathbf 1 = p,\ \pi^\top\mathbf 1 = q\}\le\delta`;
  value :math:`\sup_{\nu\ge0}\{-\nu\delta + \mathbb E_{i\sim p}\min_j(v_j+\nu C_{ij})\}`.

:func:`group_dro_step` is the online version used in training (Sagawa et al., 2020): one
exponentiated-gradient step of the adversary, :math:`q \leftarrow q\,e^{-\eta v}/Z`, which is
exactly the KL-regularised best response :math:`\arg\min_{q'}\{\eta\langle q',v\rangle + \mathrm{KL}(q'\|q)\}`.

Points with :math:`p_i = 0` are allowed. KL and :math:`\chi^2` balls (and CVaR) never give them
weight: a finite divergence forces :math:`q \ll p`, so their values may even be NaN (an empty
group). A TV ball can move up to :math:`\delta` of the mass onto them, and a Wasserstein ball
moves mass onto them at a price set by the cost :math:`C`; for those two every value must be finite.

All functions take 1-D floating tensors and return a :class:`DROResult` whose ``weights`` have the
values' dtype and device. They work in float64 inside.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from . import _validate as V

__all__ = ["DROResult", "kl_dual", "kl_dro", "chi2_dro", "cvar", "tv_dro", "wasserstein_dro", "group_dro_step"]

Tensor = torch.Tensor
_ITERS = 200
_BISECT_MAX = 2200      # halvings of a float64 interval until its ends are adjacent floats: at most ~2100
_F64 = torch.finfo(torch.float64)
_LOG_TAU = (math.log(_F64.tiny) + 1.0, math.log(_F64.max) - 1.0)    # log of the KL multiplier stays in here


class DROResult(NamedTuple):
    r"""The worst case over an uncertainty set.

    Fields: ``value`` (float, :math:`\sum_i q_i v_i` at the worst case), ``weights`` (``[n]``, the
    worst-case distribution :math:`q`), ``param`` (float, the dual variable: :math:`\nu` for KL,
    the threshold :math:`c` for :math:`\chi^2`, :math:`\eta = \mathrm{VaR}_\alpha` for CVaR,
    :math:`\nu` for Wasserstein, NaN for TV), ``plan`` (``[n, m]`` transport plan for
    Wasserstein, else None). Chapter: 19_robust_prompts.
    """

    value: float
    weights: Tensor
    param: float
    plan: Tensor | None = None


def _values_and_base(values, p, name="values", finite_off_support=False):
    """(v float64 [n], p float64 [n], support bool [n]); v may be NaN where p == 0 unless told otherwise."""
    V.float_tensor(values, name)
    if values.dim() != 1:
        raise ValueError(f"{name} must be 1-D (one value per prompt or group), got shape {tuple(values.shape)}")
    n = values.shape[0]
    if n == 0:
        raise ValueError(f"{name} is empty: the worst case over no prompts is undefined")
    if p is None:
        p64 = torch.full((n,), 1.0 / n, dtype=torch.float64, device=values.device)
    else:
        V.float_tensor(p, "p")
        V.layout("n", **{name: values, "p": p})       # a length mismatch names both
        V.distribution(p, "p", "the base distribution over the points of " + name, shape=(n,))
        V.same_kind(p, "p", values, name)
        p64 = p.detach().to(torch.float64).clamp_min(0.0)
        p64 = p64 / p64.sum()
    v64 = values.detach().to(torch.float64)
    support = p64 > 0
    check = v64 if finite_off_support else v64[support]
    if not bool(torch.isfinite(check).all()):
        where = "every entry" if finite_off_support else "every entry with p > 0"
        raise ValueError(f"{name} must be finite at {where}, got NaN or inf")
    return v64, p64, support


def _out(v64, q64, like, param, plan=None) -> DROResult:
    vv = torch.where(q64 > 0, v64, torch.zeros_like(v64))
    return DROResult(float((q64 * vv).sum()), q64.to(like.dtype), float(param), plan)


def _tilt(v, p, support, tau):
    """q proportional to p exp(-(v - min)/tau) on the support (stable)."""
    vmin = v[support].min()
    z = torch.where(support, -(v - vmin) / tau, torch.full_like(v, -math.inf))
    logq = torch.log(torch.where(support, p, torch.ones_like(p))) + z
    logq = torch.where(support, logq, torch.full_like(v, -math.inf))
    logq = logq - torch.logsumexp(logq, 0)
    return logq.exp()


def _kl(q, p):
    m = q > 0
    return float((q[m] * (q[m].log() - p[m].log())).sum())


def kl_dual(values: Tensor, tau: float, eps: float, p: Tensor | None = None) -> float:
    r"""The KL-ball dual objective at the multiplier :math:`\nu > 0` (argument ``tau``),

    .. math::  g(\nu) = -\nu\log\sum_i p_i e^{-v_i/\nu} - \nu\delta ,

    a lower bound on :math:`\min\{\mathbb E_q v : \mathrm{KL}(q\|p)\le\delta\}` for every
    :math:`\nu`, equal to it at the maximiser :math:`\nu^*` (:func:`kl_dro`). ``values`` ``[n]``,
    ``tau`` the multiplier :math:`\nu`, ``eps`` the radius :math:`\delta`, ``p`` ``[n]`` (default
    uniform). Computed stably around :math:`\min_i v_i`.
    Chapter: 19_robust_prompts.
    """
    v, pp, support = _values_and_base(values, p)
    tau = V.real_in(tau, "tau", 0.0, lo_open=True)
    eps = V.real_in(eps, "eps", 0.0)
    vmin = v[support].min()
    lse = torch.logsumexp(torch.log(pp[support]) - (v[support] - vmin) / tau, 0)
    return float(vmin - tau * lse - tau * eps)


def kl_dro(values: Tensor, eps: float, p: Tensor | None = None) -> DROResult:
    r"""Worst case over the KL ball :math:`\{q : \mathrm{KL}(q\,\|\,p) \le \delta\}`.

    (Hu and Hong, 2013.)

    The worst case is the exponential tilt of :math:`p`, and the value is the dual at its maximiser:

    .. math::

        q^*_i \propto p_i\, e^{-v_i/\nu^*}, \qquad
        \min_{\mathrm{KL}(q\|p)\le\delta}\mathbb E_q v
        = \sup_{\nu > 0}\Big\{-\nu\log\mathbb E_p e^{-v/\nu} - \nu\delta\Big\}.

    The dual's derivative is :math:`\mathrm{KL}(q_\nu\|p) - \delta`, decreasing in :math:`\nu`,
    so :math:`\nu^*` solves :math:`\mathrm{KL}(q_\nu\|p) = \delta` (bisection on
    :math:`\log\nu`). If :math:`\delta \ge -\log p(\arg\min v)`, the ball contains :math:`p`
    conditioned on the minimisers: the value is :math:`\min_i v_i` and ``param`` is 0. Equal values:
    :math:`q = p`, ``param`` inf. Always :math:`\min_i v_i \le` value :math:`\le \mathbb E_p v`.

    Args:
        values: ``[n]`` floats (NaN allowed where ``p == 0``; such points get weight 0).
        eps: the radius :math:`\delta \ge 0` (nats).
        p: ``[n]`` base distribution (default uniform).

    Returns:
        :class:`DROResult` with ``param`` = :math:`\nu^*`. Chapter: 19_robust_prompts.
    """
    v, pp, support = _values_and_base(values, p)
    eps = V.real_in(eps, "eps", 0.0)
    vs = v[support]
    vmin, vmax = float(vs.min()), float(vs.max())
    if vmax - vmin <= 1e-15 * max(1.0, abs(vmin)) or eps == 0.0:
        return _out(v, pp, values, math.inf)
    at_min = support & (v <= vmin)
    if eps >= -math.log(float(pp[at_min].sum())) - 1e-12:
        q = torch.where(at_min, pp, torch.zeros_like(pp))
        return _out(v, q / q.sum(), values, 0.0)
    span = vmax - vmin                                       # may be inf for values near +-1.8e308
    lo_end, hi_end = _LOG_TAU

    def log_of(x):
        return lo_end if x <= 0.0 else hi_end if x == math.inf else min(max(math.log(x), lo_end), hi_end)

    lo, hi = log_of(span * 1e-6), log_of(span * 1e6)         # KL(q_tau) > eps at lo, < eps at hi
    while lo > lo_end and _kl(_tilt(v, pp, support, math.exp(lo)), pp) < eps:
        lo = max(lo - 5.0, lo_end)                           # (a multiplier below e*tiny: bisect from there)
    while hi < hi_end and _kl(_tilt(v, pp, support, math.exp(hi)), pp) > eps:
        hi = min(hi + 5.0, hi_end)
    for _ in range(_ITERS):
        mid = 0.5 * (lo + hi)
        if _kl(_tilt(v, pp, support, math.exp(mid)), pp) > eps:
            lo = mid
        else:
            hi = mid
    tau = math.exp(hi)                                       # KL(q_tau) <= eps: feasible
    return _out(v, _tilt(v, pp, support, tau), values, tau)


def chi2_dro(values: Tensor, rho: float, p: Tensor | None = None) -> DROResult:
    r"""Worst case over the :math:`\chi^2` ball.

    The ball is :math:`\{q : \tfrac12\sum_i p_i (q_i/p_i - 1)^2 \le \delta\}`.

    With :math:`f(t) = \tfrac12(t-1)^2` (Duchi and Namkoong's convention) the worst-case likelihood
    ratio is affine in the value and clipped at zero,

    .. math::

        \frac{q^*_i}{p_i} = \frac{(c - v_i)_+}{\mathbb E_p (c - v)_+},\qquad
        \tfrac12\Big(\frac{\mathbb E_p (c-v)_+^2}{(\mathbb E_p (c-v)_+)^2} - 1\Big) = \delta ,

    with :math:`c > \min v` found by bisection (``param``). While no weight is clipped
    (:math:`c \ge \max v`) this is the closed form
    :math:`\mathbb E_p v - \sqrt{2\delta\,\mathrm{Var}_p v}` (mean minus a multiple of the standard
    deviation); beyond it the clipped weights make the value larger than that formula. If
    :math:`\delta \ge \tfrac12(1/p(\arg\min v) - 1)` the value is :math:`\min_i v_i`.

    Args:
        values: ``[n]`` floats (NaN allowed where ``p == 0``).
        rho: the radius :math:`\delta \ge 0`.
        p: ``[n]`` base distribution (default uniform).

    Returns:
        :class:`DROResult` with ``param`` = :math:`c`. Chapter: 19_robust_prompts.
    """
    v, pp, support = _values_and_base(values, p)
    rho = V.real_in(rho, "rho", 0.0)
    vs, ps = v[support], pp[support]
    vmin, vmax = float(vs.min()), float(vs.max())
    mean = float((ps * vs).sum())
    var = float((ps * (vs - mean) ** 2).sum())
    if vmax - vmin <= 1e-15 * max(1.0, abs(vmin)) or rho == 0.0:
        return _out(v, pp, values, math.inf)
    at_min = support & (v <= vmin)
    if rho >= 0.5 * (1.0 / float(pp[at_min].sum()) - 1.0) - 1e-12:
        q = torch.where(at_min, pp, torch.zeros_like(pp))
        return _out(v, q / q.sum(), values, vmin)

    def weights(c):
        x = torch.where(support, (c - v).clamp_min(0.0), torch.zeros_like(v))
        return pp * x / (pp * x).sum()

    def div(c):
        w = weights(c)
        r = torch.where(support, w / torch.where(support, pp, torch.ones_like(pp)), torch.zeros_like(pp))
        return 0.5 * float((pp * (r - 1.0) ** 2).sum())

    c_free = mean + math.sqrt(var / (2.0 * rho))
    if c_free == math.inf:                                    # a radius so small that the weights are p
        return _out(v, pp, values, c_free)
    if c_free >= vmax:
        return _out(v, weights(c_free), values, c_free)
    lo, hi = vmin, vmax                                       # div(lo+) > rho >= div(hi)
    for _ in range(_ITERS):
        mid = 0.5 * (lo + hi)
        if div(mid) > rho:
            lo = mid
        else:
            hi = mid
    return _out(v, weights(hi), values, hi)


def cvar(values: Tensor, alpha: float, p: Tensor | None = None) -> DROResult:
    r"""Lower-tail conditional value at risk: the mean of the worst :math:`\alpha` share of :math:`p`.

    .. math::

        \mathrm{CVaR}_\alpha(v) = \min\Big\{\mathbb E_q v : q_i \le \frac{p_i}{\alpha}\Big\}
        = \sup_{\eta}\Big\{\eta - \frac1\alpha\,\mathbb E_p (\eta - v)_+\Big\}
        \quad\text{(Rockafellar and Uryasev, 2000)},

    a DRO over likelihood ratios bounded by :math:`1/\alpha`. The worst case fills the lowest
    values up to mass 1 (``q_i = p_i / alpha``), the last one fractionally; ``param`` is the
    maximising :math:`\eta`, the :math:`\alpha`-quantile (value at risk). :math:`\alpha = 1` gives
    the mean; :math:`\alpha \to 0` the minimum over the support.

    Args:
        values: ``[n]`` floats (NaN allowed where ``p == 0``).
        alpha: the tail share, in ``(0, 1]``.
        p: ``[n]`` base distribution (default uniform).

    Returns:
        :class:`DROResult`. Chapter: 19_robust_prompts.
    """
    v, pp, support = _values_and_base(values, p)
    alpha = V.real_in(alpha, "alpha", 0.0, 1.0, lo_open=True)
    key = torch.where(support, v, torch.full_like(v, math.inf))
    order = torch.argsort(key, stable=True)
    q = torch.zeros_like(pp)
    left, eta = 1.0, float(v[order[0]])
    for i in order.tolist():
        if not bool(support[i]) or left <= 0.0:
            break
        take = min(float(pp[i]) / alpha, left)
        q[i] = take
        left -= take
        eta = float(v[i])
    return _out(v, q / q.sum(), values, eta)


def tv_dro(values: Tensor, eps: float, p: Tensor | None = None) -> DROResult:
    r"""Worst case over the total-variation ball :math:`\{q : \tfrac12\sum_i |q_i - p_i| \le \delta\}`.

    The adversary takes mass :math:`\delta` from the highest values and puts it on the single
    lowest value **anywhere**, including points with :math:`p_i = 0` (a TV ball does not need
    :math:`q \ll p`):

    .. math::

        \min_{\mathrm{TV}(q,p)\le\delta}\mathbb E_q v
        = (1-\delta)\,\mathrm{CVaR}_{1-\delta}(v) + \delta \min_i v_i ,

    with the CVaR under :math:`p` (:func:`cvar`) and the minimum over every point given. Every value
    must therefore be finite. ``param`` is NaN (the dual variable is not needed).

    Args:
        values: ``[n]`` finite floats.
        eps: the radius :math:`\delta`, in ``[0, 1]``.
        p: ``[n]`` base distribution (default uniform).

    Returns:
        :class:`DROResult`. Chapter: 19_robust_prompts.
    """
    v, pp, _ = _values_and_base(values, p, finite_off_support=True)
    eps = V.real_in(eps, "eps", 0.0, 1.0)
    j = int(torch.argmin(v))
    q = pp.clone()
    budget = eps
    for i in torch.argsort(v, descending=True, stable=True).tolist():
        if budget <= 0.0 or i == j:
            continue
        take = min(float(q[i]), budget)
        q[i] -= take
        q[j] += take
        budget -= take
    return _out(v, q.clamp_min(0.0), values, math.nan)


def wasserstein_dro(values: Tensor, cost: Tensor, eps: float, p: Tensor) -> DROResult:
    r"""Worst case over a Wasserstein ball: move the mass of :math:`p` to new points at a price.

    ``p`` ``[n]`` lives on source points (the training prompts), ``values`` ``[m]`` on target points
    (any prompts, seen or not), ``cost`` ``[n, m]`` is :math:`C_{ij} \ge 0`, the cost of turning
    prompt :math:`i` into prompt :math:`j`. The adversary picks a plan :math:`\pi \ge 0` with
    :math:`\pi\mathbf 1 = p` and :math:`\langle \pi, C\rangle \le \delta`:

    .. math::

        \min_{\pi}\sum_{ij}\pi_{ij}v_j
        = \sup_{\nu\ge 0}\Big\{-\nu\delta + \sum_i p_i \min_j\big(v_j + \nu C_{ij}\big)\Big\}

    (Gao and Kleywegt, 2023; Blanchet and Murthy, 2019). The inner :math:`\min_j` is a search for
    the prompt whose value, plus the price of reaching it, is lowest: adversarial prompt
    generation. The dual is concave and piecewise linear; its supergradient
    :math:`-\delta + \sum_i p_i C_{i j_i(\nu)}` is found by bisection, and the plan mixes
    the best responses on the two sides of the kink so that it spends exactly :math:`\delta`.

    Args:
        values: ``[m]`` finite floats.
        cost: ``[n, m]`` finite costs ``>= 0``.
        eps: the budget (radius) :math:`\delta \ge 0`, finite; it must be at least
            :math:`\sum_i p_i\min_j C_{ij}` (the cheapest plan), up to a slack of 1e-12, inside which it
            counts as that cost (the cheapest plan is returned: each source moved to its cheapest target of
            lowest value). When the kink of the dual lies beyond :math:`\nu = 10^{300}/(1+\max C)`, where
            :math:`\nu C` could overflow, the plan mixes the best response there with the limit
            :math:`\nu\to\infty` (the cheapest plan) to spend :math:`\delta`, and ``param`` is inf.
        p: ``[n]`` base distribution.

    Returns:
        :class:`DROResult` with ``weights`` = the worst-case distribution over targets
        :math:`\pi^\top\mathbf 1` ``[m]``, ``param`` = :math:`\nu^*`, ``plan`` = :math:`\pi` ``[n, m]``.
        Chapter: 19_robust_prompts.
    """
    V.float_tensor(values, "values")
    if values.dim() != 1 or values.shape[0] == 0:
        raise ValueError(f"values must be 1-D and non-empty (one value per target point), got {tuple(values.shape)}")
    V.float_tensor(cost, "cost", min_dim=2)
    V.same_kind(cost, "cost", values, "values")
    if cost.dim() != 2 or cost.shape[1] != values.shape[0]:
        raise ValueError(f"cost must have shape [n, m] = [len(p), len(values)] = (?, {values.shape[0]}), "
                         f"got {tuple(cost.shape)}")
    V.tensor_in(cost, "cost", 0.0)
    V.tensor_in(values, "values")
    V.distribution(p, "p", "the base distribution over the source points", shape=(cost.shape[0],))
    eps = V.real_in(eps, "eps", 0.0)
    v, C = values.detach().double(), cost.detach().double()
    pp = p.detach().double().clamp_min(0.0)
    pp = pp / pp.sum()

    def best(lam, prefer_cheap):
        score = v[None, :] + lam * C
        m = score.min(1, keepdim=True).values
        tie = score <= m + 1e-12 * (1.0 + m.abs())
        big = torch.full_like(C, math.inf if prefer_cheap else -math.inf)
        pick = torch.where(tie, C, big)
        j = pick.argmin(1) if prefer_cheap else pick.argmax(1)
        plan = torch.zeros_like(C)
        plan[torch.arange(C.shape[0]), j] = pp
        return plan

    def spend(plan):
        return float((plan * C).sum())

    # the limit nu -> inf: every source moves to its cheapest targets, the lowest value among them
    cmin = C.min(1, keepdim=True).values
    j = torch.where(C <= cmin, v[None, :].expand_as(C), torch.full_like(C, math.inf)).argmin(1)
    cheap = torch.zeros_like(C)
    cheap[torch.arange(C.shape[0]), j] = pp
    cheapest = float((pp * cmin[:, 0]).sum())
    if eps < cheapest - 1e-12:
        raise ValueError(f"eps ({eps}) is below the cost of the cheapest plan ({cheapest:.6g}): the Wasserstein "
                         f"ball around p is empty")
    floor = max(eps, spend(cheap))     # no plan spends less than the cheapest: an eps in the slack counts as it
    plan0 = best(0.0, True)
    if spend(plan0) <= floor:                                 # nu* = 0: everyone goes to the minimum
        return _out(v, plan0.sum(0), values, 0.0, plan0.to(values.dtype))
    gaps = C.max() - C.min()
    hi_end = 1e300 / (1.0 + float(C.max()))                   # beyond it nu * C could overflow
    hi = min(float((v.max() - v.min()) / max(float(gaps), 1e-300)) + 1.0, hi_end)
    beyond = False                                            # the kink lies beyond hi_end
    while not beyond and spend(best(hi, True)) > floor:
        beyond = 2.0 * hi > hi_end
        hi = hi if beyond else 2.0 * hi
    if beyond:                                                # mix best(hi_end) with the limit nu -> inf
        a, b, param = best(hi, True), cheap, math.inf
    else:
        lo = 0.0
        for it in range(_BISECT_MAX):   # _ITERS halvings, more while lo = 0, never past adjacent floats
            mid = 0.5 * (lo + hi)
            if not lo < mid < hi or (it >= _ITERS and lo > 0.0):
                break
            if spend(best(mid, True)) > floor:
                lo = mid
            else:
                hi = mid
        a, b, param = best(lo, True), best(hi, True), hi      # spends more / at most eps
    ca, cb = spend(a), spend(b)
    theta = 0.0 if ca <= cb else min(1.0, max(0.0, (eps - cb) / (ca - cb)))
    plan = theta * a + (1.0 - theta) * b
    return _out(v, plan.sum(0), values, param, plan.to(values.dtype))


def group_dro_step(q: Tensor, values: Tensor, step_size: float, counts: Tensor | None = None,
                   adj: float = 0.0) -> Tensor:
    r"""One exponentiated-gradient step of the group-DRO adversary (Sagawa et al., 2020).

    .. math::

        q_g \leftarrow \frac{q_g\, e^{-\eta\,(v_g - C/\sqrt{n_g})}}
                            {\sum_h q_h\, e^{-\eta\,(v_h - C/\sqrt{n_h})}}
        \;=\; \arg\min_{q'}\Big\{\eta\sum_g q'_g\tilde v_g + \mathrm{KL}(q'\,\|\,q)\Big\},

    with :math:`v_g` the group's current value (reward or accuracy; the paper writes
    :math:`e^{+\eta\ell_g}` with losses :math:`\ell = -v`), :math:`\eta` the ``step_size``, and the
    optional generalisation adjustment :math:`C/\sqrt{n_g}` (``adj``, with ``counts`` :math:`n_g`)
    that treats small groups as worse than they look. The step is a KL tilt of the previous weights
    (:func:`kl_dro` with :math:`\nu = 1/\eta`). A group whose value is NaN (absent from the batch)
    keeps its weight; the measured groups share the rest, so only they move. An infinite value is a
    measurement, and gets the formula's limit: a group at :math:`-\infty` is infinitely worse than
    every finite one, so the groups at :math:`-\infty` take all the measured mass (shared in
    proportion to :math:`q`), and a group at :math:`+\infty` gets weight 0 unless every measured
    group is at :math:`+\infty` (then they are tied and keep their shares).

    Args:
        q: ``[G]`` current weights (a distribution).
        values: ``[G]`` values per group; NaN marks a group not measured this step, ``-inf`` and ``+inf``
            are measurements (see above).
        step_size: :math:`\eta > 0`.
        counts: ``[G]`` group sizes :math:`n_g > 0` (needed when ``adj > 0``).
        adj: :math:`C \ge 0`.

    Returns:
        the new ``[G]`` weights (``q``'s dtype). Chapter: 19_robust_prompts.
    """
    V.distribution(q, "q", "the adversary's weights over groups", min_dim=1)
    V.float_tensor(values, "values")
    V.same_layout(q, "q", values, "values")
    step_size = V.real_in(step_size, "step_size", 0.0, lo_open=True)
    adj = V.real_in(adj, "adj", 0.0)
    v = values.detach().double()
    measured = ~torch.isnan(v)
    if adj > 0:
        if counts is None:
            raise ValueError("adj > 0 needs counts (the size n_g of each group)")
        V.float_tensor(counts, "counts")
        V.same_layout(q, "q", counts, "counts")
        V.tensor_in(counts, "counts", 0.0, lo_open=True)
        v = v - adj / counts.detach().double().sqrt()
    q64 = q.detach().double()
    if not bool(measured.any()):
        return q.detach().clone()
    mass = q64[measured].sum()
    if float(mass) <= 0:
        return q.detach().clone()
    vm = v[measured]
    logq = torch.log(q64[measured].clamp_min(1e-300))
    ninf = torch.full_like(vm, -math.inf)
    if bool(torch.isneginf(vm).any()):                        # the limit: all the mass on the groups at -inf
        logits = torch.where(torch.isneginf(vm), logq, ninf)
    elif bool(torch.isinf(vm).all()):                         # every measured group at +inf: tied
        logits = logq
    else:                                                     # a group at +inf gets weight 0
        finite = torch.isfinite(vm)
        logits = torch.where(finite, logq - step_size * (vm - vm[finite].min()), ninf)
    new = q64.clone()
    new[measured] = mass * torch.softmax(logits, 0)
    return new.to(q.dtype)
