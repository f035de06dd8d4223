r"""Safety on the tiny LLM: a cost signal, a decode-time shield, and a cost constraint for PPO (a hook).

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
the ``14`` (a shield with imperfect recall, as every regex or classifier has). Passed to
:func:`rlkit.llm.train` as its ``logits_processor``, it shapes the samples and the old and new
log-probs of the ratio (``sampler=Fresh(recompute=True)`` recomputes the old ones with the
learner's forward pass, as chapter 18 does), so PPO's ratio compares the shielded distribution
:math:`q` that sampled the data with the shielded distribution being optimised. :func:`removed_mass`
measures how much probability the shield took away.

**The constraint.** :class:`CostConstraint` is the chapter's hook for :func:`rlkit.llm.train`'s PPO
(``train(..., hooks=[CostConstraint("cost", multiplier)])``): the critic gets a second output, the
cost value :math:`C_\psi(h_t)` beside the reward value :math:`V_\phi(h_t)` (one
:class:`~rlkit.llm.heads.LogitHead` of shape ``(2,)``, :class:`~rlkit.llm.advantages.TokenGAE`'s value
channels); each step the hook measures the batch's mean cost :math:`\hat J_C` (of the policy that
sampled, shield included), steps the multiplier (:class:`rlkit.safety.LagrangeMultiplier` or
:class:`rlkit.safety.PIDLagrangian`), and trains the policy on the advantage of :math:`r - \nu c`,

.. math:: \hat A_t = \frac{\hat A^R_t - \nu\,\hat A^C_t}{1 + \nu},

with :math:`\hat A^R, \hat A^C` the GAE advantages of the terminal reward and the terminal cost
(:func:`rlkit.safety.lagrangian_advantages`), whitened over the batch as in
:func:`rlkit.llm.train`'s PPO. The cost is per sequence (Safe RLHF's choice), put on the last token.
:class:`ShieldRate` logs how often the shield acted. :func:`train_constrained` is the rlkit 0.2
name of that call, kept for one release.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn as nn

from .. import _validate as V
from ..objectives import normalize_advantages
from ..safety import lagrangian_advantages
from .advantages import TokenGAE
from .evaluation import evaluate
from .heads import LogitHead
from .rl import RLConfig, refuse_unread
from .samplers import Fresh
from .sampling import Rollout
from .tasks import Problem, Task, addition_problem, digit_rewards, exact_match
from .tokenizer import CharTokenizer
from .trainer import Hook, KLPenalty, RLResult, train

__all__ = ["FORBIDDEN", "forbidden_substrings", "forbidden_task", "FORBIDDEN_ADDITION", "substring_shield",
           "removed_mass", "CostConstraint", "ShieldRate", "RewardCostCritic", "ConstrainedResult", "train_constrained",
           "constraint_report"]

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


def forbidden_task(patterns: Sequence[str] = FORBIDDEN, checkers: dict | None = None,
                   name: str = "forbidden_addition") -> Task:
    r"""Two-digit addition whose answers must not contain ``patterns``: reward ``"exact"``, cost ``"cost"``.

    The task of chapter 7 (:func:`rlkit.llm.tasks.addition_problem`, 5 response tokens, the per-digit
    token checker :func:`rlkit.llm.digit_rewards` for ``"exact"``) with the cost checker
    ``forbidden_substrings(patterns)`` under the name ``"cost"``, and any further ``checkers`` (e.g.
    chapter 24's sloppy judges).

    Args:
        patterns: the forbidden substrings (:func:`forbidden_substrings`).
        checkers: more named checkers (not ``"exact"`` nor ``"cost"``), or None.
        name: the task's name.

    Returns:
        a :class:`~rlkit.llm.Task`. Chapter: 18_safety_constraints.
    """
    extra = dict(V.instance_of({} if checkers is None else checkers, "checkers", dict))
    for k in ("exact", "cost"):
        if k in extra:
            raise ValueError(f"checkers must not redefine {k!r} (the reward and the cost of the task)")
    cost = forbidden_substrings(patterns)
    return Task(name, addition_problem, exact_match, max_new_tokens=5, checkers={**extra, "cost": cost},
                token_checkers={"exact": digit_rewards},
                description=f"two-digit addition; a response containing {' or '.join(cost.patterns)} costs 1")


#: Two-digit addition whose answers must not contain "13" or "14" (reward ``"exact"``, cost ``"cost"``).
FORBIDDEN_ADDITION = forbidden_task()


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
        a logits processor ``f(context_ids [N, L], context_mask [N, L], logits [N, V]) -> logits`` (int64
        ids, a bool mask, floating logits with ``V`` at least the tokenizer's vocabulary; checked).
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
    vocab = tok.vocab_size

    def shield(context_ids: torch.Tensor, context_mask: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        V.index_tensor(context_ids, "context_ids", dim=2)
        V.bool_tensor(context_mask, "context_mask", context_ids, "context_ids")
        V.has_categories(logits, "logits")
        V.exact_shape(logits, "logits", (context_ids.shape[0], logits.shape[-1]), "[N, V] (N rows of context_ids)")
        V.fits(vocab, "the tokenizer's vocabulary size", logits.shape[-1], "logits.shape[-1]")
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


class _Fixed:
    """A constant multiplier (a fixed penalty, or 0 for no constraint)."""

    def __init__(self, value: float):
        self.value = value

    def __repr__(self) -> str:
        return f"fixed multiplier {self.value}"

    def update(self, cost) -> float:
        return self.value


def _as_multiplier(multiplier, when: str):
    if multiplier is None or isinstance(multiplier, (int, float)) and not isinstance(multiplier, bool):
        return _Fixed(V.real_in(0.0 if multiplier is None else multiplier, "multiplier", 0.0))
    V.has_method(multiplier, "multiplier", "update")
    if when == "after" and getattr(multiplier, "value", None) is None:
        raise TypeError(f"multiplier must have a value (the multiplier before its first step) with when='after', "
                        f"got {type(multiplier).__name__}")
    return multiplier


class CostConstraint(Hook):
    r"""A cost budget :math:`\mathbb E[c] \le C_{\max}` held by a multiplier :math:`\nu`: PPO on :math:`r - \nu c`.

    The Lagrangian :math:`\max_\theta \min_{\nu \ge 0} J_R(\theta) - \nu\,(J_C(\theta) - C_{\max})`, with
    the multiplier (:class:`rlkit.safety.LagrangeMultiplier`, :class:`rlkit.safety.PIDLagrangian`)
    holding the budget :math:`C_{\max}`. Every update:

    1. each response is scored by the task's cost checker ``checker`` (one cost per sequence, put on
       its last token) and handed to the estimator as a value channel (``run.value_channels``):
       :class:`~rlkit.llm.advantages.TokenGAE` then gives the critic a cost output
       :math:`C_\psi(h_t)` beside the reward value :math:`V_\phi(h_t)` (one
       :class:`~rlkit.llm.heads.LogitHead` of shape ``(2,)`` on a copy of the policy), computes the GAE
       advantages :math:`\hat A^R_t` of the terminal reward and :math:`\hat A^C_t` of the terminal cost
       with the same :math:`\gamma, \lambda`, and regresses both outputs,
       :math:`\tfrac12(V_\phi - G^R)^2 + \tfrac12(C_\psi - G^C)^2`;
    2. the multiplier steps on the batch's mean cost :math:`\hat J_C` (of the policy that sampled,
       shield included);
    3. the policy trains on the advantage of the Lagrangian reward :math:`r - \nu c`,

       .. math:: \hat A_t = \frac{\hat A^R_t - \nu\,\hat A^C_t}{1 + \nu}

       (:func:`rlkit.safety.lagrangian_advantages`), whitened over the batch's tokens (``whiten``).

    **When the multiplier steps** (``when``). ``"before"`` (chapter 18): on this batch's cost, before
    the advantages, so this batch's advantages already use the new :math:`\nu`. ``"after"`` (the 0.2
    recipe, :func:`rlkit.llm.recipe.train_recipe`): after the policy's update, so this batch's
    advantages use the :math:`\nu` of the batches before it, and the step applies from the next batch
    on. Chapter 24's recipe steps before, on the current policy's cost
    (:class:`rlkit.llm.recipe.CurrentCostConstraint`).

    Logged: ``cost`` (:math:`\hat J_C`), ``nu`` (the multiplier after this update's step: with
    ``"before"`` the one this batch's advantages used, with ``"after"`` the one the next batch will
    use) and the estimator's ``<checker>_value_loss``. ``result.nu`` is the final multiplier.

    Args:
        checker: the name of the task's cost checker, and of the value channel.
        multiplier: anything with ``update(cost) -> float`` (a ``LagrangeMultiplier``, a
            ``PIDLagrangian``; with ``when="after"`` it also needs ``value``, the multiplier before
            the first step), a number :math:`\nu \ge 0` (a fixed penalty), or None (:math:`\nu = 0`: no
            constraint; the cost is still measured and valued).
        when: ``"before"`` or ``"after"``, as above.
        whiten: whiten :math:`\hat A_t` over the batch (PPO's whitening, chapter 18); False combines the
            estimator's channel advantages as they are (an estimator that whitens each channel itself).

    The estimator must leave the channels' advantages in ``step.data["advantages"]`` (``"reward"`` and
    ``checker``), as :class:`~rlkit.llm.advantages.TokenGAE` does for ``RLConfig(algo="ppo")``.
    Chapter: 18_safety_constraints.
    """

    def __init__(self, checker: str = "cost", multiplier=None, when: str = "before", whiten: bool = True):
        self.checker = V.nonempty_str(checker, "checker")
        self.when = V.choice(when, "when", ("before", "after"))
        self.multiplier = _as_multiplier(multiplier, self.when)
        self.whiten = V.instance_of(whiten, "whiten", bool)
        value = getattr(self.multiplier, "value", None)          # nu before the first step (NaN if unknown)
        self.nu = float("nan") if value is None else V.real_in(float(value), "the multiplier's value", 0.0)
        self.cost = float("nan")

    def setup(self, run) -> None:
        if self.checker not in run.task.checkers:
            raise ValueError(f"checker {self.checker!r} is not one of the task's checkers {list(run.task.checkers)}")
        if self.checker in run.value_channels:
            raise ValueError(f"the value channel {self.checker!r} is already taken (two constraints on one checker?)")
        run.value_channels.append(self.checker)

    def _step(self) -> None:
        self.nu = V.real_in(float(self.multiplier.update(self.cost)), "the multiplier's value", 0.0)

    @torch.no_grad()
    def on_batch(self, run, step) -> None:
        b = step.batch
        costs = run.task.score(b.responses, b.problems, self.checker).to(run.device)
        step.data.setdefault("channels", {})[self.checker] = costs
        self.cost = costs.mean().item()
        if self.when == "before":
            self._step()

    @torch.no_grad()
    def on_advantages(self, run, step) -> None:
        advs = step.data.get("advantages", {})
        if "reward" not in advs or self.checker not in advs:
            raise ValueError(f"CostConstraint needs an estimator that values the {self.checker!r} channel beside the "
                             f"reward (step.data['advantages']), such as TokenGAE with RLConfig(algo='ppo')")
        mask = step.rollout.mask
        adv = lagrangian_advantages(advs["reward"], advs[self.checker], self.nu, mask)
        step.adv = normalize_advantages(adv, mask) if self.whiten else adv

    def on_update_end(self, run, step) -> None:
        if self.when == "after":
            self._step()
        run.log(cost=self.cost, nu=self.nu)

    def result(self, run) -> dict:
        return {"nu": self.nu}


class ShieldRate(Hook):
    r"""Logs ``shield_rate``: the share of the step's responses in which the run's logits processor removed probability.

    A response counts when :func:`removed_mass` exceeds :math:`10^{-6}` at one of its tokens. The
    removed mass is read from the rollout, which needs sampling at temperature 1 without top-k or
    top-p; otherwise (or without a processor) nothing is logged. Chapter: 18_safety_constraints.
    """

    def on_batch(self, run, step) -> None:
        cfg = run.cfg
        if run.logits_processor is not None and cfg.temperature == 1.0 and cfg.top_k is None and cfg.top_p is None:
            run.log(shield_rate=((removed_mass(step.rollout) > 1e-6).any(-1)).float().mean().item())


class RewardCostCritic(LogitHead):
    r"""The reward value and the cost value on one copy of the LM: ``LogitHead(lm, vocab_size, shape=(2,))``.

    ``forward(ids [B, T], attention_mask=None) -> [B, T, 2]`` (channel 0 the reward value
    :math:`V_\phi(h_t)`, 1 the cost value :math:`C_\psi(h_t)`, the expected cost still to come). Both
    start at 0. Kept for one release: :class:`CostConstraint` builds this critic itself.
    Chapter: 18_safety_constraints.
    """

    def __init__(self, lm: nn.Module, vocab_size: int):
        super().__init__(lm, V.int_in(vocab_size, "vocab_size"), (2,))


#: What :func:`train_constrained` returns (rlkit 0.2's name): an :class:`rlkit.llm.RLResult`.
ConstrainedResult = RLResult

#: The RLConfig fields the rlkit 0.2 trainer did not read (and why).
_CONSTRAINED_UNREAD = {
    "eval_every": "it does not evaluate; use constraint_report",
    "eval_problems": "it does not evaluate; use constraint_report",
}


def train_constrained(model: nn.Module, tok: CharTokenizer, task: Task, cfg: RLConfig | None = None, *,
                      multiplier=None, cost_checker: str = "cost", logits_processor=None,
                      advantages: TokenGAE | None = None, kl: KLPenalty | None = None,
                      callback: Callable | None = None) -> RLResult:
    r"""Lagrangian PPO: ``train(..., hooks=[CostConstraint(cost_checker, multiplier)])``, the rlkit 0.2 name.

    Kept for one release. The multiplier steps before the advantages (``when="before"``); a
    ``logits_processor`` (a shield) samples and scores the ratio's log-probs, which are recomputed
    by the learner (:class:`rlkit.llm.samplers.Fresh` with ``recompute=True``), and :class:`ShieldRate`
    logs how often it acted. There is no held-out evaluation (use :func:`constraint_report`).
    ``cfg`` (default ``RLConfig(algo="ppo")``) must be PPO and leave ``eval_every`` and
    ``eval_problems`` at their defaults (this trainer does not read them). ``callback(step, history)``
    returning True stops training. Returns an :class:`rlkit.llm.RLResult`: ``history`` as
    :func:`rlkit.llm.train`'s plus ``cost``, ``nu``, ``cost_value_loss`` and ``shield_rate``; extras
    ``nu`` (the final multiplier) and ``multiplier`` (the object).

    What rlkit 0.2 read from ``cfg`` or took as ``critic=`` and ``ref_model=`` is given to the parts
    (rlkit 0.3): ``advantages`` is PPO's :class:`~rlkit.llm.advantages.TokenGAE`, whose critic gets the
    cost channel (default ``TokenGAE()``: :math:`\gamma = 1`, :math:`\lambda = 0.95`, the policy's
    learning rate; ``TokenGAE(critic, gamma=, lam=, lr=, coef=)`` for 0.2's ``critic``, ``gamma``,
    ``lam``, ``value_lr``, ``value_coef``), and ``kl`` a :class:`rlkit.llm.trainer.KLPenalty`, run
    first among the hooks (default None: no reference model; ``KLPenalty(coef, estimator, where,
    ref_model=)`` for 0.2's ``kl_coef``, ``kl_estimator``, ``kl_in``, ``ref_model``).

    Chapter: 18_safety_constraints.
    """
    V.instance_of(model, "model", nn.Module)
    cfg = RLConfig(algo="ppo") if cfg is None else V.instance_of(cfg, "cfg", RLConfig)
    if cfg.algo != "ppo":
        raise ValueError(f"train_constrained runs PPO with a reward and a cost critic: cfg.algo must be 'ppo', "
                         f"got {cfg.algo!r}")
    refuse_unread(cfg, "train_constrained", _CONSTRAINED_UNREAD)
    V.instance_of(task, "task", Task, "rlkit.llm.tasks.Task")
    V.nonempty_str(cost_checker, "cost_checker")
    if cost_checker not in task.checkers:
        raise ValueError(f"cost_checker {cost_checker!r} is not one of the task's checkers {list(task.checkers)}")
    advantages = TokenGAE() if advantages is None else V.instance_of(advantages, "advantages", TokenGAE)
    if callback is not None:
        V.is_callable(callback, "callback")
    hooks = [] if kl is None else [V.instance_of(kl, "kl", KLPenalty)]
    constraint = CostConstraint(cost_checker, multiplier, when="before")
    hooks.append(constraint)
    if logits_processor is not None:
        hooks.append(ShieldRate())
    res = train(model, tok, task, cfg, sampler=Fresh(recompute=True), advantages=advantages, hooks=hooks,
                evaluation=False, logits_processor=logits_processor,
                callback=None if callback is None else lambda k, history, evals: callback(k, history))
    res.extras["multiplier"] = constraint.multiplier
    return res


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
    problems = V.tuple_of(problems, "problems", Problem)
    ev = evaluate(model, tok, task, list(problems), greedy=greedy, generator=generator, temperature=temperature,
                  logits_processor=logits_processor)
    costs = task.score(ev["responses"], list(problems), cost_checker)
    return {"reward": ev["accuracy"], "cost": costs.mean().item(), "rewards": ev["rewards"], "costs": costs,
            "responses": ev["responses"]}
