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
     :class:`rlkit.objectives.AdaptiveKLController` (``kl_target``, ``kl_rule``);
   * plus ``vf_coef`` x value loss minus ``ent_coef`` x entropy; one Adam step with the global
     gradient norm clipped to ``max_grad_norm``.

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
* global gradient clipping - yes (``max_grad_norm=0.5``);
* entropy bonus - available (``ent_coef``, default 0 as in rl-zoo's CartPole settings);
* early stop of the epochs when the approximate KL exceeds ``target_kl`` - optional (None).

Learning-rate control by KL (chapter 6): pass ``lr_controller``, any callable
``lr_controller(kl, lr) -> new_lr`` that sees the measured KL(pi_old || pi_new) of each iteration
and returns the learning rate for the next one; :class:`KLLearningRateController` is the classic
rule (divide the lr by ``factor`` when KL > ``band`` x target, multiply when KL < target / ``band``).

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

from typing import Callable

import torch

from ..divergences import entropy_categorical, kl_categorical
from ..objectives import AdaptiveKLController, normalize_advantages as _normalize, ppo_clip_loss
from ..returns import from_gymnasium, gae
from ._common import Run, adam, check_float, check_pos_int, clip_grad, setup

__all__ = ["train_ppo", "ppo_update", "KLLearningRateController"]


class KLLearningRateController:
    """A KL-triggered learning-rate controller: ``lr_new = controller(kl, lr)``.

    .. math::  \\eta \\leftarrow \\begin{cases} \\eta / f & \\text{if } KL > b\\,\\delta \\\\
               \\eta \\cdot f & \\text{if } KL < \\delta / b \\\\ \\eta & \\text{otherwise} \\end{cases}

    clipped to ``[lr_min, lr_max]``, with target ``delta = target_kl``, factor ``f`` and band ``b``.
    It closes the loop of chapter 6: the step size is adjusted by the measured size of the policy
    change rather than by a fixed schedule.  ``history`` records every (kl, lr) it saw.
    """

    def __init__(self, target_kl: float = 0.01, factor: float = 1.5, band: float = 2.0,
                 lr_min: float = 1e-6, lr_max: float = 1e-1):
        check_float(target_kl, "target_kl", 0.0, lo_open=True)
        check_float(factor, "factor", 1.0)
        check_float(band, "band", 1.0)
        check_float(lr_min, "lr_min", 0.0)
        check_float(lr_max, "lr_max", lr_min)
        self.target_kl, self.factor, self.band, self.lr_min, self.lr_max = target_kl, factor, band, lr_min, lr_max
        self.history: list[tuple[float, float]] = []

    def __call__(self, kl: float, lr: float) -> float:
        if kl > self.band * self.target_kl:
            lr = lr / self.factor
        elif kl < self.target_kl / self.band:
            lr = lr * self.factor
        lr = min(max(lr, self.lr_min), self.lr_max)
        self.history.append((float(kl), float(lr)))
        return lr


def train_ppo(env_id: str | Callable = "CartPole-v1", total_steps: int = 100_000, num_envs: int = 8,
              num_steps: int = 32, lr: float = 2e-3, anneal_lr: bool | None = None,
              gamma: float = 0.98, gae_lambda: float = 0.8, epochs: int = 20, num_minibatches: int = 1,
              mode: str = "clip", clip_eps: float = 0.2, clip_eps_high: float | None = None,
              dual_clip: float | None = None, anneal_clip: bool | None = None, kl_coef: float = 1.0,
              kl_target: float = 0.01, kl_rule: str = "ppo", clip_value: float | None = None,
              ent_coef: float = 0.0, vf_coef: float = 0.5, max_grad_norm: float | None = 0.5, normalize_advantages: bool = True,
              target_kl: float | None = None, lr_controller: Callable[[float, float], float] | None = None,
              seed: int = 0, device=None, progress: bool = True, hidden: int = 64,
              target_return: float | None = None, target_window: int = 20,
              callback: Callable | None = None, threads: int | None = 1):
    """Train a categorical actor-critic with PPO; returns ``(model, history)``.

    Args:
        num_steps: rollout length per env (batch = num_envs * num_steps).
        lr: Adam learning rate (initial value when annealed or controlled).
        anneal_lr: linear decay to 0 over total_steps; default (None) = True unless an
            ``lr_controller`` is given (the two are exclusive).
        gamma, gae_lambda: discount and GAE lambda.
        epochs: passes over each batch (K); num_minibatches: minibatches per pass.
        mode: "clip" (PPO-clip) or "penalty" (adaptive KL penalty, PPO-penalty).
        clip_eps, clip_eps_high, dual_clip: clip range (lower/upper) and dual-clip constant (clip mode).
        anneal_clip: shrink the clip range(s) linearly to 0 over total_steps, like the learning rate
            (rl-zoo's ``clip_range: lin_0.2``); default (None) = the resolved ``anneal_lr``, so a run
            driven by an ``lr_controller`` keeps a fixed clip range.
        kl_coef, kl_target, kl_rule: initial beta, target KL and the AdaptiveKLController rule
            (penalty mode).
        clip_value: if a number, clip V around the rollout values by this much (PPO2's value clip).
        ent_coef, vf_coef: entropy bonus and value loss weight.
        max_grad_norm: global gradient-norm clip (None: off).
        normalize_advantages: standardise advantages within each minibatch.
        target_kl: stop the epochs of an iteration early once the minibatch approximate KL exceeds it.
        lr_controller: ``f(kl, lr) -> lr`` called after each iteration with the exact mean
            KL(pi_old || pi_new); see :class:`KLLearningRateController`.
        Other arguments as in :func:`rlkit.algos.train_reinforce`.
    """
    check_pos_int(total_steps, "total_steps")
    check_pos_int(num_steps, "num_steps")
    check_pos_int(epochs, "epochs")
    check_pos_int(num_minibatches, "num_minibatches")
    check_float(lr, "lr", 0.0, lo_open=True)
    check_float(gamma, "gamma", 0.0, 1.0)
    check_float(gae_lambda, "gae_lambda", 0.0, 1.0)
    if mode not in ("clip", "penalty"):
        raise ValueError(f"mode must be 'clip' or 'penalty', got {mode!r}")
    check_float(clip_eps, "clip_eps", 0.0, lo_open=True)
    check_float(kl_coef, "kl_coef")
    check_float(kl_target, "kl_target", 0.0, lo_open=True)
    for name, v in (("clip_value", clip_value), ("max_grad_norm", max_grad_norm), ("target_kl", target_kl)):
        if v is not None:
            check_float(v, name, 0.0, lo_open=True)
    check_float(ent_coef, "ent_coef")
    check_float(vf_coef, "vf_coef")
    if lr_controller is not None and not callable(lr_controller):
        raise TypeError(f"lr_controller must be callable f(kl, lr) -> lr, got {type(lr_controller).__name__}")
    if anneal_lr is None:
        anneal_lr = lr_controller is None
    if anneal_clip is None:
        anneal_clip = anneal_lr
    if anneal_lr and lr_controller is not None:
        raise ValueError("anneal_lr=True and an lr_controller both set the learning rate; choose one")
    if num_envs * num_steps < num_minibatches:
        raise ValueError(f"num_minibatches={num_minibatches} exceeds the batch size num_envs*num_steps="
                         f"{num_envs * num_steps}")
    config = {k: v for k, v in locals().items() if isinstance(v, (int, float, str, bool, type(None)))}
    config["env_id"] = str(env_id)

    envs, model, collector, dev = setup(env_id, num_envs, seed, device, hidden, threads)
    opt = adam(list(model.parameters()), lr, dev, eps=1e-5)
    kl_ctl = AdaptiveKLController(init_beta=kl_coef, target=kl_target, rule=kl_rule) if mode == "penalty" else None
    run = Run(f"ppo-{mode}", config, total_steps, progress, target_return, target_window, callback)
    batch_size = num_envs * num_steps

    while True:
        frac = max(0.0, 1.0 - collector.env_steps / total_steps)     # fraction of the budget left
        if anneal_lr:
            opt.param_groups[0]["lr"] = lr * frac
        eps_lo = max(clip_eps * frac, 1e-8) if anneal_clip else clip_eps
        eps_hi = clip_eps_high
        if eps_hi is not None and anneal_clip:
            eps_hi = max(eps_hi * frac, 1e-8)

        # 1. rollout with pi_old, V(s_t), V(true s_{t+1})
        batch = collector.collect(model.actor.act, num_steps, value_fn=model.critic)

        # 2. advantages and value targets (time last: [N, T])
        discounts, lam_mask = from_gymnasium(batch.terminated, batch.truncated, gamma)
        adv, returns = gae(batch.rewards, batch.values, batch.next_values, discounts, gae_lambda * lam_mask)

        # flatten [N, T] -> [B]: the loss does not care about order any more
        obs = batch.obs.reshape(batch_size, -1)
        actions, logp_old = batch.actions.reshape(-1), batch.logp.reshape(-1)
        adv, returns, values_old = adv.reshape(-1), returns.reshape(-1), batch.values.reshape(-1)
        beta = kl_ctl.beta if kl_ctl is not None else 0.0

        # 3. K epochs of minibatch updates on this batch (see ppo_update below)
        stats = ppo_update(model, opt, obs, actions, logp_old, adv, returns, values_old, epochs=epochs,
                           num_minibatches=num_minibatches, mode=mode, clip_eps=eps_lo, clip_eps_high=eps_hi,
                           dual_clip=dual_clip, beta=beta, clip_value=clip_value,
                           ent_coef=ent_coef, vf_coef=vf_coef, max_grad_norm=max_grad_norm,
                           normalize_advantages=normalize_advantages, target_kl=target_kl)
        stats["lr"] = opt.param_groups[0]["lr"]
        if mode == "clip":
            stats["clip_eps"] = eps_lo

        # 4. adapt beta (penalty mode) and the learning rate (controller) to the measured KL
        kl_exact = stats["kl"]
        if kl_ctl is not None:
            stats["kl_coef"] = beta
            kl_ctl.update(kl_exact)
        if lr_controller is not None:
            opt.param_groups[0]["lr"] = float(lr_controller(kl_exact, opt.param_groups[0]["lr"]))
        if run.update(collector, **stats):
            break

    model.eval()
    return model, run.close(envs)


def ppo_update(model, opt: torch.optim.Optimizer, obs: torch.Tensor, actions: torch.Tensor,
               logp_old: torch.Tensor, adv: torch.Tensor, returns: torch.Tensor, values_old: torch.Tensor, *,
               epochs: int = 10, num_minibatches: int = 1, mode: str = "clip", clip_eps: float = 0.2,
               clip_eps_high: float | None = None, dual_clip: float | None = None, beta: float = 0.0,
               clip_value: float | None = None, ent_coef: float = 0.0, vf_coef: float = 0.5,
               max_grad_norm: float | None = 0.5, normalize_advantages: bool = True,
               target_kl: float | None = None) -> dict:
    r"""The optimisation phase of one PPO iteration: ``epochs`` passes of minibatch Adam steps on a fixed batch.

    Inputs are flat over the batch (``B = num_envs * num_steps``): ``obs [B, obs_dim]``,
    ``actions, logp_old, adv, returns, values_old`` all ``[B]`` (advantages and value targets from
    GAE, ``values_old`` = V(s) at rollout time).  Per minibatch the loss is

    .. math:: L = L^{\pi} + c_v\,\tfrac12\,\overline{(V_\phi(s) - \hat R)^2} - c_e\,\overline{\mathcal H[\pi_\theta(\cdot|s)]}

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
    check_pos_int(epochs, "epochs")
    check_pos_int(num_minibatches, "num_minibatches")
    if num_minibatches > B:
        raise ValueError(f"num_minibatches={num_minibatches} exceeds the batch size {B}")
    if mode not in ("clip", "penalty"):
        raise ValueError(f"mode must be 'clip' or 'penalty', got {mode!r}")
    mb_size = B // num_minibatches
    with torch.no_grad():
        logits_old = model.actor(obs)

    sums = dict(loss=0.0, policy_loss=0.0, value_loss=0.0, approx_kl=0.0, clip_frac=0.0, grad_norm=0.0)
    n_mb, epochs_run = 0, 0
    for epoch in range(epochs):
        perm = torch.randperm(B, device=obs.device)
        epoch_kl = []
        for start in range(0, mb_size * num_minibatches, mb_size):
            idx = perm[start:start + mb_size]
            logp, entropy, v, logits = model.evaluate(obs[idx], actions[idx])
            a = _normalize(adv[idx]) if normalize_advantages else adv[idx]
            if mode == "clip":
                pg_loss, st = ppo_clip_loss(logp, logp_old[idx], a, eps=clip_eps, eps_high=clip_eps_high,
                                            dual_clip=dual_clip)
                approx_kl, clip_frac = float(st["approx_kl"]), float(st["clip_fraction"])
            else:
                kl = kl_categorical(logits_old[idx], logits).mean()
                pg_loss = -(torch.exp(logp - logp_old[idx]) * a).mean() + beta * kl
                approx_kl, clip_frac = kl.item(), 0.0
            if clip_value is None:
                v_loss = 0.5 * ((v - returns[idx]) ** 2).mean()
            else:
                v_clipped = values_old[idx] + (v - values_old[idx]).clamp(-clip_value, clip_value)
                v_loss = 0.5 * torch.max((v - returns[idx]) ** 2, (v_clipped - returns[idx]) ** 2).mean()
            loss = pg_loss + vf_coef * v_loss - ent_coef * entropy.mean()

            opt.zero_grad()
            loss.backward()
            gn = clip_grad(model.parameters(), max_grad_norm)   # norm before clipping
            opt.step()

            n_mb += 1
            epoch_kl.append(approx_kl)
            for k, x in (("loss", loss.item()), ("policy_loss", pg_loss.item()), ("value_loss", v_loss.item()),
                         ("approx_kl", approx_kl), ("clip_frac", clip_frac), ("grad_norm", gn)):
                sums[k] += x
        epochs_run += 1
        if target_kl is not None and sum(epoch_kl) / len(epoch_kl) > target_kl:
            break

    with torch.no_grad():
        kl_exact = float(kl_categorical(logits_old, model.actor(obs)).mean())
        var_r = returns.var()
        ev = float(1.0 - (returns - values_old).var() / var_r) if var_r > 0 else float("nan")
    stats = {k: x / n_mb for k, x in sums.items()}
    stats.update(kl=kl_exact, entropy=float(entropy_categorical(logits_old).mean()), epochs_run=epochs_run,
                 explained_variance=ev)
    return stats
