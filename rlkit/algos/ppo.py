r"""PPO (Schulman et al., 2017): clipped surrogate or adaptive KL penalty (chapters 4-6).

One update (one "iteration"):

1. Rollout: ``num_envs`` environments x ``num_steps`` steps with the current policy pi_old
   (:meth:`rlkit.rollout.RolloutCollector.collect`, SAME_STEP autoreset, V(final obs) at truncations).
2. GAE advantages and value targets (:func:`rlkit.returns.gae`, ``lam = gae_lambda * lam_mask`` from
   :func:`rlkit.returns.from_gymnasium`).
3. ``epochs`` passes over the batch (K reuses of the same data; chapter 5), each shuffled and cut into
   ``num_minibatches`` minibatches.  On each minibatch, with :math:`\rho = \exp(\log\pi_\theta - \log\pi_{old})`:

   * ``mode="clip"`` (PPO-clip, :func:`rlkit.objectives.ppo_clip_loss`):
     :math:`L^{clip} = -\mathbb E[\min(\rho \hat A, \operatorname{clip}(\rho, 1-\epsilon, 1+\epsilon_{high})\hat A)]`
     (optionally dual-clipped);
   * ``mode="penalty"`` (PPO-penalty): :math:`L = -\mathbb E[\rho \hat A] + \beta\,
     \mathbb E_s[\mathrm{KL}(\pi_{old}(\cdot|s)\,\|\,\pi_\theta(\cdot|s))]` with the exact categorical KL
     (:func:`rlkit.divergences.kl_categorical`) and :math:`\beta` adapted after every iteration by
     :class:`rlkit.controllers.AdaptiveKLController` (``kl_target``, ``kl_rule``);
   * plus ``vf_coef`` x value loss minus ``ent_coef`` x entropy; one Adam step with the global
     gradient norm clipped to ``grad_clip``.

The well-known implementation details (Huang et al., "The 37 implementation details of PPO", 2022),
and which this trainer uses:

* orthogonal initialisation, gains sqrt(2) / 0.01 (policy head) / 1 (value head) - yes (rlkit.nets);
* separate actor and critic networks, tanh activations - yes;
* Adam with eps=1e-5 - yes;
* learning rate annealed linearly to 0 over ``total_steps`` - yes (``anneal_lr=True``), unless an
  ``lr_controller`` drives the learning rate; the clip range too (``anneal_clip=True``, as rl-zoo);
* GAE with the trace cut at episode ends and V(final obs) bootstrapped at truncations - yes;
* advantage normalisation per minibatch - yes (``normalize_advantages=True``);
* clipped value loss - optional (``clip_value=None`` by default: it did not help here);
* global gradient clipping - yes (``grad_clip=0.5``);
* entropy bonus - available (``ent_coef``, default 0 as in rl-zoo's CartPole settings);
* early stop of the epochs when the approximate KL exceeds ``target_kl`` - optional (None).

Learning-rate control by KL (chapter 6): pass ``lr_controller``, any callable
``lr_controller(kl, lr) -> new_lr`` that sees the measured KL(pi_old || pi_new) of each iteration
and returns the learning rate for the next one; :class:`rlkit.controllers.KLLearningRateController`
is the classic rule (divide the lr by ``factor`` when KL > ``band`` x target, multiply when
KL < target / ``band``).

Default hyperparameters (tuned on CartPole-v1 with benchmarks/bench_ppo_cartpole.py): 8 envs x 32
steps (batch 256), ONE minibatch, 20 epochs, Adam lr 2e-3, learning rate AND clip range 0.2 both
annealed linearly to 0 over ``total_steps`` (tuned with ``total_steps=100_000``), gamma 0.98, GAE
lambda 0.8, value coefficient 0.5, no entropy bonus, gradient clip 0.5.  Over 20 seeds they reached
a 20-episode mean return of 475 in a median of about 24k env steps (worst about 34k).  Short
rollouts with many epochs on one minibatch make each sample count.  rl-zoo's tuned settings for
SB3 are the same except lr 1e-3; with lr 1e-3 this trainer needs about 31k steps, as SB3 does.

Per-iteration stats: ``loss``, ``policy_loss``, ``value_loss``, ``entropy``, ``kl`` (exact mean
KL(pi_old || pi_new) over the batch after the epochs), ``approx_kl`` (the k3 estimate from the
minibatches, as reported by ``ppo_clip_loss``), ``clip_frac``, ``grad_norm`` (mean before clipping),
``lr``, ``epochs_run``, ``explained_variance`` and, in penalty mode, ``kl_coef`` (beta used).
"""
from __future__ import annotations

import copy
import math
from collections.abc import Callable

import numpy as np
import torch

from .. import _validate as V
from ..controllers import AdaptiveKLController
from ..divergences import entropy_categorical, kl_categorical
from ..objectives import normalize_advantages as _normalize
from ..objectives import ppo_clip_loss
from ..returns import from_gymnasium, gae
from ._common import Run, adam, config_of, setup, step
from .configs import PPOConfig

__all__ = ["train_ppo", "ppo_update", "reuse_one_batch"]


def train_ppo(env: str | Callable = "CartPole-v1", cfg: PPOConfig | None = None, *,
              lr_controller: Callable[[float, float], float] | None = None, callback: Callable | None = None,
              progress: bool = True, device=None, threads: int | None = 1):
    """Train a categorical actor-critic with PPO; returns ``(model, history)``.

    Args:
        env: a gymnasium id (Box observations, Discrete actions) or a constructor.
        cfg: a :class:`rlkit.algos.PPOConfig` (default: ``PPOConfig()``, the tuned CartPole settings).
        lr_controller: ``f(kl, lr) -> lr`` called after each iteration with the exact mean
            KL(pi_old || pi_new); see :class:`rlkit.controllers.KLLearningRateController`. A returned
            learning rate that is not a finite number > 0 is refused (``ValueError``). It has state
            (its own history), so it is an argument, not a config field; with it, ``cfg.anneal_lr``
            must not be True (both would set the learning rate).
        callback, progress, device, threads: as in :func:`rlkit.algos.train_reinforce`.

    ``history.config`` records the config with ``anneal_lr`` and ``anneal_clip`` resolved.
    """
    cfg = config_of(cfg, PPOConfig)
    if lr_controller is not None and not callable(lr_controller):
        raise TypeError(f"lr_controller must be callable f(kl, lr) -> lr, got {type(lr_controller).__name__}")
    if cfg.anneal_lr and lr_controller is not None:
        raise ValueError("PPOConfig.anneal_lr=True and an lr_controller both set the learning rate; choose one")
    anneal_lr = lr_controller is None if cfg.anneal_lr is None else cfg.anneal_lr
    cfg = cfg.replace(anneal_lr=anneal_lr, anneal_clip=anneal_lr if cfg.anneal_clip is None else cfg.anneal_clip)
    mode, lr, clip_eps = cfg.mode, cfg.lr, cfg.clip_eps

    run = Run(f"ppo-{mode}", env, cfg, progress, callback)
    envs, model, collector, dev = setup(env, cfg, device, threads)
    opt = adam(list(model.parameters()), lr, dev, eps=1e-5)
    kl_ctl = (AdaptiveKLController(init_beta=cfg.kl_coef, target=cfg.kl_target, rule=cfg.kl_rule)
              if mode == "penalty" else None)
    batch_size = cfg.num_envs * cfg.num_steps

    while True:
        frac = max(0.0, 1.0 - collector.env_steps / cfg.total_steps)     # fraction of the budget left
        if cfg.anneal_lr:
            opt.param_groups[0]["lr"] = lr * frac
        eps_lo = max(clip_eps * frac, 1e-8) if cfg.anneal_clip else clip_eps
        eps_hi = cfg.clip_eps_high
        if eps_hi is not None and cfg.anneal_clip:
            eps_hi = max(eps_hi * frac, 1e-8)

        # 1. rollout with pi_old, V(s_t), V(true s_{t+1})
        batch = collector.collect(model.actor.act, cfg.num_steps, value_fn=model.critic)

        # 2. advantages and value targets (time last: [N, T])
        discounts, lam_mask = from_gymnasium(batch.terminated, batch.truncated, cfg.gamma)
        adv, returns = gae(batch.rewards, batch.values, batch.next_values, discounts, cfg.gae_lambda * lam_mask)

        # flatten [N, T] -> [B]: the loss does not care about order any more
        obs = batch.obs.reshape(batch_size, -1)
        actions, logp_old = batch.actions.reshape(-1), batch.logp.reshape(-1)
        adv, returns, values_old = adv.reshape(-1), returns.reshape(-1), batch.values.reshape(-1)
        beta = kl_ctl.beta if kl_ctl is not None else 0.0

        # 3. K epochs of minibatch updates on this batch (see ppo_update below)
        stats = ppo_update(model, opt, obs, actions, logp_old, adv, returns, values_old, epochs=cfg.epochs,
                           num_minibatches=cfg.num_minibatches, mode=mode, clip_eps=eps_lo, clip_eps_high=eps_hi,
                           dual_clip=cfg.dual_clip, beta=beta, clip_value=cfg.clip_value,
                           ent_coef=cfg.ent_coef, vf_coef=cfg.vf_coef, grad_clip=cfg.grad_clip,
                           normalize_advantages=cfg.normalize_advantages, target_kl=cfg.target_kl)
        stats["lr"] = opt.param_groups[0]["lr"]
        if mode == "clip":
            stats["clip_eps"] = eps_lo

        # 4. adapt beta (penalty mode) and the learning rate (controller) to the measured KL
        kl_exact = stats["kl"]
        if kl_ctl is not None:
            stats["kl_coef"] = beta
            kl_ctl.update(kl_exact)
        if lr_controller is not None:
            opt.param_groups[0]["lr"] = _controlled_lr(lr_controller(kl_exact, opt.param_groups[0]["lr"]))
        if run.update(collector, **stats):
            break

    model.eval()
    return model, run.close(envs)


def _controlled_lr(lr) -> float:
    """The learning rate an ``lr_controller`` returned, refused unless a finite number > 0 (Adam with a
    negative rate ascends the loss; NaN turns every weight into NaN)."""
    try:
        return V.real_in(lr, "lr", 0.0, lo_open=True)
    except (TypeError, ValueError) as e:
        raise type(e)(f"lr_controller returned {lr!r}, but the next learning rate must be a finite number > 0 "
                      f"(a negative one makes Adam ascend the loss, NaN makes every weight NaN)") from None


def ppo_update(model, opt: torch.optim.Optimizer, obs: torch.Tensor, actions: torch.Tensor,
               logp_old: torch.Tensor, adv: torch.Tensor, returns: torch.Tensor, values_old: torch.Tensor, *,
               epochs: int = 10, num_minibatches: int = 1, mode: str = "clip", clip_eps: float = 0.2,
               clip_eps_high: float | None = None, dual_clip: float | None = None, beta: float = 0.0,
               clip_value: float | None = None, ent_coef: float = 0.0, vf_coef: float = 0.5,
               grad_clip: float | None = 0.5, normalize_advantages: bool = True,
               target_kl: float | None = None) -> dict:
    r"""The optimisation phase of one PPO iteration: ``epochs`` passes of minibatch Adam steps on a fixed batch.

    Inputs are flat over the batch (``B = num_envs * num_steps``): ``obs [B, obs_dim]``,
    ``actions, logp_old, adv, returns, values_old`` all ``[B]`` (advantages and value targets from
    GAE, ``values_old`` = V(s) at rollout time).  Per minibatch the loss is

    .. math::

        L = L^{\pi} + c_v\,\tfrac12\,\overline{(V_\phi(s) - \hat R)^2}
            - c_e\,\overline{\mathcal H[\pi_\theta(\cdot|s)]}

    with :math:`L^{\pi}` = :func:`rlkit.objectives.ppo_clip_loss` (``mode="clip"``) or
    :math:`-\overline{\rho \hat A} + \beta\,\overline{\mathrm{KL}(\pi_{old}\|\pi_\theta)}` (``mode="penalty"``);
    with ``clip_value`` the value error is the larger of the unclipped and the clipped-around-``values_old``
    one.  Stops after an epoch whose mean approximate KL exceeds ``target_kl`` (if given; the
    approximate KL is the k3 estimate on each minibatch measured BEFORE its step, as in CleanRL).

    Returns the stats of the iteration (means over minibatches): ``loss``, ``policy_loss``,
    ``value_loss``, ``approx_kl``, ``clip_frac``, ``grad_norm``; and ``kl`` (exact mean
    KL(pi_old || pi_new) over the batch after the update), ``entropy`` (of pi_old), ``epochs_run``,
    ``explained_variance`` (of ``values_old`` w.r.t. ``returns``).  Chapters 4-5 (the effect of ``epochs``).
    """
    B = obs.shape[0]
    for name, x in (("actions", actions), ("logp_old", logp_old), ("adv", adv), ("returns", returns),
                    ("values_old", values_old)):
        if not isinstance(x, torch.Tensor) or x.shape != (B,):
            raise ValueError(f"{name} must be a tensor of shape [{B}] (flat over the batch), got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
    V.int_in(epochs, "epochs")
    V.int_in(num_minibatches, "num_minibatches")
    V.fits(num_minibatches, "num_minibatches", B, "the batch size")
    V.choice(mode, "mode", ("clip", "penalty"))
    with torch.no_grad():
        logits_old = model.actor(obs)

    def policy_loss(idx, logp, logits, a):
        if mode == "clip":
            pg_loss, st = ppo_clip_loss(logp, logp_old[idx], a, eps=clip_eps, eps_high=clip_eps_high,
                                        dual_clip=dual_clip)
            return pg_loss, dict(approx_kl=float(st["approx_kl"]), clip_frac=float(st["clip_fraction"]))
        kl = kl_categorical(logits_old[idx], logits).mean()
        pg_loss = -(torch.exp(logp - logp_old[idx]) * a).mean() + beta * kl
        return pg_loss, dict(approx_kl=kl.item(), clip_frac=0.0)

    stats, epochs_run = ppo_epochs(model, opt, obs, actions, adv, returns, policy_loss, epochs=epochs,
                                    num_minibatches=num_minibatches, vf_coef=vf_coef, ent_coef=ent_coef,
                                    grad_clip=grad_clip, normalize_advantages=normalize_advantages,
                                    values_old=values_old, clip_value=clip_value, target_kl=target_kl)
    with torch.no_grad():
        kl_exact = float(kl_categorical(logits_old, model.actor(obs)).mean())
        var_r = returns.var()
        ev = float(1.0 - (returns - values_old).var() / var_r) if var_r > 0 else float("nan")
    stats.update(kl=kl_exact, entropy=float(entropy_categorical(logits_old).mean()), epochs_run=epochs_run,
                 explained_variance=ev)
    return stats


def ppo_epochs(model, opt: torch.optim.Optimizer, obs: torch.Tensor, actions: torch.Tensor, adv: torch.Tensor,
                returns: torch.Tensor, policy_loss, *, epochs: int, num_minibatches: int, vf_coef: float,
                ent_coef: float, grad_clip: float | None, normalize_advantages: bool,
                values_old: torch.Tensor | None = None, clip_value: float | None = None,
                target_kl: float | None = None) -> tuple[dict, int]:
    r"""``epochs`` shuffled passes over a fixed batch in ``num_minibatches`` minibatches, one Adam step each.

    The PPO family's optimisation loop, shared by :func:`ppo_update` and
    :func:`rlkit.algos.stale_ppo.train_stale_ppo`, which differ only in the policy term
    ``policy_loss(idx, logp, logits, a) -> (loss, stats)`` (``idx`` the minibatch's rows, ``logp`` and
    ``logits`` of :math:`\pi_\theta` on them, ``a`` their advantages, standardised within the
    minibatch if ``normalize_advantages``). Per minibatch

    .. math::

        L = L^{\pi} + c_v\,\tfrac12\,\overline{(V_\phi(s) - \hat R)^2}
            - c_e\,\overline{\mathcal H[\pi_\theta(\cdot|s)]},

    with the value error clipped around ``values_old`` by ``clip_value`` if given. After an epoch whose
    mean ``stats["approx_kl"]`` exceeds ``target_kl`` (if given) the passes stop.

    Returns ``(means over the minibatches of loss, policy_loss, value_loss, the policy term's stats
    and grad_norm (before clipping), epochs run)``.
    """
    B = obs.shape[0]
    mb_size = B // num_minibatches
    sums, n_mb, epochs_run = {}, 0, 0
    for _ in range(epochs):
        perm = torch.randperm(B, device=obs.device)
        epoch_kl = []
        for start in range(0, mb_size * num_minibatches, mb_size):
            idx = perm[start:start + mb_size]
            logp, entropy, v, logits = model.evaluate(obs[idx], actions[idx])
            a = _normalize(adv[idx]) if normalize_advantages else adv[idx]
            pg_loss, st = policy_loss(idx, logp, logits, a)
            if clip_value is None:
                v_loss = 0.5 * ((v - returns[idx]) ** 2).mean()
            else:
                v_clipped = values_old[idx] + (v - values_old[idx]).clamp(-clip_value, clip_value)
                v_loss = 0.5 * torch.max((v - returns[idx]) ** 2, (v_clipped - returns[idx]) ** 2).mean()
            loss = pg_loss + vf_coef * v_loss - ent_coef * entropy.mean()
            gn = step(opt, loss, model.parameters(), grad_clip)   # norm before clipping

            n_mb += 1
            epoch_kl.append(st.get("approx_kl", 0.0))
            for k, x in (("loss", loss.item()), ("policy_loss", pg_loss.item()), ("value_loss", v_loss.item()),
                         *st.items(), ("grad_norm", gn)):
                sums[k] = sums.get(k, 0.0) + x
        epochs_run += 1
        if target_kl is not None and sum(epoch_kl) / len(epoch_kl) > target_kl:
            break
    return {k: x / n_mb for k, x in sums.items()}, epochs_run


def reuse_one_batch(model, data, epochs: int = 32, clip: bool = True, lr: float = 2.5e-3, *,
                    clip_eps: float = 0.2, grad_clip: float | None = 0.5, band: float = 0.2) -> np.ndarray:
    r"""Take ``epochs`` full-batch PPO steps on ONE fixed batch and measure the drift after each (chapter 5).

    A copy of ``model.actor`` is trained (``model`` is left unchanged) with Adam (``lr``, eps
    :math:`10^{-5}`, the global gradient norm clipped to ``grad_clip``) on the clipped surrogate
    :func:`rlkit.objectives.ppo_clip_loss` with radius ``clip_eps`` (``clip=True``) or on the bare
    importance-sampled surrogate :math:`-\overline{\rho_\theta \hat A}` (``clip=False``), where
    :math:`\rho_\theta = \pi_\theta(a|s)/\mu(a|s)` and :math:`\mu` is the policy that sampled the batch.
    Before the first step and after every step it records

    * the exact mean :math:`\mathrm{KL}(\mu(\cdot|s)\,\|\,\pi_\theta(\cdot|s))` over the batch's states,
    * Kish's effective sample size of the ratios as a share of the batch,
      :math:`(\sum_i\rho_i)^2 / (n\sum_i\rho_i^2)` (:func:`rlkit.estimators.effective_sample_size`),
    * the share of ratios outside :math:`[1 - b, 1 + b]`, :math:`b` = ``band``.

    Args:
        model: an :class:`rlkit.nets.ActorCritic` whose actor is the behaviour policy :math:`\mu`.
        data: ``(obs [n, obs_dim], actions [n], logp_old [n], adv [n])`` from :math:`\mu`, flat over
            the batch; ``adv`` is used as given (normalise it beforehand if wanted).
        epochs: number of steps (each on the whole batch).
        clip: PPO-clip (True) or the unclipped surrogate (False).
        lr, clip_eps, grad_clip, band: as above.

    Returns:
        ``[epochs + 1, 3]`` array: row ``k`` is (KL, ESS / n, share outside the band) after ``k`` steps;
        row 0 is (0, 1, 0) up to rounding.
    """
    from ..estimators import effective_sample_size

    if not isinstance(data, (tuple, list)) or len(data) != 4:
        raise TypeError("data must be a tuple (obs, actions, logp_old, adv)")
    obs, actions, logp_old, adv = data
    V.float_tensor(obs, "data[0] (obs)", min_dim=2)
    n = obs.shape[0]
    for name, x in (("data[1] (actions)", actions), ("data[2] (logp_old)", logp_old), ("data[3] (adv)", adv)):
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != (n,):
            raise ValueError(f"{name} must be a tensor of shape [{n}] (one entry per row of obs), got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
    if n == 0:
        raise ValueError("data holds an empty batch (obs has 0 rows); reuse_one_batch needs samples")
    V.int_in(epochs, "epochs")
    V.boolean(clip, "clip")
    V.real_in(lr, "lr", 0.0, lo_open=True)
    V.real_in(clip_eps, "clip_eps", 0.0, 1.0, lo_open=True, hi_open=True)
    if grad_clip is not None:
        V.real_in(grad_clip, "grad_clip", 0.0, lo_open=True)
    V.real_in(band, "band", 0.0, lo_open=True)

    actor = copy.deepcopy(model.actor)
    opt = torch.optim.Adam(actor.parameters(), lr=lr, eps=1e-5)
    with torch.no_grad():
        logits_old = model.actor(obs)
    rows = []
    for epoch in range(epochs + 1):
        with torch.no_grad():                                  # measure the drift so far
            logits = actor(obs)
            log_ratio = torch.log_softmax(logits, -1).gather(-1, actions[:, None])[:, 0] - logp_old
            rows.append([kl_categorical(logits_old, logits).mean().item(),
                         effective_sample_size(log_ratio).item() / len(log_ratio),
                         ((log_ratio.exp() - 1).abs() > band).float().mean().item()])
        if epoch == epochs:
            break
        logp = actor.log_prob(obs, actions)
        if clip:
            loss, _ = ppo_clip_loss(logp, logp_old, adv, eps=clip_eps)
        else:
            loss = -(torch.exp(logp - logp_old) * adv).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(actor.parameters(), math.inf if grad_clip is None else grad_clip)
        opt.step()
    return np.array(rows)
