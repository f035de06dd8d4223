r"""Checkers for the exercises of chapter 6, ``lessons/06_entropy_kl_lr.ipynb``.

For a softmax policy :math:`\pi = \mathrm{softmax}(z)` whose logits move by a small :math:`\delta z`:

* ``entropy_change(logits, dz)``: the first-order change of the entropy,
  :math:`\delta H = -\mathrm{Cov}_{a\sim\pi}(\log\pi_a,\ \delta z_a)`.
* ``kl_second_order(logits, dz)``: the second-order KL,
  :math:`\mathrm{KL}(\pi\,\|\,\pi') \approx \tfrac12\mathrm{Var}_{a\sim\pi}(\delta z_a)`.
* ``kl_lr_update(lr, kl, threshold, aim)``: one step of the chapter's KL-triggered learning-rate
  rule (:class:`rlkit.controllers.KLTriggeredLR` with gain 1/2, steps of at most 1.25x, cuts of at
  most 10x).
"""
from __future__ import annotations

import math
import numbers

import torch

from rlkit.exercises import Case, Exercise, Mistake, register

__all__: list[str] = []
F64 = torch.float64


def _pair(fn, logits, dz):
    for name, x in (("logits", logits), ("dz", dz)):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"{fn}: {name} must be a floating-point torch.Tensor [..., A]")
        if x.dim() < 1:
            raise ValueError(f"{fn}: {name} must have shape [..., A], got a 0-dim tensor")
    if tuple(logits.shape) != tuple(dz.shape):
        raise ValueError(f"{fn}: dz has shape {tuple(dz.shape)}, expected the shape of logits {tuple(logits.shape)}")


def _cases(seed):
    def make():
        g = torch.Generator().manual_seed(seed)
        sharp = torch.tensor([[4.0, 1.0, 0.0, -1.0]], dtype=F64)
        return [
            Case(args=(torch.tensor([0.0, 0.0, 0.0]), torch.tensor([1.0, 0.0, 0.0])),
                 label="uniform policy over 3 actions, raise one logit"),
            Case(args=(torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)), label="5 states, 4 actions"),
            Case(args=(sharp, torch.tensor([[1.0, -1.0, 0.5, 0.0]], dtype=F64)),
                 label="a confident policy, float64"),
            Case(args=(3 * torch.randn(2, 3, 6, generator=g, dtype=F64), torch.randn(2, 3, 6, generator=g, dtype=F64)),
                 label="[2, 3] states, 6 actions"),
        ]
    return make


# --------------------------------------------------------------------------- 1. entropy_change

def _entropy_change(logits, dz):
    r""":math:`-\mathrm{Cov}_\pi(\log\pi, \delta z) = -\sum_a \pi_a(\log\pi_a - \bar\ell)(\delta z_a - \bar z)`."""
    _pair("entropy_change", logits, dz)
    logp = torch.log_softmax(logits, -1)
    p = logp.exp()
    lc = logp - (p * logp).sum(-1, keepdim=True)
    zc = dz - (p * dz).sum(-1, keepdim=True)
    return -(p * lc * zc).sum(-1)


def _ent_uncentred(logits, dz):
    logp = torch.log_softmax(logits, -1)
    p = logp.exp()
    return -(p * logp * dz).sum(-1)


def _ent_uniform_weights(logits, dz):
    logp = torch.log_softmax(logits, -1)
    lc = logp - logp.mean(-1, keepdim=True)
    zc = dz - dz.mean(-1, keepdim=True)
    return -(lc * zc).mean(-1)


def _ent_probs_not_logs(logits, dz):
    p = torch.softmax(logits, -1)
    pc = p - (p * p).sum(-1, keepdim=True)
    zc = dz - (p * dz).sum(-1, keepdim=True)
    return -(p * pc * zc).sum(-1)


register(Exercise(
    name="entropy_change",
    chapter=6,
    reference=_entropy_change,
    cases=_cases(601),
    mistakes=[
        Mistake(_ent_uncentred, "you dropped the centring of dz: the probabilities move by "
                                "pi_a (dz_a - E_pi[dz]), so the answer is a covariance, -Cov_pi(log pi, dz)"),
        Mistake(_ent_uniform_weights, "the covariance is under the policy (weights pi_a), not a plain mean over "
                                      "actions"),
        Mistake(_ent_probs_not_logs, "the covariance is between log pi_a and dz_a (dH = -sum (1 + log pi_a) "
                                     "d pi_a), not between pi_a and dz_a"),
    ],
    atol=1e-5,
    description="first-order entropy change of a softmax policy",
))


# --------------------------------------------------------------------------- 2. kl_second_order

def _kl_second_order(logits, dz):
    r""":math:`\tfrac12\mathrm{Var}_\pi(\delta z) = \tfrac12\sum_a\pi_a(\delta z_a - \bar z)^2`."""
    _pair("kl_second_order", logits, dz)
    p = torch.softmax(logits, -1)
    zc = dz - (p * dz).sum(-1, keepdim=True)
    return 0.5 * (p * zc * zc).sum(-1)


def _kl2_uncentred(logits, dz):
    p = torch.softmax(logits, -1)
    return 0.5 * (p * dz * dz).sum(-1)


def _kl2_uniform(logits, dz):
    return 0.5 * dz.var(-1, unbiased=False)


def _kl2_no_half(logits, dz):
    return 2.0 * _kl_second_order(logits, dz)


register(Exercise(
    name="kl_second_order",
    chapter=6,
    reference=_kl_second_order,
    cases=_cases(602),
    mistakes=[
        Mistake(_kl2_uncentred, "adding the same constant to every logit does not change the policy, so the "
                                "answer must not change either: centre dz at its mean under pi"),
        Mistake(_kl2_uniform, "the variance is under the policy (weights pi_a), not over actions with equal "
                              "weights"),
        Mistake(_kl2_no_half, "the second-order term of the KL is HALF the Fisher quadratic form: "
                              "(1/2) Var_pi(dz)"),
    ],
    atol=1e-6,
    description="second-order KL between softmax(z) and softmax(z + dz)",
))


# --------------------------------------------------------------------------- 3. kl_lr_update

def _num(fn, name, x, lo_open=True, lo=0.0):
    if isinstance(x, bool) or not isinstance(x, numbers.Real) or not math.isfinite(x):
        raise ValueError(f"{fn}: {name} must be a finite number, got {x!r}")
    if (x <= lo) if lo_open else (x < lo):
        raise ValueError(f"{fn}: {name} must be {'>' if lo_open else '>='} {lo}, got {x!r}")


def _kl_lr_update(lr, kl, threshold, aim):
    r"""Cut by :math:`\max(\sqrt{d^\star/d}, 1/10)` above the threshold; else
    :math:`\times\mathrm{clip}((d^\star/d)^{1/4}, 0.8, 1.25)`."""
    fn = "kl_lr_update"
    _num(fn, "lr", lr)
    _num(fn, "kl", kl, lo_open=False)
    _num(fn, "threshold", threshold)
    _num(fn, "aim", aim)
    if aim > threshold:
        raise ValueError(f"{fn}: aim must be <= threshold, got aim={aim}, threshold={threshold}")
    if kl > threshold:
        return lr * max(math.sqrt(aim / kl), 0.1)
    if kl == 0:
        return lr * 1.25
    return lr * min(max((aim / kl) ** 0.25, 0.8), 1.25)


def _lr_linear_cut(lr, kl, threshold, aim):
    if kl > threshold:
        return lr * max(aim / kl, 0.1)
    return _kl_lr_update(lr, kl, threshold, aim)


def _lr_no_floor(lr, kl, threshold, aim):
    if kl > threshold:
        return lr * math.sqrt(aim / kl)
    return _kl_lr_update(lr, kl, threshold, aim)


def _lr_cut_only(lr, kl, threshold, aim):
    if kl > threshold:
        return lr * max(math.sqrt(aim / kl), 0.1)
    return float(lr)


def _lr_cut_to_threshold(lr, kl, threshold, aim):
    if kl > threshold:
        return lr * max(math.sqrt(threshold / kl), 0.1)
    return _kl_lr_update(lr, kl, threshold, aim)


def _lr_cases():
    return [
        Case(args=(0.01, 0.08, 0.02, 0.005), label="KL = 4 x threshold"),
        Case(args=(0.01, 5.0, 0.02, 0.005), label="KL far above threshold (the cut is capped at 10x)"),
        Case(args=(0.003, 0.005, 0.02, 0.005), label="KL on the set point"),
        Case(args=(0.003, 0.008, 0.02, 0.005), label="KL between set point and threshold"),
        Case(args=(0.003, 0.0002, 0.02, 0.005), label="KL far below the set point"),
        Case(args=(0.001, 0.03, 0.02, 0.01), label="another set point"),
        Case(args=(0.001, 0.0, 0.02, 0.005), label="the policy did not move (KL = 0)"),
    ]


register(Exercise(
    name="kl_lr_update",
    chapter=6,
    reference=_kl_lr_update,
    cases=_lr_cases,
    mistakes=[
        Mistake(_lr_linear_cut, "KL grows like the SQUARE of the learning rate, so the cut that lands on the set "
                                "point is sqrt(aim / kl), not aim / kl (yours over-corrects)"),
        Mistake(_lr_no_floor, "a single cut is capped at 10x (factor >= 0.1): one wild KL measurement must not "
                              "wipe out the learning rate"),
        Mistake(_lr_cut_only, "below the threshold the rule still tracks the set point, by "
                              "clip((aim / kl)^(1/4), 0.8, 1.25); without it the learning rate can only fall"),
        Mistake(_lr_cut_to_threshold, "a trigger cuts towards the set point aim (below the threshold, to leave "
                                      "room for noise), not to the threshold itself"),
    ],
    atol=1e-12,
    description="one step of a KL-triggered learning-rate controller",
))
