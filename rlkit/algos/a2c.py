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

   with the global gradient norm clipped to ``grad_clip``.

``gae_lambda=1`` gives the n-step Monte Carlo advantage of the original A2C; ``gae_lambda=0`` the
one-step TD error.  Per-update stats: ``loss``, ``policy_loss``, ``value_loss``, ``entropy``,
``kl`` (KL(pi_old || pi_new) after the step), ``grad_norm``, ``lr``, ``explained_variance``.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from ..divergences import entropy_categorical, kl_categorical
from ..objectives import normalize_advantages as _normalize
from ..objectives import policy_gradient_loss
from ..returns import from_gymnasium, gae
from ._common import Run, adam, config_of, setup, step
from .configs import A2CConfig

__all__ = ["train_a2c"]


def train_a2c(env: str | Callable = "CartPole-v1", cfg: A2CConfig | None = None, *,
              callback: Callable | None = None, progress: bool = True, device=None, threads: int | None = 1):
    """Train a categorical actor and a value critic with A2C + GAE; returns ``(model, history)``.

    Args:
        env: a gymnasium id (Box observations, Discrete actions) or a constructor.
        cfg: an :class:`rlkit.algos.A2CConfig` (default: ``A2CConfig()``); one Adam optimiser for
            the actor and the critic (separate networks).
        callback, progress, device, threads: as in :func:`rlkit.algos.train_reinforce`.
    """
    cfg = config_of(cfg, A2CConfig)
    run = Run("a2c", env, cfg, progress, callback)
    envs, model, collector, dev = setup(env, cfg, device, threads)
    opt = adam(list(model.parameters()), cfg.lr, dev)

    while True:
        if cfg.anneal_lr:
            opt.param_groups[0]["lr"] = cfg.lr * max(0.0, 1.0 - collector.env_steps / cfg.total_steps)
        # 1. rollout [N, T] with V(s_t) and V(true s_{t+1})
        batch = collector.collect(model.actor.act, cfg.num_steps, value_fn=model.critic)

        # 2. GAE; the trace is cut at every episode end inside the rollout
        discounts, lam_mask = from_gymnasium(batch.terminated, batch.truncated, cfg.gamma)
        adv, returns = gae(batch.rewards, batch.values, batch.next_values, discounts, cfg.gae_lambda * lam_mask)
        if cfg.normalize_advantages:
            adv = _normalize(adv)

        # 3. one step on the combined loss
        logp, entropy, v, logits = model.evaluate(batch.obs, batch.actions)
        policy_loss = policy_gradient_loss(logp, adv)           # -mean(logp * A)
        value_loss = ((v - returns) ** 2).mean()
        loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy.mean()
        gnorm = step(opt, loss, model.parameters(), cfg.grad_clip)   # norm before clipping

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
