r"""Checkers for the exercises of chapter 13, ``lessons/13_engineering_checklist.ipynb``.

* ``first_alert_step(values, max_value, patience)``: for a list of per-update values, the index of
  the first update at which a ``max`` alert with ``patience`` fires (``patience`` consecutive values
  above ``max_value``, a non-finite value counting as a violation), or -1 if it never fires.
* ``window_drop_share(lag_probs, window)``: the share of data a version window of ``window``
  versions drops, :math:`P(\ell \ge W) = \sum_{\ell \ge W} p_\ell`.
* ``staleness_by_age(log_rho, ages, max_age)``: :math:`\hat S` per age, the mean of
  :math:`\tfrac12|e^{\log\rho}-1|` over the samples of each age ``0..max_age`` (NaN where there is none).
"""
from __future__ import annotations

import math

import torch

from rlkit import _validate as V
from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []
F64 = torch.float64


def _violations(values, max_value):
    """Which updates violate a ``max`` alert: above ``max_value``, or not finite."""
    return [(not math.isfinite(v)) or v > max_value for v in values]


# -------------------------------------------------------------------- 1. first_alert_step

def _fa_cases():
    nan = float("nan")
    return [
        Case(args=([0.01, 0.2, 0.01, 0.2, 0.3, 0.02], 0.1, 2),
             label="patience 2: the streak at updates 3-4 fires at 4"),
        Case(args=([0.01, 0.2, 0.3, 0.01, 0.2, 0.01, 0.3], 0.1, 3),
             label="patience 3: no three violations in a row -> -1"),
        Case(args=([0.01, 0.02, nan, 0.03], 0.1, 1), label="a NaN is an alert"),
        Case(args=([0.5, 0.01, 0.5, 0.5, 0.5], 0.1, 1), label="patience 1 fires at the first violation"),
        Case(args=([0.2, 0.6, 0.7, 0.3, 0.9], 0.5, 2), label="max_value 0.5: 0.2 and 0.3 are in range, fires at 2"),
    ]


@exercise(chapter=13, cases=_fa_cases, atol=0.0, description="When does an alert with patience fire?")
def first_alert_step(values, max_value, patience):
    """Index at which the streak of violations first reaches ``patience`` (a tensor), else -1."""
    values = V.real_list(values, "values (one value per update)")
    max_value = V.real_in(max_value, "max_value")
    patience = V.int_in(patience, "patience")
    streak = 0
    for i, bad in enumerate(_violations(values, max_value)):
        streak = streak + 1 if bad else 0
        if streak == patience:
            return torch.tensor(i)
    return torch.tensor(-1)


@mistake(first_alert_step, "patience counts CONSECUTIVE violations: reset the count when a value is back in range")
def _fa_no_reset(values, max_value, patience):
    bad = [i for i, b in enumerate(_violations(values, max_value)) if b]
    return torch.tensor(bad[patience - 1] if len(bad) >= patience else -1)


@mistake(first_alert_step, "NaN > max is False, so a NaN slips through: a non-finite value must count as a violation")
def _fa_nan_ok(values, max_value, patience):
    # NaN > x is False: NaN passes silently
    return first_alert_step([max_value if math.isnan(v) else v for v in values], max_value, patience)


@mistake(first_alert_step, "return the update at which the alert FIRES (the end of the streak), "
         "not where the streak began")
def _fa_start(values, max_value, patience):
    fired = first_alert_step(values, max_value, patience)
    return fired - (patience - 1) if fired >= 0 else fired


# -------------------------------------------------------------------- 2. window_drop_share

def _wds_cases():
    return [
        Case(args=(torch.full((9,), 1.0 / 9, dtype=F64), 3), label="lags uniform on 0..8, window 3: 6/9 dropped"),
        Case(args=(torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0], dtype=F64), 4),
             label="a fixed lag of 4, window 4: all dropped"),
        Case(args=(torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0], dtype=F64), 5),
             label="a fixed lag of 4, window 5: none dropped"),
        Case(args=(torch.tensor([0.5, 0.25, 0.125, 0.125], dtype=F64), 2), label="a geometric-like lag, window 2"),
    ]


@exercise(chapter=13, cases=_wds_cases, atol=1e-12, description="The share of data a version window drops.")
def window_drop_share(lag_probs, window):
    r""":math:`\sum_{\ell \ge W} p_\ell` as a 0-dim tensor (``lag_probs[l]`` = P(lag = l))."""
    V.layout("L", floating=True, lag_probs=lag_probs)
    window = V.int_in(window, "window")
    return lag_probs[window:].sum()


@mistake(window_drop_share, "a window of W versions keeps ages 0..W-1: data of age exactly W are dropped too")
def _wds_off_by_one(lag_probs, window):
    return window_drop_share(lag_probs, window + 1)


@mistake(window_drop_share, "you returned the share KEPT by the window; the question asks for the share dropped")
def _wds_kept(lag_probs, window):
    return lag_probs[:window].sum()


# --------------------------------------------------------------------- 3. staleness_by_age

def _per_age_mean(d, ages, max_age):
    """``out[a]`` = mean of ``d`` over the samples of age ``a``; NaN for an age with no sample."""
    out = torch.full((max_age + 1,), float("nan"), dtype=d.dtype)
    for a in range(max_age + 1):
        sel = ages == a
        if sel.any():
            out[a] = d[sel].mean()
    return out


def _sba_cases():
    g = torch.Generator().manual_seed(1303)
    ages = torch.randint(0, 5, (300,), generator=g)
    ages[ages == 2] = 3
    log_rho = 0.15 * ages.to(F64) * torch.randn(300, generator=g, dtype=F64)
    return [
        Case(args=(torch.log(torch.tensor([1.0, 1.2, 0.6, 1.0], dtype=F64)), torch.tensor([0, 1, 1, 0]), 1),
             label="age 0: ratios 1, 1; age 1: ratios 1.2, 0.6 -> (0, 0.15)"),
        Case(args=(log_rho, ages, 4), label="300 samples, no sample of age 2 (NaN there)"),
        Case(args=(log_rho, ages, 6), label="max_age beyond the data: NaN for ages 5 and 6"),
    ]


@exercise(chapter=13, cases=_sba_cases, atol=1e-12, description="The staleness of each age group of a batch.")
def staleness_by_age(log_rho, ages, max_age):
    r"""``out[a]`` = mean of ``0.5 * |exp(log_rho) - 1|`` over samples with ``ages == a``; NaN if none."""
    sizes = V.layout("N", floating=True, log_rho=log_rho)
    V.index_tensor(ages, "ages", shape=(sizes["N"],), shape_of="the shape of log_rho")
    max_age = V.int_in(max_age, "max_age", 0)
    return _per_age_mean(0.5 * torch.expm1(log_rho).abs(), ages, max_age)


@mistake(staleness_by_age, "S is HALF the mean absolute ratio deviation (a total-variation distance)")
def _sba_no_half(log_rho, ages, max_age):
    return 2 * staleness_by_age(log_rho, ages, max_age)


@mistake(staleness_by_age, "use the ratio, |rho - 1| = |exp(log_rho) - 1|, not the log-ratio")
def _sba_log(log_rho, ages, max_age):
    return _per_age_mean(0.5 * log_rho.abs(), ages, max_age)


@mistake(staleness_by_age, "average over the samples OF THAT AGE, not over the whole batch")
def _sba_total(log_rho, ages, max_age):
    count = torch.bincount(ages, minlength=max_age + 1)[: max_age + 1]
    return staleness_by_age(log_rho, ages, max_age) * count / ages.numel()
