r"""The article's starting recipe on the tiny LLM: :func:`rlkit.llm.train` with one part per component.

Chapter: 24_pitfalls_recipe.

The source article ends with a recipe: start from **PPO + GAE + V-trace + Lagrangian safety**, then add
**uncertainty-aware weighting** and **value-guided decoding**. Every piece was built in an earlier
chapter, so the recipe is a list of parts of the one training loop, and an ablation removes one::

    train(model, tok, RECIPE_TASK, RLConfig(algo="ppo"),
          sampler=Lagged(LagDistribution.uniform(4)),               # lagged actors (chapter 16)
          advantages=OffPolicy("vtrace", "q"),                      # V-trace, a Q critic per channel
          loss=ClippedLoss(),                                       # PPO-clip of pi_theta / mu
          hooks=[Judges(("prefix", "contains", "close1")),          # the reward: an ensemble's mean
                 UncertaintyWeight(2.0),                            # A_r / (1 + alpha sigma)
                 CostConstraint("cost", LagrangeMultiplier(0.08, lr=2.0), when="after", whiten=False)],
          evaluation=False)

* **Lagged actors and V-trace** (chapter 16): each group of responses is sampled by version
  :math:`k-\ell` of the policy (:class:`rlkit.llm.samplers.Lagged`); the critic's targets and the
  advantages are V-trace's (:class:`rlkit.llm.advantages.OffPolicy`, ``"vtrace"``,
  :math:`\bar\rho = \bar c`) or the uncorrected GAE of the behaviour trajectory (``"none"``); the
  policy loss is PPO-clip of :math:`\pi_\theta/\mu` in both cases (:class:`rlkit.llm.lagged.ClippedLoss`).
* **Two critics on one network**: the cost is a value channel of the estimator (the
  :class:`~rlkit.llm.safety.CostConstraint` hook asks for it), so the critic is one
  :class:`~rlkit.llm.heads.LogitHead` of shape ``(2, |V|)`` on a copy of the LM,
  :math:`(Q_r, Q_c)(h_t,\cdot)`, with :math:`V(h_t) = \sum_a\pi_k(a\mid h_t)Q(h_t,a)`. Each channel gets its
  own corrected target and its own advantage, whitened over the batch.
* **Lagrangian safety** (:class:`rlkit.llm.safety.CostConstraint` with ``when="after"``, chapter 18):

  .. math:: \hat A_t = \frac{\tilde A^r_t - \nu\,\hat A^c_t}{1 + \nu}, \qquad
            \nu \leftarrow \big[\nu + \eta_\nu(\hat C - C_{\max})\big]_+ ,

  with :math:`\hat C` the batch's mean cost, stepped after the update
  (:class:`rlkit.safety.LagrangeMultiplier`); no further whitening (``whiten=False``). Without the
  multiplier (``CostConstraint("cost", None, ...)``, :math:`\nu = 0`) the critic still values the cost.
* **Uncertainty-aware weighting** (:class:`UncertaintyWeight`, chapter 17): the reward is the mean of an
  ensemble of judges (:class:`Judges`) and the reward advantage of response :math:`i` is divided by
  :math:`1 + \alpha\sigma_i`, :math:`\sigma_i` the judges' standard deviation. It never flips a sign.
* **Value-guided decoding** (at evaluation, :func:`q_guidance`): :math:`\log\pi + \eta\,[Q_r - \nu Q_c](h,\cdot)`
  (:func:`rlkit.llm.guided.guided_logits`, chapter 20).
* A decode-time **shield** (``logits_processor=substring_shield(tok, FORBIDDEN)``, chapter 18) bans
  the digit that would complete ``13`` or ``14``; the trained policy is then the shielded one (the
  samplers' and the learner's log-probs, and :math:`\pi_k` in :math:`V`, are those of the masked distribution).

The constrained task is :data:`RECIPE_TASK`: chapter 18's two-digit addition whose answers may not
contain ``13`` or ``14`` (:func:`rlkit.llm.safety.forbidden_task`), with three sloppy judges
(:data:`SLOPPY_JUDGES`) beside the exact checker. :func:`train_recipe` (with :class:`RecipeConfig`, a
switch per component) is the rlkit 0.2 name of the call, kept for one release; :func:`recipe_parts`
builds its parts.
"""
from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn

from .. import _validate as V
from ..risk import downweighted_advantages
from ..safety import LagrangeMultiplier
from ..staleness import LagDistribution
from .advantages import OffPolicy
from .evaluation import evaluate
from .guided import guided_logits
from .heads import LogitHead
from .lagged import ClippedLoss
from .rl import RLConfig, refuse_unread
from .safety import FORBIDDEN, CostConstraint, forbidden_task, substring_shield
from .samplers import Lagged
from .tasks import Problem, Task, contains_answer, numeric_close, prefix_match
from .tokenizer import CharTokenizer
from .trainer import Hook, RLResult, train

__all__ = ["SLOPPY_JUDGES", "RECIPE_TASK", "ensemble_rewards", "Judges", "UncertaintyWeight", "q_guidance",
           "RecipeConfig", "recipe_parts", "train_recipe", "evaluate_recipe",
           "forbidden_addition", "RewardCostQHead", "RecipeResult"]

#: The three sloppy judges, reward models with blind spots, each with its own bug. The ``prefix``
#: judge accepts truncations (:func:`rlkit.llm.prefix_match`), ``contains`` extra characters
#: (:func:`rlkit.llm.contains_answer`), and ``close1`` an answer off by one (:func:`rlkit.llm.numeric_close`).
SLOPPY_JUDGES = {"prefix": prefix_match, "contains": contains_answer, "close1": numeric_close(1.0)}

#: Chapter 18's constrained addition (reward ``"exact"``, cost ``"cost"``: an answer containing ``13`` or
#: ``14``) with the :data:`SLOPPY_JUDGES` as further checkers. Of the 8100 sums, 16.8% contain a
#: forbidden substring, so the constraint costs accuracy: a safe policy must answer those prompts wrongly.
RECIPE_TASK = forbidden_task(FORBIDDEN, SLOPPY_JUDGES)


def forbidden_addition() -> Task:
    """:data:`RECIPE_TASK` (a new one): the rlkit 0.2 name, kept for one release. Chapter: 24_pitfalls_recipe."""
    return forbidden_task(FORBIDDEN, SLOPPY_JUDGES)   # TODO(0.4): remove (rlkit 0.2's name)


def ensemble_rewards(task: Task, responses: Sequence[str], problems: Sequence[Problem],
                     judges: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Mean and standard deviation over an ensemble of judges: ``(mean [N], sigma [N])``.

    .. math:: \bar r_i = \frac1K\sum_{k=1}^K r^{(k)}_i, \qquad
              \sigma_i = \Big(\frac1K\sum_k (r^{(k)}_i - \bar r_i)^2\Big)^{1/2}

    (the population deviation: 0 when every judge agrees, 0.5 for two judges that disagree).
    ``judges`` are checker names of ``task``; ``responses`` a list of strs and ``problems`` a list of
    problems, one per response. Chapter: 24_pitfalls_recipe.
    """
    V.instance_of(task, "task", Task)
    judges = V.str_list(judges, "judges")
    V.int_in(len(judges), "len(judges)")
    for i, j in enumerate(judges):
        V.choice(j, f"judges[{i}]", list(task.checkers))
    responses, problems = V.str_list(responses, "responses"), V.tuple_of(problems, "problems", Problem)
    if len(responses) == 0:
        return torch.zeros(0), torch.zeros(0)
    r = torch.stack([task.score(list(responses), list(problems), j) for j in judges])
    return r.mean(0), r.std(0, unbiased=False)


def _as_judges(x, name: str) -> tuple:
    V.instance_of(x, name, (tuple, list), "a tuple of checker names")
    if not x:
        raise ValueError(f"{name} must name at least one checker, got an empty sequence")
    return tuple(V.nonempty_str(j, f"an entry of {name}") for j in x)


class Judges(Hook):
    r"""The reward is the mean verdict of an ensemble of judges; their disagreement is kept for the weighting.

    Each response :math:`i` is scored by the ``judges`` (checker names of the task) and its reward
    becomes their mean, with :math:`\sigma_i` their population standard deviation
    (:func:`ensemble_rewards`):

    .. math:: r_i = \frac1K\sum_{k=1}^K r^{(k)}_i, \qquad
              \sigma_i = \Big(\frac1K\sum_k (r^{(k)}_i - r_i)^2\Big)^{1/2}.

    The reward replaces the checker's in ``step.rewards`` and in the batch (so ``reward`` logs the
    ensemble's mean); :math:`\sigma` ``[N]`` is left in ``step.data["reward_std"]``. A mean of sloppy
    judges is still hacked where they share a hole (chapter 24, pitfall 3). Logged: ``sigma`` (the
    batch's mean :math:`\sigma_i`). Chapter: 24_pitfalls_recipe.
    """

    def __init__(self, judges: Sequence[str] = ("exact",)):
        self.judges = _as_judges(judges, "judges")

    def setup(self, run) -> None:
        for j in self.judges:
            V.choice(j, "a judge of Judges", list(run.task.checkers))

    @torch.no_grad()
    def on_batch(self, run, step) -> None:
        b = step.batch
        mean, sigma = ensemble_rewards(run.task, b.responses, b.problems, self.judges)
        b.rewards = mean
        step.rewards = mean.to(run.device)
        step.data["reward_std"] = sigma.to(run.device)
        run.log(sigma=float(sigma.mean()))


class UncertaintyWeight(Hook):
    r"""The article's uncertainty-aware weighting: a reward advantage becomes :math:`A/(1 + \alpha\sigma_i)`.

    .. math:: \tilde A^r_t = \frac{\hat A^r_t}{1 + \alpha\,\sigma_i}

    (:func:`rlkit.risk.downweighted_advantages`), with :math:`\sigma_i` the judges' standard deviation
    on response :math:`i` (a :class:`Judges` hook earlier in the list). Every factor lies in
    :math:`(0, 1]`, so it never flips a sign: a response the judges overrate is still pushed up, only
    more slowly (chapter 17); it is not pessimism. It acts after the estimator, on ``step.adv`` and on
    the reward's channel ``step.data["advantages"]["reward"]`` when the estimator left one, so put it
    before the hook that combines the channels (:class:`~rlkit.llm.safety.CostConstraint`), which
    then reads :math:`\tilde A^r`. ``alpha=0`` changes nothing. Chapter: 24_pitfalls_recipe.
    """

    def __init__(self, alpha: float = 1.0):
        self.alpha = V.real_in(alpha, "alpha", 0.0)

    @torch.no_grad()
    def on_advantages(self, run, step) -> None:
        sigma = step.data.get("reward_std")
        if sigma is None:
            raise ValueError("UncertaintyWeight needs the judges' disagreement: put a Judges hook before it")
        advs = step.data.get("advantages", {})
        if "reward" in advs:
            advs["reward"] = downweighted_advantages(advs["reward"], sigma[:, None].expand_as(advs["reward"]),
                                                     self.alpha)
        step.adv = downweighted_advantages(step.adv, sigma[:, None].expand_as(step.adv), self.alpha)


class RewardCostQHead(LogitHead):
    r"""Two critics over the vocabulary on one LM, :math:`(Q_r, Q_c)(h_t,\cdot)`: a LogitHead of shape (2, V).

    ``forward(ids [B, T], attention_mask=None) -> q [B, T, 2, |V|]``; channel 0 is the reward's
    :math:`Q_r`, channel 1 the cost's :math:`Q_c`. The rlkit 0.2 name, kept for one release:
    :class:`rlkit.llm.advantages.OffPolicy` builds this critic itself when a hook values the cost.
    Chapter: 24_pitfalls_recipe.
    """

    def __init__(self, lm: nn.Module, vocab_size: int):   # TODO(0.4): remove (rlkit 0.2's name)
        vocab_size = V.int_in(vocab_size, "vocab_size")
        super().__init__(lm, vocab_size, (2, vocab_size))


def q_guidance(critic: LogitHead, eta: float, lam: float = 0.0):
    r"""Value-guided decoding with the recipe's critic: :math:`\log\pi + \eta\,\big(Q_r - \nu Q_c\big)(h,\cdot)`.

    With deterministic token transitions and no reward before the end, :math:`Q(h, a) = V(h\,a)`, so
    this is the article's :math:`\log\tilde\pi = \log\pi + \eta\,(V(h_{t+1}) - V(h_t))`: the
    :math:`V(h_t)` term is the same for every candidate and the softmax cancels it. ``critic`` is a
    :class:`~rlkit.llm.heads.LogitHead` of shape ``(2, |V|)`` (the recipe's ``result.critic``). Returns a
    :data:`rlkit.llm.sampling.LogitsProcessor`; ``eta`` :math:`\ge 0`, ``lam`` the multiplier :math:`\nu \ge 0`.
    Chapter: 24_pitfalls_recipe.
    """
    V.instance_of(critic, "critic", LogitHead)
    if len(critic.shape) != 2 or critic.shape[0] != 2:
        raise ValueError(f"critic must be a LogitHead of shape (2, vocab_size) (Q_r and Q_c), got shape {critic.shape}")
    eta = V.real_in(eta, "eta", 0.0)
    lam = V.real_in(lam, "lam", 0.0)
    vocab = critic.shape[1]

    @torch.no_grad()
    def guide(context_ids, context_mask, logits):
        V.index_tensor(context_ids, "context_ids", dim=2)
        V.bool_tensor(context_mask, "context_mask", context_ids, "context_ids")
        V.has_categories(logits, "logits")
        V.exact_shape(logits, "logits", (context_ids.shape[0], vocab), "[N, vocab_size of the critic]")
        q = critic(context_ids, attention_mask=context_mask)[:, -1]
        return guided_logits(logits, (q[:, 0] - lam * q[:, 1]).to(logits.dtype), eta)

    return guide


def _as_lag(x, name: str) -> LagDistribution:
    V.instance_of(x, name, (LagDistribution, numbers.Integral), "LagDistribution or an int >= 0")
    return x if isinstance(x, LagDistribution) else LagDistribution.fixed(V.int_in(x, name, 0))


@dataclass(frozen=True)
class RecipeConfig(V.ValidatedConfig):
    r"""The components of :func:`train_recipe`, each a switch, checked when built.

    Fields: ``lag`` (a :class:`rlkit.staleness.LagDistribution` or an int); ``vtrace`` (V-trace targets,
    else uncorrected GAE); ``clip_rho`` (:math:`\bar\rho=\bar c`, V-trace only); ``lagrangian``,
    ``cost_limit`` :math:`C_{\max}`, ``lambda_lr`` :math:`\eta_\nu`, ``lambda_init`` (:math:`\nu_0`, the
    multiplier's start; the three only with ``lagrangian``); ``judges`` (checker names whose mean is the
    reward) and ``alpha`` (uncertainty weighting, 0 = off); ``shield`` (train the shielded policy); the
    critic's ``gamma`` :math:`\gamma` and ``lam`` :math:`\lambda` (in ``[0, 1]``), ``value_lr`` (its
    learning rate, ``> 0``; ``None``: ``RLConfig.lr``) and ``value_coef`` (``>= 0``), passed to
    :class:`rlkit.llm.advantages.OffPolicy` (``gamma``, ``lam``, ``lr``, ``coef``; they were RLConfig's in
    rlkit 0.2).

    Chapter: 24_pitfalls_recipe.
    """

    lag: LagDistribution | int = V.config_field(0, _as_lag)
    vtrace: bool = V.bool_field(True)
    clip_rho: float = V.number_field(1.0, 0.0, lo_open=True)
    lagrangian: bool = V.bool_field(True)
    cost_limit: float = V.number_field(0.08, 0.0, 1.0)
    lambda_lr: float = V.number_field(2.0, 0.0, lo_open=True)
    lambda_init: float = V.number_field(0.0, 0.0)
    judges: tuple = V.config_field(("exact",), _as_judges)
    alpha: float = V.number_field(0.0, 0.0)
    shield: bool = V.bool_field(False)
    gamma: float = V.number_field(1.0, 0.0, 1.0)
    lam: float = V.number_field(1.0, 0.0, 1.0)
    value_lr: float | None = V.number_field(None, 0.0, lo_open=True, optional=True)   # None: RLConfig.lr
    value_coef: float = V.number_field(1.0, 0.0)


#: What :func:`train_recipe` returns (rlkit 0.2's name): an :class:`rlkit.llm.RLResult`.
RecipeResult = RLResult

#: The RLConfig fields the recipe does not read, and why (rlkit.llm.rl.refuse_unread).
_UNREAD = {
    "temperature": "its actors sample at temperature 1",
    "top_k": "its actors sample from the whole vocabulary",
    "top_p": "its actors sample from the whole vocabulary",
    "clip_eps_high": "its clip radius is the symmetric RLConfig.clip_eps",
    "checker": "its reward is the mean of RecipeConfig.judges",
    "eval_every": "it does not evaluate; use evaluate_recipe",
    "eval_problems": "it does not evaluate; use evaluate_recipe",
}


def recipe_parts(tok, cfg: RLConfig | None = None, recipe: RecipeConfig | None = None,
                 task: Task | None = None) -> tuple[Task, RLConfig, dict]:
    r"""The recipe as parts of :func:`rlkit.llm.train`: ``(task, cfg, kw)`` for ``train(model, tok, task, cfg, **kw)``.

    ``kw`` holds ``sampler`` (:class:`~rlkit.llm.samplers.Lagged` with ``recipe.lag``, keeping at
    least 9 versions), ``advantages`` (:class:`~rlkit.llm.advantages.OffPolicy`, ``"vtrace"`` with
    ``clip_rho`` or ``"none"``, a Q critic, ``gamma``, ``lam``, ``value_lr`` and ``value_coef`` from
    ``recipe``), ``loss`` (:class:`~rlkit.llm.lagged.ClippedLoss`), ``hooks`` (:class:`Judges`,
    :class:`UncertaintyWeight` if ``alpha > 0``, :class:`~rlkit.llm.safety.CostConstraint` stepped after
    the update with a :class:`rlkit.safety.LagrangeMultiplier`, or :math:`\nu = 0` without ``lagrangian``),
    ``evaluation=False`` and ``logits_processor`` (the shield, or None). ``task`` defaults to
    :data:`RECIPE_TASK`, ``cfg`` to ``RLConfig(algo="ppo")``, ``recipe`` to ``RecipeConfig()``.
    Every call builds new parts (the multiplier and the critic keep their state).
    Chapter: 24_pitfalls_recipe.
    """
    V.instance_of(tok, "tok", CharTokenizer)
    cfg = RLConfig(algo="ppo") if cfg is None else V.instance_of(cfg, "cfg", RLConfig)
    recipe = RecipeConfig() if recipe is None else V.instance_of(recipe, "recipe", RecipeConfig)
    task = RECIPE_TASK if task is None else V.instance_of(task, "task", Task, "rlkit.llm.tasks.Task")
    hooks = [Judges(recipe.judges)]
    if recipe.alpha > 0:
        hooks.append(UncertaintyWeight(recipe.alpha))
    mult = (LagrangeMultiplier(budget=recipe.cost_limit, lr=recipe.lambda_lr, init=recipe.lambda_init)
            if recipe.lagrangian else None)
    hooks.append(CostConstraint("cost", mult, when="after", whiten=False))
    target, clip = ("vtrace", recipe.clip_rho) if recipe.vtrace else ("none", 1.0)
    kw = dict(sampler=Lagged(recipe.lag, keep=max(recipe.lag.max + 1, 9)),
              advantages=OffPolicy(target, "q", clip_rho=clip, clip_c=clip, gamma=recipe.gamma, lam=recipe.lam,
                                   lr=recipe.value_lr, coef=recipe.value_coef),
              loss=ClippedLoss("standard"), hooks=hooks, evaluation=False,
              logits_processor=substring_shield(tok, FORBIDDEN) if recipe.shield else None)
    return task, cfg, kw


def _check_recipe(recipe: RecipeConfig) -> None:
    """Refuse the RecipeConfig fields that the chosen switches make unread."""
    default = RecipeConfig()
    if not recipe.vtrace and recipe.clip_rho != default.clip_rho:
        raise ValueError(f"RecipeConfig.clip_rho is V-trace's clip; with vtrace=False it is not read: leave it at "
                         f"{default.clip_rho}, got {recipe.clip_rho}")
    if not recipe.lagrangian:
        for name in ("cost_limit", "lambda_lr", "lambda_init"):
            if getattr(recipe, name) != getattr(default, name):
                raise ValueError(f"RecipeConfig.{name} belongs to the multiplier; with lagrangian=False it is not "
                                 f"read: leave it at {getattr(default, name)}, got {getattr(recipe, name)}")


def train_recipe(model: nn.Module, tok: CharTokenizer, task: Task, cfg: RLConfig | None = None,
                 recipe: RecipeConfig | None = None, *, verbose: bool = False) -> RLResult:
    r"""The recipe with a switch per component (:class:`RecipeConfig`): :func:`rlkit.llm.train` on :func:`recipe_parts`.

    The rlkit 0.2 name, kept for one release. ``cfg`` (default ``RLConfig(algo="ppo")``) must be PPO
    and leave at their defaults the fields the recipe does not read: ``temperature``, ``top_k``,
    ``top_p``, ``clip_eps_high``, ``checker``, ``eval_every``, ``eval_problems``. The critic's settings
    (``gamma``, ``lam``, ``value_lr``, ``value_coef``) are :class:`RecipeConfig`'s. ``recipe`` must leave
    ``clip_rho`` at 1 without V-trace and the multiplier's fields at their defaults without the
    Lagrangian. ``task``
    must have a ``cost`` checker and the judges (:data:`RECIPE_TASK`).

    Returns an :class:`rlkit.llm.RLResult`: ``history`` as :func:`rlkit.llm.train`'s plus ``sigma``,
    ``mean_age``, ``staleness``, ``cost``, ``nu`` (the multiplier after each update; rlkit 0.2's
    ``lambda``) and ``cost_value_loss``; ``critic`` (the ``(2, |V|)`` Q head); extras ``nu`` (the final
    multiplier; also ``lam``, its rlkit 0.2 name, for one release), ``archive`` (the last 9 or more
    versions of the policy) and ``recipe``.

    Chapter: 24_pitfalls_recipe.
    """
    V.instance_of(model, "model", nn.Module)
    V.boolean(verbose, "verbose")
    cfg = RLConfig(algo="ppo") if cfg is None else V.instance_of(cfg, "cfg", RLConfig)
    recipe = RecipeConfig() if recipe is None else V.instance_of(recipe, "recipe", RecipeConfig)
    if cfg.algo != "ppo":
        raise ValueError(f"cfg.algo must be 'ppo' for train_recipe (an actor-critic), got {cfg.algo!r}")
    refuse_unread(cfg, "train_recipe", _UNREAD)
    _check_recipe(recipe)
    V.instance_of(task, "task", Task, "rlkit.llm.tasks.Task")
    if "cost" not in task.checkers:
        raise ValueError(f"task {task.name!r} has no 'cost' checker; use rlkit.llm.recipe.RECIPE_TASK")
    for j in recipe.judges:
        V.choice(j, "a judge of RecipeConfig.judges", list(task.checkers))
    task, loop_cfg, kw = recipe_parts(tok, cfg, recipe, task)
    res = train(model, tok, task, loop_cfg, verbose=verbose, **kw)
    res.extras.update(lam=res.nu, recipe=recipe)
    return res


def evaluate_recipe(model: nn.Module, tok: CharTokenizer, task: Task, problems: Sequence[Problem], *,
                    logits_processor=None, judges: Sequence[str] = ("prefix", "contains", "close1")) -> dict:
    r"""Greedy answers to ``problems`` scored three ways: ``{"accuracy", "cost", "disagreement", "responses"}``.

    ``accuracy`` is exact match (the true reward), ``cost`` the share of answers with a forbidden
    substring, ``disagreement`` the share of answers on which the ``judges`` do not all agree.
    ``logits_processor``: e.g. :func:`rlkit.llm.safety.substring_shield` or :func:`q_guidance`.
    Chapter: 24_pitfalls_recipe.
    """
    problems = list(V.tuple_of(problems, "problems", Problem))
    out = evaluate(model, tok, task, problems, greedy=True, logits_processor=logits_processor)
    resp = out["responses"]
    _, sig = ensemble_rewards(task, resp, problems, judges)
    return {"accuracy": out["accuracy"], "cost": float(task.score(resp, problems, "cost").mean()),
            "disagreement": float((sig > 0).float().mean()), "responses": resp}
