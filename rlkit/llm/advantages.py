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
from ..staleness import staleness
from .credit import VALUE_TARGETS, value_targets
from .heads import LogitHead, ValueHead, response_positions
from .rl import ALGOS, sequence_advantages
from .sampling import apply_logits_processor

__all__ = ["Group", "TokenGAE", "OffPolicy"]


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
        if critic is not None:
            V.is_callable(critic, "critic")
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


def _shift_left(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x[..., 1:], torch.zeros_like(x[..., :1])], dim=-1)


def _processed(logits: torch.Tensor, ro, processor) -> torch.Tensor:
    """The response positions' ``logits [N, T, V]`` through a logits processor, position by position.

    ``processor`` None returns them as they are.

    Each position's context is the prompt and the response before it, as when sampling; padded
    positions are processed with zero logits (as :func:`rlkit.llm.token_logprobs` does).
    """
    if processor is None or logits.shape[1] == 0:
        return logits
    logits = logits.masked_fill(~(ro.mask > 0)[..., None], 0.0)
    P = ro.prompt_ids.shape[1]
    ids = torch.cat([ro.prompt_ids, ro.response_ids], 1)
    att = torch.cat([ro.prompt_mask, torch.ones_like(ro.response_ids, dtype=torch.bool)], 1)
    return torch.stack([apply_logits_processor(processor, ids[:, :P + t], att[:, :P + t], logits[:, t])
                        for t in range(logits.shape[1])], 1)


class OffPolicy:
    r"""Advantages and critic targets for lagged data, corrected towards the learner's policy: V-trace, Retrace or none.

    Chapter: 16_offpolicy_multistep. Every response was sampled by some version :math:`\mu` of the
    policy (``step.logp_behav``), possibly older than the learner's :math:`\pi_k` (``step.logp_old``).
    The policy loss's ratio corrects the sampled token :math:`y_t`; this estimator corrects the
    *later* tokens :math:`y_{t+1}, y_{t+2}, \dots`, which :math:`\mu` drew as well, in the target of
    the critic and in the advantage. With :math:`\log\rho_t = \log\pi_k(y_t) - \log\mu(y_t)`, the reward
    on the response's last token (or every token's own with dense rewards, minus the penalties, plus
    the bonuses), :math:`\gamma_t` = ``gamma`` inside a response and 0 after its last token, and
    :math:`\lambda` = ``lam``, :func:`rlkit.llm.lagged.offpolicy_targets` gives, per ``target``:

    * ``"none"``: the lambda-return of the behaviour trajectory,
      :math:`g_t = r_t + \gamma_t[(1-\lambda)V(h_{t+1}) + \lambda g_{t+1}]`, uncorrected (it estimates
      values of :math:`\mu`, not of :math:`\pi_k`);
    * ``"vtrace"``: :math:`q_t = r_t + \gamma_t[V(h_{t+1}) + \lambda(v_{t+1} - V(h_{t+1}))]` with the
      V-trace :math:`v_{t+1}` (:func:`rlkit.offpolicy.vtrace`, clips :math:`\bar\rho` = ``clip_rho``,
      :math:`\bar c` = ``clip_c``); it estimates values of the truncated policy
      :math:`\pi_{\bar\rho}\propto\min(\bar\rho\mu, \pi_k)`;
    * ``"retrace"``: the Retrace target :math:`G_t` (:func:`rlkit.offpolicy.retrace`,
      :math:`c_t = \lambda\min(1, \pi_k/\mu)`), whose fixed point is :math:`Q^{\pi_k}`;

    and in every case :math:`\hat A_t` = target :math:`- V(h_t)`, whitened over the batch's tokens
    (``normalize``). The critic (a :class:`rlkit.llm.heads.LogitHead` on a copy of the policy) is
    ``critic="q"``, :math:`Q(h_t,\cdot)` over the whole vocabulary (shape ``(|V|,)``) with
    :math:`V(h_t) = \sum_a\pi_k(a\mid h_t)\,Q(h_t,a)` (Retrace needs it: its target contains
    :math:`\mathbb E_{a\sim\pi_k}Q(h_{t+1}, a)`), or ``critic="v"``, :math:`V(h_t)` alone
    (:class:`rlkit.llm.ValueHead`; enough for ``"none"`` and ``"vtrace"``). For the Q critic the
    estimator scores the batch with :math:`\pi_k`'s whole next-token distribution
    (``log_softmax`` of the learner's logits, one extra forward pass).

    After every policy step, :meth:`fit` takes one Adam step of the critic on the same minibatch:
    :math:`\tfrac c2\,\overline{(Q(h_t, y_t) - q_t)^2}` over its tokens (``critic="q"``), or
    :math:`\tfrac c2\,\overline{(V(h_t) - \hat v_t)^2}` with :math:`\hat v_t` the target's estimate
    of :math:`V(h_t)` (``critic="v"``), with :math:`c` = ``coef``.

    Logged: ``mean_age`` (mean versions behind the learner of the step's responses) and
    ``staleness`` (token mean of :math:`\tfrac12|\pi_k/\mu - 1|`, :func:`rlkit.staleness.staleness`).
    Handed to hooks in ``step.data``: ``"values"`` (the reward's :math:`V(h_t)`, ``[N, T]``) and
    ``"value_estimate"``, a function ``(target, clip_rho) -> [N, T]`` giving the estimate of the
    reward's :math:`V^{\pi_k}(h_t)` that another target would give on the same data with the same
    critic (None for ``"retrace"`` without a Q critic): :class:`rlkit.llm.lagged.ValueProbes` compares them.

    **Value channels** (the loop's convention, as for :class:`TokenGAE`): a hook may name more
    per-response signals in ``run.value_channels`` at set-up (a cost) and put each step's values in
    ``step.data["channels"][name]`` (``[N]``). With :math:`k` channels the critic has :math:`1 + k`
    outputs per position, the reward's first: by default a ``LogitHead`` of shape ``(1 + k, |V|)``
    (``"q"``) or ``(1 + k,)`` (``"v"``). Each channel's signal goes on the response's last token and
    gets its own target and advantage with the same correction, ``gamma`` and ``lam`` (the penalties and
    bonuses stay on the reward); each channel's advantage, whitened over the batch on its own
    (``normalize``), is left in ``step.data["advantages"]`` (``{"reward": ..., name: ...}``, ``[N, T]``)
    for the hook that combines them (chapter 24's :class:`rlkit.llm.safety.CostConstraint` with
    ``whiten=False``), and the estimator returns the reward's. The critic regresses every output in
    one step, :math:`\tfrac c2` times the sum of the squared errors over the tokens and the outputs,
    divided by the number of tokens; logged: ``value_loss`` (the reward's term) and ``<name>_value_loss``.

    **Under the run's logits processor** (``train(..., logits_processor=...)``, a shield) the policy is
    the processed model: :math:`\pi_k`'s next-token distribution in :math:`V = \sum_a\pi_k Q` is the
    processed one.

    Args:
        target: ``"none"``, ``"vtrace"`` or ``"retrace"`` (:data:`rlkit.llm.lagged.TARGETS`).
        critic: ``"q"``, ``"v"`` or a :class:`rlkit.llm.heads.LogitHead` (shape ``()`` or ``(1 + k,)``:
            a value; ``(|V|,)`` or ``(1 + k, |V|)``: a Q-value), by default built on a copy of the
            policy when training starts.
        clip_rho, clip_c: :math:`\bar\rho, \bar c > 0`, ``"vtrace"`` only.
        normalize: whiten the advantages over the batch.
        gamma, lam: :math:`\gamma, \lambda \in [0, 1]`.
        lr: the critic's Adam learning rate (default: the policy's, ``RLConfig.lr``).
        coef: :math:`c \ge 0`, the weight of the critic's squared error.
    """

    def __init__(self, target: str = "vtrace", critic="q", *, clip_rho: float = 1.0, clip_c: float = 1.0,
                 normalize: bool = True, gamma: float = 1.0, lam: float = 1.0, lr: float | None = None,
                 coef: float = 1.0):
        from .lagged import TARGETS  # chapter 16's module, which imports this one
        self.target = V.choice(target, "target", TARGETS)
        self.critic, self.kind = None, None
        if isinstance(critic, str):
            self.kind = V.choice(critic, "critic", ("q", "v"))
        else:
            self.critic = V.instance_of(critic, "critic", LogitHead, "'q', 'v' or an rlkit.llm.heads.LogitHead")
        self._check_retrace()
        self.clip_rho = V.real_in(clip_rho, "clip_rho", 0.0, lo_open=True)
        self.clip_c = V.real_in(clip_c, "clip_c", 0.0, lo_open=True)
        if self.target != "vtrace" and (self.clip_rho != 1.0 or self.clip_c != 1.0):
            raise ValueError(f"clip_rho and clip_c are only used by target='vtrace'; with target={self.target!r} "
                             f"they would be ignored, so leave them at 1.0")
        self.normalize = V.instance_of(normalize, "normalize", bool)
        self.gamma = V.real_in(gamma, "gamma", 0.0, 1.0)
        self.lam = V.real_in(lam, "lam", 0.0, 1.0)
        self.lr = None if lr is None else V.real_in(lr, "lr", 0.0, float("inf"), lo_open=True)
        self.coef = V.real_in(coef, "coef", 0.0, float("inf"))
        self.channels: tuple = ()

    def _check_retrace(self) -> None:
        if self.target == "retrace" and self.kind == "v":
            raise ValueError("target='retrace' needs Q over the vocabulary: use critic='q' or a LogitHead of shape "
                             "(vocab_size,) (a value critic gives only V)")

    def setup(self, run) -> None:
        self.channels = tuple(getattr(run, "value_channels", ()))
        vocab, out = run.tok.vocab_size, ((1 + len(self.channels),) if self.channels else ())
        if self.critic is None:
            lm = copy.deepcopy(run.model)
            head = (LogitHead(lm, vocab, (*out, vocab)) if self.kind == "q" else
                    LogitHead(lm, vocab, out) if self.channels else ValueHead(lm, vocab))
            self.critic = head.to(run.device)
        shape = tuple(self.critic.shape)
        self.kind = "q" if shape[-1:] == (vocab,) else "v"
        if (shape[:-1] if self.kind == "q" else shape) != out:
            raise ValueError(f"critic: a LogitHead of shape {shape} for value channels {self.channels}; expected "
                             f"{out} (a value) or {(*out, vocab)} (a Q-value): the reward first, then each channel")
        self._check_retrace()
        self._channel_losses = {c: [] for c in self.channels}
        self.opt = torch.optim.Adam(self.critic.parameters(), lr=run.cfg.lr if self.lr is None else self.lr)

    def critic_outputs(self, ro, logp_all: torch.Tensor | None, rows=None):
        r"""``(values, q_taken)`` at the response positions of ``ro`` (``rows``): :math:`V(h_t)`, :math:`Q(h_t, y_t)`.

        ``[N, T]`` each (``[1 + k, N, T]`` with value channels, the reward's first); ``q_taken`` is None
        for a value critic. For a Q critic :math:`V(h_t) = \sum_a\pi_k(a\mid h_t)Q(h_t, a)` with
        ``logp_all`` :math:`\log\pi_k` ``[N, T, |V|]``.
        """
        out = self.critic.at_responses(ro, rows)                 # [N, T, *shape]
        if self.channels:
            out = out.movedim(2, 0)                              # the channel first: [1 + k, N, T(, V)]
        if self.kind == "v":
            return out, None
        y = ro.response_ids if rows is None else ro.response_ids[rows]
        v = (logp_all.exp() * out).sum(-1)
        return v, out.gather(-1, y.expand(out.shape[:-1])[..., None]).squeeze(-1)

    def rewards(self, run, step) -> torch.Tensor:
        """The reward of every token ``[N, T]`` (``[1 + k, N, T]`` with value channels, each on the last token).

        The reward is the response's on its last token (or the hooks' per-token rewards), minus the
        penalties, plus the bonuses on the last token.
        """
        mask = step.rollout.mask
        rows = torch.arange(mask.shape[0], device=mask.device)
        last = (mask.sum(-1).long() - 1).clamp_min(0)
        r = torch.zeros_like(mask)
        r[rows, last] = step.rewards
        if step.token_rewards is not None:
            r = step.token_rewards
        for coef, x in step.penalties:
            r = r - coef * x
        for coef, x in step.bonuses:
            r = r.index_put((rows, last), coef * x, accumulate=True)
        if not self.channels:
            return r
        out = [r]
        for name in self.channels:
            x = step.data.get("channels", {}).get(name)
            if x is None:
                raise ValueError(f"OffPolicy: no values for the value channel {name!r}; the hook that named it in "
                                 f"run.value_channels must put them in step.data['channels'][{name!r}]")
            c = torch.zeros_like(mask)
            c[rows, last] = x.to(c.dtype)
            out.append(c)
        return torch.stack(out)

    @torch.no_grad()
    def __call__(self, run, step) -> torch.Tensor:
        from .lagged import offpolicy_targets  # chapter 16's module, which imports this one
        ro = step.rollout
        mask = ro.mask
        logp_all = None
        if self.kind == "q":
            logits = _processed(response_positions(run.model, ro), ro, run.logits_processor)
            logp_all = torch.log_softmax(logits.float(), -1)
        values, q_taken = self.critic_outputs(ro, logp_all)
        values = values * mask
        q_taken = None if q_taken is None else q_taken * mask
        not_last = torch.zeros_like(mask)
        not_last[:, :-1] = mask[:, 1:]                           # 1 where another token follows
        discounts = (self.gamma * not_last).expand_as(values)
        next_values = _shift_left(values) * not_last
        rewards = self.rewards(run, step)
        log_rhos = ((step.logp_old - step.logp_behav) * mask).expand_as(values)

        def targets(target, clip_rho):
            return offpolicy_targets(target, log_rhos, rewards, values, next_values, discounts,
                                     q_taken=q_taken if target == "retrace" else None, lam=self.lam,
                                     clip_rho=clip_rho, clip_c=self.clip_c)

        def reward(x):                                           # the reward's channel
            return x[0] if self.channels else x

        def value_estimate(target, clip_rho=1.0):
            return None if target == "retrace" and q_taken is None else reward(targets(target, clip_rho)[1]) * mask

        q_tgt, v_tgt, adv = targets(self.target, self.clip_rho)
        returns = (q_tgt if self.kind == "q" else v_tgt) * mask
        step.data.update(returns=returns, logp_all=logp_all, values=reward(values), value_estimate=value_estimate)
        run.log(mean_age=float(step.age.float().mean()), staleness=float(staleness(step.logp_old, step.logp_behav,
                                                                                   mask)))
        if not self.channels:
            return normalize_advantages(adv, mask) if self.normalize else adv * mask
        advs = [normalize_advantages(a, mask) if self.normalize else a * mask for a in adv]
        step.data["advantages"] = dict(zip(("reward", *self.channels), advs))
        self._channel_losses = {c: [] for c in self.channels}
        return advs[0]

    def fit(self, run, step, rows) -> float:
        """One Adam step of the critic on the minibatch ``rows`` (the squared error of the class docstring)."""
        m = step.mask[rows]
        logp_all = step.data["logp_all"]
        v, q = self.critic_outputs(step.rollout, None if logp_all is None else logp_all[rows], rows)
        pred, tgt = (v if q is None else q), step.data["returns"][..., rows, :]
        if self.channels:                                        # [n, T, 1 + k]: one sum over every output
            pred, tgt, m = pred.movedim(0, -1).contiguous(), tgt.movedim(0, -1).contiguous(), m[..., None]
        err = ((pred - tgt) ** 2) * m
        vloss = self.coef * 0.5 * err.sum() / m.sum().clamp_min(1.0)
        self.opt.zero_grad(set_to_none=True)
        vloss.backward()
        run.clip(self.critic.parameters())
        self.opt.step()
        if not self.channels:
            return vloss.item()
        with torch.no_grad():
            terms = (self.coef * 0.5 * err.sum((0, 1)) / m.sum().clamp_min(1.0)).tolist()
        for name, t in zip(self.channels, terms[1:]):
            self._channel_losses[name].append(t)
            run.log(**{f"{name}_value_loss": float(np.mean(self._channel_losses[name]))})
        return terms[0]
