"""Readable policy-gradient trainers for gymnasium vector environments (Part I chapters).

Every trainer is one loop you can read top to bottom (in the spirit of CleanRL): collect a rollout,
compute returns/advantages with :mod:`rlkit.returns`, form the loss with :mod:`rlkit.objectives`,
take optimiser steps, record stats.  All share one calling convention::

    model, history = train_xxx(env="CartPole-v1", cfg=XxxConfig(total_steps=..., lr=..., seed=0),
                               callback=None, progress=True, device=None, threads=1)

* ``env``: a gymnasium id (Box observations, Discrete actions) or a zero-argument constructor.
  Vector envs are built with ``AutoresetMode.SAME_STEP`` (see :mod:`rlkit.rollout` for why).
* ``cfg``: the run's settings, a frozen dataclass checked field by field when it is built
  (:mod:`rlkit.algos.configs`: :class:`ReinforceConfig`, :class:`A2CConfig`, :class:`PPOConfig`,
  :class:`TRPOConfig`, :class:`StalePPOConfig`); ``None`` means the trainer's defaults, and
  ``cfg.replace(lr=1e-3)`` is a checked copy with one field changed.  The keyword arguments are the
  run-time objects that are not data (a callback, a learning-rate controller, the progress bar,
  the device and thread count).
* ``model``: an :class:`rlkit.nets.ActorCritic` (``model.actor`` the policy, ``model.critic`` V).
* ``history``: a :class:`History` - per update ``steps``, ``wall_time`` and ``stats`` (``loss``,
  ``entropy``, ``kl``, ``grad_norm``, ``lr`` and, where meaningful, ``clip_frac``, ``value_loss``,
  ``kl_coef``, ``step_kl`` ...; ``history["kl"]``), per completed episode ``episode_steps``,
  ``episode_returns``, ``episode_lengths``; ``history.rolling_return(20)``,
  ``history.steps_to(475)``, ``history.to_dict()``; ``history.config`` is ``cfg.to_dict()`` plus
  ``env_id``.
* ``cfg.target_return``/``cfg.target_window`` stop early once the mean of the last ``target_window``
  episode returns reaches the target; ``callback(history) -> bool`` may stop it too.
* Training runs in one torch thread by default (``threads=1``), on ``device`` (CPU by default).

Trainers:

* :func:`train_reinforce` (chapter 1-2): Monte Carlo policy gradient, ``baseline=None|"mean"|"value"``.
* :func:`train_a2c` (chapter 2): synchronous advantage actor-critic with GAE.
* :func:`train_ppo` (chapters 4-6): PPO-clip or PPO-penalty (adaptive KL), ``epochs``,
  learning-rate annealing, a KL-triggered learning-rate controller hook.
* :func:`train_trpo` (chapter 4): natural gradient by conjugate gradient + backtracking line
  search that enforces the KL bound; each accepted step's KL is in ``history["step_kl"]``.
* :func:`train_stale_ppo` (chapters 12-13, :mod:`rlkit.algos.stale_ppo`): PPO on data from lagged
  policy versions, with a :class:`rlkit.staleness.StaleTrainingConfig` as second config.

The update phases are also public, for experiments on a FIXED batch: :func:`ppo_update` (K epochs
of PPO minibatch steps), :func:`reuse_one_batch` (chapter 5: the drift of K full-batch PPO-clip
steps on one batch, measured after every epoch) and :func:`trpo_step` (one trust-region step).
:class:`rlkit.controllers.KLLearningRateController` is the KL-triggered learning-rate rule for
``train_ppo``.

Quick start (chapter 1)::

    from rlkit.algos import ReinforceConfig, train_reinforce
    model, hist = train_reinforce("CartPole-v1", ReinforceConfig(total_steps=50_000, baseline="value"))
    steps, mean20 = hist.rolling_return(20)      # plot mean20 against steps

PPO that reaches a 20-episode mean return of 475 on CartPole-v1 in ~25k steps (seconds on a CPU)::

    model, hist = train_ppo("CartPole-v1", PPOConfig(total_steps=100_000, target_return=475, seed=0))
    hist.steps_to(475), hist["kl"], hist["clip_frac"]
"""
from __future__ import annotations

from .configs import A2CConfig, PPOConfig, ReinforceConfig, StalePPOConfig, TrainerConfig, TRPOConfig
from .history import History

__all__ = ["History", "TrainerConfig", "ReinforceConfig", "A2CConfig", "PPOConfig", "TRPOConfig", "StalePPOConfig",
           "train_reinforce", "train_a2c", "train_ppo", "train_trpo", "train_stale_ppo", "ppo_update",
           "reuse_one_batch", "trpo_step", "vtrace_advantages"]

_LAZY = {"train_reinforce": ".reinforce", "train_a2c": ".a2c", "train_ppo": ".ppo", "train_trpo": ".trpo",
         "train_stale_ppo": ".stale_ppo", "vtrace_advantages": ".stale_ppo", "ppo_update": ".ppo",
         "reuse_one_batch": ".ppo", "trpo_step": ".trpo"}


def __getattr__(name):  # lazy, so that importing one trainer does not import the others
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():  # list the lazy names too (autodoc and tab completion enumerate a module with dir())
    return sorted(set(globals()) | set(__all__))
