r"""A2C: synchronous advantage actor-critic with GAE (chapter 2, 02_advantage_gae).

One update:

1. Run ``num_envs`` environments for ``num_steps`` steps with the current policy
   (:meth:`rlkit.rollout.RolloutCollector.collect`; rollouts continue across updates, episodes end
   anywhere inside them).
2. Advantages by GAE (:func:`rlkit.returns.gae`) with ``discounts, lam_mask =
   from_gymnasium(terminated, truncated, gamma)`` and ``lam = gae_lambda * lam_mask``: a termination
   zeroes the bootstrap, a truncation bootstraps from V(final observation) and cuts the trace, and
   the last step of the rollout bootstraps from V(s_T).  Value targets ``returns = A + V``.
3. One gradient step on

   .. math:: L = -\frac{1}{NT}\sum_{i,t} \log\pi_\theta(a_t|s_t)\,\hat A_t
             + c_v \frac{1}{NT}\sum_{i,t}\big(V_\phi(s_t) - \hat R_t\big)^2
             - c_e \frac{1}{NT}\sum_{i,t} \mathcal H[\pi_\theta(\cdot|s_t)],

   with the global gradient norm clipped to ``max_grad_norm``.

``gae_lambda=1`` gives the n-step Monte Carlo advantage of the original A2C; ``gae_lambda=0`` the
one-step TD error.  Per-update stats: ``loss``, ``policy_loss``, ``value_loss``, ``entropy``,
``kl`` (KL(pi_old || pi_new) after the step), ``grad_norm``, ``lr``, ``explained_variance``.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..divergences import entropy_categorical, kl_categorical
from ..objectives import normalize_advantages as _normalize, policy_gradient_loss
from ..returns import from_gymnasium, gae
from ._common import Run, adam, check_float, check_pos_int, clip_grad, setup

__all__ = ["train_a2c"]


def train_a2c(env_id: str | Callable = "CartPole-v1", total_steps: int = 100_000, num_envs: int = 8,
              num_steps: int = 5, lr: float = 1e-3, gamma: float = 0.99, gae_lambda: float = 0.95,
              ent_coef: float = 0.0, vf_coef: float = 0.5, max_grad_norm: float | None = 0.5,
              normalize_advantages: bool = False, anneal_lr: bool = False,
              seed: int = 0, device=None, progress: bool = True, hidden: int = 64,
              target_return: float | None = None, target_window: int = 20,
              callback: Callable | None = None, threads: int | None = 1):
    """Train a categorical actor and a value critic with A2C + GAE; returns ``(model, history)``.

    Args:
        num_steps: rollout length T per env per update (batch = num_envs * num_steps transitions).
        lr: Adam learning rate (one optimiser for actor and critic, separate networks).
        gamma, gae_lambda: discount and GAE lambda, both in [0, 1].
        ent_coef, vf_coef: entropy bonus and value-loss weights (>= 0).
        max_grad_norm: clip of the global gradient norm (None: no clipping).
        normalize_advantages: standardise advantages over the batch (rlkit.objectives).
        anneal_lr: decay the learning rate linearly to 0 over ``total_steps``.
        Other arguments as in :func:`rlkit.algos.train_reinforce`.
    """
    check_pos_int(total_steps, "total_steps")
    check_pos_int(num_steps, "num_steps")
    check_float(lr, "lr", 0.0, lo_open=True)
    check_float(gamma, "gamma", 0.0, 1.0)
    check_float(gae_lambda, "gae_lambda", 0.0, 1.0)
    check_float(ent_coef, "ent_coef")
    check_float(vf_coef, "vf_coef")
    if max_grad_norm is not None:
        check_float(max_grad_norm, "max_grad_norm", 0.0, lo_open=True)
    config = dict(env_id=str(env_id), total_steps=total_steps, num_envs=num_envs, num_steps=num_steps, lr=lr,
                  gamma=gamma, gae_lambda=gae_lambda, ent_coef=ent_coef, vf_coef=vf_coef,
                  max_grad_norm=max_grad_norm, normalize_advantages=normalize_advantages,
                  anneal_lr=anneal_lr, seed=seed, hidden=hidden)

    envs, model, collector, dev = setup(env_id, num_envs, seed, device, hidden, threads)
    opt = adam(list(model.parameters()), lr, dev)
    run = Run("a2c", config, total_steps, progress, target_return, target_window, callback)

    while True:
        if anneal_lr:
            opt.param_groups[0]["lr"] = lr * max(0.0, 1.0 - collector.env_steps / total_steps)
        # 1. rollout [N, T] with V(s_t) and V(true s_{t+1})
        batch = collector.collect(model.actor.act, num_steps, value_fn=model.critic)

        # 2. GAE; the trace is cut at every episode end inside the rollout
        discounts, lam_mask = from_gymnasium(batch.terminated, batch.truncated, gamma)
        adv, returns = gae(batch.rewards, batch.values, batch.next_values, discounts, gae_lambda * lam_mask)
        if normalize_advantages:
            adv = _normalize(adv)

        # 3. one step on the combined loss
        logp, entropy, v, logits = model.evaluate(batch.obs, batch.actions)
        policy_loss = policy_gradient_loss(logp, adv)           # -mean(logp * A)
        value_loss = ((v - returns) ** 2).mean()
        loss = policy_loss + vf_coef * value_loss - ent_coef * entropy.mean()
        opt.zero_grad()
        loss.backward()
        gnorm = clip_grad(model.parameters(), max_grad_norm)   # norm before clipping
        opt.step()

        with torch.no_grad():
            kl = kl_categorical(logits.detach(), model.actor(batch.obs)).mean()
            var_r = returns.var()
            ev = 1.0 - (returns - batch.values).var() / var_r if var_r > 0 else torch.tensor(float("nan"))
        stats = dict(loss=loss.item(), policy_loss=policy_loss.item(), value_loss=value_loss.item(),
                     entropy=float(entropy_categorical(logits.detach()).mean()), kl=float(kl), grad_norm=gnorm,
                     lr=opt.param_groups[0]["lr"], explained_variance=float(ev))
        if run.update(collector, **stats):
            break

    model.eval()
    return model, run.close(envs)
