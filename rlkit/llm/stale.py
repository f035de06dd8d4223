r"""GRPO on stale samples for the tiny LLM: lagged samplers, three clipped objectives, U_k and S_k.

Chapter: 12_clipping_staleness (the LLM half of its experiment).

The chapter's trainer is :func:`rlkit.llm.train` with three parts::

    stale = StaleTrainingConfig(method="adaptive", lag=4)
    train(model, tok, task, cfg, sampler=Lagged(stale.lag), loss=StaleLoss(stale), hooks=[StaleControl(stale)])

* :class:`rlkit.llm.samplers.Lagged` samples each *group* (one prompt and its ``group_size``
  responses, the unit a sampler worker produces) with version :math:`k - \ell` of the model,
  :math:`\ell \sim` ``stale.lag``, at temperature 1, and scores every token under the current
  model (:math:`\log\pi_k`, the sampler's own numbers on fresh rows);
* :class:`StaleLoss` is the clipped objective of ``stale.method`` against those versions;
* :class:`StaleControl` drops what the version window and the staleness filter reject, sets the
  learning rate, measures :math:`\hat U_k` and :math:`\hat S_k` after every update, and alerts,
  rolls back or stops as ``stale``'s rules say (:class:`rlkit.staleness.TrainingGuard`).

The advantages are :func:`rlkit.llm.train`'s group-normalised ones (``cfg.algo`` ``"grpo"`` or
``"dr_grpo"``), computed over every sampled response, before the filter. :func:`train_stale_grpo`
is the same call under its rlkit 0.2 name, kept for one release.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn as nn

from .. import _validate as V
from ..estimators import effective_sample_size
from ..objectives import clipped_policy_loss
from ..staleness import StaleTrainingConfig, TrainingGuard, staleness, staleness_filter, update_shift
from .rl import RLConfig, check_train_args, refuse_unread
from .samplers import Lagged
from .sampling import token_logprobs
from .tasks import Problem, Task
from .tokenizer import CharTokenizer
from .trainer import HeldOut, Hook, RLResult, Step, train

__all__ = ["StaleLoss", "StaleControl", "StaleResult", "train_stale_grpo"]

_ALGOS = ("grpo", "dr_grpo")

StaleResult = RLResult   # TODO(0.4): the 0.2 name of train_stale_grpo's result; its extras: stale, alerts, rollbacks


def _stale_config(stale) -> StaleTrainingConfig:
    return StaleTrainingConfig() if stale is None else V.instance_of(stale, "stale", StaleTrainingConfig)


class StaleLoss:
    r"""The clipped policy loss of ``stale.method`` on lagged samples (:func:`rlkit.objectives.clipped_policy_loss`).

    With :math:`\mu` the version that sampled each token (``step.logp_behav``) and :math:`\pi_k`
    the policy at the start of the update (``step.logp_old``):

    * ``"standard"``: PPO-clip of :math:`\pi_\theta/\mu` to :math:`1\pm\epsilon`
      (:func:`rlkit.objectives.ppo_clip_loss`);
    * ``"adaptive"`` (method 1): the window :math:`[\rho_k-\epsilon, \rho_k+\epsilon]` around
      :math:`\rho_k = \pi_k/\mu` (:func:`rlkit.objectives.geppo_loss`);
    * ``"decoupled"`` (method 2): :math:`\pi_\theta/\pi_k` clipped to :math:`1\pm\epsilon`, times
      :math:`\rho_k` truncated at ``stale.behav_clip`` (:func:`rlkit.objectives.decoupled_ppo_loss`).

    The radius :math:`\epsilon` is ``stale.clip_radius()``: ``stale.clip_eps`` (``"constant"``),
    GePPO's radius for the lag distribution (``"geppo"``), or one per response,
    :math:`\epsilon/(1 + a)` for a response of age :math:`a` (``"age"``). The tokens are those of
    ``step.mask`` (after :class:`StaleControl`'s window and filter), aggregated as
    ``RLConfig.aggregation`` says. On fresh data (lag 0) the three objectives are the same loss.
    """

    def __init__(self, stale: StaleTrainingConfig | None = None):
        self.stale = _stale_config(stale)

    def setup(self, run) -> None:
        pass

    def __call__(self, run, step: Step, rows, logp):
        """``(loss, clip_fraction)`` on the minibatch ``rows``."""
        s = self.stale
        eps = s.clip_radius(step.age[rows]) if s.clip_schedule == "age" else s.clip_radius()
        loss, st = clipped_policy_loss(s.method, logp, step.logp_old[rows], step.logp_behav[rows], step.adv[rows],
                                       eps, behav_clip=s.behav_clip, mask=step.mask[rows],
                                       aggregation=run.cfg.aggregation)
        return loss, float(st["clip_fraction"])


def _mean(xs) -> float:
    return float(np.mean(xs)) if xs else math.nan


class StaleControl(Hook):
    r"""Staleness control on lagged samples: window, filter, learning rate, :math:`\hat U_k`, :math:`\hat S_k`, guard.

    With :math:`\rho_{k,bt} = \pi_k(y_{bt}\mid x_b, y_{b,<t}) / \mu_b(y_{bt}\mid x_b, y_{b,<t})`
    (``step.logp_old - step.logp_behav``; :math:`\mu_b` the version that sampled response
    :math:`b`), at every update :math:`k`:

    1. **Learning rate** (``on_step_start``): ``RLConfig.lr`` :math:`\times` the guard's
       ``lr_scale`` (halved by each rollback, ``stale.rollback_lr_factor``) :math:`\times`
       ``lr_schedule(k)`` if given.
    2. **Window and filter** (``on_advantages``, after the advantages, which are computed over every
       sampled response): ``stale.version_window`` :math:`W` drops the responses of age
       :math:`\ge W`; ``stale.eps_stale`` drops the tokens (``filter_level="token"``) or the whole
       responses (``"sequence"``) with :math:`|\rho_k - 1| > \epsilon_{stale}`
       (:func:`rlkit.staleness.staleness_filter`). They narrow ``step.mask``, the tokens the
       update trains on; ``drop_share`` is the share of tokens they removed.
    3. **Measure** (``on_update_end``, with :math:`\pi_{k+1}` the updated policy):
       :math:`\hat U_k` (``update_shift``, :func:`rlkit.staleness.update_shift`), the token mean of
       :math:`\tfrac12|\rho_{k+1} - \rho_k|` over the kept tokens; ``kl_update``, the k3 estimate
       of :math:`KL(\pi_k\|\pi_{k+1})` per kept token; ``ess``, the effective sample size of the
       :math:`\rho_k` weights of the kept tokens as a share of them.
    4. **Guard** (:class:`rlkit.staleness.TrainingGuard`): the measurements go through
       ``stale.thresholds`` (the guard's names: ``kl`` is ``kl_update`` here, ``return`` the mean
       reward); on an alert ``stale.on_alert`` logs it, stops training, or rolls the model and the
       optimiser back to the last good checkpoint (saved every ``stale.checkpoint_every`` healthy
       updates) and empties the sampler's archive of versions (``run.sampler.reset()``), so the
       undone versions sample nothing more.

    **Which quantity** ``staleness`` **estimates.** It is the token mean over the batch,

    .. math:: \hat S_k = \frac{\sum_{b,t} \tfrac12\,|\rho_{k,bt} - 1|}{\sum_b T_b},

    with :math:`\mu_b` sampling at temperature 1 without truncation, so that :math:`\mu_b` covers
    :math:`\pi_k`'s support. Given its prefix, each term has mean
    :math:`D_{TV}(\pi_k, \mu_b; (x_b, y_{b,<t}))`, the TV distance between the two *next-token*
    distributions (lemma lem-ch11-ratio), so :math:`\hat S_k` is a token-level staleness: that TV
    averaged over prefixes weighted by the undiscounted, length-weighted token occupancy of the batch's
    mixture of versions (prompts from the task's distribution, groups in the shares of their versions).
    As the batch grows it converges to :math:`\mathbb E[\sum_t D_{TV,t}]/\mathbb E[T]`. It is not the
    state-level :math:`S_k` of the bound (corollary cor-ch11-split): that one is an expectation under the
    *discounted* visitation :math:`d_\beta` (chapter 11 measures the gap); the finite-horizon bound over
    tokens (proposition prop-ch09-finite-horizon) sums the per-step TVs, and that sum (positions after
    the end token count 0) is :math:`\mathbb E[\sum_t D_{TV,t}] = \mathbb E[T]` times the limit of
    :math:`\hat S_k`; and with the whole response as one action (the prompt as the state) :math:`S_k` is
    the TV between *response* distributions, which is at most :math:`\mathbb E[T]` times the limit of
    :math:`\hat S_k` and is estimated by :math:`\tfrac12|\prod_t\rho_{k,t} - 1|` per response instead.
    Bias: the numerator is an unbiased estimate of the batch's total :math:`\sum_b\mathbb E[\sum_t
    D_{TV,t}]` (fresh rows contribute exactly 0); dividing by the random token count makes
    :math:`\hat S_k` a ratio estimator, consistent but biased by :math:`O(1/B)` when response lengths vary
    (unbiased when every response has the same length). ``staleness_kept`` is the same mean over the
    tokens that the window and the filter kept: a selection on :math:`\rho_k`, so it estimates no TV of
    the behaviour (chapter 12). ``update_shift`` is the token mean of
    :math:`\tfrac12|\rho_{k+1} - \rho_k|` over the kept tokens, with the same caveats.

    Logged per update (besides :func:`rlkit.llm.train`'s keys): ``lr``, ``staleness`` (whole
    batch), ``staleness_kept``, ``drop_share``, ``mean_age`` (of the responses, in versions),
    ``update_shift``, ``kl_update``, ``ess``, ``alerts`` (how many fired), ``rolled_back`` (1 or 0).
    ``result.alerts`` and ``result.rollbacks`` (``(update, restored_to)``) are the guard's, and
    ``result.stale`` is ``stale``.

    Args:
        stale: a :class:`rlkit.staleness.StaleTrainingConfig` (default: no window, no filter, no rules).
        lr_schedule: optional ``f(update) -> multiplier`` of the learning rate (a finite number ``>= 0``;
            anything else stops the run with an error naming ``lr_schedule``).
    """

    def __init__(self, stale: StaleTrainingConfig | None = None, lr_schedule: Callable[[int], float] | None = None):
        self.stale = _stale_config(stale)
        if lr_schedule is not None:
            V.is_callable(lr_schedule, "lr_schedule")
        self.lr_schedule = lr_schedule

    def setup(self, run) -> None:
        self.guard = TrainingGuard(self.stale, run.model, run.opt)   # saves the "last good" update 0
        self.k = 0

    def on_step_start(self, run, k: int) -> None:
        self.k = k
        mult = 1.0 if self.lr_schedule is None else \
            V.real_in(self.lr_schedule(k), f"the learning-rate multiplier lr_schedule returned for update {k}", 0.0)
        lr = run.cfg.lr * self.guard.lr_scale * mult
        run.opt.param_groups[0]["lr"] = lr
        run.log(lr=lr)

    @torch.no_grad()
    def on_advantages(self, run, step: Step) -> None:
        s, full = self.stale, step.rollout.mask
        lp_k, lb = step.logp_old, step.logp_behav
        keep = step.mask.clone()
        if s.version_window is not None:
            keep = keep * (step.age < s.version_window).to(keep.dtype)[:, None]
        if s.eps_stale is not None:
            keep = keep * staleness_filter(lp_k, lb, s.eps_stale, full, s.filter_level).to(keep.dtype)
        drop = 1.0 - float(keep.sum()) / max(float(step.mask.sum()), 1.0)
        step.mask = keep
        self._before = dict(staleness=float(staleness(lp_k, lb, full)), drop_share=drop)
        run.log(mean_age=float(step.age.float().mean()), **self._before)

    @torch.no_grad()
    def on_update_end(self, run, step: Step) -> bool:
        ro, lp_k, lb = step.rollout, step.logp_old, step.logp_behav
        tm = step.mask > 0
        kept = bool(tm.any())
        lp_new = token_logprobs(run.model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask)
        u_hat = float(update_shift(lp_new, lp_k, lb, tm)) if kept else math.nan
        d = torch.where(tm, lp_new - lp_k, torch.zeros_like(lp_new))
        kl = float((torch.expm1(d) - d).sum()) / max(1.0, float(tm.sum()))
        ess = float(effective_sample_size(lp_k - lb, mask=tm, dim=None, share=True)) if kept else math.nan
        st = run.minibatch_stats()
        measured = dict(update_shift=u_hat, staleness=self._before["staleness"],
                        clip_fraction=_mean(st["clip_fraction"]), kl=kl, entropy=_mean(st["entropy"]), ess=ess,
                        drop_share=self._before["drop_share"], grad_norm=_mean(st["grad_norm"]))
        if st["loss"]:                     # no minibatch trained: no loss to check
            measured["loss"] = _mean(st["loss"])
        measured["return"] = float(step.rewards.mean())
        decision = self.guard.update(self.k, **measured)
        if decision.rolled_back and hasattr(run.sampler, "reset"):
            run.sampler.reset()            # the undone versions' data must not be sampled
        run.log(update_shift=u_hat, kl_update=kl, ess=ess,
                staleness_kept=float(staleness(lp_k, lb, tm)) if kept else math.nan,
                alerts=len(decision.alerts), rolled_back=float(decision.rolled_back))
        return decision.stop

    def result(self, run) -> dict:
        return {"stale": self.stale, "alerts": list(self.guard.alerts), "rollbacks": self.guard.rollbacks}


# RLConfig fields train_stale_grpo does not read, and why (refused unless at their default, or "off")
_UNREAD = {
    "clip_eps": "the clip radius is StaleTrainingConfig.clip_eps (and its clip_schedule)",
    "clip_eps_high": "the clip radius is StaleTrainingConfig.clip_eps (symmetric)",
    "temperature": "the samplers draw at temperature 1 (the behaviour log-probs are the model's own)",
    "top_k": "the samplers draw from the full distribution (the behaviour log-probs are the model's own)",
    "top_p": "the samplers draw from the full distribution (the behaviour log-probs are the model's own)",
    "dynamic_sampling": ("groups are sampled once, by their versions", (None, False)),
    "max_sample_rounds": "groups are sampled once, by their versions (no dynamic sampling)",
}


def train_stale_grpo(model: nn.Module, tok: CharTokenizer, task: Task, cfg: RLConfig | None = None,
                     stale: StaleTrainingConfig | None = None, *, eval_problems: Sequence[Problem] | None = None,
                     eval_sampled: bool = False, lr_schedule: Callable[[int], float] | None = None,
                     callback: Callable | None = None, verbose: bool = False) -> RLResult:
    """GRPO on lagged samples: :func:`rlkit.llm.train` with ``Lagged``, :class:`StaleLoss` and :class:`StaleControl`.

    The rlkit 0.2 name of the chapter's call, kept for one release::

        train(model, tok, task, cfg, sampler=Lagged(stale.lag), loss=StaleLoss(stale),
              hooks=[StaleControl(stale, lr_schedule)], callback=callback,
              evaluation=HeldOut(eval_problems, sampled=eval_sampled, seed_offset=2, rewards=False))

    (a greedy held-out evaluation, and a sampled one if ``eval_sampled``, its generator seeded
    ``RLConfig.seed + 2``).
    ``cfg.algo`` must be ``"grpo"`` or ``"dr_grpo"``; every :class:`rlkit.llm.RLConfig` field it does
    not read (the clip radius, temperature and truncation, dynamic sampling) must keep its default
    (it has no KL term, no critic and no dense rewards). Returns an :class:`rlkit.llm.RLResult` whose extras
    are ``stale``, ``alerts`` and ``rollbacks`` (:class:`StaleControl`).

    Chapter: 12_clipping_staleness.
    """
    V.instance_of(model, "model", nn.Module)
    V.boolean(verbose, "verbose")
    V.boolean(eval_sampled, "eval_sampled")
    if eval_problems is not None:
        V.tuple_of(eval_problems, "eval_problems", Problem)
    if callback is not None:
        V.is_callable(callback, "callback")
    algo = check_train_args(tok, task, cfg).algo     # checks the types of tok, task and cfg
    stale = _stale_config(stale)
    if algo not in _ALGOS:
        raise ValueError(f"cfg.algo must be one of {_ALGOS} for the stale driver, got {algo!r}")
    refuse_unread(cfg, "train_stale_grpo", _UNREAD)   # cfg as given: which fields were set
    return train(model, tok, task, cfg, sampler=Lagged(stale.lag), loss=StaleLoss(stale),
                 hooks=[StaleControl(stale, lr_schedule)],
                 evaluation=HeldOut(eval_problems, sampled=eval_sampled, seed_offset=2, rewards=False),
                 callback=callback, verbose=verbose)
