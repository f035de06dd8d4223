r"""Checkers for the exercises of chapter 16, ``lessons/16_offpolicy_multistep.ipynb``.

* ``vtrace_nstep_target(log_rhos, rewards, values, next_values, discounts, clip_rho, clip_c, n)``: the
  n-step V-trace targets of IMPALA's definition (time last),
  :math:`v_s = V(s_s) + \sum_{t=s}^{\min(s+n,T)-1}\big(\prod_{i=s}^{t-1}\gamma_i c_i\big)\bar\rho_t\delta_t`. The
  chapter displays the full-length target (``rlkit.offpolicy.vtrace``), so the exercise asks for the windowed one.
* ``clipped_target_policy(pi, mu, rho_lo, rho_bar)``: the policy V-trace evaluates when the TD error's weight is
  clipped on both sides, :math:`\operatorname{clip}(\rho, \rho_{lo}, \bar\rho)`:
  :math:`\propto\operatorname{clip}(\pi, \rho_{lo}\mu, \bar\rho\mu)` (the chapter displays the one-sided
  ``rlkit.tabular.truncated_policy``, the case :math:`\rho_{lo} = 0`).
* ``retrace_traces(log_rhos, lam)``: Retrace's trace coefficients :math:`c_t = \lambda\min(1, \pi/\mu)`.
"""
from __future__ import annotations

import torch

from rlkit import _validate as V
from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []
F64 = torch.float64


# ---------------------------------------------------------------- 1. vtrace_nstep_target

def _vt_cases():
    g = torch.Generator().manual_seed(1601)

    def traj(b, t, scale, cut=None):
        lr = scale * torch.randn(b, t, generator=g, dtype=F64)
        r = torch.randn(b, t, generator=g, dtype=F64)
        v = torch.randn(b, t, generator=g, dtype=F64)
        nv = torch.cat([v[:, 1:], torch.randn(b, 1, generator=g, dtype=F64)], 1)
        d = torch.full((b, t), 0.9, dtype=F64)
        d[:, -1] = 0.0
        if cut is not None:                      # an episode ends inside the row: no trace across it
            d[:, cut] = 0.0
        return lr, r, v, nv, d

    lr = torch.log(torch.tensor([[2.0, 0.5, 3.0]], dtype=F64))
    hand = (lr, torch.tensor([[0.0, 0.0, 1.0]], dtype=F64), torch.tensor([[0.2, 0.4, 0.5]], dtype=F64),
            torch.tensor([[0.4, 0.5, 0.0]], dtype=F64), torch.tensor([[1.0, 1.0, 0.0]], dtype=F64))
    return [
        Case(args=(*hand, 1.0, 1.0, 2),
             label="3 steps by hand: ratios 2, 0.5, 3; reward 1 at the end; clips 1, 1; n = 2"),
        Case(args=(*traj(4, 7, 0.8), 2.0, 1.0, 3), label="4 trajectories of 7 steps, rho-bar = 2, c-bar = 1, n = 3"),
        Case(args=(*traj(3, 8, 1.2), 1.0, 0.5, 2), label="c-bar = 0.5 below rho-bar = 1, n = 2"),
        Case(args=(*traj(2, 6, 1.0, cut=2), 1.0, 1.0, 4), label="an episode ends at step 2 inside the row, n = 4"),
        Case(args=(*traj(2, 5, 1.0), 1.5, 1.0, 1), label="n = 1: one clipped TD error, no trace"),
        Case(args=(*traj(2, 5, 1.0), 1.0, 1.0, 9),
             label="n = 9 longer than the row (5 steps): the full V-trace target"),
        Case(args=(*traj(2, 6, 0.0), 1.0, 1.0, 3), label="on-policy data (all log-ratios 0), n = 3"),
    ]


def _window(log_rhos, rewards, values, next_values, discounts, clip_rho, clip_c, n, *, rho_fn=None, c_fn=None,
            extra=0, discount_trace=True, own_c=False):
    """The n-step V-trace target written as the forward sum over a window, with switches for the slips."""
    rho = torch.exp(log_rhos)
    rb = rho.clamp(max=clip_rho) if rho_fn is None else rho_fn(rho, clip_rho, clip_c)
    c = rho.clamp(max=clip_c) if c_fn is None else c_fn(rho, clip_rho, clip_c)
    delta = rewards + discounts * next_values - values
    T = values.shape[-1]
    out = values.clone()
    for s in range(T):
        coef = torch.ones_like(values[..., 0])
        for t in range(s, min(s + n + extra, T)):
            w = coef * c[..., t] if own_c else coef
            out[..., s] = out[..., s] + w * rb[..., t] * delta[..., t]
            coef = coef * (discounts[..., t] if discount_trace else 1.0) * c[..., t]
    return out


@exercise(chapter=16, cases=_vt_cases, atol=1e-9, description="n-step V-trace targets (IMPALA's definition).")
def vtrace_nstep_target(log_rhos, rewards, values, next_values, discounts, clip_rho, clip_c, n):
    r"""n-step V-trace targets ``[..., T]``:
    :math:`v_s = V_s + \sum_{t=s}^{\min(s+n, T)-1}\big(\prod_{i=s}^{t-1}\gamma_i c_i\big)\bar\rho_t\delta_t`."""
    V.matching_floats(log_rhos=log_rhos, rewards=rewards, values=values, next_values=next_values,
                      discounts=discounts)
    n = V.int_in(n, "n", 1)
    return _window(log_rhos, rewards, values, next_values, discounts, clip_rho, clip_c, n)


@mistake(vtrace_nstep_target, "your window never stops: that is the full-length V-trace target (for example "
         "rlkit.offpolicy.vtrace); the n-step target of step s sums only the TD errors of steps s .. s+n-1")
def _vt_full_length(log_rhos, rewards, values, next_values, discounts, clip_rho, clip_c, n):
    return _window(log_rhos, rewards, values, next_values, discounts, clip_rho, clip_c, values.shape[-1])


@mistake(vtrace_nstep_target, "off by one: your window holds n + 1 TD errors (steps s .. s+n); an n-step target "
         "has n of them, and the bootstrap V(s_{s+n}) comes in through the last one")
def _vt_window_plus_one(*a):
    return _window(*a, extra=1)


@mistake(vtrace_nstep_target, "rho-bar and c-bar are swapped: clip_rho truncates the weight of the TD error, "
         "min(clip_rho, pi/mu), and clip_c the trace, min(clip_c, pi/mu)")
def _vt_swapped(*a):
    return _window(*a, rho_fn=lambda r, rb, cb: r.clamp(max=cb), c_fn=lambda r, rb, cb: r.clamp(max=rb))


@mistake(vtrace_nstep_target, "the TD error is weighted by the raw ratio pi/mu; V-trace truncates that weight too, "
         "min(rho-bar, pi/mu), which bounds its variance and sets the fixed point")
def _vt_raw_rho_on_delta(*a):
    return _window(*a, rho_fn=lambda r, rb, cb: r)


@mistake(vtrace_nstep_target, "the discount is missing from the trace: each later TD error is weighted by "
         "prod gamma_i c_i; without gamma_i the correction also runs across the end of an episode")
def _vt_undiscounted_trace(*a):
    return _window(*a, discount_trace=False)


@mistake(vtrace_nstep_target, "c_t must only cut the trace to LATER steps; it does not multiply step t's own TD "
         "error (the product runs over i = s .. t-1)")
def _vt_trace_on_delta(*a):
    return _window(*a, own_c=True)


@mistake(vtrace_nstep_target, "the ratio is pi/mu (target over behaviour): exp(log_rhos), not exp(-log_rhos)")
def _vt_inverted(log_rhos, *a):
    return vtrace_nstep_target(-log_rhos, *a)


@mistake(vtrace_nstep_target, "the ratios are not truncated: that is per-decision importance sampling, unbiased "
         "for V^pi but with unbounded variance")
def _vt_unclipped(*a):
    return _window(*a, rho_fn=lambda r, rb, cb: r, c_fn=lambda r, rb, cb: r)


# -------------------------------------------------------------- 2. clipped_target_policy

def _tp_cases():
    g = torch.Generator().manual_seed(1602)

    def pol(*shape, temp=1.0):
        return torch.softmax(torch.randn(*shape, generator=g, dtype=F64) / temp, -1)

    pi = torch.tensor([0.7, 0.2, 0.1], dtype=F64)
    mu = torch.tensor([0.2, 0.3, 0.5], dtype=F64)
    zero = torch.tensor([0.6, 0.4, 0.0], dtype=F64)
    return [
        Case(args=(pi, mu, 0.5, 1.0), label="pi = (0.7, 0.2, 0.1), mu = (0.2, 0.3, 0.5), rho_lo = 0.5, rho-bar = 1"),
        Case(args=(pi, mu, 0.0, 1.0), label="rho_lo = 0: the chapter's one-sided truncation"),
        Case(args=(zero, mu, 0.5, 2.0), label="an action pi never takes is lifted to rho_lo * mu"),
        Case(args=(pol(5, 4, temp=0.5), pol(5, 4), 0.7, 1.5),
             label="5 states x 4 actions, rho_lo = 0.7, rho-bar = 1.5"),
        Case(args=(pol(3, 6), pol(3, 6), 0.01, 100.0),
             label="rho_lo = 0.01, rho-bar = 100: wide clips, close to pi"),
        Case(args=(pol(2, 3, 5), pol(2, 3, 5), 1.0, 1.0),
             label="rho_lo = rho-bar = 1: every weight is 1, so mu itself"),
    ]


@exercise(chapter=16, cases=_tp_cases, atol=1e-10,
          description="The policy V-trace evaluates when the TD error's weight is clipped on both sides.")
def clipped_target_policy(pi, mu, rho_lo, rho_bar):
    r""":math:`\operatorname{clip}(\pi, \rho_{lo}\mu, \bar\rho\mu)` normalised over the last dimension."""
    V.matching_floats(pi=pi, mu=mu)
    m = torch.minimum(torch.maximum(pi, rho_lo * mu), rho_bar * mu)
    return m / m.sum(-1, keepdim=True)


@mistake(clipped_target_policy, "the lower clip is missing: min(rho-bar mu, pi) is the one-sided truncated policy "
         "of the chapter (rlkit.tabular.truncated_policy); the weight max(rho_lo, .) also lifts pi up to rho_lo mu")
def _tp_one_sided(pi, mu, rho_lo, rho_bar):
    m = torch.minimum(rho_bar * mu, pi)
    return m / m.sum(-1, keepdim=True)


@mistake(clipped_target_policy, "clip(pi, rho_lo mu, rho-bar mu) is not a distribution: renormalise it over the "
         "actions")
def _tp_unnormalised(pi, mu, rho_lo, rho_bar):
    return torch.minimum(torch.maximum(pi, rho_lo * mu), rho_bar * mu)


@mistake(clipped_target_policy, "you clipped the RATIO, clip(pi/mu, rho_lo, rho-bar), and normalised that; the "
         "expected TD error weights action a by mu(a) times the clipped ratio, clip(pi, rho_lo mu, rho-bar mu)")
def _tp_ratio_only(pi, mu, rho_lo, rho_bar):
    m = torch.clamp(pi / mu, min=rho_lo, max=rho_bar)
    return m / m.sum(-1, keepdim=True)


@mistake(clipped_target_policy, "the roles of pi and mu are swapped: the bounds are rho_lo and rho-bar times the "
         "BEHAVIOUR mu, and pi is what gets clipped")
def _tp_swapped(pi, mu, rho_lo, rho_bar):
    m = torch.minimum(torch.maximum(mu, rho_lo * pi), rho_bar * pi)
    return m / m.sum(-1, keepdim=True)


# ------------------------------------------------------------------------ 3. retrace_traces

def _rt_cases():
    g = torch.Generator().manual_seed(1603)
    return [
        Case(args=(torch.log(torch.tensor([0.5, 1.0, 2.0, 4.0], dtype=F64)), 1.0),
             label="ratios 0.5, 1, 2, 4 with lambda = 1"),
        Case(args=(torch.log(torch.tensor([0.5, 1.0, 2.0, 4.0], dtype=F64)), 0.9), label="the same with lambda = 0.9"),
        Case(args=(1.5 * torch.randn(6, 10, generator=g, dtype=F64), 0.95), label="6 x 10 log-ratios of scale 1.5"),
        Case(args=(torch.tensor([-80.0, 0.0, 80.0], dtype=F64), 0.5), label="log-ratios of -80, 0, 80"),
    ]


@exercise(chapter=16, cases=_rt_cases, atol=1e-12, description="Retrace's trace coefficients.")
def retrace_traces(log_rhos, lam):
    r""":math:`c_t = \lambda\min(1, e^{\ell_t})`, computed as :math:`\lambda e^{\min(\ell_t, 0)}`."""
    V.float_tensor(log_rhos, "log_rhos", min_dim=1)
    lam = V.real_in(lam, "lam", 0.0, 1.0)
    return lam * torch.exp(log_rhos.clamp(max=0.0))


@mistake(retrace_traces, "lambda is missing: Retrace(lambda)'s trace is lambda * min(1, pi/mu)")
def _rt_no_lam(log_rhos, lam):
    return torch.exp(log_rhos.clamp(max=0.0))


@mistake(retrace_traces, "the ratio is not truncated at 1: that is importance sampling (lambda pi/mu), whose "
         "products of traces explode")
def _rt_is(log_rhos, lam):
    return lam * torch.exp(log_rhos)


@mistake(retrace_traces, "you capped the LOG-ratio at 1 (min(1, log rho)) before exponentiating: the cap is on "
         "the ratio, i.e. the log-ratio is capped at 0")
def _rt_log_cap(log_rhos, lam):
    return lam * torch.exp(log_rhos.clamp(max=1.0))


@mistake(retrace_traces, "lambda multiplies the truncated ratio; min(lambda, pi/mu) truncates at lambda instead")
def _rt_lam_inside(log_rhos, lam):
    return torch.exp(log_rhos).clamp(max=lam)
