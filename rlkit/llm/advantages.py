r"""Advantage estimators of the LLM training loop: group-relative, or token-level GAE with a learned critic.

Chapters: 07_tiny_llm (:class:`Group`, :class:`TokenGAE`), 14_credit_over_tokens (the critic's targets).

An estimator is called once per update by :func:`rlkit.llm.train` as ``estimator(run, step) -> adv``
(``[N, T]``, zero on padding), after the hooks have added their reward channels; if it learns
something (a critic), ``estimator.fit(run, step, rows)`` runs after every policy step on the same
minibatch. The reward it uses is built from the step's channels in one fixed order:

* the response's reward ``step.rewards`` ``[N]`` (the checker's), or, when a hook supplied them
  (chapter 14's :class:`rlkit.llm.trainer.DenseRewards`), the per-token rewards ``step.token_rewards``;
* minus every penalty ``coef * x`` in ``step.penalties`` (``x`` per token, ``[N, T]``), summed over the
  response for a sequence-level estimator (the KL in the reward, :class:`rlkit.llm.trainer.KLPenalty`).
"""
from __future__ import annotations

import copy

import torch

from .. import _validate as V
from ..objectives import aggregate, normalize_advantages
from ..returns import gae
from .credit import VALUE_TARGETS, value_targets
from .heads import ValueHead
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
        adv = sequence_advantages(seq_r, self.algo, run.cfg.group_size)
        return adv[:, None].expand_as(mask) * mask

    def fit(self, run, step, rows) -> None:
        pass


class TokenGAE:
    r"""PPO's advantages: GAE over the response's tokens with a learned value, whitened over the batch.

    The reward of the last token is the response's reward (or every token's own, with dense
    rewards), minus the penalties per token. With :math:`\gamma` ``gamma`` and :math:`\lambda` ``lam``,
    :math:`\hat A_t = \sum_l (\gamma\lambda)^l \delta_{t+l}` (:func:`rlkit.returns.gae`). The critic
    regresses on ``target`` (chapter 14, :func:`rlkit.llm.value_targets`): ``"gae"`` (GAE's returns,
    the default), ``"nstep"`` with ``n``, ``"lambda"`` with ``target_lam`` (default ``lam``), ``"mc"``.

    Args:
        critic: the value model (default: :class:`rlkit.llm.ValueHead` on a copy of the policy).
        gamma, lam: GAE's discount and trace parameter, in [0, 1].
        lr: the critic's Adam learning rate (default: the policy's ``RLConfig.lr``).
        coef: the weight of the critic's squared error (its own optimiser, so it scales its step).
        target, n, target_lam: the critic's regression target, as above.
    """

    def __init__(self, critic=None, *, gamma: float = 1.0, lam: float = 0.95, lr: float | None = None,
                 coef: float = 1.0, target: str = "gae", n: int = 1, target_lam: float | None = None):
        self.critic = critic
        self.gamma = V.real_in(gamma, "gamma", 0.0, 1.0)
        self.lam = V.real_in(lam, "lam", 0.0, 1.0)
        self.lr = None if lr is None else V.real_in(lr, "lr", 0.0, float("inf"), lo_open=True)
        self.coef = V.real_in(coef, "coef", 0.0, float("inf"))
        self.target = V.choice(target, "target", VALUE_TARGETS)
        self.n = V.int_in(n, "n")
        self.target_lam = None if target_lam is None else V.real_in(target_lam, "target_lam", 0.0, 1.0)

    def setup(self, run) -> None:
        if self.critic is None:
            self.critic = ValueHead(copy.deepcopy(run.model), run.tok.vocab_size).to(run.device)
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
        values = self.values(ro) * mask
        next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1) * mask
        not_last = torch.zeros_like(mask)
        not_last[:, :-1] = mask[:, 1:]                        # 1 where another token follows
        adv, returns = gae(tok_rewards, values, next_values, self.gamma * not_last, self.lam)
        if self.target != "gae":
            returns = value_targets(tok_rewards, values, mask, self.target, gamma=self.gamma,
                                    lam=self.lam if self.target_lam is None else self.target_lam, n=self.n)
        step.data["returns"] = returns
        return normalize_advantages(adv, mask)

    def fit(self, run, step, rows) -> float:
        """One Adam step of the critic on ``rows``: :math:`\\tfrac{c}{2}\\,\\overline{(V - \\hat R)^2}` over tokens."""
        m = step.mask[rows]
        v = self.values(step.batch.rollout.select(rows))
        vloss = self.coef * 0.5 * aggregate((v - step.data["returns"][rows]) ** 2, m, "token-mean")
        self.opt.zero_grad(set_to_none=True)
        vloss.backward()
        run.clip(self.critic.parameters())
        self.opt.step()
        return vloss.item()
