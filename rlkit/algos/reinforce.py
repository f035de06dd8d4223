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
   :math:`L(\theta) = -\frac1N\sum_i\sum_t \log\pi_\theta(a^i_t|s^i_t)(G^i_t-b^i_t)` with the weights :math:`G - b` held constant.  One Adam step on :math:`L`.

Per-update stats in the history: ``loss`` (the surrogate above), ``entropy`` (mean policy entropy on
the batch), ``kl`` (mean KL(pi_old || pi_new) over the batch's states, measured after the step),
``grad_norm`` (before clipping), ``lr``, ``adv_std`` (std of G - b over real steps; chapter 2 plots it),
``episodes``, and ``value_loss`` with the value baseline.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..divergences import entropy_categorical, kl_categorical
from ..returns import discounted_returns, from_gymnasium
from ._common import Run, adam, check_float, check_pos_int, clip_grad, setup

__all__ = ["train_reinforce"]

BASELINES = (None, "mean", "value")


def train_reinforce(env_id: str | Callable = "CartPole-v1", total_steps: int = 100_000, num_envs: int = 8,
                    lr: float = 1e-2, gamma: float = 0.99, baseline: str | None = None,
                    value_lr: float = 1e-2, value_epochs: int = 10, max_grad_norm: float | None = None,
                    seed: int = 0, device=None, progress: bool = True, hidden: int = 64,
                    target_return: float | None = None, target_window: int = 20,
                    callback: Callable | None = None, threads: int | None = 1):
    """Train a categorical MLP policy with REINFORCE; returns ``(model, history)``.

    Args:
        env_id: a gymnasium id with Box observations and Discrete actions, or a constructor.
        total_steps: stop after this many env steps (steps of complete episodes; the filler steps
            of already-finished envs in a batch are not counted, see ``collect_episodes``).
        num_envs: episodes per update (one per vectorised env).
        lr: Adam learning rate of the policy.
        gamma: discount in [0, 1].
        baseline: None, "mean" or "value" (see the module docstring).
        value_lr, value_epochs: Adam learning rate and full-batch steps per update for the value
            baseline (ignored otherwise).
        max_grad_norm: clip the policy gradient's global norm (None: no clipping).
        seed: seeds torch, numpy, python and the envs (env i gets seed + i).
        device: torch device of the networks (default CPU, the fastest for these tiny MLPs).
        progress: show a tqdm progress bar.
        hidden: width of the two hidden layers.
        target_return, target_window: stop early once the mean return of the last
            ``target_window`` completed episodes reaches ``target_return``.
        callback: ``callback(history) -> bool``, called after every update; True stops training.
        threads: torch CPU threads (1 by default, see rlkit.utils.seed_everything).

    Returns:
        ``model``: an :class:`rlkit.nets.ActorCritic` (``model.actor`` is the trained policy,
        ``model.critic`` the value baseline, untrained unless ``baseline="value"``), in eval mode.
        ``history``: an :class:`rlkit.algos.History`.
    """
    check_pos_int(total_steps, "total_steps")
    check_float(lr, "lr", 0.0, lo_open=True)
    check_float(gamma, "gamma", 0.0, 1.0)
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    check_float(value_lr, "value_lr", 0.0, lo_open=True)
    check_pos_int(value_epochs, "value_epochs")
    if max_grad_norm is not None:
        check_float(max_grad_norm, "max_grad_norm", 0.0, lo_open=True)
    config = dict(env_id=str(env_id), total_steps=total_steps, num_envs=num_envs, lr=lr, gamma=gamma,
                  baseline=baseline, value_lr=value_lr, value_epochs=value_epochs,
                  max_grad_norm=max_grad_norm, seed=seed, hidden=hidden)

    envs, model, collector, dev = setup(env_id, num_envs, seed, device, hidden, threads)
    policy, value = model.actor, model.critic
    opt = adam(list(policy.parameters()), lr, dev)
    v_opt = adam(list(value.parameters()), value_lr, dev) if baseline == "value" else None
    run = Run("reinforce", config, total_steps, progress, target_return, target_window, callback)

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
        opt.zero_grad()
        loss.backward()
        gnorm = clip_grad(policy.parameters(), max_grad_norm)   # norm before clipping
        opt.step()

        stats = dict(loss=loss.item(), grad_norm=gnorm, lr=opt.param_groups[0]["lr"],
                     episodes=n_episodes, adv_std=float(adv[m].std()) if m.sum() > 1 else 0.0)
        with torch.no_grad():
            new_logits = policy(batch.obs)
            stats["kl"] = float(kl_categorical(logits.detach(), new_logits)[m].mean())
            stats["entropy"] = float(entropy_categorical(logits.detach())[m].mean())

        # value baseline: regress V(s_t) on G_t over the real steps
        if v_opt is not None:
            for _ in range(value_epochs):
                v_loss = (((value(batch.obs) - G) ** 2) * mf).sum() / mf.sum()
                v_opt.zero_grad()
                v_loss.backward()
                v_opt.step()
            stats["value_loss"] = v_loss.item()

        if run.update(collector, **stats):
            break

    model.eval()
    return model, run.close(envs)
