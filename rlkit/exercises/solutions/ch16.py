r"""Checkers for the exercises of chapter 16, ``lessons/16_offpolicy_multistep.ipynb``.

* ``vtrace_target(log_rhos, rewards, values, next_values, discounts, clip_rho, clip_c)``: the V-trace
  targets :math:`v_t` of one or more trajectories (time last), by the recursion
  :math:`v_t - V(s_t) = \bar\rho_t\delta_t + \gamma_t c_t (v_{t+1} - V(s_{t+1}))`.
* ``truncated_target_policy(pi, mu, rho_bar)``: the policy V-trace evaluates,
  :math:`\pi_{\bar\rho} \propto \min(\bar\rho\mu, \pi)`.
* ``retrace_traces(log_rhos, lam)``: Retrace's trace coefficients :math:`c_t = \lambda\min(1, \pi/\mu)`.
"""
from __future__ import annotations

import torch

from rlkit import _validate as V
from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []
F64 = torch.float64


# ------------------------------------------------------------------------ 1. vtrace_target

def _vt_cases():
    g = torch.Generator().manual_seed(1601)

    def traj(b, t, scale):
        lr = scale * torch.randn(b, t, generator=g, dtype=F64)
        r = torch.randn(b, t, generator=g, dtype=F64)
        v = torch.randn(b, t, generator=g, dtype=F64)
        nv = torch.cat([v[:, 1:], torch.randn(b, 1, generator=g, dtype=F64)], 1)
        d = torch.full((b, t), 0.9, dtype=F64)
        d[:, -1] = 0.0
        return lr, r, v, nv, d

    lr = torch.log(torch.tensor([[2.0, 0.5, 3.0]], dtype=F64))
    hand = (lr, torch.tensor([[0.0, 0.0, 1.0]], dtype=F64), torch.tensor([[0.2, 0.4, 0.5]], dtype=F64),
            torch.tensor([[0.4, 0.5, 0.0]], dtype=F64), torch.tensor([[1.0, 1.0, 0.0]], dtype=F64))
    return [
        Case(args=(*hand, 1.0, 1.0), label="3 steps by hand: ratios 2, 0.5, 3; reward 1 at the end; clips 1, 1"),
        Case(args=(*traj(4, 6, 0.8), 2.0, 1.0), label="4 trajectories of 6 steps, rho-bar = 2, c-bar = 1"),
        Case(args=(*traj(3, 8, 1.2), 1.0, 0.5), label="c-bar = 0.5 below rho-bar = 1"),
        Case(args=(*traj(2, 5, 0.0), 1.0, 1.0), label="on-policy data (all log-ratios 0): the lambda-return"),
    ]


@exercise(chapter=16, cases=_vt_cases, atol=1e-9, description="V-trace targets of a trajectory, by hand.")
def vtrace_target(log_rhos, rewards, values, next_values, discounts, clip_rho, clip_c):
    r"""V-trace targets ``[..., T]``: :math:`v_t = V_t + \bar\rho_t\delta_t + \gamma_t c_t(v_{t+1} - V_{t+1})`."""
    V.matching_floats(log_rhos=log_rhos, rewards=rewards, values=values, next_values=next_values,
                      discounts=discounts)
    rho = torch.exp(log_rhos)
    rho_bar, c = rho.clamp(max=clip_rho), rho.clamp(max=clip_c)
    acc = torch.zeros_like(values[..., 0])
    out = torch.zeros_like(values)
    for t in reversed(range(values.shape[-1])):
        delta = rewards[..., t] + discounts[..., t] * next_values[..., t] - values[..., t]
        acc = rho_bar[..., t] * delta + discounts[..., t] * c[..., t] * acc
        out[..., t] = values[..., t] + acc
    return out


def _vt_variant(rho_fn, c_fn, weight_delta=True, discount_trace=True):
    def fn(log_rhos, rewards, values, next_values, discounts, clip_rho, clip_c):
        rho = torch.exp(log_rhos)
        rb, c = rho_fn(rho, clip_rho, clip_c), c_fn(rho, clip_rho, clip_c)
        acc = torch.zeros_like(values[..., 0])
        out = torch.zeros_like(values)
        for t in reversed(range(values.shape[-1])):
            delta = rewards[..., t] + discounts[..., t] * next_values[..., t] - values[..., t]
            trace = (discounts[..., t] if discount_trace else 1.0) * c[..., t]
            acc = (rb[..., t] if weight_delta else 1.0) * delta + trace * acc
            out[..., t] = values[..., t] + acc
        return out
    return fn


@mistake(vtrace_target, "the trace c_t is truncated at c-bar, not at rho-bar: rho-bar weights the TD error "
         "(and sets the fixed point), c-bar cuts the trace (and sets the speed)")
def _vt_c_at_rho(*a):
    return _vt_variant(lambda r, rb, cb: r.clamp(max=rb), lambda r, rb, cb: r.clamp(max=rb))(*a)


@mistake(vtrace_target, "the TD error of each step must be weighted by rho-bar_t = min(rho-bar, pi/mu); "
         "without it you evaluate mu's action at every step, not pi's")
def _vt_no_rho(*a):
    return _vt_variant(lambda r, rb, cb: r, lambda r, rb, cb: r.clamp(max=cb), weight_delta=False)(*a)


@mistake(vtrace_target, "the ratios are not truncated: that is per-decision importance sampling, unbiased "
         "for V^pi but with unbounded variance")
def _vt_unclipped(*a):
    return _vt_variant(lambda r, rb, cb: r, lambda r, rb, cb: r)(*a)


@mistake(vtrace_target, "rho-bar and c-bar are swapped: clip_rho truncates the weight of the TD error, "
         "min(clip_rho, pi/mu), and clip_c the trace, min(clip_c, pi/mu)")
def _vt_swapped(*a):
    return _vt_variant(lambda r, rb, cb: r.clamp(max=cb), lambda r, rb, cb: r.clamp(max=rb))(*a)


@mistake(vtrace_target, "the TD error is weighted by the raw ratio pi/mu; V-trace truncates that weight too, "
         "min(rho-bar, pi/mu), which bounds its variance and sets the fixed point")
def _vt_raw_rho_on_delta(*a):
    return _vt_variant(lambda r, rb, cb: r, lambda r, rb, cb: r.clamp(max=cb))(*a)


@mistake(vtrace_target, "the discount is missing from the trace: v_t - V_t = rho-bar_t delta_t + gamma_t c_t "
         "(v_{t+1} - V_{t+1}); without gamma_t the correction also runs across the end of an episode")
def _vt_undiscounted_trace(*a):
    return _vt_variant(lambda r, rb, cb: r.clamp(max=rb), lambda r, rb, cb: r.clamp(max=cb), discount_trace=False)(*a)


@mistake(vtrace_target, "the ratio is pi/mu (target over behaviour): exp(log_rhos), not exp(-log_rhos)")
def _vt_inverted(log_rhos, *a):
    return vtrace_target(-log_rhos, *a)


@mistake(vtrace_target, "c_t must only cut the trace to LATER steps; it does not multiply step t's own TD "
         "error (the product runs over i = s .. t-1)")
def _vt_trace_on_delta(log_rhos, rewards, values, next_values, discounts, clip_rho, clip_c):
    rho = torch.exp(log_rhos)
    rb, c = rho.clamp(max=clip_rho), rho.clamp(max=clip_c)
    acc = torch.zeros_like(values[..., 0])
    out = torch.zeros_like(values)
    for t in reversed(range(values.shape[-1])):
        delta = rewards[..., t] + discounts[..., t] * next_values[..., t] - values[..., t]
        acc = c[..., t] * (rb[..., t] * delta + discounts[..., t] * acc)
        out[..., t] = values[..., t] + acc
    return out


# -------------------------------------------------------------- 2. truncated_target_policy

def _tp_cases():
    g = torch.Generator().manual_seed(1602)

    def pol(*shape, temp=1.0):
        return torch.softmax(torch.randn(*shape, generator=g, dtype=F64) / temp, -1)

    pi = torch.tensor([0.7, 0.2, 0.1], dtype=F64)
    mu = torch.tensor([0.2, 0.3, 0.5], dtype=F64)
    return [
        Case(args=(pi, mu, 1.0), label="pi = (0.7, 0.2, 0.1), mu = (0.2, 0.3, 0.5), rho-bar = 1"),
        Case(args=(pi, mu, 2.0), label="the same with rho-bar = 2"),
        Case(args=(pol(5, 4, temp=0.5), pol(5, 4), 1.5), label="5 states x 4 actions, rho-bar = 1.5"),
        Case(args=(pol(3, 6), pol(3, 6), 100.0), label="rho-bar = 100 (above every ratio): pi itself"),
    ]


@exercise(chapter=16, cases=_tp_cases, atol=1e-10, description="The truncated policy that V-trace evaluates.")
def truncated_target_policy(pi, mu, rho_bar):
    r""":math:`\min(\bar\rho\mu, \pi)` normalised over the last dimension."""
    V.matching_floats(pi=pi, mu=mu)
    m = torch.minimum(rho_bar * mu, pi)
    return m / m.sum(-1, keepdim=True)


@mistake(truncated_target_policy, "min(rho-bar mu, pi) is not a distribution: renormalise it over the actions")
def _tp_unnormalised(pi, mu, rho_bar):
    return torch.minimum(rho_bar * mu, pi)


@mistake(truncated_target_policy, "you truncated the RATIO, min(rho-bar, pi/mu), and normalised that; the policy "
         "is mu times the truncated ratio, min(rho-bar mu, pi)")
def _tp_ratio_only(pi, mu, rho_bar):
    m = torch.clamp(pi / mu, max=rho_bar)
    return m / m.sum(-1, keepdim=True)


@mistake(truncated_target_policy, "the truncation caps pi at rho-bar * mu (min), it does not lift it (max)")
def _tp_max(pi, mu, rho_bar):
    m = torch.maximum(rho_bar * mu, pi)
    return m / m.sum(-1, keepdim=True)


@mistake(truncated_target_policy, "the roles of pi and mu are swapped: the cap is rho-bar times the BEHAVIOUR mu")
def _tp_swapped(pi, mu, rho_bar):
    m = torch.minimum(rho_bar * pi, mu)
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
