r"""The article's starting recipe on the tiny LLM: :func:`rlkit.llm.train` with one part per component.

Chapter: 24_pitfalls_recipe.

The source article ends with a recipe: start from **PPO + GAE + V-trace + Lagrangian safety**, then add
**uncertainty-aware weighting** and **value-guided decoding**. Every piece was built in an earlier
chapter, so the recipe is a list of parts of the one training loop, and an ablation removes one. Chapter
24 assembles it with what the chapters before it recommend::

    train(model, tok, RECIPE_TASK, RLConfig(algo="ppo"),
          sampler=Lagged(LagDistribution.uniform(4)),               # lagged actors (chapter 16)
          advantages=OffPolicy("vtrace", "q", normalize=False),     # V-trace, a Q critic per channel
          loss=ClippedLoss(),                                       # PPO-clip of pi_theta / mu
          hooks=[Judges(("prefix", "contains", "close1"), aggregate="min"),  # pessimistic ensemble (ch. 24)
                 UncertaintyWeight(2.0),                            # the article's A_r / (1 + alpha sigma)
                 CurrentCostConstraint("cost", PIDLagrangian(0.08, kp=10, ki=0.5, ema=0.5, init=1.0),
                                       when="before", whiten=True)],  # chapter 18's multiplier, on pi_k's cost
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
  own corrected target and its own advantage (not whitened on its own: ``normalize=False``).
* **Lagrangian safety** (:class:`CurrentCostConstraint`, chapter 18's hook with the cost of the current
  policy):

  .. math:: \hat A_t = \mathrm{whiten}\Big(\frac{\tilde A^r_t - \nu\,\hat A^c_t}{1 + \nu}\Big), \qquad
            \nu \leftarrow \mathrm{PID}\big(\hat J_C(\pi_k) - C_{\max}\big),

  with :math:`\hat J_C(\pi_k)` the importance-weighted cost of the batch (:func:`current_policy_cost`),
  stepped before the advantages, and the combination whitened once, as in chapter 18, so that
  :math:`\nu` is a price in units of reward per unit of cost. Without the multiplier
  (``CurrentCostConstraint("cost", None, ...)``, :math:`\nu = 0`) the critic still values the cost.
* **The reward from several judges** (:class:`Judges`): their minimum (``aggregate="min"``), which
  closes every hole that at least one judge does not share (chapter 24, pitfall 3), or their mean.
* **Uncertainty-aware weighting** (:class:`UncertaintyWeight`, chapter 17): the reward advantage of
  response :math:`i` is divided by :math:`1 + \alpha\sigma_i`, :math:`\sigma_i` the judges' standard
  deviation. It never flips a sign, so without a KL term it keeps the mean's fixed points (chapter 17).
* **Value-guided decoding** (at evaluation, :func:`q_guidance`): :math:`\log\pi + \eta\,[Q_r - \nu Q_c](h,\cdot)`
  (:func:`rlkit.llm.guided.guided_logits`, chapter 20).
* A decode-time **shield** (``logits_processor=substring_shield(tok, FORBIDDEN)``, chapter 18) bans
  the digit that would complete ``13`` or ``14``; the trained policy is then the shielded one (the
  samplers' and the learner's log-probs, and :math:`\pi_k` in :math:`V`, are those of the masked distribution).

:func:`train_recipe` and :class:`RecipeConfig` (a switch per component) are the rlkit 0.2 form of the
call, kept for one release with rlkit 0.2's choices: the judges' mean, a
:class:`~rlkit.safety.LagrangeMultiplier` stepped after the update on the batch's plain mean cost, each
channel whitened on its own. :func:`recipe_parts` builds its parts. For a new run use the parts above.

The constrained task is :data:`RECIPE_TASK`: chapter 18's two-digit addition whose answers may not
contain ``13`` or ``14`` (:func:`rlkit.llm.safety.forbidden_task`), with three sloppy judges
(:data:`SLOPPY_JUDGES`) beside the exact checker; :data:`SHARED_BUG_JUDGES` are the same judges with one
blind spot in common (:func:`shared_truncation`).
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
from .tasks import Checker, Problem, Task, contains_answer, numeric_close, prefix_match
from .tokenizer import CharTokenizer
from .trainer import Hook, RLResult, train

__all__ = ["SLOPPY_JUDGES", "SHARED_BUG_JUDGES", "RECIPE_TASK", "shared_truncation", "aggregate_judges",
           "ensemble_rewards", "Judges", "UncertaintyWeight", "current_policy_cost", "CurrentCostConstraint",
           "q_guidance",
           "RecipeConfig", "recipe_parts", "train_recipe", "evaluate_recipe",
           "forbidden_addition", "RewardCostQHead", "RecipeResult"]

#: The three sloppy judges, reward models with blind spots, each with its own bug. The ``prefix``
#: judge accepts truncations (:func:`rlkit.llm.prefix_match`), ``contains`` extra characters
#: (:func:`rlkit.llm.contains_answer`), and ``close1`` an answer off by one (:func:`rlkit.llm.numeric_close`).
SLOPPY_JUDGES = {"prefix": prefix_match, "contains": contains_answer, "close1": numeric_close(1.0)}


def shared_truncation(checker: Checker) -> Checker:
    r"""The judge ``checker`` with a bug that every judge built on the same helper shares: short answers are trusted.

    A non-empty response shorter than the answer is checked against the answer cut to the
    response's length, :math:`a_{1:|y|}`, instead of the whole answer (a grader that "compares what the
    two strings have", written once and shared). So every judge wrapped this way accepts every
    non-empty truncation of the answer (``"1"`` and ``"14"`` for ``"1462"``), whatever its own bug.
    The empty response and responses at least as long as the answer are checked as by ``checker``.
    Chapter: 24_pitfalls_recipe.
    """
    V.is_callable(checker, "checker")

    def check(response: str, problem: Problem) -> float:
        if 0 < len(response) < len(problem.answer):
            problem = Problem(problem.prompt, problem.answer[:len(response)])
        return checker(response, problem)

    check.__name__ = f"shared_truncation_{getattr(checker, '__name__', 'checker')}"
    return check


#: The :data:`SLOPPY_JUDGES` with one blind spot in common (:func:`shared_truncation`): each keeps its
#: own bug and all three accept every non-empty truncation of the answer. Their minimum therefore closes
#: the three private holes (the empty answer, extra characters, off by one) and keeps the shared one.
SHARED_BUG_JUDGES = {name: shared_truncation(j) for name, j in SLOPPY_JUDGES.items()}


def aggregate_judges(judges, how: str = "min") -> Checker:
    r"""One checker from several: their ``"min"`` (pessimistic) or ``"mean"`` verdict.

    ``judges``: a non-empty dict of name -> checker or a sequence of checkers. The minimum gives a
    response 1 only if every judge does, so it closes a hole that at least one judge does not share
    and keeps every hole that all of them share; the mean gives a hole the share of judges it fools.
    Chapter: 24_pitfalls_recipe.
    """
    fns = tuple(judges.values()) if isinstance(judges, dict) else tuple(V.instance_of(judges, "judges", (tuple, list)))
    if not fns:
        raise ValueError("judges must hold at least one checker, got none")
    for i, f in enumerate(fns):
        V.is_callable(f, f"judges[{i}]")
    how = V.choice(how, "how", ("min", "mean"))

    def check(response: str, problem: Problem) -> float:
        verdicts = [f(response, problem) for f in fns]
        return min(verdicts) if how == "min" else sum(verdicts) / len(verdicts)

    check.__name__ = f"{how}_of_{len(fns)}_judges"
    return check

#: Chapter 18's constrained addition (reward ``"exact"``, cost ``"cost"``: an answer containing ``13`` or
#: ``14``) with the :data:`SLOPPY_JUDGES` as further checkers. Of the 8100 sums, 16.8% contain a
#: forbidden substring, so the constraint costs accuracy: a safe policy must answer those prompts wrongly.
RECIPE_TASK = forbidden_task(FORBIDDEN, SLOPPY_JUDGES)


def forbidden_addition() -> Task:
    """:data:`RECIPE_TASK` (a new one): the rlkit 0.2 name, kept for one release. Chapter: 24_pitfalls_recipe."""
    return forbidden_task(FORBIDDEN, SLOPPY_JUDGES)   # TODO(0.4): remove (rlkit 0.2's name)


def ensemble_rewards(task: Task, responses: Sequence[str], problems: Sequence[Problem],
                     judges: Sequence[str], aggregate: str = "mean") -> tuple[torch.Tensor, torch.Tensor]:
    r"""An ensemble's verdict and its standard deviation: ``(mean [N] or min [N], sigma [N])``.

    .. math:: \bar r_i = \frac1K\sum_{k=1}^K r^{(k)}_i \;\text{or}\; \min_k r^{(k)}_i, \qquad
              \sigma_i = \Big(\frac1K\sum_k (r^{(k)}_i - \bar r_i)^2\Big)^{1/2}

    (:math:`\sigma_i` is the population deviation around the mean, whatever ``aggregate``: 0 when every
    judge agrees, 0.5 for two judges that disagree). ``judges`` are checker names of ``task``;
    ``responses`` a list of strs and ``problems`` a list of problems, one per response; ``aggregate``
    ``"mean"`` or ``"min"``. Chapter: 24_pitfalls_recipe.
    """
    aggregate = V.choice(aggregate, "aggregate", ("mean", "min"))
    V.instance_of(task, "task", Task)
    judges = V.str_list(judges, "judges")
    V.int_in(len(judges), "len(judges)")
    for i, j in enumerate(judges):
        V.choice(j, f"judges[{i}]", list(task.checkers))
    responses, problems = V.str_list(responses, "responses"), V.tuple_of(problems, "problems", Problem)
    if len(responses) == 0:
        return torch.zeros(0), torch.zeros(0)
    r = torch.stack([task.score(list(responses), list(problems), j) for j in judges])
    return (r.mean(0) if aggregate == "mean" else r.min(0).values), r.std(0, unbiased=False)


def _as_judges(x, name: str) -> tuple:
    V.instance_of(x, name, (tuple, list), "a tuple of checker names")
    if not x:
        raise ValueError(f"{name} must name at least one checker, got an empty sequence")
    return tuple(V.nonempty_str(j, f"an entry of {name}") for j in x)


class Judges(Hook):
    r"""The reward is an ensemble's verdict (mean or minimum); the judges' disagreement is kept for the weighting.

    Each response :math:`i` is scored by the ``judges`` (checker names of the task) and its reward
    becomes their mean (``aggregate="mean"``) or their minimum (``"min"``, the pessimistic verdict),
    with :math:`\sigma_i` their population standard deviation (:func:`ensemble_rewards`):

    .. math:: r_i = \frac1K\sum_{k=1}^K r^{(k)}_i \;\text{or}\; \min_k r^{(k)}_i, \qquad
              \sigma_i = \Big(\frac1K\sum_k (r^{(k)}_i - \bar r_i)^2\Big)^{1/2}.

    The reward replaces the checker's in ``step.rewards`` and in the batch (so ``reward`` logs the
    ensemble's verdict); :math:`\sigma` ``[N]`` is left in ``step.data["reward_std"]``. A mean of sloppy
    judges is hacked through any judge's hole; the minimum only through a hole that every judge
    shares (chapter 24, pitfall 3). Logged: ``sigma`` (the batch's mean :math:`\sigma_i`).
    Chapter: 24_pitfalls_recipe.
    """

    def __init__(self, judges: Sequence[str] = ("exact",), aggregate: str = "mean"):
        self.judges = _as_judges(judges, "judges")
        self.aggregate = V.choice(aggregate, "aggregate", ("mean", "min"))

    def setup(self, run) -> None:
        for j in self.judges:
            V.choice(j, "a judge of Judges", list(run.task.checkers))

    @torch.no_grad()
    def on_batch(self, run, step) -> None:
        b = step.batch
        mean, sigma = ensemble_rewards(run.task, b.responses, b.problems, self.judges, self.aggregate)
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
    more slowly; without a KL term it is not pessimism (chapter 17). It acts after the estimator, on
    ``step.adv`` and on the reward's channel ``step.data["advantages"]["reward"]`` when the estimator left
    one, so put it before the hook that combines the channels (:class:`~rlkit.llm.safety.CostConstraint`), which
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


def current_policy_cost(costs: torch.Tensor, logp_new: torch.Tensor, logp_behav: torch.Tensor,
                        mask: torch.Tensor) -> float:
    r"""The current policy's expected cost from responses that older versions sampled (self-normalised IS).

    .. math:: \hat J_C(\pi_k) = \frac{\sum_i w_i c_i}{\sum_i w_i}, \qquad
              w_i = \exp\Big(\sum_t m_{i,t}\,\big(\log\pi_k(y_{i,t}\mid h_{i,t})
              - \log\mu_i(y_{i,t}\mid h_{i,t})\big)\Big),

    with :math:`\mu_i` the version that sampled response :math:`i`. It is consistent for
    :math:`\mathbb E_{\pi_k}[c]` (the cost of the policy being trained, which chapter 18's multiplier
    step needs), where the batch's plain mean :math:`\frac1N\sum_i c_i` estimates the cost of the mix of
    stale versions. On a fresh batch (:math:`\pi_k = \mu`) the two are equal. The weights are computed
    as a softmax of the log-ratios, so a large log-ratio cannot overflow. ``costs`` ``[N]``,
    ``logp_new`` and ``logp_behav`` ``[N, T]`` (log-probs of the sampled tokens; padding may hold
    anything), ``mask`` ``[N, T]``; an empty batch or a non-finite cost or real log-probability raises
    ``ValueError``. Chapter: 24_pitfalls_recipe.
    """
    sizes = V.layout("N", floating=True, costs=costs)
    V.layout("N T", sizes, floating=True, logp_new=logp_new, logp_behav=logp_behav)
    m = V.check_mask(mask, logp_new, "logp_new", as_bool=True)
    if costs.shape[0] == 0:
        raise ValueError("costs is empty: there is no response to estimate the current policy's cost from")
    diff = torch.where(m, logp_new - logp_behav, torch.zeros((), dtype=logp_new.dtype))   # NaN in padding is ignored
    for name, x in (("logp_new", logp_new), ("logp_behav", logp_behav)):
        if not bool(torch.isfinite(torch.where(m, x, torch.zeros((), dtype=x.dtype))).all()):
            raise ValueError(f"{name} must be finite on the real tokens (where mask is 1)")
    if not bool(torch.isfinite(costs).all()):
        raise ValueError("costs must be finite")
    log_w = diff.sum(-1)
    w = torch.softmax(log_w.double(), 0)
    return float((w * costs.double()).sum())


class CurrentCostConstraint(CostConstraint):
    r"""Chapter 18's :class:`~rlkit.llm.safety.CostConstraint`, whose multiplier steps on the current policy's cost.

    Identical to ``CostConstraint`` except for the cost the multiplier sees: :math:`\hat J_C(\pi_k)`
    of :func:`current_policy_cost` (importance-weighted from the batch, whose responses older versions
    may have sampled) instead of the batch's plain mean. Chapter 18's rule is to step the multiplier on
    the cost of the current policy, before the advantages (``when="before"``); with lagged actors the
    plain mean is the cost of versions up to ``lag.max`` updates old. Logged as ``CostConstraint``
    (``cost`` is :math:`\hat J_C(\pi_k)`), plus ``batch_cost`` (the plain mean). Chapter: 24_pitfalls_recipe.
    """

    @torch.no_grad()
    def on_batch(self, run, step) -> None:
        b = step.batch
        costs = run.task.score(b.responses, b.problems, self.checker).to(run.device)
        step.data.setdefault("channels", {})[self.checker] = costs
        self.cost = current_policy_cost(costs, step.logp_old, step.logp_behav, step.mask)
        run.log(batch_cost=costs.mean().item())
        if self.when == "before":
            self._step()


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
