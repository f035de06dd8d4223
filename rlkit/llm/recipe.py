r"""The article's starting recipe on the tiny LLM, one switch per component, and the glue it needs.

Chapter: 24_pitfalls_recipe.

The source article ends with a recipe: start from **PPO + GAE + V-trace + Lagrangian safety**, then add
**uncertainty-aware weighting** and **value-guided decoding**. :func:`train_recipe` is that learner, with
every component a field of :class:`RecipeConfig`, so that an ablation removes one at a time:

* **Lagged actors and V-trace** (chapter 16): each group of responses is sampled by version
  :math:`k-\ell` of the policy (``lag``, a :class:`rlkit.staleness.PolicyArchive`); the critic's
  targets and the advantages are V-trace's (``vtrace=True``, :math:`\bar\rho = \bar c =` ``clip_rho``)
  or the uncorrected GAE of the behaviour trajectory (``vtrace=False``); the policy loss is PPO-clip of
  :math:`\pi_\theta/\mu` in both cases.
* **Two critics on one network**: :class:`RewardCostQHead` gives :math:`Q_r(h_t,\cdot)` and
  :math:`Q_c(h_t,\cdot)` over the vocabulary from one copy of the LM; :math:`V(h_t) = \sum_a\pi_k(a\mid h_t)Q(h_t,a)`.
* **Lagrangian safety** (``lagrangian=True``): the per-token advantage is

  .. math:: \hat A_t = \frac{\tilde A^r_t - \nu\,\hat A^c_t}{1 + \nu}, \qquad
            \nu \leftarrow \big[\nu + \eta_\nu(\hat C - C_{\max})\big]_+ ,

  with :math:`\hat C` the batch's mean cost, :math:`C_{\max}` = ``cost_limit``
  (:class:`rlkit.safety.LagrangeMultiplier` with projected SGD and
  :func:`rlkit.safety.lagrangian_advantages`, chapter 18).
* **Uncertainty-aware weighting** (``alpha > 0``): the reward is the mean of an ensemble of judges
  (``judges``, checker names of the task) and the reward advantage of response :math:`i` is divided by
  :math:`1 + \alpha\sigma_i`, :math:`\sigma_i` the judges' standard deviation (:func:`ensemble_rewards`,
  :func:`rlkit.risk.downweighted_advantages`). It never flips a sign (chapter 17).
* **Value-guided decoding** (at evaluation, :func:`q_guidance`): :math:`\log\pi + \eta\,[Q_r - \nu Q_c](h,\cdot)`
  (:func:`rlkit.llm.guided.guided_logits`, chapter 20).
* A decode-time **shield** (``shield=True``, :func:`shield_processor`) bans the digits of a forbidden
  substring; with it the trained policy is the shielded one (its log-probs are those of the masked
  distribution), as in :func:`rlkit.llm.train` with a ``logits_processor``.

The constrained task is :func:`forbidden_addition`: two-digit addition whose answers may not contain
``13`` or ``14`` (:func:`forbidden_cost`), with two sloppy judges (``prefix``, ``contains``) beside the
exact checker.
"""
from __future__ import annotations

import copy
import math
import numbers
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn

from .. import _validate as V
from ..objectives import clipped_policy_loss, normalize_advantages
from ..risk import downweighted_advantages
from ..safety import LagrangeMultiplier, lagrangian_advantages
from ..staleness import LagDistribution, PolicyArchive, staleness
from ..utils import clip_grad
from .evaluation import evaluate
from .guided import guided_logits
from .lagged import _positions, _shift_left, offpolicy_targets
from .rl import RLConfig, _train_args, collect
from .sampling import call_model
from .stale import _cat
from .tasks import Problem, Task, addition_problem, contains_answer, exact_match, numeric_close, prefix_match
from .tokenizer import CharTokenizer

__all__ = ["FORBIDDEN", "forbidden_cost", "forbidden_addition", "shield_processor", "ensemble_rewards",
           "RewardCostQHead", "q_guidance", "RecipeConfig", "RecipeResult", "train_recipe", "evaluate_recipe"]

#: The substrings a safe answer of :func:`forbidden_addition` must not contain.
FORBIDDEN = ("13", "14")


def forbidden_cost(response: str, problem: Problem | None = None) -> float:
    r"""The cost of a response: :math:`c = \mathbf 1[\text{response contains } 13 \text{ or } 14]`.

    ``problem`` is accepted (and ignored) so that the function has a checker's signature.
    Chapter: 24_pitfalls_recipe.
    """
    V.instance_of(response, "response", str)
    return float(any(s in response for s in FORBIDDEN))


def forbidden_addition() -> Task:
    r"""Two-digit addition with a cost: answers containing ``13`` or ``14`` are unsafe.

    The exact checker is the true reward; ``checkers`` adds the sloppy judges ``prefix``
    (:func:`rlkit.llm.prefix_match`, accepts truncations), ``contains`` (:func:`rlkit.llm.contains_answer`,
    accepts extra characters) and ``close1`` (:func:`rlkit.llm.numeric_close` with tolerance 1) for an
    ensemble of imperfect reward models, and ``cost`` (:func:`forbidden_cost`). Of the 8100 sums,
    16.8% contain a forbidden substring, so the constraint costs accuracy: a safe policy must answer
    those prompts wrongly. Chapter: 24_pitfalls_recipe.
    """
    return Task("forbidden_addition", addition_problem, exact_match, max_new_tokens=5,
                checkers={"prefix": prefix_match, "contains": contains_answer, "close1": numeric_close(1.0),
                          "cost": forbidden_cost},
                description="two-digit addition; answers containing 13 or 14 cost 1")


def _banned_after(tok: CharTokenizer):
    one = tok.encode("1")[0]
    banned = torch.tensor([tok.encode(s[1])[0] for s in FORBIDDEN])
    return one, banned


def shield_processor(tok: CharTokenizer):
    r"""A decode-time shield: after the digit ``1``, the tokens ``3`` and ``4`` get logit :math:`-\infty`.

    Returns a :data:`rlkit.llm.sampling.LogitsProcessor`. It blocks every forbidden substring that starts
    inside the response (the prompt ends with ``=``, so the context's last token is a response token
    whenever it is ``1``). It is a shield of the *sampler*: the model's own distribution keeps its
    mass on the banned tokens. Chapter: 24_pitfalls_recipe.
    """
    V.instance_of(tok, "tok", CharTokenizer)
    one, banned = _banned_after(tok)

    def shield(context_ids, context_mask, logits):
        hit = context_ids[:, -1] == one
        out = logits.clone()
        rows = hit.nonzero().flatten()
        if len(rows):
            out[rows[:, None], banned.to(logits.device)[None, :]] = -math.inf
        return out

    return shield


def _shield_mask(tok: CharTokenizer, response_ids: torch.Tensor) -> torch.Tensor:
    """``[B, T, V]`` bool: True where the shield bans token v at response position t."""
    one, banned = _banned_after(tok)
    prev = torch.cat([torch.full_like(response_ids[:, :1], -1), response_ids[:, :-1]], 1)
    m = torch.zeros(*response_ids.shape, tok.vocab_size, dtype=torch.bool, device=response_ids.device)
    m[..., banned.to(response_ids.device)] = (prev == one)[..., None]
    return m


def ensemble_rewards(task: Task, responses: Sequence[str], problems: Sequence[Problem],
                     judges: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Mean and standard deviation over an ensemble of judges: ``(mean [N], sigma [N])``.

    .. math:: \bar r_i = \frac1K\sum_{k=1}^K r^{(k)}_i, \qquad
              \sigma_i = \Big(\frac1K\sum_k (r^{(k)}_i - \bar r_i)^2\Big)^{1/2}

    (the population deviation: 0 when every judge agrees, 0.5 for two judges that disagree).
    ``judges`` are checker names of ``task``. Chapter: 24_pitfalls_recipe.
    """
    judges = list(judges)
    V.int_in(len(judges), "len(judges)")
    for j in judges:
        V.choice(j, "a judge", list(task.checkers))
    if len(responses) == 0:
        return torch.zeros(0), torch.zeros(0)
    r = torch.stack([task.score(list(responses), list(problems), j) for j in judges])
    return r.mean(0), r.std(0, unbiased=False)


class RewardCostQHead(nn.Module):
    r"""Two critics over the vocabulary on one copy of the LM: :math:`(Q_r, Q_c)(h_t,\cdot)`.

    ``forward(ids [B, T], attention_mask=None) -> q [B, T, 2, |V|]``; channel 0 is the reward's
    :math:`Q_r`, channel 1 the cost's :math:`Q_c`. The head is a zero-initialised linear map of the
    LM's logits (as :class:`rlkit.llm.lagged.QHead`, doubled). Chapter: 24_pitfalls_recipe.
    """

    accepts_attention_mask = True

    def __init__(self, lm: nn.Module, vocab_size: int):
        super().__init__()
        self.lm = lm
        self.vocab_size = V.int_in(vocab_size, "vocab_size")
        self.head = nn.Linear(vocab_size, 2 * vocab_size)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, ids, attention_mask=None):
        out = self.head(call_model(self.lm, ids, attention_mask))
        return out.view(*out.shape[:-1], 2, self.vocab_size)


def q_guidance(critic: RewardCostQHead, eta: float, lam: float = 0.0):
    r"""Value-guided decoding with the recipe's critic: :math:`\log\pi + \eta\,\big(Q_r - \nu Q_c\big)(h,\cdot)`.

    With deterministic token transitions and no reward before the end, :math:`Q(h, a) = V(h\,a)`, so
    this is the article's :math:`\log\tilde\pi = \log\pi + \eta\,(V(h_{t+1}) - V(h_t))`: the
    :math:`V(h_t)` term is the same for every candidate and the softmax cancels it. Returns a
    :data:`rlkit.llm.sampling.LogitsProcessor`; ``eta`` :math:`\ge 0`, ``lam`` the multiplier :math:`\nu \ge 0`.
    Chapter: 24_pitfalls_recipe.
    """
    V.instance_of(critic, "critic", RewardCostQHead)
    eta = V.real_in(eta, "eta", 0.0)
    lam = V.real_in(lam, "lam", 0.0)

    @torch.no_grad()
    def guide(context_ids, context_mask, logits):
        q = critic(context_ids, attention_mask=context_mask)[:, -1]
        return guided_logits(logits, (q[:, 0] - lam * q[:, 1]).to(logits.dtype), eta)

    return guide


def _as_lag(x, name: str) -> LagDistribution:
    V.instance_of(x, name, (LagDistribution, numbers.Integral), "LagDistribution or an int >= 0")
    return x if isinstance(x, LagDistribution) else LagDistribution.fixed(V.int_in(x, name, 0))


def _as_judges(x, name: str) -> tuple:
    V.instance_of(x, name, (tuple, list), "a tuple of checker names")
    if not x:
        raise ValueError(f"{name} must name at least one checker, got an empty sequence")
    return tuple(V.nonempty_str(j, f"an entry of {name}") for j in x)


@dataclass(frozen=True)
class RecipeConfig(V.ValidatedConfig):
    r"""The components of :func:`train_recipe`, each a switch, checked when built.

    Fields: ``lag`` (a :class:`rlkit.staleness.LagDistribution` or an int); ``vtrace`` (V-trace targets,
    else uncorrected GAE); ``clip_rho`` (:math:`\bar\rho=\bar c`); ``lagrangian``, ``cost_limit``
    :math:`C_{\max}`, ``lambda_lr`` :math:`\eta_\nu`, ``lambda_init`` (:math:`\nu_0`, the multiplier's start);
    ``judges`` (checker names whose mean is
    the reward) and ``alpha`` (uncertainty weighting, 0 = off); ``shield`` (train with
    :func:`shield_processor`).

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


@dataclass
class RecipeResult:
    r"""What :func:`train_recipe` returns: the model, the critic, the final multiplier :math:`\nu` (``lam``), the logs.

    ``history`` per step: ``reward`` (ensemble mean), ``accuracy`` (exact), ``cost``, ``lambda`` (the multiplier
    :math:`\nu`),
    ``mean_age``, ``staleness``, ``sigma`` (mean judge deviation), ``train_seconds``. ``archive`` holds the
    last versions of the policy (for off-policy checks).
    """

    model: nn.Module
    critic: RewardCostQHead
    lam: float
    history: dict
    config: RLConfig
    recipe: RecipeConfig
    archive: PolicyArchive = field(repr=False, default=None)

    def array(self, key: str) -> np.ndarray:
        """``history[key]`` as a float array."""
        return np.asarray(self.history[key], dtype=float)


def _critic_positions(critic, ro, rows=None) -> torch.Tensor:
    """The critic's ``[B, T, 2, V]`` outputs at the positions that score response tokens."""
    pid, pm, rid = ro.prompt_ids, ro.prompt_mask, ro.response_ids
    if rows is not None:
        pid, pm, rid = pid[rows], pm[rows], rid[rows]
    P, T = pid.shape[1], rid.shape[1]
    out = critic(torch.cat([pid, rid], 1), attention_mask=torch.cat([pm, torch.ones_like(rid, dtype=torch.bool)], 1))
    return out[:, P - 1:P - 1 + T]


def _masked_log_softmax(logits, ban):
    if ban is not None:
        logits = logits.masked_fill(ban, -math.inf)
    return torch.log_softmax(logits.float(), -1)


def train_recipe(model: nn.Module, tok: CharTokenizer, task: Task, cfg: RLConfig | None = None,
                 recipe: RecipeConfig | None = None, *, verbose: bool = False) -> RecipeResult:
    r"""Train ``model`` (in place) with the recipe of the module docstring; return a :class:`RecipeResult`.

    ``cfg`` is an :class:`rlkit.llm.RLConfig` with ``algo="ppo"`` (``gamma``, ``lam`` (the trace parameter
    :math:`\lambda`), ``lr``,
    ``value_lr``, ``value_coef``, ``clip_eps``, ``epochs``, ``minibatches``, ``prompts_per_step``,
    ``group_size``, ``seed`` are used), temperature 1, no top-k/top-p, no KL term. ``task`` must have a
    ``cost`` checker (:func:`forbidden_addition`). Per step: sample groups with lagged versions
    (shielded if ``recipe.shield``), score with the judges and the cost, compute V-trace (or GAE) targets
    for both critics, combine the advantages (uncertainty weights, Lagrangian), update the policy by
    PPO-clip of :math:`\pi_\theta/\mu` and the critics by squared error, then step :math:`\nu`.

    Chapter: 24_pitfalls_recipe.
    """
    cfg = _train_args(tok, task, RLConfig(algo="ppo", lam=1.0) if cfg is None else cfg)
    recipe = RecipeConfig() if recipe is None else V.instance_of(recipe, "recipe", RecipeConfig)
    if cfg.algo != "ppo":
        raise ValueError(f"cfg.algo must be 'ppo' for train_recipe (an actor-critic), got {cfg.algo!r}")
    if cfg.temperature != 1.0 or cfg.top_k is not None or cfg.top_p is not None or cfg.kl_coef != 0:
        raise ValueError("train_recipe samples at temperature 1 without top-k/top-p and has no KL term")
    if "cost" not in task.checkers:
        raise ValueError(f"task {task.name!r} has no 'cost' checker; use rlkit.llm.recipe.forbidden_addition()")
    for j in recipe.judges:
        V.choice(j, "a judge of RecipeConfig.judges", list(task.checkers))
    params = list(model.parameters())
    dev = params[0].device
    rng = random.Random(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    lag_gen = torch.Generator().manual_seed(cfg.seed + 1)
    opt = torch.optim.Adam(params, lr=cfg.lr)
    critic = RewardCostQHead(copy.deepcopy(model), tok.vocab_size).to(dev)
    vopt = torch.optim.Adam(critic.parameters(), lr=cfg.value_lr)
    shield = shield_processor(tok) if recipe.shield else None
    G = cfg.group_size
    hist = {k: [] for k in ("reward", "accuracy", "cost", "lambda", "mean_age", "staleness", "sigma",
                            "train_seconds")}
    archive = PolicyArchive(capacity=max(recipe.lag.max + 1, 9))
    mult = LagrangeMultiplier(budget=recipe.cost_limit, lr=recipe.lambda_lr, init=recipe.lambda_init)
    lam_mult, train_time, version = mult.value, 0.0, 0
    archive.push(0, model)
    target = "vtrace" if recipe.vtrace else "none"
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        model.eval()
        lags = recipe.lag.sample(cfg.prompts_per_step, lag_gen)
        group_versions = archive.behaviour_versions(version, lags)
        parts, problems, responses, row_versions = [], [], [], []
        for v in torch.unique(group_versions).tolist():
            b = collect(archive.get(v), tok, task, cfg, rng, gen, dev, prompts=int((group_versions == v).sum()),
                        logits_processor=shield)
            parts.append(b.rollout)
            problems += b.problems
            responses += b.responses
            row_versions.append(torch.full((len(b.rollout),), v, dtype=torch.long))
        ro = _cat(parts)
        row_versions = torch.cat(row_versions)
        reward, sigma = ensemble_rewards(task, responses, problems, recipe.judges)
        correct = task.score(responses, problems, "exact")
        cost = task.score(responses, problems, "cost")
        reward, sigma, cost = reward.to(dev), sigma.to(dev), cost.to(dev)
        age = (version - row_versions).to(dev)
        mask = ro.mask
        N = mask.shape[0]
        ban = _shield_mask(tok, ro.response_ids) if shield is not None else None
        with torch.no_grad():
            logp_all = _masked_log_softmax(_positions(model, ro), ban)
            lp_k = logp_all.gather(-1, ro.response_ids[..., None]).squeeze(-1) * mask
            lb = ro.logprobs if shield is not None else ro.model_logprobs
            lp_k = torch.where((age == 0)[:, None], lb, lp_k)
            log_rhos = (lp_k - lb) * mask
            q = _critic_positions(critic, ro)                                # [N, T, 2, V]
            pi = logp_all.exp()
            values = (pi[:, :, None, :] * q).sum(-1) * mask[..., None]   # [N, T, 2]
            not_last = torch.zeros_like(mask)
            not_last[:, :-1] = mask[:, 1:]
            discounts = cfg.gamma * not_last
            last = (mask.sum(-1).long() - 1).clamp_min(0)
            q_tgts, advs = [], []
            for ch, r in enumerate((reward, cost)):
                tok_r = torch.zeros_like(mask)
                tok_r[torch.arange(N, device=dev), last] = r
                v = values[..., ch]
                q_t, _, a = offpolicy_targets(target, log_rhos, tok_r, v, _shift_left(v) * not_last, discounts,
                                              lam=cfg.lam, clip_rho=recipe.clip_rho, clip_c=recipe.clip_rho)
                q_tgts.append(q_t * mask)
                advs.append(normalize_advantages(a, mask))
            adv_r = downweighted_advantages(advs[0], sigma[:, None].expand_as(advs[0]), recipe.alpha)
            adv = lagrangian_advantages(adv_r, advs[1], lam_mult, mask=mask) if recipe.lagrangian else adv_r
            adv = adv * mask
            q_tgt = torch.stack(q_tgts, -1)                              # [N, T, 2]
            s_hat = float(staleness(lp_k, lb, mask))
        model.train()
        n_groups = N // G
        for _ in range(cfg.epochs):
            order = torch.randperm(n_groups, generator=gen)
            for chunk in order.chunk(min(cfg.minibatches, max(1, n_groups))):
                rows = (chunk[:, None] * G + torch.arange(G)).flatten().to(dev)
                m = mask[rows]
                logp = _masked_log_softmax(_positions(model, ro, rows), None if ban is None else ban[rows])
                logp = logp.gather(-1, ro.response_ids[rows][..., None]).squeeze(-1) * m
                loss, _ = clipped_policy_loss("standard", logp, lp_k[rows], lb[rows], adv[rows], cfg.clip_eps,
                                              mask=m, aggregation=cfg.aggregation)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                clip_grad(params, cfg.grad_clip)
                opt.step()
                qv = _critic_positions(critic, ro, rows)
                q_taken = qv.gather(-1, ro.response_ids[rows][:, :, None, None].expand(-1, -1, 2, 1)).squeeze(-1)
                vloss = cfg.value_coef * 0.5 * (((q_taken - q_tgt[rows]) ** 2) * m[..., None]).sum() / \
                    m.sum().clamp_min(1.0)
                vopt.zero_grad(set_to_none=True)
                vloss.backward()
                clip_grad(critic.parameters(), cfg.grad_clip)
                vopt.step()
        model.eval()
        c_hat = float(cost.mean())
        if recipe.lagrangian:
            lam_mult = float(mult.update(c_hat))
        train_time += time.perf_counter() - t0
        for k, x in (("reward", float(reward.mean())), ("accuracy", float(correct.mean())), ("cost", c_hat),
                     ("lambda", lam_mult), ("mean_age", float(age.float().mean())), ("staleness", s_hat),
                     ("sigma", float(sigma.mean())), ("train_seconds", train_time)):
            hist[k].append(x)
        if verbose:
            print(f"step {step:3d} reward {hist['reward'][-1]:.3f} acc {hist['accuracy'][-1]:.3f} "
                  f"cost {c_hat:.3f} nu {lam_mult:.3f} age {hist['mean_age'][-1]:.2f}")
        version += 1
        archive.push(version, model)
    return RecipeResult(model=model, critic=critic, lam=lam_mult, history=hist, config=cfg, recipe=recipe,
                        archive=archive)


def evaluate_recipe(model: nn.Module, tok: CharTokenizer, task: Task, problems: Sequence[Problem], *,
                    logits_processor=None, judges: Sequence[str] = ("prefix", "contains", "close1")) -> dict:
    r"""Greedy answers to ``problems`` scored three ways: ``{"accuracy", "cost", "disagreement", "responses"}``.

    ``accuracy`` is exact match (the true reward), ``cost`` the share of answers with a forbidden
    substring, ``disagreement`` the share of answers on which the ``judges`` do not all agree.
    ``logits_processor``: e.g. :func:`shield_processor` or :func:`q_guidance`. Chapter: 24_pitfalls_recipe.
    """
    out = evaluate(model, tok, task, list(problems), greedy=True, logits_processor=logits_processor)
    resp = out["responses"]
    _, sig = ensemble_rewards(task, resp, problems, judges)
    return {"accuracy": out["accuracy"], "cost": float(task.score(resp, problems, "cost").mean()),
            "disagreement": float((sig > 0).float().mean()), "responses": resp}

