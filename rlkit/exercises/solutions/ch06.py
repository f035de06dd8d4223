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

import torch

from rlkit import _validate as V
from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []
F64 = torch.float64


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


def _centred(x, p):
    r""":math:`x - \mathbb E_{a\sim p}[x_a]` over the last dimension."""
    return x - (p * x).sum(-1, keepdim=True)


# --------------------------------------------------------------------------- 1. entropy_change

@exercise(chapter=6, cases=_cases(601), atol=1e-5, description="first-order entropy change of a softmax policy")
def entropy_change(logits, dz):
    r""":math:`-\mathrm{Cov}_\pi(\log\pi, \delta z) = -\sum_a \pi_a(\log\pi_a - \bar\ell)(\delta z_a - \bar z)`."""
    V.matching_floats(logits=logits, dz=dz)
    logp = torch.log_softmax(logits, -1)
    p = logp.exp()
    return -(p * _centred(logp, p) * _centred(dz, p)).sum(-1)


@mistake(entropy_change, "you dropped the centring of dz: the probabilities move by "
         "pi_a (dz_a - E_pi[dz]), so the answer is a covariance, -Cov_pi(log pi, dz)")
def _ent_uncentred(logits, dz):
    logp = torch.log_softmax(logits, -1)
    return -(logp.exp() * logp * dz).sum(-1)


@mistake(entropy_change, "the covariance is under the policy (weights pi_a), not a plain mean over actions")
def _ent_uniform_weights(logits, dz):
    logp = torch.log_softmax(logits, -1)
    return -((logp - logp.mean(-1, keepdim=True)) * (dz - dz.mean(-1, keepdim=True))).mean(-1)


@mistake(entropy_change, "the covariance is between log pi_a and dz_a (dH = -sum (1 + log pi_a) "
         "d pi_a), not between pi_a and dz_a")
def _ent_probs_not_logs(logits, dz):
    p = torch.softmax(logits, -1)
    return -(p * _centred(p, p) * _centred(dz, p)).sum(-1)


# --------------------------------------------------------------------------- 2. kl_second_order

@exercise(chapter=6, cases=_cases(602), description="second-order KL between softmax(z) and softmax(z + dz)")
def kl_second_order(logits, dz):
    r""":math:`\tfrac12\mathrm{Var}_\pi(\delta z) = \tfrac12\sum_a\pi_a(\delta z_a - \bar z)^2`."""
    V.matching_floats(logits=logits, dz=dz)
    p = torch.softmax(logits, -1)
    zc = _centred(dz, p)
    return 0.5 * (p * zc * zc).sum(-1)


@mistake(kl_second_order, "adding the same constant to every logit does not change the policy, so the "
         "answer must not change either: centre dz at its mean under pi")
def _kl2_uncentred(logits, dz):
    return 0.5 * (torch.softmax(logits, -1) * dz * dz).sum(-1)


@mistake(kl_second_order, "the variance is under the policy (weights pi_a), not over actions with equal weights")
def _kl2_uniform(logits, dz):
    return 0.5 * dz.var(-1, unbiased=False)


@mistake(kl_second_order, "the second-order term of the KL is HALF the Fisher quadratic form: (1/2) Var_pi(dz)")
def _kl2_no_half(logits, dz):
    return 2.0 * kl_second_order(logits, dz)


# --------------------------------------------------------------------------- 3. kl_lr_update

def _lr_cases():
    return [
        Case(args=(0.01, 0.08, 0.02, 0.005), label="KL = 4 x threshold"),
        Case(args=(0.01, 5.0, 0.02, 0.005), label="KL far above threshold (the cut is capped at 10x)"),
        Case(args=(0.003, 0.005, 0.02, 0.005), label="KL on the set point"),
        Case(args=(0.003, 0.008, 0.02, 0.005), label="KL between set point and threshold"),
        Case(args=(0.003, 0.0002, 0.02, 0.005), label="KL far below the set point"),
        Case(args=(0.001, 0.03, 0.02, 0.01), label="another set point"),
        Case(args=(0.001, 0.0, 0.02, 0.005), label="the policy did not move (KL = 0)"),
        Case(args=(0.001, 0.03, 0.04, 0.01), label="threshold 0.04: KL 0.03 is under it (no cut, the set-point rule)"),
    ]


@exercise(chapter=6, cases=_lr_cases, atol=1e-12, description="one step of a KL-triggered learning-rate controller")
def kl_lr_update(lr, kl, threshold, aim):
    r"""Cut by :math:`\max(\sqrt{d^\star/d}, 1/10)` above the threshold; else
    :math:`\times\mathrm{clip}((d^\star/d)^{1/4}, 0.8, 1.25)`."""
    lr = V.real_in(lr, "lr", 0.0, lo_open=True)
    kl = V.real_in(kl, "kl", 0.0)
    threshold = V.real_in(threshold, "threshold", 0.0, lo_open=True)
    aim = V.real_in(aim, "aim (at most threshold)", 0.0, threshold, lo_open=True)
    if kl > threshold:
        return lr * max(math.sqrt(aim / kl), 0.1)
    if kl == 0:
        return lr * 1.25
    return lr * min(max((aim / kl) ** 0.25, 0.8), 1.25)


@mistake(kl_lr_update, "KL grows like the SQUARE of the learning rate, so the cut that lands on the set "
         "point is sqrt(aim / kl), not aim / kl (yours over-corrects)")
def _lr_linear_cut(lr, kl, threshold, aim):
    return lr * max(aim / kl, 0.1) if kl > threshold else kl_lr_update(lr, kl, threshold, aim)


@mistake(kl_lr_update, "a single cut is capped at 10x (factor >= 0.1): one wild KL measurement must not "
         "wipe out the learning rate")
def _lr_no_floor(lr, kl, threshold, aim):
    return lr * math.sqrt(aim / kl) if kl > threshold else kl_lr_update(lr, kl, threshold, aim)


@mistake(kl_lr_update, "below the threshold the rule still tracks the set point, by "
         "clip((aim / kl)^(1/4), 0.8, 1.25); without it the learning rate can only fall")
def _lr_cut_only(lr, kl, threshold, aim):
    return kl_lr_update(lr, kl, threshold, aim) if kl > threshold else float(lr)


@mistake(kl_lr_update, "a trigger cuts towards the set point aim (below the threshold, to leave "
         "room for noise), not to the threshold itself")
def _lr_cut_to_threshold(lr, kl, threshold, aim):
    return kl_lr_update(lr, kl, threshold, threshold) if kl > threshold else kl_lr_update(lr, kl, threshold, aim)
