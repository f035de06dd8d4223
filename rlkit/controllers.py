r"""Feedback controllers that set a training knob from the measured KL of each update (chapters 4, 6).

Every controller here has ONE interface, :class:`KLController`: after a policy update with measured
KL :math:`d`, ``new = controller(kl, value)`` returns the knob's next value

.. math:: v \leftarrow \mathrm{clip}\big(v\cdot f(d),\ v_{\min},\ v_{\max}\big),

a multiplicative factor :math:`f(d)` (``controller.factor(kl)``) and bounds that keep the knob
positive and finite; every call is recorded in ``controller.history``. The three rules:

* :class:`AdaptiveKLController` - the KL-penalty coefficient :math:`\beta` of PPO-penalty / RLHF
  (chapter 4); it also keeps its own :math:`\beta` (``ctl.update(kl)``).
* :class:`KLLearningRateController` - the learning rate, a fixed factor with a dead band
  (chapter 6's comparison).
* :class:`KLTriggeredLR` - the learning rate, a square-root cut above a threshold (chapter 6).

The learning-rate controllers plug into :func:`rlkit.algos.train_ppo` as ``lr_controller``; the
trainer calls ``lr = lr_controller(kl, lr)`` after each iteration (any callable of that form works).

:class:`KLTriggeredLR` closes the loop "learning rate -> size of the policy change -> learning
rate". Why a square root: for one small step :math:`\Delta\theta = \eta\,u` the KL is quadratic in
the step size, :math:`\mathrm{KL} \approx \tfrac12\eta^2\,u^\top F u` (chapter 4, the Fisher
matrix :math:`F`), and Adam's step is proportional to :math:`\eta` whatever the gradient's scale.
So if a learning rate :math:`\eta` produced a KL :math:`d`, the learning rate that would have
produced :math:`d^\star` is about :math:`\eta\sqrt{d^\star/d}`. A fixed decay factor ignores how
far over the threshold the update went; this rule uses it.

Compare :class:`KLLearningRateController` (a fixed factor and a dead band around the target): one
division by its factor per update needs many updates to undo a learning rate that is far too
high, and a dead band centred on the target lets every noisy spike above the band through. The
proportional cut and a set point well below the threshold address both.
"""
from __future__ import annotations

import math

from . import _validate as V

__all__ = ["KLController", "AdaptiveKLController", "KLLearningRateController", "KLTriggeredLR"]


class KLController:
    r"""The interface of every KL-driven controller: ``new = controller(kl, value)``.

    .. math:: v \leftarrow \mathrm{clip}\big(v\cdot f(d),\ v_{\min},\ v_{\max}\big)

    with :math:`d` the measured KL of the update just made, :math:`v` the knob's current value
    (a learning rate, a KL coefficient) and :math:`f` = :meth:`factor`, which a subclass defines.
    The bounds keep the knob in :math:`[v_{\min}, v_{\max}]`, ``0 < v_min <= v_max < inf``, so it is
    never 0, negative, infinite or NaN, whatever the sequence of KLs.

    Attributes:
        history: one dict per call: ``kl``, ``value_in``, ``value_out``.

    Chapters: 04_kl_trpo_ppo, 06_entropy_kl_lr.
    """

    knob = "value"          # what the value is, for error messages

    def __init__(self, value_min: float, value_max: float):
        self.value_min = V.real_in(value_min, f"{self.knob}_min", 0.0, lo_open=True)
        self.value_max = V.real_in(value_max, f"{self.knob}_max", self.value_min)
        self.history: list[dict] = []

    def factor(self, kl: float) -> float:
        r"""The multiplicative change :math:`f(d) \ge 0` of the knob for a measured ``kl``."""
        raise NotImplementedError

    def __call__(self, kl, value) -> float:
        """The knob's next value after an update with measured ``kl`` made at ``value``."""
        kl = V.real_in(kl, "kl")
        value = V.real_in(value, self.knob, 0.0, lo_open=True)
        return self._step(kl, value, self.factor(kl))

    def _step(self, kl: float, value: float, f: float) -> float:
        out = min(max(value * f, self.value_min), self.value_max)
        self.history.append(dict(kl=kl, value_in=value, value_out=out))
        return out


class AdaptiveKLController(KLController):
    r"""Adapts the KL-penalty coefficient :math:`\beta` of PPO-penalty / RLHF toward a KL target.

    Three named rules, so that the book can compare them:

    * ``"ppo"`` (Schulman et al. 2017, sec. 4): after each update with measured KL :math:`d`,
      :math:`\beta \leftarrow 2\beta` if :math:`d > 1.5\,d_{\text{targ}}`, and
      :math:`\beta \leftarrow \beta/2` if :math:`d < d_{\text{targ}}/1.5`. The dead band
      :math:`[d_{\text{targ}}/1.5,\ 1.5\,d_{\text{targ}}]` is symmetric in log scale
      (factor 1.5 each way), so beta does not drift when KL sits near the target.
    * ``"article"``: the same doubling, but halving only when :math:`d < 0.5\,d_{\text{targ}}`.
      The dead band :math:`[0.5, 1.5]\,d_{\text{targ}}` reaches further down (factor 2 below,
      1.5 above), so beta is relaxed later and the policy is held tighter on average.
    * ``"proportional"`` (Ziegler et al. 2019): a smooth proportional controller in log space,
      :math:`e = \mathrm{clip}(d/d_{\text{targ}} - 1, -0.2, 0.2)`,
      :math:`\beta \leftarrow \beta\,\exp(K_\beta\, e\, n_{\text{steps}}/H)`. Each update moves
      :math:`\log\beta` by at most :math:`0.2 K_\beta n/H`, with no dead band: it never jumps by
      2x, and it keeps nudging beta until KL sits on the target. For small steps
      :math:`e^{x} \approx 1 + x`, the paper's and TRL's linear form (``k_beta=1``,
      ``horizon=10000``, ``n_steps`` = samples per batch); unlike :math:`1 + x`, the exponential
      stays positive for any ``n_steps`` (the linear form reaches :math:`\beta = -1` at
      ``n_steps = 100`` with the defaults).

    Whatever the rule, beta stays in ``[beta_min, beta_max]`` (:class:`KLController`).

    Args:
        init_beta: initial coefficient in ``[beta_min, beta_max]``.
        target: KL target ``> 0``.
        rule: ``"ppo"``, ``"article"`` or ``"proportional"``.
        k_beta, horizon: the proportional rule's gain and horizon (``> 0``).
        beta_min, beta_max: bounds, ``0 < beta_min <= beta_max``.

    Use: ``beta = ctl.update(measured_kl, n_steps)`` after each policy update (``ctl.beta`` is
    the current value), or statelessly ``beta = ctl(measured_kl, beta)``.

    Chapter: 04_kl_trpo_ppo.
    """

    RULES = ("ppo", "article", "proportional")
    knob = "beta"

    def __init__(self, init_beta: float = 1.0, target: float = 0.01, rule: str = "ppo",
                 k_beta: float = 0.1, horizon: float = 1.0, beta_min: float = 1e-8, beta_max: float = 1e8):
        super().__init__(beta_min, beta_max)
        self.beta = V.real_in(init_beta, "init_beta", self.value_min, self.value_max)
        self.target = V.real_in(target, "target", 0.0, lo_open=True)
        self.rule = V.choice(rule, "rule", self.RULES)
        self.k_beta = V.real_in(k_beta, "k_beta", 0.0, lo_open=True)
        self.horizon = V.real_in(horizon, "horizon", 0.0, lo_open=True)

    def factor(self, kl: float, n_steps: int = 1) -> float:
        if self.rule == "proportional":
            err = min(max(kl / self.target - 1.0, -0.2), 0.2)
            return math.exp(min(self.k_beta * err * n_steps / self.horizon, 700.0))
        low = self.target / 1.5 if self.rule == "ppo" else 0.5 * self.target
        if kl > 1.5 * self.target:
            return 2.0
        if kl < low:
            return 0.5
        return 1.0

    def update(self, kl, n_steps: int = 1) -> float:
        """Update beta from the measured KL (a number or 0-dim tensor); returns the new beta."""
        kl = V.real_in(kl, "kl")
        n_steps = V.int_in(n_steps, "n_steps")
        self.beta = self._step(kl, self.beta, self.factor(kl, n_steps))
        return self.beta

    def __repr__(self) -> str:
        return (f"AdaptiveKLController(beta={self.beta:.4g}, target={self.target:.4g}, "
                f"rule={self.rule!r})")


class KLLearningRateController(KLController):
    r"""A fixed-factor learning-rate rule with a dead band: ``lr_new = controller(kl, lr)``.

    .. math::  f(d) = \begin{cases} 1/c & d > b\,\delta \\ c & d < \delta / b \\ 1 & \text{otherwise}
               \end{cases}

    with target :math:`\delta` = ``target_kl``, factor :math:`c` = ``factor`` and band :math:`b` =
    ``band``; the learning rate is then clipped to ``[lr_min, lr_max]`` (:class:`KLController`).
    It closes the loop of chapter 6: the step size is adjusted by the measured size of the policy
    change rather than by a fixed schedule.

    Args:
        target_kl: :math:`\delta > 0`. factor: :math:`c \ge 1`. band: :math:`b \ge 1`.
        lr_min, lr_max: bounds, ``0 < lr_min <= lr_max``.

    Chapter: 06_entropy_kl_lr.
    """

    knob = "lr"

    def __init__(self, target_kl: float = 0.01, factor: float = 1.5, band: float = 2.0,
                 lr_min: float = 1e-6, lr_max: float = 1e-1):
        super().__init__(lr_min, lr_max)
        self.target_kl = V.real_in(target_kl, "target_kl", 0.0, lo_open=True)
        self.step_factor = V.real_in(factor, "factor", 1.0)
        self.band = V.real_in(band, "band", 1.0)
        self.lr_min, self.lr_max = self.value_min, self.value_max

    def factor(self, kl: float) -> float:
        if kl > self.band * self.target_kl:
            return 1.0 / self.step_factor
        if kl < self.target_kl / self.band:
            return self.step_factor
        return 1.0


class KLTriggeredLR(KLController):
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
    PPO on CartPole has its 90th percentile about 3 to 5 times its median (chapter 6 measures it), so
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
        history: one dict per call, ``kl``, ``value_in``, ``value_out`` (:class:`KLController`).

    Use: ``train_ppo(..., lr=3e-2, lr_controller=KLTriggeredLR(threshold=0.02))``; the trainer
    calls it after each iteration with the exact KL and uses the returned learning rate next.

    Chapter: 06_entropy_kl_lr.
    """

    knob = "lr"

    def __init__(self, threshold: float = 0.02, aim: float | None = None, gain: float = 0.5,
                 max_step: float = 1.25, max_cut: float = 10.0, lr_min: float = 1e-6, lr_max: float = 1.0):
        super().__init__(lr_min, lr_max)
        self.lr_min, self.lr_max = self.value_min, self.value_max
        self.threshold = V.real_in(threshold, "threshold", 0.0, lo_open=True)
        self.aim = self.threshold / 4 if aim is None else V.real_in(aim, "aim", 0.0, self.threshold, lo_open=True)
        self.gain = V.real_in(gain, "gain", 0.0, 2.0)
        self.max_step = V.real_in(max_step, "max_step", 1.0)
        self.max_cut = V.real_in(max_cut, "max_cut", 1.0)

    def factor(self, kl: float) -> float:
        """The multiplicative change of the learning rate for a measured ``kl``."""
        kl = V.real_in(kl, "kl", 0.0)        # an exact KL, not a noisy estimate that can be < 0
        if kl > self.threshold:
            return max(math.sqrt(self.aim / kl), 1.0 / self.max_cut)
        if kl == 0.0:
            return self.max_step
        f = (self.aim / kl) ** (self.gain / 2)
        return min(max(f, 1.0 / self.max_step), self.max_step)

    @property
    def n_triggered(self) -> int:
        """How many updates exceeded the threshold so far."""
        return sum(h["kl"] > self.threshold for h in self.history)

    def fraction_within(self) -> float:
        """Fraction of the updates seen so far whose KL was ``<= threshold`` (NaN before any)."""
        if not self.history:
            return math.nan
        return 1.0 - self.n_triggered / len(self.history)

    def __repr__(self) -> str:
        return (f"KLTriggeredLR(threshold={self.threshold:g}, aim={self.aim:g}, gain={self.gain:g}, "
                f"max_step={self.max_step:g}, max_cut={self.max_cut:g}, updates={len(self.history)}, "
                f"triggered={self.n_triggered})")
