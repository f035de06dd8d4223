r"""Checkers for the exercises of chapter 6, ``lessons/06_entropy_kl_lr.ipynb``.

For a softmax policy :math:`\pi = \mathrm{softmax}(z)` whose logits move by a small :math:`\delta z`:

* ``entropy_change(logits, dz)``: the first-order change of the entropy,
  :math:`\delta H = -\mathrm{Cov}_{a\sim\pi}(\log\pi_a,\ \delta z_a)`.
* ``kl_second_order(logits, dz)``: the second-order KL,
  :math:`\mathrm{KL}(\pi\,\|\,\pi') \approx \tfrac12\mathrm{Var}_{a\sim\pi}(\delta z_a)`.
* ``kl_lr_trajectory(lr0, c, threshold, aim, steps, power, noise)``: the chapter's KL-triggered
  learning-rate rule (:class:`rlkit.controllers.KLTriggeredLR` with gain 1/2, steps of at most 1.25x, cuts
  of at most 10x) run in closed loop on the model KL :math:`c\,\eta^p e^{\xi}`, returning the learning
  rates and the KLs. (The chapter displays ``KLTriggeredLR.factor``, one step of the rule, which passed
  the old one-step exercise.)
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


# --------------------------------------------------------------------------- 3. kl_lr_trajectory

def _lr_step(lr, kl, threshold, aim, linear_cut=False, floor=0.1, track=True, cut_to=None):
    if kl > threshold:
        goal = aim if cut_to is None else cut_to
        f = goal / kl if linear_cut else math.sqrt(goal / kl)
        return lr * (max(f, floor) if floor else f)
    if not track:
        return lr
    if kl == 0:
        return lr * 1.25
    return lr * min(max((aim / kl) ** 0.25, 0.8), 1.25)


def _lr_loop(lr0, c, threshold, aim, steps, power, noise, late_kl=False, **rule):
    lrs, kls = [float(lr0)], []
    for k in range(steps):
        kl = c * lrs[-1] ** power * (math.exp(float(noise[k])) if noise is not None else 1.0)
        new = _lr_step(lrs[-1], kl, threshold, aim, **rule)
        if late_kl:     # the KL recorded is the one the NEW learning rate would produce
            kl = c * new ** power * (math.exp(float(noise[k])) if noise is not None else 1.0)
        kls.append(kl)
        lrs.append(new)
    return torch.tensor(lrs, dtype=F64), torch.tensor(kls, dtype=F64)


def _lr_cases():
    g = torch.Generator().manual_seed(606)
    noise = 0.5 * torch.randn(20, generator=g, dtype=F64)
    return [
        Case(args=(0.2, 40.0, 0.02, 0.005, 8),
             label="KL = 40 lr^2 from lr = 0.2: KL 1.6, a cut capped at 10x, then tracking"),
        Case(args=(0.05, 40.0, 0.02, 0.005, 4),
             label="KL 0.1 = 5 x threshold: one square-root cut lands on the set point 0.005"),
        Case(args=(0.1, 0.5, 0.02, 0.005, 10), kwargs={"power": 1.0},
             label="KL = 0.5 lr (power 1): the square-root cut falls short of the set point"),
        Case(args=(0.2, 40.0, 0.02, 0.005, 20), kwargs={"noise": noise},
             label="KL = 40 lr^2 e^(0.5 xi), 20 updates with the given noise"),
        Case(args=(1e-4, 40.0, 0.02, 0.005, 12), label="a learning rate far too small: steps of 1.25x"),
        Case(args=(0.03, 40.0, 0.04, 0.01, 6), kwargs={"power": 1.5},
             label="threshold 0.04, set point 0.01, power 1.5: after the cut KL 0.021 is under this threshold"),
        Case(args=(0.2, 40.0, 0.02, 0.005, 0), label="no update: ([lr0], [])"),
    ]


@exercise(chapter=6, cases=_lr_cases, atol=0.0, rtol=1e-10,
          description="the KL-triggered learning-rate rule in closed loop on a model of the KL")
def kl_lr_trajectory(lr0, c, threshold, aim, steps, power=2.0, noise=None):
    r"""``(lrs, kls)``: :math:`\eta_0..\eta_{\text{steps}}` and the KLs :math:`d_k = c\,\eta_k^p e^{\xi_k}` they
    produced (float64), with :math:`\eta_{k+1}` from :math:`d_k` by the chapter's rule: above the threshold
    :math:`\times\max(\sqrt{d^\star/d}, 1/10)`, else :math:`\times\mathrm{clip}((d^\star/d)^{1/4}, 0.8, 1.25)`."""
    lr0 = V.real_in(lr0, "lr0", 0.0, lo_open=True)
    c = V.real_in(c, "c (the KL at lr = 1)", 0.0, lo_open=True)
    threshold = V.real_in(threshold, "threshold", 0.0, lo_open=True)
    aim = V.real_in(aim, "aim (at most threshold)", 0.0, threshold, lo_open=True)
    steps = V.int_in(steps, "steps", 0)
    power = V.real_in(power, "power", 0.0, lo_open=True)
    if noise is not None:
        noise = torch.as_tensor(noise, dtype=F64).reshape(-1)
        if noise.numel() < steps:
            raise ValueError(f"noise: expected at least steps = {steps} values, got {noise.numel()}")
    return _lr_loop(lr0, c, threshold, aim, steps, power, noise)


@mistake(kl_lr_trajectory, "KL grows like the SQUARE of the learning rate, so the cut that lands on the set "
         "point is sqrt(aim / kl), not aim / kl (yours over-corrects)")
def _lr_linear_cut(lr0, c, threshold, aim, steps, power=2.0, noise=None):
    return _lr_loop(lr0, c, threshold, aim, steps, power, noise, linear_cut=True)


@mistake(kl_lr_trajectory, "a single cut is capped at 10x (factor >= 0.1): one wild KL measurement must not "
         "wipe out the learning rate")
def _lr_no_floor(lr0, c, threshold, aim, steps, power=2.0, noise=None):
    return _lr_loop(lr0, c, threshold, aim, steps, power, noise, floor=None)


@mistake(kl_lr_trajectory, "below the threshold the rule still tracks the set point, by "
         "clip((aim / kl)^(1/4), 0.8, 1.25); without it the learning rate can only fall")
def _lr_cut_only(lr0, c, threshold, aim, steps, power=2.0, noise=None):
    return _lr_loop(lr0, c, threshold, aim, steps, power, noise, track=False)


@mistake(kl_lr_trajectory, "a trigger cuts towards the set point aim (below the threshold, to leave "
         "room for noise), not to the threshold itself")
def _lr_cut_to_threshold(lr0, c, threshold, aim, steps, power=2.0, noise=None):
    return _lr_loop(lr0, c, threshold, aim, steps, power, noise, cut_to=threshold)


@mistake(kl_lr_trajectory, "your model's KL ignores the power: the KL is c lr^power (power 2 by default), not c lr")
def _lr_power_one(lr0, c, threshold, aim, steps, power=2.0, noise=None):
    return _lr_loop(lr0, c, threshold, aim, steps, 1.0, noise)


@mistake(kl_lr_trajectory, "the noise is ignored: the measured KL of update k is c lr_k^power e^(noise[k])")
def _lr_no_noise(lr0, c, threshold, aim, steps, power=2.0, noise=None):
    return _lr_loop(lr0, c, threshold, aim, steps, power, None)


@mistake(kl_lr_trajectory, "kls[k] must be the KL that lrs[k] produced (the one the rule reads), not the KL "
         "of the learning rate it chose")
def _lr_late_kl(lr0, c, threshold, aim, steps, power=2.0, noise=None):
    return _lr_loop(lr0, c, threshold, aim, steps, power, noise, late_kl=True)
