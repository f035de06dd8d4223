r"""Safety on the tiny LLM: a cost signal, a decode-time shield, and a Lagrangian PPO trainer.

Chapter: 18_safety_constraints.

**The cost.** :data:`FORBIDDEN_ADDITION` is two-digit addition (the task of chapter 7, with its
forgotten carries) with a second checker, ``"cost"``: a response costs 1 if it contains a
forbidden substring, ``"13"`` or ``"14"`` (:func:`forbidden_substrings`), and 0 otherwise. The
reward is still exact match. About 16% of the sums (113, 114, 130-149) *are* forbidden, so on
those prompts the right answer is also the unsafe one: reward and cost conflict, and meeting a
budget :math:`C_{\max}` below the cost of a correct policy means giving up correct answers there.

**The shield.** :func:`substring_shield` is a logits processor (:data:`~rlkit.llm.sampling.LogitsProcessor`)
that bans the last character of a pattern whenever the response so far ends with the rest of it.
``substring_shield(tok, ("13",))`` bans ``3`` right after ``1``: it removes every ``13`` and none of
the ``14`` (a shield with imperfect recall, as every regex or classifier has). Because the
trainers also recompute the old and new log-probs with the processor, the ratio of PPO compares
the shielded distribution :math:`q` that sampled the data with the shielded distribution being
optimised. :func:`removed_mass` measures how much probability the shield took away.

**The trainer.** :func:`train_constrained` is PPO (:func:`rlkit.llm.policy_loss`, GAE over
tokens) with one critic that has two heads (:class:`RewardCostCritic`): the reward value
:math:`V_\phi(h_t)` and the cost value :math:`C_\psi(h_t)`. Each step it measures the batch's mean
cost :math:`\hat J_C` (of the policy that sampled, shield included), updates the multiplier
(:class:`rlkit.safety.LagrangeMultiplier` or :class:`rlkit.safety.PIDLagrangian`), and trains the
policy on the advantage of :math:`r - \nu c`,

.. math:: \hat A_t = \frac{\hat A^R_t - \nu\,\hat A^C_t}{1 + \nu},

with :math:`\hat A^R, \hat A^C` the GAE advantages of the terminal reward and the terminal cost
(:func:`rlkit.safety.lagrangian_advantages`), whitened over the batch as in
:func:`rlkit.llm.train`'s PPO. The cost is per sequence (Safe RLHF's choice), put on the last token.
"""
from __future__ import annotations

import copy
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn

from .. import _validate as V
from ..divergences import kl_k3
from ..objectives import aggregate, normalize_advantages
from ..returns import gae
from ..safety import lagrangian_advantages
from ..utils import clip_grad
from .evaluation import evaluate
from .rl import RLConfig, _kl_estimate, _reference_model, _select, _train_args, collect, policy_loss
from .sampling import Rollout, call_model, token_logprobs
from .tasks import Problem, Task, addition_problem, digit_rewards, exact_match
from .tokenizer import CharTokenizer

__all__ = ["FORBIDDEN", "forbidden_substrings", "FORBIDDEN_ADDITION", "substring_shield", "removed_mass",
           "RewardCostCritic", "ConstrainedResult", "train_constrained", "constraint_report"]

#: The forbidden substrings of :data:`FORBIDDEN_ADDITION`.
FORBIDDEN = ("13", "14")


def forbidden_substrings(patterns: Sequence[str]) -> Callable[[str, Problem], float]:
    r"""A cost checker: :math:`c(y) = \mathbf 1[\text{some pattern occurs in } y]`.

    Args:
        patterns: a non-empty list of non-empty strings.

    Returns:
        ``check(response, problem) -> 1.0 or 0.0`` (the problem is ignored), usable as a
        :class:`~rlkit.llm.Task` checker. Chapter: 18_safety_constraints.
    """
    pats = V.tuple_of(patterns, "patterns", str, "str")
    if not pats:
        raise ValueError("patterns must hold at least one string")
    for i, p in enumerate(pats):
        V.nonempty_str(p, f"patterns[{i}]")

    def cost(response: str, problem: Problem) -> float:
        return float(any(p in response for p in pats))

    cost.__name__ = "forbidden_" + "_".join(pats)
    cost.patterns = pats
    return cost


#: Two-digit addition whose answers must not contain "13" or "14" (reward ``"exact"``, cost ``"cost"``).
FORBIDDEN_ADDITION = Task("forbidden_addition", addition_problem, exact_match, max_new_tokens=5,
                          checkers={"cost": forbidden_substrings(FORBIDDEN)},
                          token_checkers={"exact": digit_rewards},
                          description="two-digit addition; a response containing 13 or 14 costs 1")


def substring_shield(tok: CharTokenizer, patterns: Sequence[str], start: str = "="):
    r"""A decode-time shield: ban the token that would complete a forbidden pattern.

    For each pattern :math:`s = s_1\dots s_k` the processor sets the logit of :math:`s_k` to
    :math:`-\infty` whenever the response so far ends with :math:`s_1\dots s_{k-1}` (a one-character
    pattern is banned everywhere), so no sampled response can contain :math:`s`. The response is
    what follows the last ``start`` token of the context (the ``=`` of a prompt ``a+b=``); a pattern
    never matches across it.

    Args:
        tok: the tokenizer (each pattern character must be one token).
        patterns: a non-empty list of non-empty strings.
        start: the character that ends a prompt.

    Returns:
        a logits processor ``f(context_ids [N, L], context_mask [N, L], logits [N, V]) -> logits``.
        Chapter: 18_safety_constraints.
    """
    V.instance_of(tok, "tok", CharTokenizer)
    pats = V.tuple_of(patterns, "patterns", str, "str")
    if not pats:
        raise ValueError("patterns must hold at least one string")
    coded = []
    for i, p in enumerate(pats):
        V.nonempty_str(p, f"patterns[{i}]")
        ids = tok.encode(p)
        if len(ids) != len(p):
            raise ValueError(f"patterns[{i}] = {p!r} must be one token per character")
        coded.append(torch.tensor(ids, dtype=torch.long))
    V.nonempty_str(start, "start")
    start_ids = tok.encode(start)
    if len(start_ids) != 1:
        raise ValueError(f"start must be one token, got {start!r}")
    start_id = start_ids[0]

    def shield(context_ids: torch.Tensor, context_mask: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        N, L = context_ids.shape
        pos = torch.arange(L, device=context_ids.device)
        is_start = (context_ids == start_id) & context_mask
        last = torch.where(is_start, pos, torch.full_like(pos, -1)).amax(-1) if L else \
            torch.full((N,), -1, device=context_ids.device)
        n_resp = L - 1 - last                             # response tokens so far (L if no start token)
        ban = torch.zeros_like(logits, dtype=torch.bool)
        for code in coded:
            k = len(code) - 1
            if k == 0:
                hit = torch.ones(N, dtype=torch.bool, device=logits.device)
            elif L < k:
                continue
            else:
                hit = (context_ids[:, L - k:] == code[:k].to(context_ids.device)).all(-1) & (n_resp >= k)
            ban[hit, code[-1]] = True
        return logits.masked_fill(ban, float("-inf"))

    shield.patterns = pats
    return shield


def removed_mass(rollout: Rollout) -> torch.Tensor:
    r"""The probability a processor (a shield) removed at each sampled position, from a rollout.

    When a processor only bans tokens and sampling uses temperature 1 without top-k/top-p, the
    sampling distribution is :math:`q(y) = p_\theta(y)/(1 - m)` on the allowed tokens, where
    :math:`m` is the model's probability of the banned ones. So at every sampled token

    .. math:: m_t = 1 - \frac{p_\theta(y_t \mid h_t)}{q(y_t \mid h_t)} = 1 - e^{\log p_\theta - \log q},

    read from ``rollout.model_logprobs`` and ``rollout.logprobs`` (0 where nothing was banned).

    Args:
        rollout: a :class:`~rlkit.llm.Rollout` sampled as above (not greedy).

    Returns:
        ``[B, T]`` float, 0 at padding. Chapter: 18_safety_constraints.
    """
    V.instance_of(rollout, "rollout", Rollout)
    m = rollout.mask > 0
    out = (1.0 - torch.exp(rollout.model_logprobs - rollout.logprobs)).clamp_min(0.0)
    return torch.where(m, out, torch.zeros((), dtype=out.dtype, device=out.device))


class RewardCostCritic(nn.Module):
    r"""Two value heads on one copy of the LM: the reward value :math:`V_\phi(h_t)`, the cost value :math:`C_\psi(h_t)`.

    .. math:: \big(V_\phi(h_t),\ C_\psi(h_t)\big) = W\,\mathrm{logits}_t + b,
              \qquad W \in \mathbb R^{2\times|\mathcal V|},

    the construction of :class:`~rlkit.llm.ValueHead` with a second output, so one forward pass
    serves both critics. :math:`C_\psi(h_t)` estimates the expected cost still to come from the
    state after ``ids[:, :t + 1]`` (here: the probability that the finished response will contain
    a forbidden substring). Both heads start at 0.

    ``forward(ids [B, T], attention_mask=None) -> [B, T, 2]`` (channel 0 reward, 1 cost).

    Args:
        lm: a model following the protocol of :mod:`rlkit.llm.model` (e.g. a copy of the policy).
        vocab_size: the width of its logits.

    Chapter: 18_safety_constraints.
    """

    accepts_attention_mask = True

    def __init__(self, lm: nn.Module, vocab_size: int):
        super().__init__()
        self.lm = V.instance_of(lm, "lm", nn.Module)
        self.head = nn.Linear(V.int_in(vocab_size, "vocab_size"), 2)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, ids, attention_mask=None):
        return self.head(call_model(self.lm, ids, attention_mask))


@dataclass
class ConstrainedResult:
    r"""What :func:`train_constrained` returns: the trained model, its critic, the multiplier and the per-step log.

    ``history`` keys (one entry per step): ``reward``, ``cost`` (the batch means the multiplier
    saw), ``accuracy``, ``lam`` (the multiplier :math:`\nu` used in that step's advantages), ``kl``
    (NaN without a reference model), ``entropy``, ``clip_fraction``, ``value_loss``,
    ``cost_value_loss``, ``shield_rate`` (share of responses in which the processor removed
    probability, NaN without one), ``train_seconds`` (cumulative).
    """

    model: nn.Module
    critic: nn.Module
    multiplier: object
    history: dict
    config: RLConfig
    samples: list = field(default_factory=list)

    def array(self, key: str) -> np.ndarray:
        """``history[key]`` as a float array."""
        return np.asarray(self.history[key], dtype=float)


class _Fixed:
    """A constant multiplier (a fixed penalty, or 0 for no constraint)."""

    def __init__(self, value: float):
        self.value = value

    def update(self, cost) -> float:
        return self.value


def _critic_values(critic, ro: Rollout) -> torch.Tensor:
    P, T = ro.prompt_ids.shape[1], ro.response_ids.shape[1]
    ids = torch.cat([ro.prompt_ids, ro.response_ids], 1)
    att = torch.cat([ro.prompt_mask, torch.ones_like(ro.response_ids, dtype=torch.bool)], 1)
    out = critic(ids, attention_mask=att)
    if out.dim() != 3 or out.shape[-1] != 2:
        raise ValueError(f"critic must return [batch, tokens, 2] (reward and cost values), got {tuple(out.shape)}")
    return out[:, P - 1:P - 1 + T]


def _terminal(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(mask)
    last = (mask.sum(-1).long() - 1).clamp_min(0)
    out[torch.arange(mask.shape[0], device=mask.device), last] = x.to(out.dtype)
    return out * mask


def train_constrained(model: nn.Module, tok: CharTokenizer, task: Task, cfg: RLConfig | None = None, *,
                      multiplier=None, cost_checker: str = "cost", logits_processor=None,
                      critic: nn.Module | None = None, ref_model: nn.Module | None = None,
                      callback: Callable | None = None) -> ConstrainedResult:
    r"""Lagrangian PPO: maximise reward s.t. :math:`\mathbb E[c] \le C_{\max}`, with a cost value head and a multiplier.

    Each step: sample ``cfg.prompts_per_step`` × ``cfg.group_size`` responses (with
    ``logits_processor``, if given, as :func:`rlkit.llm.train` does); score the reward
    (``task.checkers[cfg.checker]``) and the cost (``task.checkers[cost_checker]``); update the
    multiplier with the batch's mean cost :math:`\hat J_C` (measured on the current policy, before
    its update); compute GAE advantages of the terminal reward and the terminal cost with the two
    heads of the critic, combine them as
    :math:`(\hat A^R - \nu\hat A^C)/(1+\nu)` (:func:`rlkit.safety.lagrangian_advantages`), whiten
    them, and take ``cfg.epochs`` passes of PPO-clip (:func:`rlkit.llm.policy_loss`) in
    ``cfg.minibatches`` pieces; the critic regresses both heads on their GAE returns,
    :math:`\tfrac12(V_\phi - G^R)^2 + \tfrac12(C_\psi - G^C)^2`. ``cfg.kl_coef > 0`` adds the KL to the
    reference as :func:`rlkit.llm.train` does (``kl_in="reward"`` subtracts it from the reward
    channel only).

    Args:
        model: the policy (updated in place). tok: its tokenizer.
        task: a :class:`~rlkit.llm.Task` with a cost checker (e.g. :data:`FORBIDDEN_ADDITION`).
        cfg: an :class:`~rlkit.llm.RLConfig` with ``algo="ppo"`` (the default here); its ``lam`` is the GAE
            trace parameter :math:`\lambda` of both heads, not the multiplier; ``eval_every`` and
            ``eval_problems`` are not used (evaluate with :func:`constraint_report`).
        multiplier: a :class:`rlkit.safety.LagrangeMultiplier`, a :class:`rlkit.safety.PIDLagrangian`
            (anything with ``update(cost) -> float``), a number, the multiplier :math:`\nu \ge 0` (a fixed penalty),
            or None (no constraint: :math:`\nu = 0`; the cost head is still trained and the cost logged).
        cost_checker: the name of the task's cost checker.
        logits_processor: a decode-time processor (a shield), used when sampling AND when the
            old and new log-probs are recomputed, so the ratio is that of the distributions that
            sampled and that are optimised. None: no processor.
        critic: a model returning ``[B, T, 2]`` (default :class:`RewardCostCritic` on a copy of ``model``).
        ref_model: the frozen reference for ``kl_coef > 0`` (default: a copy of ``model``).
        callback: ``callback(step, history)`` after every step; return True to stop.

    Returns:
        a :class:`ConstrainedResult`. Chapter: 18_safety_constraints.
    """
    cfg = _train_args(tok, task, RLConfig(algo="ppo") if cfg is None else cfg)
    if cfg.algo != "ppo":
        raise ValueError(f"train_constrained runs PPO with a reward and a cost critic: cfg.algo must be 'ppo', "
                         f"got {cfg.algo!r}")
    V.nonempty_str(cost_checker, "cost_checker")
    if cost_checker not in task.checkers:
        raise ValueError(f"cost_checker {cost_checker!r} is not one of the task's checkers {list(task.checkers)}")
    if multiplier is None or isinstance(multiplier, (int, float)) and not isinstance(multiplier, bool):
        multiplier = _Fixed(V.real_in(0.0 if multiplier is None else multiplier, "multiplier", 0.0))
    else:
        V.has_method(multiplier, "multiplier", "update")
    if logits_processor is not None:
        V.is_callable(logits_processor, "logits_processor")
    use_ref, ref_model = _reference_model(model, ref_model, cfg)
    params = list(model.parameters())
    dev = params[0].device
    rng = random.Random(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    if critic is None:
        critic = RewardCostCritic(copy.deepcopy(model), tok.vocab_size).to(dev)
    opt = torch.optim.Adam(params, lr=cfg.lr)
    vopt = torch.optim.Adam(critic.parameters(), lr=cfg.value_lr)
    G = cfg.group_size
    keys = ("reward", "cost", "accuracy", "lam", "kl", "entropy", "clip_fraction", "value_loss",
            "cost_value_loss", "shield_rate", "train_seconds")
    hist = {k: [] for k in keys}
    train_time = 0.0
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        model.eval()
        batch = collect(model, tok, task, cfg, rng, gen, dev, logits_processor=logits_processor)
        ro = batch.rollout
        mask = ro.mask
        costs = task.score(batch.responses, batch.problems, cost_checker).to(dev)
        lam = float(multiplier.update(costs.mean().item()))
        V.real_in(lam, "the multiplier's value", 0.0)
        with torch.no_grad():
            if cfg.temperature == 1.0 and logits_processor is None:
                old = ro.model_logprobs
            else:
                old = token_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, mask,
                                     temperature=cfg.temperature, logits_processor=logits_processor)
            ref = kl_tok = None
            if use_ref:
                ref = token_logprobs(ref_model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, mask,
                                     temperature=cfg.temperature)
                kl_tok = _kl_estimate(cfg.kl_estimator, old, ref) * mask
            r_tok = _terminal(batch.rewards.to(dev), mask)
            if cfg.kl_coef > 0 and cfg.kl_in == "reward":
                r_tok = r_tok - cfg.kl_coef * kl_tok
            c_tok = _terminal(costs, mask)
            vals = _critic_values(critic, ro) * mask[..., None]
            nxt = torch.cat([vals[:, 1:], torch.zeros_like(vals[:, :1])], dim=1) * mask[..., None]
            not_last = torch.zeros_like(mask)
            not_last[:, :-1] = mask[:, 1:]
            disc = cfg.gamma * not_last
            adv_r, ret_r = gae(r_tok, vals[..., 0], nxt[..., 0], disc, cfg.lam)
            adv_c, ret_c = gae(c_tok, vals[..., 1], nxt[..., 1], disc, cfg.lam)
            adv = normalize_advantages(lagrangian_advantages(adv_r, adv_c, lam, mask), mask)
        model.train()
        n_groups = mask.shape[0] // G
        clips, ents, vls, cls_ = [], [], [], []
        for _ in range(cfg.epochs):
            order = torch.randperm(n_groups, generator=gen)
            for chunk in order.chunk(min(cfg.minibatches, max(1, n_groups))):
                rows = (chunk[:, None] * G + torch.arange(G)).flatten().to(dev)
                m = mask[rows]
                logp, ent = token_logprobs(model, ro.prompt_ids[rows], ro.prompt_mask[rows], ro.response_ids[rows],
                                           m, temperature=cfg.temperature, with_entropy=True,
                                           logits_processor=logits_processor)
                loss, clip = policy_loss(cfg, logp, old[rows], adv[rows], m)
                if cfg.kl_coef > 0 and cfg.kl_in == "loss":
                    loss = loss + cfg.kl_coef * aggregate(_kl_estimate(cfg.kl_estimator, logp, ref[rows]), m,
                                                          "token-mean")
                opt.zero_grad(set_to_none=True)
                loss.backward()
                clip_grad(params, cfg.grad_clip)
                opt.step()
                v = _critic_values(critic, _select(ro, rows))
                vl = 0.5 * aggregate((v[..., 0] - ret_r[rows]) ** 2, m, "token-mean")
                cl = 0.5 * aggregate((v[..., 1] - ret_c[rows]) ** 2, m, "token-mean")
                vopt.zero_grad(set_to_none=True)
                (cfg.value_coef * (vl + cl)).backward()
                clip_grad(critic.parameters(), cfg.grad_clip)
                vopt.step()
                clips.append(clip)
                ents.append((ent * m).sum().item() / max(1.0, m.sum().item()))
                vls.append(vl.item())
                cls_.append(cl.item())
        train_time += time.perf_counter() - t0
        model.eval()
        h = hist
        h["reward"].append(batch.rewards.mean().item())
        h["cost"].append(costs.mean().item())
        h["accuracy"].append(batch.correct.mean().item())
        h["lam"].append(lam)
        h["kl"].append((kl_k3(old, ref) * mask).sum().item() / max(1.0, mask.sum().item()) if use_ref
                       else float("nan"))
        h["entropy"].append(float(np.mean(ents)) if ents else float("nan"))
        h["clip_fraction"].append(float(np.mean(clips)) if clips else float("nan"))
        h["value_loss"].append(float(np.mean(vls)) if vls else float("nan"))
        h["cost_value_loss"].append(float(np.mean(cls_)) if cls_ else float("nan"))
        if logits_processor is not None and cfg.temperature == 1.0 and cfg.top_k is None and cfg.top_p is None:
            h["shield_rate"].append(((removed_mass(ro) > 1e-6).any(-1)).float().mean().item())
        else:
            h["shield_rate"].append(float("nan"))
        h["train_seconds"].append(train_time)
        if callback is not None and callback(step, hist):
            break
    samples = [(p.prompt, r, float(x), float(c)) for p, r, x, c in
               zip(batch.problems[:8], batch.responses[:8], batch.rewards[:8], costs[:8])]
    return ConstrainedResult(model=model, critic=critic, multiplier=multiplier, history=hist, config=cfg,
                             samples=samples)


def constraint_report(model, tok: CharTokenizer, task: Task, problems: Sequence[Problem], *,
                      cost_checker: str = "cost", logits_processor=None, greedy: bool = False,
                      generator: torch.Generator | None = None, temperature: float = 1.0) -> dict:
    r"""Reward and cost of a model on ``problems``: one response each, sampled (or greedy).

    .. math:: \hat J_R = \frac1n\sum_i r(x_i, y_i),\qquad \hat J_C = \frac1n\sum_i c(x_i, y_i),
              \qquad y_i \sim q(\cdot\mid x_i),

    with :math:`q` the model's distribution at ``temperature``, processed by ``logits_processor``
    if one is given (a shield at deployment) or left alone (the *unshielded* policy).

    Args:
        model, tok, task, problems: as :func:`rlkit.llm.evaluate` (``problems`` non-empty).
        cost_checker: the name of the task's cost checker. logits_processor: a processor or None.
        greedy, generator, temperature: as :func:`rlkit.llm.evaluate`.

    Returns:
        ``{"reward", "cost"}`` (floats) and ``"rewards"``, ``"costs"`` (``[n]`` tensors),
        ``"responses"``. Chapter: 18_safety_constraints.
    """
    V.instance_of(task, "task", Task)
    V.nonempty_str(cost_checker, "cost_checker")
    if cost_checker not in task.checkers:
        raise ValueError(f"cost_checker {cost_checker!r} is not one of the task's checkers {list(task.checkers)}")
    ev = evaluate(model, tok, task, list(problems), greedy=greedy, generator=generator, temperature=temperature,
                  logits_processor=logits_processor)
    costs = task.score(ev["responses"], list(problems), cost_checker)
    return {"reward": ev["accuracy"], "cost": costs.mean().item(), "rewards": ev["rewards"], "costs": costs,
            "responses": ev["responses"]}
