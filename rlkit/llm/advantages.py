r"""Advantage estimators of the LLM training loop: group-relative, or token-level GAE with a learned critic.

Chapters: 07_tiny_llm (:class:`Group`, :class:`TokenGAE`), 14_credit_over_tokens (the critic's targets).

An estimator is called once per update by :func:`rlkit.llm.train` as ``estimator(run, step) -> adv``
(``[N, T]``, zero on padding), after the hooks have added their reward channels; if it learns
something (a critic), ``estimator.fit(run, step, rows)`` runs after every policy step on the same
minibatch. The reward it uses is built from the step's channels in one fixed order:

* the response's reward ``step.rewards`` ``[N]`` (the checker's), or, when a hook supplied them
  (chapter 14's :class:`rlkit.llm.trainer.DenseRewards`), the per-token rewards ``step.token_rewards``;
* minus every penalty ``coef * x`` in ``step.penalties`` (``x`` per token, ``[N, T]``), summed over the
  response for a sequence-level estimator (the KL in the reward, :class:`rlkit.llm.trainer.KLPenalty`);
* plus every bonus ``coef * x`` in ``step.bonuses`` (``x`` one per response, ``[N]``), in list order
  (chapter 22's exploration bonuses); a token-level estimator puts it on the response's last token.
"""
from __future__ import annotations

import copy

import numpy as np
import torch

from .. import _validate as V
from ..objectives import aggregate, normalize_advantages
from ..returns import gae
from .credit import VALUE_TARGETS, value_targets
from .heads import LogitHead, ValueHead
from .rl import ALGOS, sequence_advantages

__all__ = ["Group", "TokenGAE"]


class Group:
    r"""One advantage per response, from its group's rewards (``algo`` as in :func:`rlkit.llm.sequence_advantages`).

    ``"reinforce"`` (batch-mean baseline), ``"rloo"``, ``"grpo"``/``"dapo"``/``"gspo"`` (std-scaled)
    or ``"dr_grpo"`` (not scaled); the advantage is spread over the response's tokens.
    """

    def __init__(self, algo: str = "grpo"):
        self.algo = V.choice(algo, "algo", tuple(a for a in ALGOS if a != "ppo"))

    def setup(self, run) -> None:
        pass

    def __call__(self, run, step) -> torch.Tensor:
        mask = step.batch.rollout.mask
        seq_r = step.rewards if step.token_rewards is None else step.token_rewards.sum(-1)
        for coef, x in step.penalties:
            seq_r = seq_r - coef * x.sum(-1)
        for coef, x in step.bonuses:
            seq_r = seq_r + coef * x
        adv = sequence_advantages(seq_r, self.algo, run.cfg.group_size)
        return adv[:, None].expand_as(mask) * mask

    def fit(self, run, step, rows) -> None:
        pass


class TokenGAE:
    r"""PPO's advantages: GAE over the response's tokens with a learned value, whitened over the batch.

    The reward of the last token is the response's reward (or every token's own, with dense
    rewards), minus the penalties per token, plus the bonuses on the last token. With :math:`\gamma`
    ``gamma`` and :math:`\lambda` ``lam``, :math:`\hat A_t = \sum_l (\gamma\lambda)^l \delta_{t+l}`
    (:func:`rlkit.returns.gae`). The critic regresses on ``target`` (chapter 14,
    :func:`rlkit.llm.value_targets`): ``"gae"`` (GAE's returns, the default), ``"nstep"`` with ``n``,
    ``"lambda"`` with ``target_lam`` (default ``lam``), ``"mc"``.

    **Value channels.** Hooks may ask for more per-response signals to be valued beside the reward
    (chapter 18's cost, :class:`rlkit.llm.safety.CostConstraint`): they name them in
    ``run.value_channels`` at set-up and put each step's values in ``step.data["channels"][name]``
    (``[N]``). With :math:`k` channels the critic has :math:`1 + k` outputs per position (by default a
    :class:`rlkit.llm.heads.LogitHead` of shape ``(1 + k,)``; output 0 values the reward). Each channel's
    signal goes on the response's last token and gets its own GAE advantage and target with the same
    :math:`\gamma`, :math:`\lambda` and ``target``; the penalties and bonuses stay on the reward. The
    raw (not whitened) advantages are left in ``step.data["advantages"]`` (``{"reward": ..., name:
    ...}``) for the hook that combines them; the estimator still returns the reward's, whitened. The
    critic regresses every output, :math:`c\sum_j \tfrac12\overline{(V_j - \hat R_j)^2}` in one step;
    logged: ``value_loss`` (the reward's term) and ``<name>_value_loss`` (each channel's).

    Args:
        critic: the value model (default: :class:`rlkit.llm.ValueHead` on a copy of the policy; with
            value channels, a model returning ``[B, L, 1 + k]``).
        gamma, lam: GAE's discount and trace parameter, in [0, 1].
        lr: the critic's Adam learning rate (default: the policy's ``RLConfig.lr``).
        coef: the weight of the critic's squared error (its own optimiser, so it scales its step).
        target, n, target_lam: the critic's regression target, as above.
    """

    def __init__(self, critic=None, *, gamma: float = 1.0, lam: float = 0.95, lr: float | None = None,
                 coef: float = 1.0, target: str = "gae", n: int = 1, target_lam: float | None = None):
        self.critic = critic
        self.channels: tuple = ()
        self.gamma = V.real_in(gamma, "gamma", 0.0, 1.0)
        self.lam = V.real_in(lam, "lam", 0.0, 1.0)
        self.lr = None if lr is None else V.real_in(lr, "lr", 0.0, float("inf"), lo_open=True)
        self.coef = V.real_in(coef, "coef", 0.0, float("inf"))
        self.target = V.choice(target, "target", VALUE_TARGETS)
        self.n = V.int_in(n, "n")
        self.target_lam = None if target_lam is None else V.real_in(target_lam, "target_lam", 0.0, 1.0)

    def setup(self, run) -> None:
        self.channels = tuple(getattr(run, "value_channels", ()))
        if self.critic is None:
            lm, width = copy.deepcopy(run.model), run.tok.vocab_size
            self.critic = (LogitHead(lm, width, (1 + len(self.channels),)) if self.channels
                           else ValueHead(lm, width)).to(run.device)
        self.opt = torch.optim.Adam(self.critic.parameters(), lr=run.cfg.lr if self.lr is None else self.lr)

    def values(self, ro) -> torch.Tensor:
        """:math:`V(s_t)` at every response position ``[N, T]``: the state after the prompt and ``y_<t``."""
        P, T = ro.prompt_ids.shape[1], ro.response_ids.shape[1]
        ids = torch.cat([ro.prompt_ids, ro.response_ids], 1)
        att = torch.cat([ro.prompt_mask, torch.ones_like(ro.response_ids, dtype=torch.bool)], 1)
        return self.critic(ids, attention_mask=att)[:, P - 1:P - 1 + T]

    @torch.no_grad()
    def __call__(self, run, step) -> torch.Tensor:
        ro = step.batch.rollout
        mask = ro.mask
        N = mask.shape[0]
        tok_rewards = torch.zeros_like(mask)
        last = (mask.sum(-1).long() - 1).clamp_min(0)
        tok_rewards[torch.arange(N, device=mask.device), last] = step.rewards
        if step.token_rewards is not None:
            tok_rewards = step.token_rewards
        for coef, x in step.penalties:
            tok_rewards = tok_rewards - coef * x
        for coef, x in step.bonuses:
            tok_rewards = tok_rewards.index_put((torch.arange(N, device=mask.device), last), coef * x,
                                                accumulate=True)
        values = self.values(ro)
        not_last = torch.zeros_like(mask)
        not_last[:, :-1] = mask[:, 1:]                        # 1 where another token follows
        if not self.channels:
            adv, step.data["returns"] = self._gae(tok_rewards, values, mask, not_last)
            return normalize_advantages(adv, mask)
        rewards = {"reward": tok_rewards, **{c: self._terminal(step, c, last) for c in self.channels}}
        if values.shape != (*mask.shape, len(rewards)):
            raise ValueError(f"TokenGAE: with value channels {self.channels} the critic must return [batch, tokens, "
                             f"{len(rewards)}] (the reward first), got {tuple(values.shape)}")
        advs, returns = {}, []
        for j, (name, r) in enumerate(rewards.items()):
            advs[name], ret = self._gae(r, values[..., j], mask, not_last)
            returns.append(ret)
        step.data["advantages"], step.data["returns"] = advs, torch.stack(returns, -1)
        self._channel_losses = {c: [] for c in self.channels}
        return normalize_advantages(advs["reward"], mask)

    @staticmethod
    def _terminal(step, name: str, last: torch.Tensor) -> torch.Tensor:
        x = step.data.get("channels", {}).get(name)
        if x is None:
            raise ValueError(f"TokenGAE: no values for the value channel {name!r}; the hook that named it in "
                             f"run.value_channels must put them in step.data['channels'][{name!r}]")
        mask = step.batch.rollout.mask
        out = torch.zeros_like(mask)
        out[torch.arange(mask.shape[0], device=mask.device), last] = x.to(out.dtype)
        return out

    def _gae(self, rewards, values, mask, not_last):
        """``(advantages, critic targets)`` of one channel: GAE and ``target`` on masked values."""
        values = values * mask
        next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1) * mask
        adv, returns = gae(rewards, values, next_values, self.gamma * not_last, self.lam)
        if self.target != "gae":
            returns = value_targets(rewards, values, mask, self.target, gamma=self.gamma,
                                    lam=self.lam if self.target_lam is None else self.target_lam, n=self.n)
        return adv, returns

    def fit(self, run, step, rows) -> float:
        """One Adam step of the critic on ``rows``: :math:`\\tfrac{c}{2}\\,\\overline{(V - \\hat R)^2}` over tokens
        (summed over the value channels)."""
        m = step.mask[rows]
        v = self.values(step.batch.rollout.select(rows))
        target = step.data["returns"][rows]
        if not self.channels:
            vloss = self.coef * 0.5 * aggregate((v - target) ** 2, m, "token-mean")
        else:
            terms = [0.5 * aggregate((v[..., j] - target[..., j]) ** 2, m, "token-mean") for j in range(v.shape[-1])]
            vloss = terms[0]
            for t in terms[1:]:
                vloss = vloss + t
            vloss = self.coef * vloss
        self.opt.zero_grad(set_to_none=True)
        vloss.backward()
        run.clip(self.critic.parameters())
        self.opt.step()
        if not self.channels:
            return vloss.item()
        for name, t in zip(self.channels, terms[1:]):
            self._channel_losses[name].append(self.coef * t.item())
            run.log(**{f"{name}_value_loss": float(np.mean(self._channel_losses[name]))})
        return self.coef * terms[0].item()
