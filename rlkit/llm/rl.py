r"""The RL algorithms for language models with verifiable rewards, and the settings of the loop that runs them.

Chapter: 07_tiny_llm (and every later chapter that trains the tiny LLM).

The loop itself is :func:`rlkit.llm.train` (:mod:`rlkit.llm.trainer`); this module holds what it is
configured with: :class:`RLConfig`, the per-algorithm advantages (:func:`~rlkit.llm.sequence_advantages`) and
policy loss (:func:`~rlkit.llm.policy_loss`), and :func:`~rlkit.llm.collect`, which samples and scores a step's groups.
Every step draws ``prompts_per_step`` training prompts and samples ``group_size`` responses to each
(the completions of one prompt are consecutive rows). REINFORCE and RLOO have no ratio to correct
for a policy that moved, so they default to one optimiser step per batch; the clipped algorithms
default to two (the second is slightly off-policy, which the clip handles).

=========  =================================================  ==============================  =======================
``algo``   advantage of response :math:`i` (token :math:`t`)  policy loss                     aggregation (default)
=========  =================================================  ==============================  =======================
reinforce  :math:`r_i - \bar r` (batch-mean baseline)         policy gradient                 seq-mean-token-sum-norm
rloo       :math:`r_i - \frac{1}{m-1}\sum_{j\ne i}r_j`        policy gradient                 seq-mean-token-sum-norm
grpo       :math:`(r_i - \bar r_g)/(\sigma_g + \zeta)`        PPO-clip, :math:`\epsilon=0.2`  seq-mean-token-mean
dr_grpo    :math:`r_i - \bar r_g`                             PPO-clip                        seq-mean-token-sum-norm
dapo       as grpo, zero-variance groups resampled            clip-higher (0.2, 0.28)         token-mean
gspo       as grpo                                            PPO-clip on the sequence ratio  one term per sequence
ppo        GAE over tokens with a learned value, whitened     PPO-clip + value loss           token-mean
=========  =================================================  ==============================  =======================

The policy gradient is :func:`~rlkit.objectives.policy_gradient_loss`, PPO-clip
:func:`~rlkit.objectives.ppo_clip_loss`; :func:`~rlkit.llm.policy_loss` picks the one for ``algo``.
GSPO's sequence ratio is

.. math::

    s_i = \exp\Big(\frac{1}{|y_i|}\sum_t \log\frac{\pi_\theta(y_{i,t})}{\pi_{\text{old}}(y_{i,t})}\Big),

clipped to :math:`[1-3\cdot10^{-4},\, 1+4\cdot10^{-4}]` as in the paper; it is computed here by feeding
the length-normalised sequence log-probs to :func:`rlkit.objectives.ppo_clip_loss`.

**KL to the reference model**: a hook of the loop, :class:`rlkit.llm.trainer.KLPenalty` (in the
reward or in the loss, with the k1 or k3 estimator; its docstring says which combinations mean something).

**What "the policy" is.** The trainers treat the model at ``temperature`` (no top-k/top-p) as the
policy :math:`\pi_\theta`. If you sample with top-k/top-p, the data come from a different
distribution :math:`q` whose log-probs the rollout keeps in ``Rollout.logprobs``; the trainers
ignore that mismatch, as many real systems do (Part II measures it).

**Models.** Any model following the protocol of :mod:`rlkit.llm.model` (``ids -> logits``). PPO's
critic is a copy of the initial policy whose logits feed a linear layer (:class:`~rlkit.llm.ValueHead`),
so it needs nothing more from the model either. A Hugging Face model runs through
:class:`rlkit.llm.hf.HFCausalLM` (chapter 25).

**Against TRL's loss types** (``GRPOConfig.loss_type``; ``tests/test_grpo_loss_formulas.py``):
``aggregation="seq-mean-token-mean"`` is TRL's ``grpo``, ``"seq-mean-token-sum-norm"`` (with the
task's ``max_new_tokens`` as TRL's ``max_completion_length``) its ``dr_grpo``, ``"token-mean"`` its
``bnpo``, and its ``dapo`` too when one optimisation step takes the whole batch (``minibatches=1``).
Where rlkit differs on purpose: (1) the std in the group advantage gets :math:`\zeta = 10^{-6}`,
TRL's :math:`10^{-4}` (a relative difference below :math:`10^{-4}` for 0/1 rewards in groups of 8);
(2) with several minibatches ``"token-mean"`` divides each one by its own token count (TRL's
``bnpo``), where TRL's ``dapo`` divides by the whole generation batch's count; (3) a response with
no token is left out of the sequence mean (TRL counts it as 0), which a trainer's batch never
has; (4) the defaults differ: TRL's default ``loss_type`` is ``dapo`` with a symmetric clip
(:math:`\epsilon_{high} = \epsilon = 0.2`), rlkit's ``algo="dapo"`` clips at (0.2, 0.28) and
resamples zero-variance groups; both default to :math:`\beta = 0` and std-scaled rewards.

What the loop logs, and what each key means, is in :mod:`rlkit.llm.trainer`.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from .. import _validate as V
from ..objectives import (
    AGGREGATIONS,
    grpo_advantages,
    policy_gradient_loss,
    ppo_clip_loss,
    rloo_advantages,
)
from .evaluation import encode_prompts
from .heads import ValueHead
from .sampling import Rollout, cat_rollouts, sample
from .tasks import Task
from .tokenizer import CharTokenizer

__all__ = ["ALGOS", "RLConfig", "MOVED_FIELDS", "ValueHead", "Batch", "collect", "sequence_advantages",
           "check_train_args",
           "refuse_unread", "policy_loss"]

#: The algorithms :func:`rlkit.llm.train` runs (``RLConfig.algo``), as in the table of the module docstring.
ALGOS = ("reinforce", "rloo", "grpo", "dr_grpo", "dapo", "gspo", "ppo")

_DEFAULT_AGG = {"reinforce": "seq-mean-token-sum-norm", "rloo": "seq-mean-token-sum-norm",
                "grpo": "seq-mean-token-mean", "dr_grpo": "seq-mean-token-sum-norm",
                "dapo": "token-mean", "gspo": "seq-mean-token-mean", "ppo": "token-mean"}
_DEFAULT_CLIP = {"dapo": (0.2, 0.28), "gspo": (3e-4, 4e-4)}


@dataclass(frozen=True)
class RLConfig(V.ValidatedConfig):
    """Settings of :func:`train`, checked when built. ``None`` means "the algorithm's default" (see the module table).

    Every field's type and range is checked on construction, with an error that names the field
    (``RLConfig.grad_clip must be a finite number in (0.0, inf], got -1.0``), and so are the rules
    between fields (a group-relative ``algo`` needs ``group_size >= 2``; no more ``minibatches``
    than ``prompts_per_step``). The object is frozen: ``cfg.replace(lr=3e-4)`` is a checked copy.
    :meth:`resolved` fills in the ``None`` defaults for ``algo``.

    Ranges: ``steps``, ``prompts_per_step``, ``group_size``, ``epochs``, ``minibatches``,
    ``max_sample_rounds``, ``eval_every``, ``eval_problems``, ``top_k``: ints ``>= 1``; ``lr``,
    ``temperature``, ``clip_eps_high``, ``grad_clip``: ``> 0``; ``clip_eps`` in ``(0, 1)``; ``top_p`` in
    ``(0, 1]``; ``seed >= 0``. ``grad_clip=None`` turns gradient clipping off.

    ``RLConfig`` holds the loop's settings only. What belongs to a component is given to it
    (rlkit 0.3): the KL penalty to the reference model is ``hooks=[KLPenalty(coef, estimator,
    where)]``, PPO's critic is ``advantages=TokenGAE(gamma=, lam=, lr=, coef=, target=, n=,
    target_lam=)``, chapter 14's per-token rewards are ``hooks=[DenseRewards(checker)]``
    (:mod:`rlkit.llm.trainer`, :mod:`rlkit.llm.advantages`). Passing one of the old fields
    (``kl_coef``, ``lam``, ``value_lr``, ...) raises an error that says where it went.
    """

    algo: str = V.choice_field("grpo", ALGOS)
    steps: int = V.int_field(100)
    prompts_per_step: int = V.int_field(16)
    group_size: int = V.int_field(8)
    lr: float = V.number_field(1e-4, 0.0, lo_open=True)        # Adam; 1e-3 already collapses the tiny model
    epochs: int = V.int_field(1)
    minibatches: int | None = V.int_field(None, optional=True)  # reinforce/rloo 1 (on-policy), others 2
    clip_eps: float | None = V.number_field(None, 0.0, 1.0, lo_open=True, hi_open=True, optional=True)
    #                                        grpo/ppo 0.2, dapo 0.2, gspo 3e-4
    clip_eps_high: float | None = V.number_field(None, 0.0, lo_open=True, optional=True)
    #                                        defaults to clip_eps; dapo 0.28, gspo 4e-4
    aggregation: str | None = V.choice_field(None, AGGREGATIONS, optional=True)
    temperature: float = V.number_field(1.0, 0.0, lo_open=True)
    top_k: int | None = V.int_field(None, optional=True)
    top_p: float | None = V.number_field(None, 0.0, 1.0, lo_open=True, optional=True)
    checker: str = V.config_field("exact", V.nonempty_str)   # which of the task's checkers gives the reward
    dynamic_sampling: bool | None = V.bool_field(None, optional=True)   # DAPO: resample until groups vary
    max_sample_rounds: int = V.int_field(4)
    # housekeeping
    grad_clip: float | None = V.number_field(1.0, 0.0, lo_open=True, optional=True)
    eval_every: int = V.int_field(5)
    eval_problems: int = V.int_field(256)
    seed: int = V.int_field(0, 0)

    def __post_init__(self):
        super().__post_init__()
        if self.algo in ("rloo", "grpo", "dr_grpo", "dapo", "gspo") and self.group_size < 2:
            raise ValueError(f"RLConfig.group_size must be >= 2 for algo={self.algo!r}, which compares "
                             f"responses within a group; got {self.group_size}")
        mb = self._default_minibatches() if self.minibatches is None else self.minibatches
        if mb > self.prompts_per_step:
            raise ValueError(f"RLConfig.minibatches ({mb}{' by default' if self.minibatches is None else ''}) "
                             f"must not exceed prompts_per_step ({self.prompts_per_step}): a minibatch is "
                             f"a set of whole groups")

    def _default_minibatches(self) -> int:
        return 1 if self.algo in ("reinforce", "rloo") else 2

    def resolved(self) -> RLConfig:
        """A checked copy with every ``None`` default filled in for ``algo``."""
        lo, hi = _DEFAULT_CLIP.get(self.algo, (0.2, None))
        if self.clip_eps is not None:
            lo, hi = self.clip_eps, None                 # a user-given clip_eps is symmetric by default
        return self.replace(
            clip_eps=lo,
            clip_eps_high=(lo if hi is None else hi) if self.clip_eps_high is None else self.clip_eps_high,
            aggregation=_DEFAULT_AGG[self.algo] if self.aggregation is None else self.aggregation,
            dynamic_sampling=(self.algo == "dapo") if self.dynamic_sampling is None else self.dynamic_sampling,
            minibatches=self._default_minibatches() if self.minibatches is None else self.minibatches)


#: Where each RLConfig field of rlkit 0.2 that is not a setting of the loop went in 0.3.
MOVED_FIELDS = {
    "kl_coef": "hooks=[KLPenalty(coef)]", "kl_estimator": "hooks=[KLPenalty(coef, estimator)]",
    "kl_in": "hooks=[KLPenalty(coef, where=...)]",
    "log_kl": "hooks=[KLPenalty(0.0)] (a coefficient of 0 only measures)",
    "gamma": "advantages=TokenGAE(gamma=...) or OffPolicy(gamma=...) (the 0.2 wrappers: LaggedConfig, RecipeConfig)",
    "lam": "advantages=TokenGAE(lam=...) or OffPolicy(lam=...) (the 0.2 wrappers: LaggedConfig, RecipeConfig)",
    "value_lr": "advantages=TokenGAE(lr=...) or OffPolicy(lr=...) (the 0.2 wrappers: LaggedConfig, RecipeConfig)",
    "value_coef": "advantages=TokenGAE(coef=...) or OffPolicy(coef=...) (0.2 wrappers: LaggedConfig, RecipeConfig)",
    "value_target": "advantages=TokenGAE(target=...)", "value_nstep": "advantages=TokenGAE(n=...)",
    "value_lam": "advantages=TokenGAE(target_lam=...)", "token_rewards": "hooks=[DenseRewards(checker)]",
}
_dataclass_init = RLConfig.__init__


def _init(self, *args, **kwargs):
    for name in kwargs:
        if name in MOVED_FIELDS:
            raise ValueError(f"RLConfig.{name} is not a setting of the loop since rlkit 0.3: it belongs to a "
                             f"component, {MOVED_FIELDS[name]} (rlkit.llm.trainer, rlkit.llm.advantages)")
    _dataclass_init(self, *args, **kwargs)


_init.__doc__ = _dataclass_init.__doc__
RLConfig.__init__ = _init


@dataclass
class Batch:
    """The responses of one step: ``problems[i]`` was answered by row ``i`` of ``rollout``."""

    problems: list
    rollout: Rollout
    rewards: torch.Tensor          # [N] reward of the chosen checker
    correct: torch.Tensor          # [N] exact-match (the true reward)
    responses: list
    zero_var_share: float          # of the first sampling round


@torch.no_grad()
def collect(model, tok: CharTokenizer, task: Task, cfg: RLConfig, rng: random.Random,
            generator: torch.Generator, device=None, prompts: int | None = None,
            logits_processor=None) -> Batch:
    """Sample ``cfg.group_size`` responses to each of ``prompts`` training prompts and score them.

    ``prompts`` defaults to ``cfg.prompts_per_step`` (a stale sampler asks each policy version for
    its share of the step's prompts).

    With ``dynamic_sampling`` (DAPO), groups whose rewards are all equal are dropped and more
    prompts are drawn, up to ``max_sample_rounds`` rounds; the batch may end up smaller.
    Responses are padded to the task's full budget ``task.max_new_tokens``. ``logits_processor``
    is passed to :func:`~rlkit.llm.sample` (a decode-time shield, chapter 18).
    """
    V.instance_of(tok, "tok", CharTokenizer)
    V.instance_of(task, "task", Task, "rlkit.llm.tasks.Task")
    V.instance_of(cfg, "cfg", RLConfig)
    V.instance_of(rng, "rng", random.Random, "random.Random")
    G = cfg.group_size
    n_prompts = cfg.prompts_per_step if prompts is None else V.int_in(prompts, "prompts")
    kept_problems, kept_rollouts, kept_rewards, kept_correct, kept_resp = [], [], [], [], []
    zero_share = None
    for _ in range(cfg.max_sample_rounds if cfg.dynamic_sampling else 1):
        need = n_prompts - len(kept_problems) // G
        if need <= 0:
            break
        probs = task.problems(need, rng, split="train")
        rows = [p for p in probs for _ in range(G)]
        ids, mask = encode_prompts(rows, tok, device)
        ro = sample(model, ids, mask, max_new_tokens=task.max_new_tokens, eos_id=tok.eos_id, pad_id=tok.pad_id,
                    temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, generator=generator,
                    logits_processor=logits_processor)
        resp = tok.decode_batch(ro.response_ids.cpu())
        rewards = task.score(resp, rows, cfg.checker)
        correct = task.score(resp, rows, "exact")
        flat = rewards.view(-1, G)
        varied = (flat.max(1).values > flat.min(1).values)
        if zero_share is None:
            zero_share = 1.0 - varied.float().mean().item()
        if cfg.dynamic_sampling:
            keep_groups = varied.nonzero().flatten()[:need]
        else:
            keep_groups = torch.arange(flat.shape[0])
        rows_idx = (keep_groups[:, None] * G + torch.arange(G)).flatten()
        if len(rows_idx) == 0:
            continue
        kept_problems += [rows[i] for i in rows_idx.tolist()]
        kept_rollouts.append(ro.select(rows_idx.to(ro.response_ids.device)))
        kept_rewards.append(rewards[rows_idx])
        kept_correct.append(correct[rows_idx])
        kept_resp += [resp[i] for i in rows_idx.tolist()]
    if not kept_rollouts:     # every group had zero variance: return the last round (no gradient)
        return Batch(rows, cat_rollouts([ro], tok.pad_id, task.max_new_tokens), rewards, correct, resp, zero_share)
    return Batch(kept_problems, cat_rollouts(kept_rollouts, tok.pad_id, task.max_new_tokens),
                 torch.cat(kept_rewards), torch.cat(kept_correct), kept_resp, zero_share)


def sequence_advantages(rewards: torch.Tensor, algo: str, group_size: int) -> torch.Tensor:
    r"""One advantage per response for the critic-free algorithms (``rewards`` ``[N]`` -> ``[N]``).

    reinforce: :math:`r_i - \bar r` over the batch; rloo: :func:`rlkit.objectives.rloo_advantages`;
    grpo/dapo/gspo: :func:`rlkit.objectives.grpo_advantages` with ``scale="std"``;
    dr_grpo: the same with ``scale="none"``. Chapter: 07_tiny_llm.
    """
    V.choice(algo, "algo", ("reinforce", "rloo", "grpo", "dapo", "gspo", "dr_grpo"))
    V.float_tensor(rewards, "rewards", min_dim=1)
    V.layout("N", rewards=rewards)
    V.int_in(group_size, "group_size")
    if algo == "reinforce":
        return rewards - rewards.mean()
    if algo == "rloo":
        return rloo_advantages(rewards, group_size)
    if algo in ("grpo", "dapo", "gspo"):
        return grpo_advantages(rewards, group_size, scale="std")
    return grpo_advantages(rewards, group_size, scale="none")          # dr_grpo


def policy_loss(cfg: RLConfig, logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor,
                mask: torch.Tensor) -> tuple[torch.Tensor, float]:
    r"""The policy loss of ``cfg.algo`` on a minibatch of responses; returns ``(loss, clip_fraction)``.

    All tensors are ``[B, T]`` over response tokens: ``logp`` (differentiable) and ``logp_old`` the
    log-probs of the sampled tokens under :math:`\pi_\theta` and :math:`\pi_{old}`, ``adv`` the
    per-token advantages, ``mask`` the real tokens. ``cfg`` must be :meth:`RLConfig.resolved`.

    * ``reinforce``, ``rloo``: :func:`rlkit.objectives.policy_gradient_loss`,
      :math:`-\mathrm{agg}\big(\log\pi_\theta(y_t)\,\hat A_t\big)` (no ratio, clip fraction 0);
    * ``gspo``: PPO-clip (:func:`rlkit.objectives.ppo_clip_loss`) of one sequence ratio per response,

      .. math:: s_i = \exp\Big(\frac{1}{|y_i|}\sum_t \big(\log\pi_\theta(y_{i,t}) - \log\pi_{old}(y_{i,t})\big)\Big),

      with the response's advantage :math:`\hat A_i` (``adv[:, 0]``), averaged over the responses;
    * the others (``grpo``, ``dr_grpo``, ``dapo``, ``ppo``): per-token PPO-clip with
      ``cfg.clip_eps``/``cfg.clip_eps_high``, aggregated by ``cfg.aggregation``.

    Responses are padded to the task's full budget, so ``seq-mean-token-sum-norm`` divides by the
    constant ``max_new_tokens`` (Dr. GRPO), not by the longest response of the batch.
    Chapter: 07_tiny_llm.
    """
    if not isinstance(cfg, RLConfig):
        raise TypeError(f"cfg must be an RLConfig, got {type(cfg).__name__}")
    if cfg.aggregation is None or cfg.clip_eps is None:
        raise ValueError("cfg must be resolved (cfg.resolved()): its aggregation and clip_eps are still None")
    V.layout("B T", floating=True, logp=logp)
    V.matching_floats(min_dim=2, logp=logp, logp_old=logp_old, adv=adv)
    V.check_mask(V.given(mask, "mask", "it marks the real response tokens"), logp, "logp")
    if cfg.algo in ("reinforce", "rloo"):
        return policy_gradient_loss(logp, adv, mask, cfg.aggregation), 0.0
    if cfg.algo == "gspo":
        # length-normalised sequence log-probs -> ratio s_i = exp(mean_t log pi/pi_old)
        n = mask.sum(-1, keepdim=True).clamp_min(1.0)
        seq_new = (logp * mask).sum(-1, keepdim=True) / n
        seq_old = (logp_old * mask).sum(-1, keepdim=True) / n
        loss, st = ppo_clip_loss(seq_new, seq_old, adv[:, :1], eps=cfg.clip_eps, eps_high=cfg.clip_eps_high,
                                 mask=(n > 0).float(), aggregation="token-mean")
        return loss, st["clip_fraction"].item()
    loss, st = ppo_clip_loss(logp, logp_old, adv, eps=cfg.clip_eps, eps_high=cfg.clip_eps_high, mask=mask,
                             aggregation=cfg.aggregation)
    return loss, st["clip_fraction"].item()


def check_train_args(tok, task, cfg) -> RLConfig:
    """Check the arguments every LLM trainer shares; return ``cfg`` (default ``RLConfig()``) resolved."""
    cfg = RLConfig() if cfg is None else V.instance_of(cfg, "cfg", RLConfig)
    V.instance_of(task, "task", Task, "rlkit.llm.tasks.Task")
    V.instance_of(tok, "tok", CharTokenizer)
    cfg = cfg.resolved()
    if cfg.checker not in task.checkers:
        raise ValueError(f"RLConfig.checker {cfg.checker!r} is not one of the task's checkers {list(task.checkers)}")
    return cfg


def refuse_unread(cfg: RLConfig | None, trainer: str, unread: dict) -> None:
    """Refuse the :class:`RLConfig` fields a trainer does not read, each by name.

    ``unread`` maps a field's name to why the trainer does not read it, or to ``(why, allowed)`` with
    the values that mean the same as ignoring it (e.g. ``log_kl`` ``(None, False)``); otherwise only
    the field's default is allowed. ``cfg`` is the config as the caller gave it (not resolved), None
    meaning the defaults. Raises ``ValueError("<trainer> does not read RLConfig.<field> (<why>) ...")``.
    """
    if cfg is None:
        return
    default = RLConfig()
    for name, why in unread.items():
        why, allowed = why if isinstance(why, tuple) else (why, (getattr(default, name),))
        x = getattr(cfg, name)
        if x not in allowed:
            ok = " or ".join(repr(a) for a in allowed)
            raise ValueError(f"{trainer} does not read RLConfig.{name} ({why}): leave it at {ok}, got {x!r}")
