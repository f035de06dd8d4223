r"""PPO on stale data: a simulated asynchronous sampler, three clipped objectives, monitors, rollback.

Chapters 12 (clipping under staleness) and 13 (the engineering checklist).

Real LLM pipelines sample with version :math:`k - \ell` of the policy while the learner is at
version :math:`k`. This trainer reproduces that on a gymnasium task without threads: it keeps the
last few published versions of the actor in a :class:`rlkit.staleness.PolicyArchive` and, at
update :math:`k`, lets each environment row act with version :math:`k - \ell`, :math:`\ell` drawn
from ``stale.lag`` (one lag per env row, so a batch can mix versions). Since the environment
does not change with time, generating the data now with an old version is the same as having
generated it :math:`\ell` updates ago and queued it.

One update :math:`k` (read top to bottom in :func:`rlkit.algos.train_stale_ppo`):

1. **Sample.** Draw a lag per env row, act with the archived versions
   (:meth:`rlkit.rollout.RolloutCollector.collect`); every sample keeps its version and its
   behaviour log-prob :math:`\log\mu(a\mid s)` (:class:`rlkit.staleness.VersionedBuffer`).
2. **Advantages.** With ``cfg.advantages="gae"`` (default): GAE with the learner's current critic
   (:func:`rlkit.returns.gae`) on the behaviour trajectory as observed: every later action was
   the old version's, and nothing corrects for it. With ``cfg.advantages="vtrace"``:
   :func:`rlkit.algos.vtrace_advantages`, the advantage of the *current* policy :math:`\pi_k` estimated
   off-policy from the stale trajectory with truncated importance weights
   :math:`\min(\bar c, \pi_k/\mu)` on the later actions, and V-trace targets for the critic
   (:func:`rlkit.offpolicy.vtrace`, target :math:`\pi_k`, behaviour the version that sampled).
3. **Staleness control.** :math:`\log\pi_k(a\mid s)` of every sample; :math:`\hat S_k` on the
   whole batch; the version window (:func:`rlkit.staleness.version_window`) and the staleness
   filter (:func:`rlkit.staleness.staleness_filter`) choose the samples to learn from.
4. **Update.** ``epochs`` x ``num_minibatches`` Adam steps on ``stale.method``'s loss
   (``"standard"``: :func:`rlkit.objectives.ppo_clip_loss` of :math:`\pi_\theta/\mu`;
   ``"adaptive"``: :func:`rlkit.objectives.geppo_loss`; ``"decoupled"``:
   :func:`rlkit.objectives.decoupled_ppo_loss`) plus the value loss, with the clip radius of
   ``stale.clip_schedule``.
5. **Measure.** :math:`\hat U_k` (:func:`rlkit.staleness.update_shift`) and, because the policy
   is a small categorical network, the *exact* per-state TV distances
   :math:`\overline{D_{TV}(\pi_{k+1},\pi_k;s)}` and :math:`\overline{D_{TV}(\pi_k,\mu;s)}` over the
   batch's states, which the ratio estimates must agree with (lemma lem-ch11-ratio). The
   :class:`rlkit.staleness.Monitor` checks ``stale.thresholds``; on an alert the trainer
   logs, stops, or rolls back to the last good checkpoint (and multiplies the learning rate
   by ``stale.rollback_lr_factor``).
6. **Publish.** The new weights become version :math:`k+1` in the archive.

With a lag of 0 the three objectives are the same function of the same numbers (the proximal
log-probs of fresh samples ARE the behaviour log-probs), so the three runs are identical.

Per-update stats in the returned :class:`rlkit.algos.History`: ``update_shift`` (:math:`\hat U_k`),
``update_shift_tv`` (exact mean TV), ``staleness`` (:math:`\hat S_k`, whole batch),
``staleness_tv`` (exact), ``staleness_kept`` (after filter/window), ``drop_share``, ``ess``,
``clip_fraction``, ``kl`` (exact KL(pi_k || pi_{k+1})), ``entropy``, ``mean_age``, ``lr``,
``rho_adv_corr`` (the correlation of :math:`\rho_k - 1` with the advantage over the sampled batch:
positive when the learner has already raised the probability of the actions the stale batch
calls good),
``grad_norm``, ``loss``, ``value_loss``, ``rolled_back`` (1 at an update that was undone),
``alerts`` (number fired). ``history.alerts`` lists the :class:`rlkit.staleness.Alert` s and
``history.rollbacks`` the ``(update, restored_to)`` pairs.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from .. import _validate as V
from ..divergences import entropy_categorical, kl_categorical, tv_categorical
from ..estimators import effective_sample_size
from ..objectives import clipped_policy_loss
from ..offpolicy import vtrace
from ..returns import from_gymnasium, gae
from ..staleness import (
    LagDistribution,
    PolicyArchive,
    StaleTrainingConfig,
    TrainingGuard,
    VersionedBuffer,
    staleness,
    staleness_filter,
    update_shift,
    version_window,
)
from ._common import Run, config_of, setup
from .configs import StalePPOConfig
from .ppo import ppo_epochs

__all__ = ["train_stale_ppo", "vtrace_advantages"]


def vtrace_advantages(log_rhos: torch.Tensor, rewards: torch.Tensor, values: torch.Tensor,
                      next_values: torch.Tensor, discounts: torch.Tensor, lam: float | torch.Tensor,
                      clip: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Off-policy GAE with V-trace: advantages of the target policy from a behaviour trajectory.

    With :math:`\rho_t = \pi(a_t|s_t)/\mu(a_t|s_t)` (``log_rhos`` its log), :math:`\bar\rho_t =
    \min(\bar\rho, \rho_t)`, :math:`c_t = \lambda_t\min(\bar c, \rho_t)` (here
    :math:`\bar\rho = \bar c =` ``clip``), :math:`\delta_t = r_t + \gamma_t V(s_{t+1}) - V(s_t)`
    and the V-trace targets :math:`v_t` of :func:`rlkit.offpolicy.vtrace`,

    .. math::  \hat A_t = \delta_t + \gamma_t\lambda_t\,\big(v_{t+1} - V(s_{t+1})\big)
               = \delta_t + \sum_{j\ge 1}\Big(\prod_{i=0}^{j-1}\gamma_{t+i}\Big)\lambda_t
               \Big(\prod_{i=1}^{j-1} c_{t+i}\Big)\bar\rho_{t+j}\,\delta_{t+j},

    with :math:`v_T - V(s_T) = 0` at the end of the segment. It is an estimate of
    :math:`Q^{\tilde\pi}(s_t, a_t) - V(s_t)` for the action actually taken, where :math:`\tilde\pi
    \propto \min(\bar\rho\,\mu, \pi)` is V-trace's target (:math:`\tilde\pi = \pi` when no ratio
    exceeds the clip; a larger ``clip`` moves it towards :math:`\pi` at the price of variance,
    Espeholt et al., 2018). The action :math:`a_t` itself carries no weight, because the clipped
    objective's own ratio :math:`\pi_\theta/\mu` reweights it; the later actions are corrected by
    the truncated ratios. (IMPALA's policy-gradient advantage, the second output of
    :func:`rlkit.offpolicy.vtrace`, is instead :math:`\bar\rho_t(r_t + \gamma_t v_{t+1} - V(s_t))`,
    weighted for a loss without a ratio.)

    On-policy (``log_rhos`` all 0) with ``clip >= 1`` this is GAE (:func:`rlkit.returns.gae`,
    same ``lam``) and :math:`v_t` the lambda-return, up to rounding.

    Args:
        log_rhos: ``[..., T]`` :math:`\log\pi - \log\mu` of the taken actions (no gradient used).
        rewards, values, next_values, discounts: ``[..., T]`` as in :func:`rlkit.returns.gae`.
        lam: float or ``[..., T]`` tensor in ``[0, 1]``; zeros cut the trace (truncations, see
            :func:`rlkit.returns.from_gymnasium`).
        clip: :math:`\bar\rho = \bar c > 0`, finite.

    Returns:
        ``(advantages, value_targets)``, both ``[..., T]``, without gradient; ``value_targets`` are
        the V-trace targets :math:`v_t` (the critic's regression targets for :math:`V^{\pi}`).

    Chapter: 12_clipping_staleness (method 1 with corrected advantages).
    """
    clip = V.real_in(clip, "clip", 0.0, lo_open=True)
    vs, _ = vtrace(log_rhos, rewards, values, next_values, discounts, clip_rho=clip, clip_c=clip, lam=lam)
    with torch.no_grad():
        lam_t = lam if isinstance(lam, torch.Tensor) else torch.full_like(rewards, float(lam))
        correction = torch.zeros_like(values)                         # v_{t+1} - V(s_{t+1}); 0 at t = T-1
        correction[..., :-1] = (vs - values)[..., 1:]
        td = rewards + discounts * next_values - values
        adv = td + discounts * lam_t * correction
    return adv.detach(), vs.detach()


def _tempered(policy: torch.nn.Module, temperature: float):
    """``act`` of a sampler that draws from ``softmax(logits / temperature)`` and reports that
    distribution's log-probabilities (a sampler that does not match the learner when ``temperature != 1``)."""
    if temperature == 1.0:
        return policy.act

    def act(obs):
        logp_all = torch.log_softmax(policy(obs) / temperature, dim=-1)
        a = torch.multinomial(logp_all.exp(), 1).squeeze(-1)
        return a, logp_all.gather(-1, a[:, None]).squeeze(-1)
    return act


def _mixed_actor(archive: PolicyArchive, versions: torch.Tensor, temperature: float = 1.0):
    """``act(obs [N, d]) -> (actions [N], logp [N])``: env row i acts with version ``versions[i]``."""
    groups = [(int(v), (versions == v).nonzero().flatten()) for v in torch.unique(versions)]
    if len(groups) == 1:
        return _tempered(archive.get(groups[0][0]), temperature)

    def act(obs):
        a = torch.empty(obs.shape[0], dtype=torch.long, device=obs.device)
        lp = torch.empty(obs.shape[0], dtype=obs.dtype, device=obs.device)
        for v, idx in groups:
            idx = idx.to(obs.device)
            a_v, lp_v = _tempered(archive.get(v), temperature)(obs[idx])
            a[idx], lp[idx] = a_v, lp_v
        return a, lp
    return act


def _checked_settings(stale, lr_schedule, lag_schedule, sampler_temperature) -> tuple:
    """``train_stale_ppo``'s checks of its staleness settings and hooks; returns ``(stale, sampler_temperature)``."""
    stale = StaleTrainingConfig() if stale is None else stale
    if not isinstance(stale, StaleTrainingConfig):
        raise TypeError(f"stale must be a rlkit.staleness.StaleTrainingConfig, got {type(stale).__name__}")
    for name, f, what in (("lr_schedule", lr_schedule, "learning-rate multiplier"),
                          ("lag_schedule", lag_schedule, "rlkit.staleness.LagDistribution")):
        if f is not None and not callable(f):
            raise TypeError(f"{name} must be callable: f(update) -> {what}")
    return stale, V.real_in(sampler_temperature, "sampler_temperature", 0.0, lo_open=True)


def _lags(stale: StaleTrainingConfig, lag_schedule, update: int, archive: PolicyArchive, n: int,
          gen: torch.Generator) -> torch.Tensor:
    """The lags of update ``update``'s ``n`` env rows: from ``lag_schedule(update)`` if given, else
    ``stale.lag``; the archive grows to hold the largest lag asked for."""
    lag_dist = stale.lag if lag_schedule is None else lag_schedule(update)
    if not isinstance(lag_dist, LagDistribution):
        raise TypeError(f"lag_schedule({update}) must return a rlkit.staleness.LagDistribution, "
                        f"got {type(lag_dist).__name__}")
    archive.capacity = max(archive.capacity, lag_dist.max + 1)
    return lag_dist.sample(n, gen)


def train_stale_ppo(env: str | Callable = "CartPole-v1", cfg: StalePPOConfig | None = None,
                    stale: StaleTrainingConfig | None = None, *, lr_schedule: Callable[[int], float] | None = None,
                    lag_schedule: Callable[[int], LagDistribution] | None = None,
                    sampler_temperature: float = 1.0, callback: Callable | None = None, progress: bool = True,
                    device=None, threads: int | None = 1):
    r"""Train a categorical actor-critic with PPO on lagged data; returns ``(model, history)``.

    Args:
        env: a gymnasium id (Box observations, Discrete actions) or a constructor.
        cfg: a :class:`rlkit.algos.StalePPOConfig` (default: ``StalePPOConfig()``, the book's tuned
            CartPole settings of :func:`rlkit.algos.train_ppo`, a 25k-step budget). The lags are drawn
            from a generator seeded with ``cfg.seed``.
        stale: a :class:`rlkit.staleness.StaleTrainingConfig` (default: ``StaleTrainingConfig()``,
            the adaptive-centre objective on fresh data), as for :func:`rlkit.llm.stale.train_stale_grpo`.
        lr_schedule: optional ``f(update) -> multiplier`` of the learning rate (chapter 13 uses it to
            push the learning rate up mid-run); applied on top of the annealing and of rollbacks.
        lag_schedule: optional ``f(update) -> LagDistribution``, the lags of update ``update`` in place
            of ``stale.lag`` (chapter 13 grows the queue mid-run). The archive of past versions grows
            to the largest lag asked for; versions it no longer holds are replaced by the oldest it
            holds, so a lag raised mid-run reaches its new value only as new versions are published.
        sampler_temperature: the samplers draw from ``softmax(logits / sampler_temperature)`` and
            report its log-probabilities as the behaviour's, while the learner's policy is
            ``softmax(logits)``: the sampler mismatch of chapter 13's troubleshooting table, which makes
            :math:`\hat S_k > 0` at lag 0. With a value other than 1 the staleness of fresh samples is
            measured against the learner's log-probabilities (with 1 it is 0 by construction).
        callback, progress, device, threads: as in :func:`rlkit.algos.train_reinforce`.

    ``cfg.advantages`` chooses the advantage estimator (``"gae"``, uncorrected, or ``"vtrace"``,
    :func:`vtrace_advantages` with ``cfg.vtrace_clip``; both use the learner's current critic, which
    regresses on the matching targets). ``history.config`` holds ``cfg``'s fields and, under
    ``"staleness"``, ``stale.to_dict()``.
    """
    cfg = config_of(cfg, StalePPOConfig)
    stale, sampler_temperature = _checked_settings(stale, lr_schedule, lag_schedule, sampler_temperature)
    num_envs, num_steps, lr = cfg.num_envs, cfg.num_steps, cfg.lr
    run = Run(f"stale-ppo-{stale.method}", env, cfg, progress, callback, staleness=stale.to_dict())
    envs, model, collector, dev = setup(env, cfg, device, threads)
    opt = torch.optim.Adam(model.parameters(), lr=lr, eps=1e-5)
    lag_gen = torch.Generator().manual_seed(cfg.seed)
    archive = PolicyArchive(capacity=stale.lag.max + 1)
    buffer = VersionedBuffer()
    guard = TrainingGuard(stale, model, opt)           # monitor, rollback and "last good" checkpoints
    version, update = 0, 0
    archive.push(version, model.actor)

    while True:
        frac = max(0.0, 1.0 - collector.env_steps / cfg.total_steps) if cfg.anneal_lr else 1.0
        lr_now = lr * frac * guard.lr_scale * (float(lr_schedule(update)) if lr_schedule is not None else 1.0)
        opt.param_groups[0]["lr"] = lr_now

        # 1. sample: env row i acts with version k - lag_i; every sample is tagged with its version
        lags = _lags(stale, lag_schedule, update, archive, num_envs, lag_gen)
        row_versions = archive.behaviour_versions(version, lags)
        batch = collector.collect(_mixed_actor(archive, row_versions, sampler_temperature), num_steps,
                                  value_fn=model.critic)

        # 2. advantages with the learner's critic (time last: [N, T]): GAE as observed, or the advantage
        #    of the current policy pi_k by V-trace (target pi_k, behaviour the version of each row)
        discounts, lam_mask = from_gymnasium(batch.terminated, batch.truncated, cfg.gamma)
        if cfg.advantages == "gae":
            adv, returns = gae(batch.rewards, batch.values, batch.next_values, discounts, cfg.gae_lambda * lam_mask)
        else:
            with torch.no_grad():
                lp_now = torch.distributions.Categorical(logits=model.actor(batch.obs)).log_prob(batch.actions)
                fresh = (row_versions.to(dev) == version)[:, None]       # pi_k sampled these rows itself
                fresh &= sampler_temperature == 1.0                      # ... unless the sampler is tempered
                log_rhos = torch.where(fresh, torch.zeros_like(lp_now), lp_now - batch.logp)
            adv, returns = vtrace_advantages(log_rhos, batch.rewards, batch.values, batch.next_values, discounts,
                                             cfg.gae_lambda * lam_mask, clip=cfg.vtrace_clip)
        T = num_steps
        buffer.put(row_versions.to(dev).repeat_interleave(T), batch.logp.reshape(-1),
                   obs=batch.obs.reshape(num_envs * T, -1), actions=batch.actions.reshape(-1),
                   adv=adv.reshape(-1), returns=returns.reshape(-1))
        data = buffer.take(version)                     # everything sampled for this update
        obs, actions, lb, age = data["obs"], data["actions"], data["logp_behav"], data["age"]

        # 3. staleness: log pi_k of every sample (fresh samples: pi_k IS the behaviour version)
        with torch.no_grad():
            logits_k = model.actor(obs)
            lp_k = torch.distributions.Categorical(logits=logits_k).log_prob(actions)
            if sampler_temperature == 1.0:              # the sampler of a fresh sample IS pi_k
                lp_k = torch.where(age == 0, lb, lp_k)
            s_hat = staleness(lp_k, lb)
            logits_mu = torch.empty_like(logits_k)
            for v in torch.unique(data["version"]):
                idx = (data["version"] == v).nonzero().flatten()
                logits_mu[idx] = archive.get(int(v))(obs[idx]) / sampler_temperature
            s_tv = tv_categorical(logits_k, logits_mu).mean()
            # has the learner already acted on these advantages? corr(rho_k - 1, A) over the batch
            x, y = torch.expm1(lp_k - lb), data["adv"]
            sx, sy = x.std(), y.std()
            rho_adv_corr = float(((x - x.mean()) * (y - y.mean())).mean() / (sx * sy)) if sx > 0 and sy > 0 else 0.0
        keep = torch.ones_like(age, dtype=torch.bool)
        if stale.version_window is not None:
            keep &= version_window(data["version"], version, stale.version_window)
        if stale.eps_stale is not None:
            keep &= staleness_filter(lp_k, lb, stale.eps_stale)
        kept = keep.nonzero().flatten()
        B = kept.numel()
        stats = dict(staleness=float(s_hat), staleness_tv=float(s_tv), drop_share=1.0 - B / age.numel(),
                     rho_adv_corr=rho_adv_corr,
                     mean_age=float(age.float().mean()), lr=lr_now,
                     entropy=float(entropy_categorical(logits_k).mean()))
        if B < max(2, cfg.num_minibatches):                 # nothing (or too little) to learn from
            if run.update(collector, **stats):
                break
            continue
        o, a, lbk, lpk = obs[kept], actions[kept], lb[kept], lp_k[kept]
        ad, ret, ag = data["adv"][kept], data["returns"][kept], age[kept]
        eps = stale.clip_radius(ag) if stale.clip_schedule == "age" else stale.clip_radius()
        stats.update(staleness_kept=float(staleness(lpk, lbk)),
                     ess=float(effective_sample_size(lpk - lbk, share=True)))

        # 4. update: epochs x minibatches of Adam steps (PPO's loop, with the stale objective)
        def policy_loss(idx, logp, logits, A, eps=eps, lpk=lpk, lbk=lbk):   # binds this update's tensors
            e = eps[idx] if isinstance(eps, torch.Tensor) else eps
            pg, st = clipped_policy_loss(stale.method, logp, lpk[idx], lbk[idx], A, e, behav_clip=stale.behav_clip)
            return pg, dict(clip_fraction=float(st["clip_fraction"]))

        upd, _ = ppo_epochs(model, opt, o, a, ad, ret, policy_loss, epochs=cfg.epochs,
                             num_minibatches=cfg.num_minibatches, vf_coef=cfg.vf_coef, ent_coef=cfg.ent_coef,
                             grad_clip=cfg.grad_clip, normalize_advantages=cfg.normalize_advantages)
        stats.update(upd)

        # 5. measure the update: U_k from ratios (lemma lem-ch11-ratio) and the exact mean TV / KL
        with torch.no_grad():
            logits_new = model.actor(o)
            lp_new = torch.distributions.Categorical(logits=logits_new).log_prob(a)
            stats.update(update_shift=float(update_shift(lp_new, lpk, lbk)),
                         update_shift_tv=float(tv_categorical(logits_new, logits_k[kept]).mean()),
                         kl=float(kl_categorical(logits_k[kept], logits_new).mean()))
        metrics = {k: stats[k] for k in ("update_shift", "staleness", "clip_fraction", "kl", "entropy", "ess",
                                         "drop_share", "grad_norm", "loss")}
        if collector.episodes.returns:
            metrics["return"] = float(sum(collector.episodes.returns[-20:]) / len(collector.episodes.returns[-20:]))
        decision = guard.update(update, **metrics)
        stats.update(alerts=len(decision.alerts), rolled_back=float(decision.rolled_back))
        if decision.rolled_back:
            archive = PolicyArchive(capacity=stale.lag.max + 1)   # flush the bad versions' in-flight data

        # 6. publish the new weights as version k + 1
        version += 1
        update += 1
        archive.push(version, model.actor)
        if run.update(collector, **stats) or decision.stop:
            break

    model.eval()
    history = run.close(envs)
    history.alerts = list(guard.alerts)
    history.rollbacks = guard.rollbacks
    return model, history
