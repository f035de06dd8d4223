r"""The settings of the Part I trainers, one frozen dataclass per trainer, checked when built.

A trainer call separates **data** from **run-time objects**::

    model, history = train_ppo("CartPole-v1", PPOConfig(total_steps=50_000, lr=1e-3, seed=1),
                               progress=False, callback=None, lr_controller=None, device=None)

* The config holds everything that decides *what* is computed: sizes, step sizes, coefficients,
  switches, the seed, the network width, the stopping rule (``target_return``). It is a frozen
  dataclass whose every field is checked on construction (type, range, finiteness; the error
  names the field, e.g. ``PPOConfig.grad_clip must be a finite number in (0.0, inf], got -1.0``),
  so that a bad value is refused before any environment is built and never silently replaced.
  ``history.config`` records it (``cfg.to_dict()`` plus ``env_id``). One field is changed with
  ``cfg.replace(lr=1e-3)`` (or ``dataclasses.replace``), which checks again.
* The keyword arguments hold the objects that are not data: the environment (an id or a
  constructor), a ``callback``, a learning-rate ``lr_controller`` (an object with state), the
  ``progress`` bar, the torch ``device`` and ``threads``. They change how a run is observed or
  where it runs, not which numbers it computes (the callback and controller excepted, which are
  code and would not fit in a record of the run).

The classes share their common fields by inheritance: :class:`TrainerConfig` (budget, envs,
discount, seed, network, stopping rule) is the base of :class:`ReinforceConfig`,
:class:`A2CConfig` and :class:`TRPOConfig`; :class:`PPOConfig` and :class:`StalePPOConfig` extend
A2C's fields with epochs and minibatches. Defaults are the book's tuned CartPole settings of each
trainer (see the trainers' docstrings); chapters that compare trainers spell every field out.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import _validate as V
from ..controllers import AdaptiveKLController

__all__ = ["TrainerConfig", "ReinforceConfig", "A2CConfig", "PPOConfig", "StalePPOConfig", "TRPOConfig"]

_POS = dict(lo=0.0, lo_open=True)           # a number > 0
_UNIT = dict(lo=0.0, hi=1.0)                # a number in [0, 1]
KL_RULES = AdaptiveKLController.RULES


def _fits_batch(cfg, field: str) -> None:
    """A count of minibatches must not exceed the rollout's ``num_envs * num_steps`` transitions."""
    n, batch = getattr(cfg, field), cfg.num_envs * cfg.num_steps
    if n > batch:
        raise ValueError(f"{type(cfg).__name__}.{field} = {n} exceeds the batch size num_envs * num_steps "
                         f"= {cfg.num_envs} * {cfg.num_steps} = {batch}")


@dataclass(frozen=True)
class TrainerConfig(V.ValidatedConfig):
    """Fields every Part I trainer has.

    Fields:

    * ``total_steps``: stop after this many env steps (``>= 1``).
    * ``num_envs``: vectorised environments (env ``i`` is seeded with ``seed + i``).
    * ``gamma``: discount, in ``[0, 1]``.
    * ``seed``: seeds torch, numpy, python and the environments (``>= 0``).
    * ``hidden``: width of the two hidden layers of the actor and of the critic.
    * ``target_return``, ``target_window``: stop early once the mean return of the last
      ``target_window`` completed episodes reaches ``target_return`` (``None``: never).
    """

    total_steps: int = V.int_field(100_000)
    num_envs: int = V.int_field(8)
    gamma: float = V.number_field(0.99, **_UNIT)
    seed: int = V.int_field(0, 0)
    hidden: int = V.int_field(64)
    target_return: float | None = V.number_field(None, optional=True)
    target_window: int = V.int_field(20)



@dataclass(frozen=True)
class ReinforceConfig(TrainerConfig):
    """:func:`rlkit.algos.train_reinforce`: one complete episode per env and update.

    * ``lr``: Adam learning rate of the policy (``> 0``).
    * ``baseline``: ``None``, ``"mean"`` or ``"value"`` (see :mod:`rlkit.algos.reinforce`).
    * ``value_lr``, ``value_epochs``: the value baseline's Adam learning rate and full-batch steps
      per update (used with ``baseline="value"`` only).
    * ``grad_clip``: clip the policy gradient's global norm to this (``> 0``; ``None``: no clip).
    """

    lr: float = V.number_field(1e-2, **_POS)
    baseline: str | None = V.choice_field(None, (None, "mean", "value"))
    value_lr: float = V.number_field(1e-2, **_POS)
    value_epochs: int = V.int_field(10)
    grad_clip: float | None = V.number_field(None, **_POS, optional=True)


@dataclass(frozen=True)
class A2CConfig(TrainerConfig):
    r""":func:`rlkit.algos.train_a2c`: rollouts of ``num_steps`` per env, GAE, one step per rollout.

    * ``num_steps``: rollout length T per env (batch = ``num_envs * num_steps``).
    * ``lr``: Adam learning rate (``> 0``); ``anneal_lr``: decay it linearly to 0 over ``total_steps``.
    * ``gae_lambda``: GAE :math:`\lambda`, in ``[0, 1]``.
    * ``ent_coef``, ``vf_coef``: entropy-bonus and value-loss weights (``>= 0``).
    * ``grad_clip``: global gradient-norm clip (``> 0``; ``None``: off).
    * ``normalize_advantages``: standardise the advantages (over the batch, or the minibatch).
    """

    num_steps: int = V.int_field(5)
    lr: float = V.number_field(1e-3, **_POS)
    anneal_lr: bool = V.bool_field(False)
    gae_lambda: float = V.number_field(0.95, **_UNIT)
    ent_coef: float = V.number_field(0.0, lo=0.0)
    vf_coef: float = V.number_field(0.5, lo=0.0)
    grad_clip: float | None = V.number_field(0.5, **_POS, optional=True)
    normalize_advantages: bool = V.bool_field(False)


@dataclass(frozen=True)
class _EpochConfig(A2CConfig):
    """A2C's fields with the PPO family's tuned rollout (8 x 32, gamma 0.98, GAE 0.8), plus
    ``epochs`` passes over each batch in ``num_minibatches`` minibatches."""

    num_steps: int = V.int_field(32)
    gamma: float = V.number_field(0.98, **_UNIT)
    gae_lambda: float = V.number_field(0.8, **_UNIT)
    normalize_advantages: bool = V.bool_field(True)
    epochs: int = V.int_field(10)
    num_minibatches: int = V.int_field(1)

    def __post_init__(self):
        super().__post_init__()
        _fits_batch(self, "num_minibatches")


@dataclass(frozen=True)
class PPOConfig(_EpochConfig):
    r""":func:`rlkit.algos.train_ppo` (PPO-clip or PPO-penalty); the fields of :class:`A2CConfig` and:

    * ``epochs``, ``num_minibatches``: passes over each batch (K) and minibatches per pass.
    * ``anneal_lr``: ``None`` (default) means True unless an ``lr_controller`` is given.
    * ``mode``: ``"clip"`` or ``"penalty"``.
    * ``clip_eps``: clip radius, in ``(0, 1)``; ``clip_eps_high``: the upper radius (``> 0``;
      ``None``: ``clip_eps``); ``dual_clip``: the dual-clip constant (``> 1``; ``None``: off).
      Clip mode only.
    * ``anneal_clip``: shrink the clip radii linearly to 0 like the learning rate (``None``: as
      the resolved ``anneal_lr``).
    * ``kl_coef`` (``>= 0``), ``kl_target`` (``> 0``), ``kl_rule`` (``"ppo"``, ``"article"``,
      ``"proportional"``): the initial :math:`\beta`, target and rule of the adaptive KL penalty
      (:class:`rlkit.controllers.AdaptiveKLController`; penalty mode).
    * ``clip_value``: clip V around the rollout values by this much (``> 0``; ``None``: off).
    * ``target_kl``: stop an iteration's epochs once the approximate KL exceeds it (``None``: off).
    """

    lr: float = V.number_field(2e-3, **_POS)
    anneal_lr: bool | None = V.bool_field(None, optional=True)
    epochs: int = V.int_field(20)
    mode: str = V.choice_field("clip", ("clip", "penalty"))
    clip_eps: float = V.number_field(0.2, 0.0, 1.0, lo_open=True, hi_open=True)
    clip_eps_high: float | None = V.number_field(None, **_POS, optional=True)
    dual_clip: float | None = V.number_field(None, lo=1.0, lo_open=True, optional=True)
    anneal_clip: bool | None = V.bool_field(None, optional=True)
    kl_coef: float = V.number_field(1.0, lo=0.0)
    kl_target: float = V.number_field(0.01, **_POS)
    kl_rule: str = V.choice_field("ppo", KL_RULES)
    clip_value: float | None = V.number_field(None, **_POS, optional=True)
    target_kl: float | None = V.number_field(None, **_POS, optional=True)

    def __post_init__(self):
        super().__post_init__()
        if self.mode == "penalty":
            for name in ("clip_eps_high", "dual_clip"):
                if getattr(self, name) is not None:
                    raise ValueError(f"PPOConfig.{name} shapes the clip of mode='clip'; with mode='penalty' "
                                     f"it would be ignored. Remove it or use mode='clip'")


@dataclass(frozen=True)
class StalePPOConfig(_EpochConfig):
    r""":func:`rlkit.algos.train_stale_ppo`: the fields of :class:`A2CConfig`, ``epochs`` and
    ``num_minibatches``, with its own defaults (a 25k-step budget, lr 2.5e-3 annealed, 10 epochs), and

    * ``advantages``: ``"gae"`` (GAE on the stale trajectory as observed, uncorrected) or
      ``"vtrace"`` (the current policy's advantage :math:`A^{\pi_k}` estimated off-policy by
      :func:`rlkit.algos.vtrace_advantages`, critic regressed on V-trace targets);
    * ``vtrace_clip``: V-trace's truncation :math:`\bar\rho = \bar c` (``> 0``; used by
      ``advantages="vtrace"`` only).

    The clipped objective and the staleness knobs are a :class:`rlkit.staleness.StaleTrainingConfig`,
    the trainer's second argument."""

    total_steps: int = V.int_field(25_000)
    lr: float = V.number_field(2.5e-3, **_POS)
    anneal_lr: bool = V.bool_field(True)
    advantages: str = V.choice_field("gae", ("gae", "vtrace"))
    vtrace_clip: float = V.number_field(1.0, **_POS)


@dataclass(frozen=True)
class TRPOConfig(TrainerConfig):
    r""":func:`rlkit.algos.train_trpo`.

    * ``num_steps``: rollout length per env (batch = ``num_envs * num_steps``).
    * ``max_kl``: the trust-region radius :math:`\delta` on the mean KL (``> 0``).
    * ``gae_lambda``: GAE :math:`\lambda` in ``[0, 1]``; ``normalize_advantages``: over the batch.
    * ``cg_iters`` (``>= 1``), ``cg_damping`` (``>= 0``): conjugate gradient and Fisher damping.
    * ``backtrack_ratio`` (in ``(0, 1)``), ``max_backtracks`` (``>= 1``), ``accept_ratio`` (in
      ``[0, 1]``): the line search (:func:`rlkit.trust_region.backtracking_line_search`).
    * ``value_lr``, ``value_epochs``, ``value_minibatches``: the critic's Adam regression per update.
    """

    num_steps: int = V.int_field(128)
    max_kl: float = V.number_field(0.01, **_POS)
    gae_lambda: float = V.number_field(0.95, **_UNIT)
    cg_iters: int = V.int_field(10)
    cg_damping: float = V.number_field(0.1, lo=0.0)
    backtrack_ratio: float = V.number_field(0.8, 0.0, 1.0, lo_open=True, hi_open=True)
    max_backtracks: int = V.int_field(10)
    accept_ratio: float = V.number_field(0.1, **_UNIT)
    normalize_advantages: bool = V.bool_field(True)
    value_lr: float = V.number_field(1e-3, **_POS)
    value_epochs: int = V.int_field(10)
    value_minibatches: int = V.int_field(4)

    def __post_init__(self):
        super().__post_init__()
        _fits_batch(self, "value_minibatches")
