r"""The one LLM training loop: sample, score, advantages, minibatch updates, with hooks for every chapter's idea.

Chapter: 07_tiny_llm (the loop), and every later chapter that trains the tiny LLM through it.

:func:`~rlkit.llm.train` is built from four parts, each replaceable:

* a **sampler** (:mod:`rlkit.llm.samplers`): :class:`~rlkit.llm.samplers.Fresh` responses of the
  current policy (the default), :class:`~rlkit.llm.samplers.Lagged` versions of it (chapter 12), or
  an actor pool (chapter 16);
* an **advantage estimator** (:mod:`rlkit.llm.advantages`): group-relative
  (:class:`~rlkit.llm.advantages.Group`, the default for every ``algo`` but PPO), token-level GAE
  with a critic (:class:`~rlkit.llm.advantages.TokenGAE`, PPO's default), or off-policy targets;
* a **policy loss**: :class:`PolicyLoss` (``RLConfig.algo``'s loss, :func:`rlkit.llm.policy_loss`);
* a list of **hooks** (:class:`Hook`): reward channels, advantage reweighting, extra loss terms,
  and what happens after an update. The KL penalty to a reference model is one
  (:class:`KLPenalty`); the staleness control, the cost constraint, the DRO weights, the
  exploration bonuses and the judges of Part III are others, each in its chapter's module.

One update (:func:`~rlkit.llm.train`'s loop, in this order):

1. ``step = sampler(run)``: the responses, their rewards and log-probs (a :class:`Step`);
2. ``hook.on_batch(run, step)`` for each hook: reward channels (a cost, a bonus, the KL penalty);
3. ``step.adv = advantages(run, step)``, then ``hook.on_advantages(run, step)`` for each hook
   (reweighting, filtering the tokens that train through ``step.mask``);
4. ``epochs`` passes over the batch in ``minibatches`` sets of whole groups: the policy loss plus
   every hook's ``loss`` term, one optimiser step, then ``advantages.fit`` (the critic, if any);
5. ``hook.on_update_end(run, step)`` for each hook (a measurement, a multiplier's step, a
   rollback; returning True stops training), ``sampler.publish(run)``, the log and the held-out
   evaluation every ``eval_every`` updates.

**What is logged** (``RLResult.history[key]``, one entry per update, NaN where an update did not
measure it). Every key means one thing in every run, whichever chapter's parts produced it:

=============================  =====================================================================================
key                            meaning (who logs it)
=============================  =====================================================================================
``reward``                     mean reward of the update's responses under the checker (``RLConfig.checker``; with
                               :class:`rlkit.llm.recipe.Judges` the judges' mean)
``accuracy``                   mean exact-match of the update's responses (the true reward)
``response_length``            mean number of response tokens (``<eos>`` included)
``zero_var_share``             share of groups whose rewards were all equal, so no gradient (fresh sampling only)
``loss``                       mean over minibatches of the minimised loss: policy loss plus the hooks' terms
``grad_norm``                  mean over minibatches of the policy's gradient norm before clipping
``clip_fraction``              mean over minibatches of the share of tokens whose ratio was clipped
``entropy``                    mean over minibatches of the policy's entropy per trained token (nats)
``value_loss``                 mean over minibatches of the critic's loss on the reward (estimators with a critic)
``<channel>_value_loss``       the same for a value channel, e.g. ``cost_value_loss`` (chapter 18)
``train_seconds``              cumulative wall-clock seconds of training, evaluations excluded
``kl``                         per-token k3 estimate of KL(pi_old || pi_ref) on the update's samples
                               (:class:`KLPenalty`)
``kl_seq``                     mean over responses of the KL penalty's sum over the response, before beta
                               (:class:`KLPenalty` in the reward; with k1 the sequence log-ratio)
``kl_update``                  per-token k3 estimate of KL(pi_k || pi_k+1), the update's own size, on the trained tokens
                               (:class:`rlkit.llm.stale.StaleControl`)
``update_shift``               :math:`\hat U_k`, the update's shift on the samples (``StaleControl``)
``staleness``                  :math:`\hat S_k`, the distance of the samplers from :math:`\pi_k` (``StaleControl``,
                               :class:`~rlkit.llm.advantages.OffPolicy`)
``staleness_kept``             :math:`\hat S_k` on the tokens the filter kept (``StaleControl``)
``mean_age``                   mean version age of the update's responses (lagged sampling)
``drop_share``                 share of tokens the window and filter removed (``StaleControl``)
``ess``                        effective sample share of the ratios :math:`\pi_k/\mu` (``StaleControl``)
``lr``                         the learning rate used (``StaleControl``: schedule times the guard's scale)
``alerts``, ``rolled_back``    the guard's alerts and rollback at this update (``StaleControl``)
``cost``                       mean cost of the update's responses (:class:`rlkit.llm.safety.CostConstraint`)
``nu``                         the Lagrange multiplier after the update (``CostConstraint``)
``shield_rate``                share of responses whose shield removed probability
                               (:class:`rlkit.llm.safety.ShieldRate`)
``group_share/<group>``        share of the update's prompts from a group (:class:`rlkit.llm.dro.DROWeights`)
``bonus_div``, ``bonus_rnd``   mean diversity and novelty bonus (:mod:`rlkit.llm.explore`'s hooks)
``rnd_raw``                    mean raw RND prediction error, before normalisation (``RNDBonus``)
``distinct_correct``           mean number of distinct correct answers per group (``DiversityBonus``)
``sigma``                      mean spread of the judges' scores (:class:`rlkit.llm.recipe.Judges`)
=============================  =====================================================================================

The multi-turn and hierarchical trainers (chapters 15 and 23) log through the same :class:`Run`, with
keys of their own (``first_attempt``, ``retry_accuracy``, ``mean_turns``, ...; ``step1``, ``final``, ...)
described in their modules. ``RLResult.evals`` holds the held-out evaluations: ``step`` (updates done
before it, 0 = the base model), ``train_seconds`` and what the evaluation returns (:class:`HeldOut`:
``greedy_accuracy``, ``sampled_accuracy``, and with a proxy checker ``greedy_reward`` and ``sampled_reward``).
"""
from __future__ import annotations

import copy
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn

from .. import _validate as V
from ..divergences import kl_k1, kl_k3
from ..objectives import aggregate
from ..utils import clip_grad
from .advantages import Group, TokenGAE
from .credit import dense_rewards
from .evaluation import evaluate
from .rl import Batch, RLConfig, check_train_args, policy_loss
from .samplers import Fresh
from .sampling import token_logprobs
from .tasks import Problem, Task
from .tokenizer import CharTokenizer

__all__ = ["Step", "Hook", "Run", "RLResult", "PolicyLoss", "KLPenalty", "DenseRewards", "HeldOut", "train", "assemble",
           "steps_to_reach"]


@dataclass
class Step:
    """One update's data, filled in order by the sampler, the hooks and the advantage estimator.

    Tensors are ``[N, T]`` over response tokens unless said otherwise (``N`` responses, whole groups).
    """

    batch: Batch                   # problems, rollout, rewards [N], correct [N], responses
    logp_old: torch.Tensor         # log pi_k of the sampled tokens (the ratio's denominator)
    logp_behav: torch.Tensor       # log mu, the sampler's own log-probs (= logp_old for fresh rows)
    age: torch.Tensor              # [N] versions behind the learner (0 = fresh)
    mask: torch.Tensor             # the tokens the update trains on (a hook may narrow it)
    rewards: torch.Tensor          # [N] the response's reward (the checker's)
    token_rewards: torch.Tensor | None = None     # per-token rewards, when a hook supplies them
    penalties: list = field(default_factory=list)  # (coef, x [N, T]): the reward becomes r - coef * x
    bonuses: list = field(default_factory=list)    # (coef, x [N]): then r + coef * x, one per response
    adv: torch.Tensor | None = None
    data: dict = field(default_factory=dict)       # what components hand to each other ("logp_ref", "returns")

    @property
    def rollout(self):
        return self.batch.rollout


class Hook:
    """One chapter's addition to the loop. Every method is optional; hooks run in list order.

    * ``setup(run)``: once, before the first evaluation (make a reference copy, an optimiser);
    * ``on_step_start(run, k)``: before sampling update ``k`` (set a learning rate);
    * ``on_batch(run, step)``: after sampling (add reward channels, score with a reference);
    * ``on_advantages(run, step)``: after the advantages (reweight ``step.adv``, narrow ``step.mask``);
    * ``loss(run, step, rows, logp, entropy)``: an extra loss term on a minibatch (a tensor or None);
    * ``on_update_end(run, step)``: after the update (measure, step a multiplier); True stops training;
    * ``result(run)``: extra fields of the :class:`RLResult` (``result.extras``).

    Hooks log with ``run.log(key=value)``.
    """

    def setup(self, run) -> None:
        pass

    def on_step_start(self, run, k: int) -> None:
        pass

    def on_batch(self, run, step: Step) -> None:
        pass

    def on_advantages(self, run, step: Step) -> None:
        pass

    def loss(self, run, step: Step, rows: torch.Tensor, logp: torch.Tensor, entropy: torch.Tensor):
        return None

    def on_update_end(self, run, step: Step) -> bool | None:
        return None

    def result(self, run) -> dict:
        return {}


@dataclass
class RLResult:
    """What :func:`~rlkit.llm.train` returns: the trained model, the critic (if any), the log and the evaluations.

    ``extras`` holds what the hooks add (a multiplier's trajectory, a staleness guard's alerts, a
    policy archive); its entries are also readable as attributes (``result.alerts``).
    """

    model: nn.Module
    history: dict                 # per update: lists of length (number of updates run)
    evals: dict                   # held-out evaluations: "step" = updates done before it (0 = base model)
    config: RLConfig
    critic: nn.Module | None = None
    samples: list = field(default_factory=list)   # a few (prompt, response, reward) of the last update
    extras: dict = field(default_factory=dict)

    def __getattr__(self, name):
        extras = self.__dict__.get("extras", {})
        if name in extras:
            return extras[name]
        raise AttributeError(f"{type(self).__name__} has no attribute or extra {name!r}")

    def array(self, key: str) -> np.ndarray:
        """``history[key]`` or ``evals[key]`` as a float array."""
        src = self.history if key in self.history else self.evals
        return np.asarray(src[key], dtype=float)


class HeldOut:
    """The held-out evaluation of :func:`~rlkit.llm.train`: greedy (and sampled) exact match on ``problems``.

    Args:
        problems: the held-out problems (default: ``RLConfig.eval_problems`` of the task's test split,
            drawn with seed ``10_000 + RLConfig.seed``).
        sampled: also sample one response per problem (at ``RLConfig.temperature``) and score it.
        seed_offset: the sampled evaluation's generator is seeded ``RLConfig.seed + seed_offset``.
        rewards: also log ``greedy_reward``/``sampled_reward`` under the training checker (default:
            when ``RLConfig.checker`` is not ``"exact"``).
    """

    def __init__(self, problems: Sequence[Problem] | None = None, *, sampled: bool = True, seed_offset: int = 1,
                 rewards: bool | None = None):
        self.problems = problems
        self.sampled = V.instance_of(sampled, "sampled", bool)
        self.seed_offset = V.int_in(seed_offset, "seed_offset", 0)
        self.rewards = rewards

    def setup(self, run) -> None:
        cfg = run.cfg
        if self.problems is None:
            self.problems = run.task.problems(cfg.eval_problems, seed=10_000 + cfg.seed, split="test")
        self.gen = run.generator(self.seed_offset)
        if self.rewards is None:
            self.rewards = cfg.checker != "exact"

    def __call__(self, run) -> dict:
        model, tok, task, cfg = run.model, run.tok, run.task, run.cfg
        g = evaluate(model, tok, task, self.problems, greedy=True)
        out = {"greedy_accuracy": g["accuracy"]}
        if self.sampled:
            s = evaluate(model, tok, task, self.problems, greedy=False, temperature=cfg.temperature, generator=self.gen)
            out["sampled_accuracy"] = s["accuracy"]
        if self.rewards:
            out["greedy_reward"] = task.score(g["responses"], self.problems, cfg.checker).mean().item()
            if self.sampled:
                out["sampled_reward"] = task.score(s["responses"], self.problems, cfg.checker).mean().item()
        return out


class Run:
    """What every update of one training run shares: the model, the optimiser, the generators, the log.

    Built by :func:`~rlkit.llm.train` (and by the multi-turn and hierarchical trainers, which have their own
    rollouts): ``rng`` (a ``random.Random`` for prompts) and ``gen`` (a torch generator for
    sampling and minibatch order) are seeded ``RLConfig.seed``; :meth:`generator` gives further
    generators seeded ``seed + offset``. ``version`` counts the published updates.

    ``value_channels`` names the per-response signals besides the reward that a critic should value
    (chapter 18's cost): a hook appends a name in ``setup`` and puts the step's values in
    ``step.data["channels"][name]`` (``[N]``); an estimator with a critic gives each its own output
    and advantage (:class:`~rlkit.llm.advantages.TokenGAE`).
    """

    def __init__(self, model: nn.Module, tok: CharTokenizer, task: Task, cfg, *, evaluation=None,
                 logits_processor=None, verbose: bool = False):
        self.model, self.tok, self.task, self.cfg = model, tok, task, cfg
        self.params = list(model.parameters())
        self.device = self.params[0].device
        self.rng = random.Random(cfg.seed)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.opt = torch.optim.Adam(self.params, lr=cfg.lr)
        self.logits_processor = logits_processor
        self.evaluation = evaluation
        self.verbose = verbose
        self.version = 0
        self.train_time = 0.0
        self.history: dict = {}
        self.evals: dict = {"step": [], "train_seconds": []}
        self._row: dict = {}
        self._stats: dict = {}
        self.sampler = None
        self.last_step = None
        self.value_channels: list[str] = []

    def generator(self, offset: int) -> torch.Generator:
        """A fresh torch generator seeded ``RLConfig.seed + offset``."""
        return torch.Generator().manual_seed(self.cfg.seed + offset)

    # --- the update -------------------------------------------------------------------------------
    def minibatches(self, step: Step):
        """``epochs`` passes over the step's groups in random order, ``minibatches`` sets of whole groups each.

        Yields the row indices of each minibatch. A minibatch without a trained token is skipped
        (an optimiser step on a zero gradient would still move the weights by its momentum), and so
        is the whole update when no token trains.
        """
        cfg, G = self.cfg, self.cfg.group_size
        if float(step.mask.sum()) == 0:
            return
        n_groups = step.mask.shape[0] // G
        for _ in range(cfg.epochs):
            order = torch.randperm(n_groups, generator=self.gen)
            for chunk in order.chunk(min(cfg.minibatches, max(1, n_groups))):
                rows = (chunk[:, None] * G + torch.arange(G)).flatten().to(self.device)
                if float(step.mask[rows].sum()) == 0:
                    continue
                yield rows

    def logprobs(self, step: Step, rows: torch.Tensor):
        """``(logp, entropy)`` of the responses ``rows`` under the policy being trained (differentiable)."""
        ro = step.rollout
        return token_logprobs(self.model, ro.prompt_ids[rows], ro.prompt_mask[rows], ro.response_ids[rows],
                              step.mask[rows], temperature=self.cfg.temperature, with_entropy=True,
                              logits_processor=self.logits_processor)

    def clip(self, params) -> float:
        """Clip the gradient norm of ``params`` to ``RLConfig.grad_clip``; return the norm before clipping."""
        return clip_grad(params, self.cfg.grad_clip)

    def optimise(self, loss: torch.Tensor) -> float:
        """One Adam step of the policy on ``loss``; returns the gradient norm before clipping."""
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = self.clip(self.params)
        self.opt.step()
        return norm

    def start_update(self, k: int, hooks=()) -> None:
        """Start update ``k``: the clock, the hooks' ``on_step_start``, the model in eval mode for sampling."""
        self._t0 = time.perf_counter()
        self._stats = {"loss": [], "clip_fraction": [], "entropy": [], "grad_norm": [], "value_loss": []}
        for h in hooks:
            h.on_step_start(self, k)
        self.model.eval()

    def stop_clock(self) -> None:
        """Add the time since :meth:`start_update` to ``train_time`` (evaluations are not training)."""
        self.train_time += time.perf_counter() - self._t0

    def record(self, step: Step, rows, loss, clip, entropy, grad_norm, value_loss=None) -> None:
        """Keep one minibatch's numbers for the update's log (their means over the minibatches)."""
        m = step.mask[rows]
        st = self._stats
        st["loss"].append(loss.item())
        st["clip_fraction"].append(clip)
        st["entropy"].append((entropy.detach() * m).sum().item() / max(1.0, m.sum().item()))
        st["grad_norm"].append(grad_norm)
        if value_loss is not None:
            st["value_loss"].append(value_loss)

    def minibatch_stats(self) -> dict:
        """This update's numbers so far, one entry per minibatch (``loss``, ``clip_fraction``, ``entropy``,
        ``grad_norm``, ``value_loss``): for a hook that acts on them in ``on_update_end`` (a guard)."""
        return {k: list(v) for k, v in self._stats.items()}

    # --- the log ----------------------------------------------------------------------------------
    def log(self, **metrics) -> None:
        """Record metrics of the current update (one value per key and update)."""
        self._row.update(metrics)

    def end_update(self, step: Step | None = None) -> None:
        """Log the update into the history: the standard keys (from ``step`` and the minibatches), then the hooks'.

        A key that an update did not log gets NaN there, so every history list has one entry per update.
        """
        if step is not None:
            b, mask = step.batch, step.rollout.mask
            st = {k: (float(np.mean(v)) if v else math.nan) for k, v in self._stats.items()
                  if v or k != "value_loss"}
            self._row = {"reward": b.rewards.mean().item(), "accuracy": b.correct.float().mean().item(),
                         "response_length": mask.sum(-1).mean().item(), "zero_var_share": b.zero_var_share,
                         "train_seconds": self.train_time, **st, **self._row}
            self.last_step = step
            if self.verbose:
                r = self._row
                print(f"update {self.version:4d} reward {r['reward']:.3f} acc {r['accuracy']:.3f} "
                      f"loss {r['loss']:.4f} clip {r['clip_fraction']:.3f} len {r['response_length']:.2f} "
                      f"t {self.train_time:.1f}s")
        n = len(next(iter(self.history.values()))) if self.history else 0
        for k in self._row:
            if k not in self.history:
                self.history[k] = [math.nan] * n
        for k, xs in self.history.items():
            xs.append(float(self._row.get(k, math.nan)))
        self._row = {}

    def result(self, *parts) -> RLResult:
        """The :class:`RLResult` of the run: the parts' ``result(run)`` extras and a few samples of the last update."""
        extras, flat = {}, []
        for part in parts:
            flat += list(part) if isinstance(part, list | tuple) else [part]
        for p in flat:
            if hasattr(p, "result"):
                extras.update(p.result(self))
        b = self.last_step.batch if self.last_step is not None else None
        samples = [] if b is None else [(p.prompt, r, float(x)) for p, r, x in
                                        zip(b.problems[:8], b.responses[:8], b.rewards[:8])]
        critic = next((p.critic for p in flat if isinstance(getattr(p, "critic", None), nn.Module)), None)
        return RLResult(model=self.model, history=self.history, evals=self.evals, config=self.cfg, critic=critic,
                        samples=samples, extras=extras)

    def evaluate(self, step: int) -> None:
        """Run the held-out evaluation (if any) after ``step`` updates and record it."""
        if self.evaluation is None:
            return
        out = self.evaluation(self)
        self.evals["step"].append(step)
        self.evals["train_seconds"].append(self.train_time)
        for k, x in out.items():
            self.evals.setdefault(k, []).append(x)

    def end_step(self, k: int, stop: bool, callback: Callable | None) -> bool:
        """Evaluate every ``eval_every`` updates and after the last; True when training should stop."""
        if (k + 1) % self.cfg.eval_every == 0 or k == self.cfg.steps - 1:
            self.evaluate(k + 1)
        stop = stop or (callback is not None and bool(callback(k, self.history, self.evals)))
        if stop and self.evaluation is not None and self.evals["step"][-1] != k + 1:
            self.evaluate(k + 1)
        return stop


class PolicyLoss:
    """The policy loss of ``RLConfig.algo`` (:func:`rlkit.llm.policy_loss`): PPO-clip, GSPO's or the policy gradient."""

    def setup(self, run) -> None:
        pass

    def __call__(self, run, step: Step, rows, logp):
        """``(loss, clip_fraction)`` on the minibatch ``rows``."""
        return policy_loss(run.cfg, logp, step.logp_old[rows], step.adv[rows], step.mask[rows])


def _kl(name: str, logp, logp_ref):
    return kl_k1(logp, logp_ref) if name == "k1" else kl_k3(logp, logp_ref)


class KLPenalty(Hook):
    r"""A KL penalty to a frozen reference model, in the reward or in the loss; it logs ``kl``.

    With :math:`k_t` the ``estimator`` (``"k1"``: :math:`\log\pi - \log\pi_{ref}`; ``"k3"``) on the
    sampled tokens: ``where="reward"`` subtracts :math:`\beta k_t` from the reward of every token
    (the sum over the response for a sequence-level estimator); ``where="loss"`` adds
    :math:`\beta\,\mathrm{agg}(k_t)` (token mean) to every minibatch's loss. Beware: as a loss, k1's
    gradient has zero mean under the samples; k3 in the loss (GRPO's choice) and k1 in the reward
    (classic RLHF) are the meaningful combinations. ``coef=0`` only measures the KL.

    Logged: ``kl``, the per-token k3 estimate of KL(:math:`\pi_{old}\,\|\,\pi_{ref}`) on the step's samples;
    with ``where="reward"`` also ``kl_seq``, the mean over responses of :math:`\sum_t k_t` (the penalty
    before :math:`\beta`; with k1 the sequence log-ratio :math:`\log\pi_{old}(y)/\pi_{ref}(y)`).

    Args:
        coef: :math:`\beta \ge 0`.
        estimator: ``"k1"`` or ``"k3"``.
        where: ``"loss"`` or ``"reward"``.
        ref_model: the frozen reference (default: a copy of the model when training starts).
        processed: score the reference with the run's ``logits_processor`` too. By default the
            reference is the unprocessed model (a shield the policy should learn not to need, chapter
            18); a decoding grammar that is part of the policy belongs to the reference as well
            (chapter 22), else the KL counts the mass the grammar removes from the reference.
    """

    def __init__(self, coef: float = 0.0, estimator: str = "k3", where: str = "loss", ref_model=None,
                 processed: bool = False):
        self.coef = V.real_in(coef, "coef", 0.0)
        self.estimator = V.choice(estimator, "estimator", ("k1", "k3"))
        self.where = V.choice(where, "where", ("loss", "reward"))
        self.ref_model = ref_model
        self.processed = V.instance_of(processed, "processed", bool)

    def setup(self, run) -> None:
        if self.ref_model is None:
            self.ref_model = copy.deepcopy(run.model)
        self.ref_model.eval()
        for p in self.ref_model.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def on_batch(self, run, step: Step) -> None:
        ro, mask = step.rollout, step.rollout.mask
        ref = token_logprobs(self.ref_model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, mask,
                             temperature=run.cfg.temperature,
                             logits_processor=run.logits_processor if self.processed else None)
        step.data["logp_ref"] = ref
        if self.where == "reward":
            x = _kl(self.estimator, step.logp_old, ref) * mask
            if self.coef > 0:
                step.penalties.append((self.coef, x))
            run.log(kl_seq=x.sum(-1).mean().item())
        run.log(kl=(kl_k3(step.logp_old, ref) * mask).sum().item() / max(1.0, mask.sum().item()))

    def loss(self, run, step: Step, rows, logp, entropy):
        if self.coef > 0 and self.where == "loss":
            term = _kl(self.estimator, logp, step.data["logp_ref"][rows])
            return self.coef * aggregate(term, step.mask[rows], "token-mean")
        return None


class DenseRewards(Hook):
    """Per-token rewards from the task's token checker ``checker`` (chapter 14, :func:`rlkit.llm.dense_rewards`).

    Token-level estimators put each token's reward on that token; sequence-level ones use their sum.
    ``checker`` defaults to ``RLConfig.checker``: the token checker of the same name as the reward's.
    """

    def __init__(self, checker: str | None = None):
        self.checker = None if checker is None else V.nonempty_str(checker, "checker")

    def setup(self, run) -> None:
        if self.checker is None:
            self.checker = run.cfg.checker
        if self.checker not in run.task.token_checkers:
            raise ValueError(f"DenseRewards needs a token checker named {self.checker!r} in task {run.task.name!r}, "
                             f"whose token checkers are {list(run.task.token_checkers)}")

    @torch.no_grad()
    def on_batch(self, run, step: Step) -> None:
        ro = step.rollout
        step.token_rewards = dense_rewards(run.task, run.tok, ro.response_ids, ro.mask, step.batch.problems,
                                           self.checker).to(run.device)


def _default_estimator(cfg: RLConfig):
    """PPO's :class:`TokenGAE` (its defaults) for ``algo="ppo"``, ``Group(cfg.algo)`` otherwise."""
    return TokenGAE() if cfg.algo == "ppo" else Group(cfg.algo)


def assemble(model: nn.Module, tok: CharTokenizer, task: Task, cfg: RLConfig | None = None, *, sampler=None,
             advantages=None, loss=None, hooks: Sequence[Hook] = (), evaluation=None,
             eval_problems: Sequence[Problem] | None = None, verbose: bool = False, logits_processor=None,
             callback: Callable | None = None):
    """Check :func:`~rlkit.llm.train`'s arguments; build and set up ``(run, sampler, advantages, loss, hooks)``.

    ``cfg.algo`` picks the default estimator: PPO's :class:`~rlkit.llm.advantages.TokenGAE`, or the
    group-relative :class:`~rlkit.llm.advantages.Group`. ``callback`` is only checked here.
    """
    if not (callable(model) and callable(getattr(model, "parameters", None))):
        raise TypeError(f"model must be a language model (a callable torch module: ids -> logits), "
                        f"got {type(model).__name__}")
    cfg = check_train_args(tok, task, cfg)
    V.instance_of(verbose, "verbose", bool)
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be None or a callable callback(step, history, evals), "
                        f"got {type(callback).__name__}")
    if eval_problems is not None:
        if isinstance(eval_problems, (str, bytes)) or not isinstance(eval_problems, Sequence):
            raise TypeError(f"eval_problems must be a list of Problem, got {type(eval_problems).__name__}")
        for i, p in enumerate(eval_problems):
            V.instance_of(p, f"eval_problems[{i}]", Problem)
    if logits_processor is not None and not callable(logits_processor):
        raise TypeError(f"logits_processor must be a callable f(context_ids, context_mask, logits) -> logits "
                        f"or None, got {type(logits_processor).__name__}")
    hooks = list(hooks)
    for i, h in enumerate(hooks):
        if not isinstance(h, Hook):
            raise TypeError(f"hooks[{i}] must be an rlkit.llm.trainer.Hook, got {type(h).__name__}")
    sampler, loss = sampler or Fresh(), loss or PolicyLoss()
    advantages = _default_estimator(cfg) if advantages is None else advantages
    if evaluation is None or evaluation is False:
        evaluation = HeldOut(eval_problems) if evaluation is None else None
    run = Run(model, tok, task, cfg, logits_processor=logits_processor, verbose=verbose, evaluation=evaluation)
    run.sampler = sampler
    for part in (*hooks, sampler, advantages, loss, run.evaluation):
        if hasattr(part, "setup"):
            part.setup(run)
    return run, sampler, advantages, loss, hooks


def train(model: nn.Module, tok: CharTokenizer, task: Task, cfg: RLConfig | None = None, *,
          sampler=None, advantages=None, loss=None, hooks: Sequence[Hook] = (), evaluation=None,
          eval_problems: Sequence[Problem] | None = None, callback: Callable | None = None,
          verbose: bool = False, logits_processor=None) -> RLResult:
    """Train ``model`` (in place) on ``task``; return an :class:`RLResult`. The loop of the module docstring.

    Args:
        model: any LM following the protocol (``ids -> logits``); its parameters are updated.
        tok: the tokenizer the model was trained with.
        task: a :class:`rlkit.llm.tasks.Task`; the reward is ``task.checkers[cfg.checker]``.
        cfg: an :class:`RLConfig` (defaults: GRPO).
        sampler: where the responses come from (default :class:`~rlkit.llm.samplers.Fresh`).
        advantages: the advantage estimator (default: ``TokenGAE()`` for ``algo="ppo"``, whose critic
            is a :class:`~rlkit.llm.ValueHead` on a copy of the model; ``Group(cfg.algo)`` otherwise).
        loss: the policy loss (default :class:`PolicyLoss`).
        hooks: :class:`Hook` objects, called in order (e.g. ``[KLPenalty(0.05)]``, ``[DenseRewards()]``).
        evaluation: ``f(run) -> dict`` of held-out metrics (default :class:`HeldOut` on ``eval_problems``;
            ``False``: none).
        eval_problems: held-out problems (default: ``cfg.eval_problems`` from the task's test split).
        callback: called as ``callback(step, history, evals)`` after every update; True stops training.
        logits_processor: a decode-time processor (e.g. a shield). The policy being trained is then
            the *processed* model: it samples with the processor, and the old and new log-probs of
            the ratio are computed with it, so the ratio compares the distributions that really
            sampled and that are being optimised. The reference and the evaluations stay unprocessed.

    Chapter: 07_tiny_llm.
    """
    run, sampler, advantages, loss, hooks = assemble(
        model, tok, task, cfg, sampler=sampler, advantages=advantages, loss=loss, hooks=hooks, evaluation=evaluation,
        eval_problems=eval_problems, verbose=verbose, logits_processor=logits_processor, callback=callback)
    run.evaluate(0)
    for k in range(run.cfg.steps):
        run.start_update(k, hooks)
        step = sampler(run)                                     # 1. sample (fresh, lagged or actors)
        for h in hooks:
            h.on_batch(run, step)                               # 2. reward channels: KL, cost, bonuses
        step.adv = advantages(run, step)                        # 3. advantages: group, GAE or V-trace ...
        for h in hooks:
            h.on_advantages(run, step)                          #    ... reweighted or filtered by hooks
        model.train()
        for rows in run.minibatches(step):                      # 4. epochs x minibatches of whole groups
            logp, ent = run.logprobs(step, rows)
            total, clip = loss(run, step, rows, logp)
            for h in hooks:
                term = h.loss(run, step, rows, logp, ent)       #    extra terms: KL, entropy bonus
                total = total if term is None else total + term
            norm = run.optimise(total)                          #    zero_grad, backward, clip, Adam step
            run.record(step, rows, total, clip, ent, norm, advantages.fit(run, step, rows))
        model.eval()
        run.stop_clock()
        stop = [h.on_update_end(run, step) for h in hooks]      # 5. measure, step a multiplier, roll back
        sampler.publish(run)                                    #    the new weights reach the samplers
        run.end_update(step)                                    #    log, evaluate every eval_every updates
        if run.end_step(k, any(stop), callback):
            break
    return run.result(sampler, advantages, loss, hooks)


def steps_to_reach(evals: dict, threshold: float = 0.9,
                   keys: Sequence[str] = ("greedy_accuracy", "sampled_accuracy")):
    """First evaluation where every one of ``keys`` is >= ``threshold``.

    ``evals`` is ``RLResult.evals``. Returns ``(updates, training_seconds)`` at that
    evaluation, or ``(None, None)`` if it never happened.
    """
    for i, step in enumerate(evals["step"]):
        if all(evals[k][i] >= threshold for k in keys):
            return step, evals["train_seconds"][i]
    return None, None
