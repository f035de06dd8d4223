r"""Feedback controllers that adjust a training knob from a measured quantity (chapter 6).

:class:`KLTriggeredLR` closes the loop "learning rate -> size of the policy change -> learning
rate": after every policy update it reads the measured :math:`\mathrm{KL}(\pi_{old}\,\|\,\pi_{new})`
and sets the learning rate of the next update.  It plugs into
:func:`rlkit.algos.train_ppo` as ``lr_controller=KLTriggeredLR(...)`` (any callable
``f(kl, lr) -> lr`` works there).

Why a square root.  For one small step :math:`\Delta\theta = \eta\,u` the KL is quadratic in the
step size, :math:`\mathrm{KL} \approx \tfrac12\eta^2\,u^\top F u` (chapter 4, the Fisher matrix
:math:`F`), and Adam's step is proportional to :math:`\eta` whatever the gradient's scale.  So if a
learning rate :math:`\eta` produced a KL :math:`d`, the learning rate that would have produced
:math:`d^\star` is about :math:`\eta\sqrt{d^\star/d}`.  A fixed decay factor ignores how far over the
threshold the update went; this rule uses it.

Compare :class:`rlkit.algos.ppo.KLLearningRateController` (a fixed factor and a dead band around the
target): one division by its factor per update needs many updates to undo a learning rate that is
far too high, and a dead band centred on the target lets every noisy spike above the band through.
The proportional cut and a set point well below the threshold address both.
"""
from __future__ import annotations

import math
import numbers

import torch

__all__ = ["KLTriggeredLR"]


def _number(x, name: str) -> float:
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise TypeError(f"{name} must be a number, got a tensor of shape {tuple(x.shape)}")
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x}")
    return x


class KLTriggeredLR:
    r"""A KL-triggered learning-rate controller: ``new_lr = controller(kl, lr)``.

    With the measured KL :math:`d` of the update just made (exact mean
    :math:`\mathrm{KL}(\pi_{old}\,\|\,\pi_{new})` over the batch), the learning rate :math:`\eta`
    it was made with, the threshold :math:`d_{\max}` and the set point
    :math:`d^\star \le d_{\max}`:

    .. math::

        \eta \leftarrow
        \begin{cases}
          \eta\cdot\max\!\big(\sqrt{d^\star/d},\ 1/c_{\max}\big) & d > d_{\max}
            \quad\text{(triggered: cut to where } d \propto \eta^2 \text{ says } d^\star \text{ lies)}\\[2pt]
          \eta\cdot\mathrm{clip}\!\big((d^\star/d)^{g/2},\ 1/s_{\max},\ s_{\max}\big) & d \le d_{\max}
            \quad\text{(between triggers: track } d^\star \text{ gently)}
        \end{cases}

    then :math:`\eta \leftarrow \mathrm{clip}(\eta, \eta_{\min}, \eta_{\max})`.  ``gain`` :math:`g = 1`
    would jump straight to the set point's learning rate (noisy, since :math:`d` is noisy);
    :math:`g = 0.5` moves half-way in log space; :math:`g = 0` holds the learning rate until the next
    trigger.  A KL of 0 (the policy did not move) counts as far below the set point.

    The set point defaults to :math:`d_{\max}/4`: at a fixed learning rate the per-update KL of
    PPO on CartPole has its 90th percentile about 3-4 times its median (chapter 6 measures it), so
    a median held at a quarter of the threshold leaves room for the spikes no controller can
    foresee.

    Args:
        threshold: :math:`d_{\max} > 0`, the KL that triggers a cut.
        aim: :math:`d^\star \in (0, d_{\max}]`, default ``threshold / 4``.
        gain: :math:`g \in [0, 2]`, the tracking gain below the threshold.
        max_step: :math:`s_{\max} \ge 1`, the largest factor of one tracking step (up or down).
        max_cut: :math:`c_{\max} \ge 1`, the largest factor one trigger may divide by.
        lr_min, lr_max: bounds, ``0 < lr_min <= lr_max``.

    Attributes:
        history: one dict per call, ``kl``, ``lr_in``, ``lr_out``, ``triggered``.

    Use: ``train_ppo(..., lr=3e-2, lr_controller=KLTriggeredLR(threshold=0.02))``; the trainer
    calls it after each iteration with the exact KL and uses the returned learning rate next.

    Chapter: 06_entropy_kl_lr.
    """

    def __init__(self, threshold: float = 0.02, aim: float | None = None, gain: float = 0.5,
                 max_step: float = 1.25, max_cut: float = 10.0, lr_min: float = 1e-6, lr_max: float = 1.0):
        self.threshold = _number(threshold, "threshold")
        if self.threshold <= 0:
            raise ValueError(f"threshold must be > 0, got {self.threshold}")
        self.aim = self.threshold / 4 if aim is None else _number(aim, "aim")
        if not 0 < self.aim <= self.threshold:
            raise ValueError(f"aim must lie in (0, threshold={self.threshold}], got {self.aim}")
        self.gain = _number(gain, "gain")
        if not 0 <= self.gain <= 2:
            raise ValueError(f"gain must lie in [0, 2], got {self.gain}")
        self.max_step = _number(max_step, "max_step")
        if self.max_step < 1:
            raise ValueError(f"max_step must be >= 1, got {self.max_step}")
        self.max_cut = _number(max_cut, "max_cut")
        if self.max_cut < 1:
            raise ValueError(f"max_cut must be >= 1, got {self.max_cut}")
        self.lr_min = _number(lr_min, "lr_min")
        self.lr_max = _number(lr_max, "lr_max")
        if not 0 < self.lr_min <= self.lr_max:
            raise ValueError(f"need 0 < lr_min <= lr_max, got lr_min={self.lr_min}, lr_max={self.lr_max}")
        self.history: list[dict] = []

    def factor(self, kl: float) -> tuple[float, bool]:
        """The multiplicative change for a measured ``kl`` (before the lr bounds) and whether it
        was a trigger."""
        kl = _number(kl, "kl")
        if kl < 0:
            raise ValueError(f"kl must be >= 0 (an exact KL, not a noisy estimate), got {kl}")
        if kl > self.threshold:
            return max(math.sqrt(self.aim / kl), 1.0 / self.max_cut), True
        if kl == 0.0:
            return self.max_step, False
        f = (self.aim / kl) ** (self.gain / 2)
        return min(max(f, 1.0 / self.max_step), self.max_step), False

    def __call__(self, kl, lr) -> float:
        lr_in = _number(lr, "lr")
        if lr_in <= 0:
            raise ValueError(f"lr must be > 0, got {lr_in}")
        f, triggered = self.factor(kl)
        lr_out = min(max(lr_in * f, self.lr_min), self.lr_max)
        self.history.append(dict(kl=float(kl), lr_in=lr_in, lr_out=lr_out, triggered=triggered))
        return lr_out

    @property
    def n_triggered(self) -> int:
        """How many updates exceeded the threshold so far."""
        return sum(h["triggered"] for h in self.history)

    def fraction_within(self) -> float:
        """Fraction of the updates seen so far whose KL was ``<= threshold`` (NaN before any)."""
        if not self.history:
            return math.nan
        return 1.0 - self.n_triggered / len(self.history)

    def __repr__(self) -> str:
        return (f"KLTriggeredLR(threshold={self.threshold:g}, aim={self.aim:g}, gain={self.gain:g}, "
                f"max_step={self.max_step:g}, max_cut={self.max_cut:g}, updates={len(self.history)}, "
                f"triggered={self.n_triggered})")
