r"""PPO on stale data: a simulated asynchronous sampler, three clipped objectives, monitors, rollback.

Chapters 12 (clipping under staleness) and 13 (the engineering checklist).

Real LLM pipelines sample with version :math:`k - \ell` of the policy while the learner is at
version :math:`k`. This trainer reproduces that on a gymnasium task without threads: it keeps the
last few published versions of the actor in a :class:`rlkit.staleness.PolicyArchive` and, at
update :math:`k`, lets each environment row act with version :math:`k - \ell`, :math:`\ell` drawn
from ``config.lag`` (one lag per env row, so a batch can mix versions). Since the environment
does not change with time, generating the data now with an old version is the same as having
generated it :math:`\ell` updates ago and queued it.

One update :math:`k` (read top to bottom in :func:`train_stale_ppo`):

1. **Sample.** Draw a lag per env row, act with the archived versions
   (:meth:`rlkit.rollout.RolloutCollector.collect`); every sample keeps its version and its
   behaviour log-prob :math:`\log\mu(a\mid s)` (:class:`rlkit.staleness.VersionedBuffer`).
2. **Advantages.** GAE with the learner's current critic (:func:`rlkit.returns.gae`); the
   behaviour trajectory is what was observed, so the advantage is the behaviour version's.
3. **Staleness control.** :math:`\log\pi_k(a\mid s)` of every sample; :math:`\hat S_k` on the
   whole batch; the version window (:func:`rlkit.staleness.version_window`) and the staleness
   filter (:func:`rlkit.staleness.staleness_filter`) choose the samples to learn from.
4. **Update.** ``epochs`` x ``num_minibatches`` Adam steps on ``config.method``'s loss
   (``"standard"``: :func:`rlkit.objectives.ppo_clip_loss` of :math:`\pi_\theta/\mu`;
   ``"adaptive"``: :func:`rlkit.objectives.geppo_loss`; ``"decoupled"``:
   :func:`rlkit.objectives.decoupled_ppo_loss`) plus the value loss, with the clip radius of
   ``config.clip_schedule``.
5. **Measure.** :math:`\hat U_k` (:func:`rlkit.staleness.update_shift`) and, because the policy
   is a small categorical network, the *exact* per-state TV distances
   :math:`\overline{D_{TV}(\pi_{k+1},\pi_k;s)}` and :math:`\overline{D_{TV}(\pi_k,\mu;s)}` over the
   batch's states, which the ratio estimates must agree with (Lemma 5.1). The
   :class:`rlkit.staleness.Monitor` checks ``config.thresholds``; on an alert the trainer
   logs, stops, or rolls back to the last good checkpoint (and multiplies the learning rate
   by ``config.rollback_lr_factor``).
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

from typing import Callable

import torch

from ..divergences import entropy_categorical, kl_categorical, tv_categorical
from ..objectives import decoupled_ppo_loss, geppo_loss, normalize_advantages as _normalize, ppo_clip_loss
from ..returns import from_gymnasium, gae
from ..staleness import (Checkpoint, Monitor, PolicyArchive, StaleTrainingConfig, VersionedBuffer,
                         effective_sample_size, staleness, staleness_filter, update_shift, version_window)
from ._common import Run, check_float, check_pos_int, clip_grad, setup

__all__ = ["train_stale_ppo", "stale_policy_loss"]


def stale_policy_loss(method: str, logp: torch.Tensor, logp_prox: torch.Tensor, logp_behav: torch.Tensor,
                      adv: torch.Tensor, eps, behav_clip: float | None = None):
    r"""The clipped policy loss of ``method`` on flat ``[B]`` tensors; returns ``(loss, clip_fraction)``.

    * ``"standard"``: :math:`-\overline{\min(\rho\hat A, \mathrm{clip}(\rho, 1\pm\epsilon)\hat A)}`, :math:`\rho=\pi_\theta/\mu`;
    * ``"adaptive"`` (method 1): the clip window is :math:`[\rho_k-\epsilon, \rho_k+\epsilon]`;
    * ``"decoupled"`` (method 2): :math:`r = \pi_\theta/\pi_k` clipped to :math:`1\pm\epsilon`, times :math:`\rho_k`.

    ``eps`` is a float or a ``[B]`` tensor of per-sample radii (an age-dependent schedule); the
    token-mean loss of a per-sample radius is the count-weighted mean of the losses of the
    groups of equal radius. Chapter: 12_clipping_staleness.
    """
    def one(idx, e):
        sl = (lambda x: x) if idx is None else (lambda x: x[idx])
        if method == "standard":
            loss, st = ppo_clip_loss(sl(logp), sl(logp_behav), sl(adv), eps=e)
        elif method == "adaptive":
            loss, st = geppo_loss(sl(logp), sl(logp_prox), sl(logp_behav), sl(adv), eps=e)
        elif method == "decoupled":
            loss, st = decoupled_ppo_loss(sl(logp), sl(logp_prox), sl(logp_behav), sl(adv), eps=e,
                                          behav_clip=behav_clip)
        else:
            raise ValueError(f"method must be 'standard', 'adaptive' or 'decoupled', got {method!r}")
        return loss, st["clip_fraction"]

    if not isinstance(eps, torch.Tensor):
        return one(None, float(eps))
    if eps.shape != logp.shape:
        raise ValueError(f"per-sample eps must have the shape of logp {tuple(logp.shape)}, got {tuple(eps.shape)}")
    n = logp.shape[0]
    loss, clip = 0.0, 0.0
    for e in torch.unique(eps):
        idx = (eps == e).nonzero().flatten()
        l_g, c_g = one(idx, float(e))
        loss = loss + l_g * (idx.numel() / n)
        clip = clip + c_g * (idx.numel() / n)
    return loss, clip


def _mixed_actor(archive: PolicyArchive, versions: torch.Tensor):
    """``act(obs [N, d]) -> (actions [N], logp [N])``: env row i acts with version ``versions[i]``."""
    groups = [(int(v), (versions == v).nonzero().flatten()) for v in torch.unique(versions)]
    if len(groups) == 1:
        return archive.get(groups[0][0]).act

    def act(obs):
        a = torch.empty(obs.shape[0], dtype=torch.long, device=obs.device)
        lp = torch.empty(obs.shape[0], dtype=obs.dtype, device=obs.device)
        for v, idx in groups:
            idx = idx.to(obs.device)
            a_v, lp_v = archive.get(v).act(obs[idx])
            a[idx], lp[idx] = a_v, lp_v
        return a, lp
    return act


def train_stale_ppo(env_id: str | Callable = "CartPole-v1", total_steps: int = 25_000, num_envs: int = 8,
                    num_steps: int = 32, lr: float = 2.5e-3, anneal_lr: bool = True, gamma: float = 0.98,
                    gae_lambda: float = 0.8, epochs: int = 10, num_minibatches: int = 1,
                    config: StaleTrainingConfig | None = None, ent_coef: float = 0.0, vf_coef: float = 0.5,
                    max_grad_norm: float | None = 0.5, normalize_advantages: bool = True,
                    lr_schedule: Callable[[int], float] | None = None, seed: int = 0, device=None,
                    progress: bool = True, hidden: int = 64, target_return: float | None = None,
                    target_window: int = 20, callback: Callable | None = None, threads: int | None = 1):
    """Train a categorical actor-critic with PPO on lagged data; returns ``(model, history)``.

    Args:
        config: a :class:`rlkit.staleness.StaleTrainingConfig` (default: ``StaleTrainingConfig()``,
            the adaptive-centre objective on fresh data).
        lr_schedule: optional ``f(update) -> multiplier`` of the learning rate (chapter 13 uses it to
            push the learning rate up mid-run); applied on top of the annealing and of rollbacks.
        Other arguments as in :func:`rlkit.algos.train_ppo` (same defaults: the book's tuned
        CartPole settings). The lags are drawn from a generator seeded with ``seed``.
    """
    check_pos_int(total_steps, "total_steps")
    check_pos_int(num_steps, "num_steps")
    check_pos_int(epochs, "epochs")
    check_pos_int(num_minibatches, "num_minibatches")
    check_float(lr, "lr", 0.0, lo_open=True)
    check_float(gamma, "gamma", 0.0, 1.0)
    check_float(gae_lambda, "gae_lambda", 0.0, 1.0)
    check_float(ent_coef, "ent_coef")
    check_float(vf_coef, "vf_coef")
    if max_grad_norm is not None:
        check_float(max_grad_norm, "max_grad_norm", 0.0, lo_open=True)
    if config is None:
        config = StaleTrainingConfig()
    if not isinstance(config, StaleTrainingConfig):
        raise TypeError(f"config must be a rlkit.staleness.StaleTrainingConfig, got {type(config).__name__}")
    if lr_schedule is not None and not callable(lr_schedule):
        raise TypeError("lr_schedule must be callable: f(update) -> learning-rate multiplier")
    if num_envs * num_steps < num_minibatches:
        raise ValueError(f"num_minibatches={num_minibatches} exceeds the batch size {num_envs * num_steps}")
    run_config = {k: v for k, v in locals().items() if isinstance(v, (int, float, str, bool, type(None)))}
    run_config["env_id"] = str(env_id)
    run_config["staleness"] = config.to_dict()

    envs, model, collector, dev = setup(env_id, num_envs, seed, device, hidden, threads)
    opt = torch.optim.Adam(model.parameters(), lr=lr, eps=1e-5)
    run = Run(f"stale-ppo-{config.method}", run_config, total_steps, progress, target_return, target_window,
              callback)
    lag_gen = torch.Generator().manual_seed(seed)
    archive = PolicyArchive(capacity=config.lag.max + 1)
    buffer = VersionedBuffer()
    monitor = Monitor(config.thresholds)
    good = Checkpoint()
    good.save(0, model, opt)
    version, update, lr_scale, rollbacks = 0, 0, 1.0, []
    archive.push(version, model.actor)

    while True:
        frac = max(0.0, 1.0 - collector.env_steps / total_steps) if anneal_lr else 1.0
        lr_now = lr * frac * lr_scale * (float(lr_schedule(update)) if lr_schedule is not None else 1.0)
        opt.param_groups[0]["lr"] = lr_now

        # 1. sample: env row i acts with version k - lag_i; every sample is tagged with its version
        lags = config.lag.sample(num_envs, lag_gen)
        row_versions = archive.behaviour_versions(version, lags)
        batch = collector.collect(_mixed_actor(archive, row_versions), num_steps, value_fn=model.critic)

        # 2. GAE with the learner's critic (time last: [N, T])
        discounts, lam_mask = from_gymnasium(batch.terminated, batch.truncated, gamma)
        adv, returns = gae(batch.rewards, batch.values, batch.next_values, discounts, gae_lambda * lam_mask)
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
            lp_k = torch.where(age == 0, lb, lp_k)
            s_hat = staleness(lp_k, lb)
            logits_mu = torch.empty_like(logits_k)
            for v in torch.unique(data["version"]):
                idx = (data["version"] == v).nonzero().flatten()
                logits_mu[idx] = archive.get(int(v))(obs[idx])
            s_tv = tv_categorical(logits_k, logits_mu).mean()
            # has the learner already acted on these advantages? corr(rho_k - 1, A) over the batch
            x, y = torch.expm1(lp_k - lb), data["adv"]
            sx, sy = x.std(), y.std()
            rho_adv_corr = float(((x - x.mean()) * (y - y.mean())).mean() / (sx * sy)) if sx > 0 and sy > 0 else 0.0
        keep = torch.ones_like(age, dtype=torch.bool)
        if config.version_window is not None:
            keep &= version_window(data["version"], version, config.version_window)
        if config.eps_stale is not None:
            keep &= staleness_filter(lp_k, lb, config.eps_stale)
        kept = keep.nonzero().flatten()
        B = kept.numel()
        stats = dict(staleness=float(s_hat), staleness_tv=float(s_tv), drop_share=1.0 - B / age.numel(),
                     rho_adv_corr=rho_adv_corr,
                     mean_age=float(age.float().mean()), lr=lr_now,
                     entropy=float(entropy_categorical(logits_k).mean()))
        if B < max(2, num_minibatches):                 # nothing (or too little) to learn from
            if run.update(collector, **stats):
                break
            continue
        o, a, lbk, lpk = obs[kept], actions[kept], lb[kept], lp_k[kept]
        ad, ret, ag = data["adv"][kept], data["returns"][kept], age[kept]
        eps = config.clip_radius(ag) if config.clip_schedule == "age" else config.clip_radius()
        stats.update(staleness_kept=float(staleness(lpk, lbk)),
                     ess=float(effective_sample_size(lpk - lbk)))

        # 4. update: epochs x minibatches of Adam steps
        mb = B // num_minibatches
        sums = dict(loss=0.0, value_loss=0.0, clip_fraction=0.0, grad_norm=0.0)
        n_mb = 0
        for _ in range(epochs):
            perm = torch.randperm(B, device=o.device)
            for start in range(0, mb * num_minibatches, mb):
                idx = perm[start:start + mb]
                logp, ent, v, _ = model.evaluate(o[idx], a[idx])
                A = _normalize(ad[idx]) if normalize_advantages else ad[idx]
                e = eps[idx] if isinstance(eps, torch.Tensor) else eps
                pg, clip = stale_policy_loss(config.method, logp, lpk[idx], lbk[idx], A, e, config.behav_clip)
                v_loss = 0.5 * ((v - ret[idx]) ** 2).mean()
                loss = pg + vf_coef * v_loss - ent_coef * ent.mean()
                opt.zero_grad()
                loss.backward()
                gn = clip_grad(model.parameters(), max_grad_norm)
                opt.step()
                n_mb += 1
                for k, x in (("loss", loss.item()), ("value_loss", v_loss.item()), ("clip_fraction", float(clip)),
                             ("grad_norm", gn)):
                    sums[k] += x
        stats.update({k: x / n_mb for k, x in sums.items()})

        # 5. measure the update: U_k from ratios (Lemma 5.1) and the exact mean TV / KL
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
        alerts = monitor.update(update, **metrics)
        stats.update(alerts=len(alerts), rolled_back=0.0)
        action = config.alert_action(alerts, len(rollbacks))
        stop = action == "stop"
        if action == "rollback":
            to = good.restore(model, opt)
            rollbacks.append((update, to))
            lr_scale *= config.rollback_lr_factor
            monitor.reset_streaks()
            stats["rolled_back"] = 1.0
            archive = PolicyArchive(capacity=config.lag.max + 1)   # flush the bad versions' in-flight data
        elif action == "continue" and monitor.ok and (update + 1) % config.checkpoint_every == 0:
            good.save(update + 1, model, opt)

        # 6. publish the new weights as version k + 1
        version += 1
        update += 1
        archive.push(version, model.actor)
        if run.update(collector, **stats) or stop:
            break

    model.eval()
    history = run.close(envs)
    history.alerts = list(monitor.alerts)
    history.rollbacks = rollbacks
    return model, history
