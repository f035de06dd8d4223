r"""TRPO (Schulman et al., 2015): a natural-gradient step with a hard KL trust region (chapter 4).

One update:

1. Rollout (``num_envs`` x ``num_steps``, SAME_STEP autoreset) and GAE advantages, normalised.
2. The surrogate to minimise, :math:`\mathcal L(\theta) = -\frac1B\sum_b \rho_b(\theta)\hat A_b`,
   :math:`\rho_b = \exp(\log\pi_\theta(a_b|s_b) - \log\pi_{old}(a_b|s_b))`, and its gradient
   :math:`g = \nabla\mathcal L(\theta_{old})`.
3. The search direction :math:`s \approx -F^{-1} g` by :func:`rlkit.trust_region.conjugate_gradient`
   (``cg_iters`` iterations) using Fisher-vector products of the mean exact KL
   :math:`\bar D(\theta) = \frac1B\sum_b \mathrm{KL}(\pi_{old}(\cdot|s_b)\,\|\,\pi_\theta(\cdot|s_b))`
   (:func:`rlkit.trust_region.fisher_vector_product`, damping ``cg_damping``).
4. The step is scaled so that the quadratic model of the KL sits on the boundary,
   :math:`\Delta = \sqrt{2\delta / s^\top F s}\; s` with :math:`\delta` = ``max_kl``, and
   :func:`rlkit.trust_region.backtracking_line_search` shrinks it by ``backtrack_ratio`` until the
   *measured* mean KL is :math:`\le\delta` and the surrogate improves by at least
   ``accept_ratio`` of the first-order prediction.  If no fraction is accepted the policy is left
   unchanged for this batch.
5. The critic is fitted separately: ``value_epochs`` passes of Adam on :math:`(V(s) - \hat R)^2`.

History stats per update: ``step_kl`` (the measured mean KL of the ACCEPTED step, 0 when rejected:
it is ``<= max_kl`` by construction, and chapter 4 asserts so), ``accepted`` (1/0), ``step_frac``
(the accepted fraction of the full step), ``kl`` (exact KL(pi_old || pi_new) on the batch after the
update), ``expected_improvement`` and ``improvement`` of the surrogate, ``loss`` (surrogate before),
``grad_norm`` (:math:`\|g\|`), ``entropy``, ``value_loss``, ``lr`` (the critic's).
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from .. import _validate as V
from ..divergences import entropy_categorical, kl_categorical
from ..nets import CategoricalPolicy
from ..objectives import normalize_advantages as _normalize
from ..returns import from_gymnasium, gae
from ..trust_region import backtracking_line_search, conjugate_gradient, fisher_vector_product, flat_grad
from ._common import Run, adam, config_of, setup, step
from .configs import TRPOConfig

__all__ = ["train_trpo", "trpo_step"]


def train_trpo(env: str | Callable = "CartPole-v1", cfg: TRPOConfig | None = None, *,
               callback: Callable | None = None, progress: bool = True, device=None, threads: int | None = 1):
    """Train a categorical actor (TRPO step) and a value critic (Adam); returns ``(model, history)``.

    Args:
        env: a gymnasium id (Box observations, Discrete actions) or a constructor.
        cfg: a :class:`rlkit.algos.TRPOConfig` (default: ``TRPOConfig()``).
        callback, progress, device, threads: as in :func:`rlkit.algos.train_reinforce`.
    """
    cfg = config_of(cfg, TRPOConfig)
    run = Run("trpo", env, cfg, progress, callback)
    envs, model, collector, dev = setup(env, cfg, device, threads)
    actor, critic = model.actor, model.critic
    v_opt = adam(list(critic.parameters()), cfg.value_lr, dev, eps=1e-5)
    B = cfg.num_envs * cfg.num_steps

    while True:
        # 1. rollout and advantages
        batch = collector.collect(actor.act, cfg.num_steps, value_fn=critic)
        discounts, lam_mask = from_gymnasium(batch.terminated, batch.truncated, cfg.gamma)
        adv, returns = gae(batch.rewards, batch.values, batch.next_values, discounts, cfg.gae_lambda * lam_mask)
        obs, actions, logp_old = batch.obs.reshape(B, -1), batch.actions.reshape(-1), batch.logp.reshape(-1)
        adv, returns = adv.reshape(-1), returns.reshape(-1)
        if cfg.normalize_advantages:
            adv = _normalize(adv)
        # 2-4. the trust-region step on the policy (see trpo_step below)
        info = trpo_step(actor, obs, actions, logp_old, adv, max_kl=cfg.max_kl, cg_iters=cfg.cg_iters,
                         cg_damping=cfg.cg_damping, backtrack_ratio=cfg.backtrack_ratio,
                         max_backtracks=cfg.max_backtracks, accept_ratio=cfg.accept_ratio)

        # 5. critic regression
        for _ in range(cfg.value_epochs):
            perm = torch.randperm(B, device=dev)
            for idx in perm.chunk(cfg.value_minibatches):
                v_loss = ((critic(obs[idx]) - returns[idx]) ** 2).mean()
                step(v_opt, v_loss, critic.parameters(), None)

        stats = dict(info, value_loss=v_loss.item(), lr=cfg.value_lr)
        if run.update(collector, **stats):
            break

    model.eval()
    return model, run.close(envs)


def trpo_step(actor: CategoricalPolicy, obs: torch.Tensor, actions: torch.Tensor, logp_old: torch.Tensor,
              adv: torch.Tensor, *, max_kl: float = 0.01, cg_iters: int = 10, cg_damping: float = 0.1,
              backtrack_ratio: float = 0.8, max_backtracks: int = 10, accept_ratio: float = 0.1) -> dict:
    r"""One TRPO policy step on a fixed batch, in place: steps 2-4 of the module docstring.

    ``obs [B, obs_dim]``, ``actions, logp_old, adv`` ``[B]`` (``logp_old`` from the policy that
    acted, which must be ``actor`` itself: the KL is measured from its current logits).

    Returns floats: ``loss`` (surrogate -mean(rho A) before the step), ``step_kl`` (measured mean
    KL(pi_old || pi_new) of the accepted step, 0 if rejected), ``accepted`` (1.0 / 0.0),
    ``step_frac``, ``kl`` (the KL after the update, equal to ``step_kl``), ``expected_improvement``,
    ``improvement``, ``grad_norm`` (:math:`\|g\|`), ``entropy`` (of pi_old).  Chapter 4.
    """
    B = obs.shape[0]
    for name, x in (("actions", actions), ("logp_old", logp_old), ("adv", adv)):
        if not isinstance(x, torch.Tensor) or x.shape != (B,):
            raise ValueError(f"{name} must be a tensor of shape [{B}] (flat over the batch), got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
    V.real_in(max_kl, "max_kl", 0.0, lo_open=True)
    params = list(actor.parameters())
    with torch.no_grad():
        logits_old = actor(obs)

    def surrogate_loss():                      # -mean(rho * A), to minimise
        logp = torch.distributions.Categorical(logits=actor(obs), validate_args=False).log_prob(actions)
        return -(torch.exp(logp - logp_old) * adv).mean()

    def mean_kl():                             # mean KL(pi_old || pi_theta) over the batch
        return kl_categorical(logits_old, actor(obs)).mean()

    # 2. gradient of the surrogate at theta_old
    loss = surrogate_loss()
    g = flat_grad(loss, params)

    # 3. natural-gradient direction s = -F^{-1} g by conjugate gradient on Fisher-vector products
    Fvp = lambda v: fisher_vector_product(mean_kl, params, v, damping=cg_damping)
    s = conjugate_gradient(Fvp, -g, iters=cg_iters)

    # 4. scale to the KL boundary: 1/2 D^T F D = max_kl, then backtrack on the MEASURED KL
    sFs = float((s * Fvp(s)).sum())
    full_step = s * math.sqrt(2.0 * max_kl / max(sFs, 1e-12))
    expected = float(-(g * full_step).sum())
    theta_old = parameters_to_vector(params).detach().clone()

    def evaluate(step):                        # (loss, KL) at theta_old + step; parameters restored
        vector_to_parameters(theta_old + step, params)
        with torch.no_grad():
            out = float(surrogate_loss()), float(mean_kl())
        vector_to_parameters(theta_old, params)
        return out

    accepted, frac, info = backtracking_line_search(
        evaluate, full_step, max_kl, expected_improvement=expected, backtrack_ratio=backtrack_ratio,
        max_backtracks=max_backtracks, accept_ratio=accept_ratio)
    if accepted:
        vector_to_parameters(theta_old + frac * full_step, params)
    with torch.no_grad():
        kl_after = float(mean_kl())
    return dict(loss=loss.item(), step_kl=info["constraint"] if accepted else 0.0, accepted=float(accepted),
                step_frac=frac, kl=kl_after, expected_improvement=expected,
                improvement=info["improvement"] if accepted else 0.0, grad_norm=float(g.norm()),
                entropy=float(entropy_categorical(logits_old).mean()))
