r"""REINFORCE (Williams, 1992): Monte Carlo policy gradient, with an optional baseline.

Chapter 1 (01_policy_gradient) derives it; chapter 2 adds the baselines.  One update:

1. Reset the ``num_envs`` environments and run each for ONE complete episode with the current policy
   (:meth:`rlkit.rollout.RolloutCollector.collect_episodes`; rows are padded, ``mask`` marks real steps).
2. Reward-to-go :math:`G_t = \sum_{k \ge t} \gamma^{k-t} r_k` inside each episode
   (:func:`rlkit.returns.discounted_returns` with ``discounts = gamma * (1 - terminated)`` and a zero
   bootstrap: every row is a complete episode, or one cut by the time limit, which REINFORCE treats
   as the end of the sample).
3. Baseline :math:`b` (``baseline=``): ``None`` (b = 0, the plain estimator), ``"mean"`` (the mean
   reward-to-go of the batch, one number; it uses the batch's own returns, which biases the
   gradient by O(1/batch) - the price of not keeping a separate estimate), or ``"value"``
   (a learned :math:`V_\phi(s_t)`, evaluated BEFORE it is fitted on this batch so that the gradient
   stays unbiased, then regressed on :math:`G_t` with ``value_epochs`` full-batch Adam steps).
4. The score-function estimate of the policy gradient, averaged over the N episodes,

   .. math::  \hat g = \frac1N \sum_{i=1}^N \sum_{t} \nabla_\theta \log\pi_\theta(a^i_t\mid s^i_t)\,
              \big(G^i_t - b^i_t\big),

   obtained as the gradient of the loss
   :math:`L(\theta) = -\frac1N\sum_i\sum_t \log\pi_\theta(a^i_t|s^i_t)(G^i_t-b^i_t)` with the weights
   :math:`G - b` held constant.  One Adam step on :math:`L`.

Per-update stats in the history: ``loss`` (the surrogate above), ``entropy`` (mean policy entropy on
the batch), ``kl`` (mean KL(pi_old || pi_new) over the batch's states, measured after the step),
``grad_norm`` (before clipping), ``lr``, ``adv_std`` (std of G - b over real steps; chapter 2 plots it),
``episodes``, and ``value_loss`` with the value baseline.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from ..divergences import entropy_categorical, kl_categorical
from ..returns import discounted_returns, from_gymnasium
from ._common import Run, adam, config_of, setup, step
from .configs import ReinforceConfig

__all__ = ["train_reinforce"]


def train_reinforce(env: str | Callable = "CartPole-v1", cfg: ReinforceConfig | None = None, *,
                    callback: Callable | None = None, progress: bool = True, device=None,
                    threads: int | None = 1):
    """Train a categorical MLP policy with REINFORCE; returns ``(model, history)``.

    Args:
        env: a gymnasium id with Box observations and Discrete actions, or a constructor.
        cfg: a :class:`rlkit.algos.ReinforceConfig` (default: ``ReinforceConfig()``). Its
            ``total_steps`` counts the steps of complete episodes (the filler steps of
            already-finished envs in a batch are not counted, see ``collect_episodes``);
            ``num_envs`` is the number of episodes per update.
        callback: ``callback(history) -> bool``, called after every update; True stops training.
        progress: show a tqdm progress bar.
        device: torch device of the networks (default CPU, the fastest for these tiny MLPs): a
            ``torch.device`` or a string such as ``"cpu"``, ``"cuda"``, ``"cuda:0"``, ``"mps"``; an unknown
            or unavailable one is refused (``ValueError``).
        threads: torch CPU threads (1 by default, see rlkit.utils.seed_everything).

    Returns:
        ``model``: an :class:`rlkit.nets.ActorCritic` (``model.actor`` is the trained policy,
        ``model.critic`` the value baseline, untrained unless ``baseline="value"``), in eval mode.
        ``history``: an :class:`rlkit.algos.History`.
    """
    cfg = config_of(cfg, ReinforceConfig)
    gamma, baseline = cfg.gamma, cfg.baseline
    run = Run("reinforce", env, cfg, progress, callback)
    envs, model, collector, dev = setup(env, cfg, device, threads)
    policy, value = model.actor, model.critic
    opt = adam(list(policy.parameters()), cfg.lr, dev)
    v_opt = adam(list(value.parameters()), cfg.value_lr, dev) if baseline == "value" else None

    while True:
        # 1. one complete episode per env, padded; mask marks the real steps
        batch = collector.collect_episodes(policy.act)
        m = batch.mask
        mf = m.float()
        n_episodes = batch.obs.shape[0]

        # 2. Monte Carlo reward-to-go (rewards are 0 on padded steps, so padding adds nothing)
        discounts, _ = from_gymnasium(batch.terminated, batch.truncated, gamma)
        G = discounted_returns(batch.rewards, discounts, 0.0)            # [N, T]

        # 3. baseline (computed before any fitting on this batch)
        if baseline is None:
            b = torch.zeros_like(G)
        elif baseline == "mean":
            b = torch.full_like(G, float(G[m].mean()))
        else:
            with torch.no_grad():
                b = value(batch.obs)
        adv = (G - b) * mf                                                 # zero on padded steps

        # 4. the surrogate whose gradient is the REINFORCE estimate
        logits = policy(batch.obs)                                         # [N, T, A]
        logp = torch.distributions.Categorical(logits=logits, validate_args=False).log_prob(batch.actions)
        loss = -(logp * adv).sum() / n_episodes
        gnorm = step(opt, loss, policy.parameters(), cfg.grad_clip)   # norm before clipping

        stats = dict(loss=loss.item(), grad_norm=gnorm, lr=opt.param_groups[0]["lr"],
                     episodes=n_episodes, adv_std=float(adv[m].std()) if m.sum() > 1 else 0.0)
        with torch.no_grad():
            new_logits = policy(batch.obs)
            stats["kl"] = float(kl_categorical(logits.detach(), new_logits)[m].mean())
            stats["entropy"] = float(entropy_categorical(logits.detach())[m].mean())

        # value baseline: regress V(s_t) on G_t over the real steps
        if v_opt is not None:
            for _ in range(cfg.value_epochs):
                v_loss = (((value(batch.obs) - G) ** 2) * mf).sum() / mf.sum()
                step(v_opt, v_loss, value.parameters(), None)
            stats["value_loss"] = v_loss.item()

        if run.update(collector, **stats):
            break

    model.eval()
    return model, run.close(envs)
