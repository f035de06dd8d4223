r"""An actor-critic learner for the tiny LLM on lagged data, with corrections of the *value target*.

Chapter: 16_offpolicy_multistep.

Part II (chapters 11-12) corrects the *policy ratio* of a stale sample: the clipped objective
reweights the sampled token :math:`y_t` by :math:`\pi_\theta/\mu` (or a variant of it). That
leaves the advantage :math:`\hat A_t` the ratio multiplies, and the critic's regression targets,
computed on a trajectory whose *later* tokens :math:`y_{t+1}, y_{t+2},\dots` were drawn by the old
version :math:`\mu`. {prf:ref}`prop-ch11-current-advantage` asks for :math:`A^{\pi_k}`, so the later
tokens must be corrected too. This module does that with the off-policy multi-step targets of
:mod:`rlkit.offpolicy`, one per ``LaggedConfig.target``:

* ``none``: the lambda-return of the behaviour trajectory, uncorrected (it estimates values of
  :math:`\mu`, not of :math:`\pi_k`);
* ``vtrace``: :math:`r_t + \gamma_t[V(h_{t+1}) + \lambda(v_{t+1} - V(h_{t+1}))]` with the V-trace
  :math:`v_{t+1}` (clips :math:`\bar\rho`, :math:`\bar c`); it estimates values of the truncated
  policy :math:`\pi_{\bar\rho}\propto\min(\bar\rho\mu, \pi_k)`;
* ``retrace``: the Retrace target :math:`G_t` (:func:`rlkit.offpolicy.retrace`), whose fixed point
  is :math:`Q^{\pi_k}`;

and in every case :math:`\hat A_t` = target :math:`- V(h_t)`.

The critic is a :class:`QHead` (``critic="q"``: :math:`Q(h_t,\cdot)` over the whole vocabulary and
:math:`V(h_t) = \sum_a\pi_k(a\mid h_t)Q(h_t,a)`, needed by Retrace) or PPO's
:class:`rlkit.llm.ValueHead` (``critic="v"``, enough for ``none`` and ``vtrace``). One step of
:func:`train_lagged`:

1. **Sample** with lagged versions: each group of ``group_size`` responses comes from version
   :math:`k-\ell`, :math:`\ell\sim` ``lag`` (a :class:`rlkit.staleness.PolicyArchive`, as in
   :func:`rlkit.llm.stale.train_stale_grpo`); behaviour log-probs :math:`\log\mu(y_t)` are the
   sampler's ``model_logprobs``.
2. **Score** with :math:`\pi_k` (log-probs and, for the Q critic, the full next-token distribution)
   and the critic; the reward (exact match) sits on the last token; :math:`\gamma_t` =
   ``cfg.gamma`` inside a response, 0 after its last token.
3. **Targets** by :func:`offpolicy_targets`; advantages whitened over the batch.
4. **Update** ``cfg.epochs`` x ``cfg.minibatches``: the policy by
   :func:`rlkit.objectives.clipped_policy_loss` (``LaggedConfig.method``: the ratio correction of
   chapter 12), the critic by a squared error on the targets.
5. **Probe** (every ``probe_every`` steps): for ``probe_rows`` responses evenly spaced over the batch, the true
   :math:`V^{\pi_k}(h_t)` of every prefix estimated by ``probe_continuations`` on-policy
   continuations (:func:`continuation_values`), and the estimates of it that each target of
   :data:`PROBES` gives with the same critic on the same data (a paired comparison).

Logged per step (``result.history``): ``reward``, ``accuracy``, ``mean_age``, ``staleness`` (token
mean of :math:`\tfrac12|\pi_k/\mu - 1|`), ``clip_fraction``, ``policy_loss``, ``value_loss``,
``train_seconds``; ``result.evals``: held-out ``greedy_accuracy`` every ``cfg.eval_every`` steps.
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
from ..objectives import CLIP_METHODS, clipped_policy_loss, normalize_advantages
from ..offpolicy import retrace, trace_coefficients, vtrace
from ..returns import gae
from ..staleness import LagDistribution, PolicyArchive, staleness
from ..utils import clip_grad
from .evaluation import evaluate
from .rl import RLConfig, ValueHead, _train_args, collect
from .sampling import Rollout, call_model, sample
from .stale import _cat
from .tasks import Problem, Task
from .tokenizer import CharTokenizer

__all__ = ["TARGETS", "PROBES", "QHead", "LaggedConfig", "LaggedResult", "offpolicy_targets", "continuation_values",
           "train_lagged"]

#: The value-target corrections of :func:`train_lagged` (``LaggedConfig.target``).
TARGETS = ("none", "vtrace", "retrace")

#: The estimates of :math:`V^{\pi_k}(h_t)` that a probe compares, as ``name: (target, clip_rho)``.
PROBES = {"none": ("none", 1.0), "vtrace(1)": ("vtrace", 1.0), "vtrace(2)": ("vtrace", 2.0),
          "retrace": ("retrace", 1.0)}


class QHead(nn.Module):
    r"""A critic over the vocabulary: :math:`Q(h_t, \cdot) = W\,\mathrm{logits}_t + b \in \mathbb R^{|\mathcal V|}`.

    ``forward(ids [B, T], attention_mask=None) -> q [B, T, |V|]``; ``q[:, t, a]`` is the value of
    emitting token ``a`` after reading ``ids[:, :t + 1]``. Built, like :class:`rlkit.llm.ValueHead`,
    on a copy of the LM; the head (:math:`|\mathcal V|^2 + |\mathcal V|` parameters here, a
    :math:`d\times|\mathcal V|` matrix on hidden states in a real LLM) starts at zero. Retrace and
    Tree-Backup need it because their targets contain :math:`\mathbb E_{a\sim\pi}Q(h_{t+1}, a)`.

    Chapter: 16_offpolicy_multistep.
    """

    accepts_attention_mask = True

    def __init__(self, lm: nn.Module, vocab_size: int):
        super().__init__()
        self.lm = lm
        vocab_size = V.int_in(vocab_size, "vocab_size")
        self.head = nn.Linear(vocab_size, vocab_size)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, ids, attention_mask=None):
        return self.head(call_model(self.lm, ids, attention_mask))


def _as_lag(x, name: str) -> LagDistribution:
    V.instance_of(x, name, (LagDistribution, numbers.Integral), "LagDistribution or an int >= 0")
    return x if isinstance(x, LagDistribution) else LagDistribution.fixed(V.int_in(x, name, 0))


@dataclass(frozen=True)
class LaggedConfig(V.ValidatedConfig):
    r"""The off-policy knobs of :func:`train_lagged`, checked when built.

    Fields: ``target`` (one of :data:`TARGETS`); ``clip_rho`` :math:`\bar\rho > 0` and ``clip_c``
    :math:`\bar c > 0` (V-trace); ``lag`` (a :class:`rlkit.staleness.LagDistribution` or an int);
    ``method`` (the policy-ratio correction, one of :data:`rlkit.objectives.CLIP_METHODS`);
    ``critic`` (``"q"``: :class:`QHead`; ``"v"``: :class:`rlkit.llm.ValueHead`, not with Retrace);
    ``normalize`` (whiten the advantages); ``probe_every`` (``None`` or steps between probes),
    ``probe_rows``, ``probe_continuations``.

    Chapter: 16_offpolicy_multistep.
    """

    target: str = V.choice_field("vtrace", TARGETS)
    clip_rho: float = V.number_field(1.0, 0.0, lo_open=True)
    clip_c: float = V.number_field(1.0, 0.0, lo_open=True)
    lag: LagDistribution | int = V.config_field(0, _as_lag)
    method: str = V.choice_field("standard", CLIP_METHODS)
    critic: str = V.choice_field("q", ("q", "v"))
    normalize: bool = V.bool_field(True)
    probe_every: int | None = V.int_field(None, optional=True)
    probe_rows: int = V.int_field(32)
    probe_continuations: int = V.int_field(16, 2)

    def __post_init__(self):
        super().__post_init__()
        if self.target == "retrace" and self.critic != "q":
            raise ValueError("LaggedConfig.target = 'retrace' needs Q over the vocabulary: use critic='q' "
                             "(a ValueHead gives only V)")


@dataclass
class LaggedResult:
    r"""What :func:`train_lagged` returns.

    ``probes`` is a list of dicts, one per probe: ``step``, ``age`` ``[R]`` (versions behind the
    learner), ``mask`` ``[R, T]``, ``truth`` ``[R, T]`` (the continuation estimate of
    :math:`V^{\pi_k}(h_t)`), ``n`` (continuations per prefix) and ``estimates`` (``name -> [R, T]``,
    the names of :data:`PROBES` available for the critic, plus ``"critic"``: :math:`V(h_t)` itself).
    ``consumed`` lists ``(step, actor, seq, version, lag)`` of every sample taken from an
    :class:`rlkit.distributed.ActorPool` (empty for simulated lags).
    """

    model: nn.Module
    critic: nn.Module
    history: dict
    evals: dict
    probes: list
    config: RLConfig
    lagged: LaggedConfig
    consumed: list = field(default_factory=list)

    def array(self, key: str) -> np.ndarray:
        """``history[key]`` or ``evals[key]`` as a float array."""
        src = self.history if key in self.history else self.evals
        return np.asarray(src[key], dtype=float)

    def target_errors(self, name: str, ages: Sequence[int] | None = None) -> tuple[float, int]:
        r"""Mean squared error of estimate ``name`` against :math:`V^{\pi_k}` over the probed tokens.

        .. math:: \widehat{\mathrm{MSE}} = \frac1n\sum\Big[(\hat v - \hat p)^2 - \frac{\hat p(1-\hat p)}{K-1}\Big],

        with :math:`\hat p` the mean of :math:`K` continuation rewards (0/1): the second term removes
        the truth's own sampling variance, so the estimate is unbiased for the error against the
        exact :math:`V^{\pi_k}`. Only rows whose age is in ``ages`` (all if ``None``). Returns
        ``(mse, n_tokens)``; ``(nan, 0)`` when nothing matches.
        """
        tot, n = 0.0, 0
        for p in self.probes:
            if name not in p["estimates"]:
                raise KeyError(f"no estimate {name!r} in the probes (have {sorted(p['estimates'])})")
            rows = torch.ones_like(p["age"], dtype=torch.bool) if ages is None else \
                torch.isin(p["age"], torch.as_tensor(list(ages), dtype=p["age"].dtype))
            m = (p["mask"] > 0) & rows[:, None]
            if not m.any():
                continue
            t, e = p["truth"][m].double(), p["estimates"][name][m].double()
            tot += float(((e - t) ** 2 - t * (1 - t) / (p["n"] - 1)).sum())
            n += int(m.sum())
        return (tot / n if n else math.nan), n


def _shift_left(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x[..., 1:], torch.zeros_like(x[..., :1])], dim=-1)


def offpolicy_targets(target: str, log_rhos: torch.Tensor, rewards: torch.Tensor, values: torch.Tensor,
                  next_values: torch.Tensor, discounts: torch.Tensor, *, q_taken: torch.Tensor | None = None,
                  lam: float = 1.0, clip_rho: float = 1.0, clip_c: float = 1.0
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""Off-policy targets for one batch: ``(q_targets, v_estimates, advantages)``, each ``[..., T]``.

    With ``log_rhos`` :math:`= \log\pi_k(y_t) - \log\mu(y_t)`, :math:`V_t = V(h_t)`
    (``values``), :math:`V_{t+1}` (``next_values``, 0 after the last token) and :math:`\gamma_t`:

    * ``"none"``: the lambda-return :math:`g_t = r_t + \gamma_t[(1-\lambda)V_{t+1} + \lambda g_{t+1}]`
      (:func:`rlkit.returns.gae`) of the behaviour trajectory; ``q_targets = v_estimates`` :math:`= g_t`.
    * ``"vtrace"``: :math:`v_t` of :func:`rlkit.offpolicy.vtrace` (:math:`\bar\rho` = ``clip_rho``,
      :math:`\bar c` = ``clip_c``) is the estimate of :math:`V(h_t)`, and
      :math:`q_t = r_t + \gamma_t[V_{t+1} + \lambda(v_{t+1} - V_{t+1})]` the target for
      :math:`Q(h_t, y_t)` (the token itself is not reweighted: the policy loss's ratio does that).
    * ``"retrace"``: :math:`q_t = G_t` of :func:`rlkit.offpolicy.retrace` (needs ``q_taken``
      :math:`= Q(h_t, y_t)` and ``values`` :math:`=\mathbb E_{\pi_k}Q(h_t,\cdot)`), and
      :math:`\hat v_t = V_t + \lambda c_t(G_t - Q(h_t,y_t))`, :math:`c_t = \min(1, \pi_k(y_t)/\mu(y_t))`, the
      bracket of the Retrace recursion, an estimate of :math:`V^{\pi_k}(h_t)`.

    In every case ``advantages`` :math:`= q_t - V_t` (with ``"none"``, GAE).

    Args:
        target: one of :data:`TARGETS`.
        log_rhos, rewards, values, next_values, discounts: ``[..., T]`` (0 at padding).
        q_taken: ``[..., T]``, ``"retrace"`` only.
        lam: :math:`\lambda \in [0, 1]`. clip_rho, clip_c: ``> 0``, ``"vtrace"`` only.

    Returns:
        Three ``[..., T]`` tensors without gradient.

    Chapter: 16_offpolicy_multistep, eq-ch16-llm-targets.
    """
    V.choice(target, "target", TARGETS)
    V.matching_floats(log_rhos=log_rhos, rewards=rewards, values=values, next_values=next_values,
                      discounts=discounts)
    lam = V.real_in(lam, "lam", 0.0, 1.0)
    with torch.no_grad():
        if target == "none":
            V.unused(q_taken, "q_taken", "by target='retrace'")
            adv, ret = gae(rewards, values, next_values, discounts, lam)
            return ret, ret, adv
        if target == "vtrace":
            V.unused(q_taken, "q_taken", "by target='retrace'")
            vs, _ = vtrace(log_rhos, rewards, values, next_values, discounts, clip_rho, clip_c, lam)
            q = rewards + discounts * (next_values + lam * _shift_left(vs - values))
            return q, vs, q - values
        V.given(q_taken, "q_taken", "target='retrace' needs Q(h_t, y_t) of the sampled tokens")
        V.matching_floats(rewards=rewards, q_taken=q_taken)
        G = retrace(log_rhos, rewards, q_taken, next_values, discounts, lam)
        c = trace_coefficients("retrace", log_rhos=log_rhos)
        return G, values + lam * c * (G - q_taken), G - values


@torch.no_grad()
def continuation_values(model, tok: CharTokenizer, task: Task, rollout: Rollout, problems: Sequence[Problem],
                        n: int, generator: torch.Generator | None = None, checker: str = "exact") -> torch.Tensor:
    r"""Monte Carlo :math:`V^{\pi}(h_t)` of every response prefix, from ``n`` on-policy continuations each.

    For row :math:`i` and response position :math:`t` (a real token), :math:`h_t` is the prompt
    followed by :math:`y_{<t}`; ``model`` (temperature 1) completes it ``n`` times within the task's
    budget, and the result is the mean reward of the completed responses,

    .. math:: \hat V(h_t) = \frac1n\sum_{j=1}^n r\big(y_{<t}\,\tilde y^{(j)}\big), \qquad
              \tilde y^{(j)} \sim \pi(\cdot\mid h_t),

    unbiased for :math:`V^\pi(h_t)` with variance :math:`V(1-V)/n` for a 0/1 reward.

    Args:
        model: the policy :math:`\pi` (an LM following the protocol).
        tok, task: the tokenizer and the task (its checker ``checker`` scores).
        rollout: ``[N, T]`` responses whose prefixes are valued.
        problems: the ``N`` problems of the rows.
        n: continuations per prefix, ``>= 1``.
        generator: for the sampler.

    Returns:
        ``[N, T]`` float32, 0 at masked positions.

    Chapter: 16_offpolicy_multistep.
    """
    V.instance_of(rollout, "rollout", Rollout)
    n = V.int_in(n, "n")
    V.same_length(list(problems), "problems", list(range(len(rollout))), "rollout")
    dev = rollout.response_ids.device
    N, T = rollout.response_ids.shape
    out = torch.zeros(N, T)
    lengths = rollout.mask.sum(-1).long().cpu()
    for t in range(T):
        rows = (lengths > t).nonzero().flatten().tolist()
        if not rows or task.max_new_tokens - t < 1:
            continue
        heads = [tok.decode(rollout.response_ids[i, :t].cpu()) for i in rows]
        texts = [problems[i].prompt + h for i, h in zip(rows, heads) for _ in range(n)]
        ids, mask = tok.encode_batch(texts, device=dev)
        ro = sample(model, ids, mask, max_new_tokens=task.max_new_tokens - t, eos_id=tok.eos_id,
                    pad_id=tok.pad_id, generator=generator)
        tails = tok.decode_batch(ro.response_ids.cpu())
        probs = [problems[i] for i in rows for _ in range(n)]
        r = task.score([heads[j // n] + s for j, s in enumerate(tails)], probs, checker).view(len(rows), n)
        out[rows, t] = r.mean(-1)
    return out * rollout.mask.cpu().float()


def _positions(net, ro: Rollout, rows=None) -> torch.Tensor:
    """``net``'s outputs at the positions that score response tokens: ``[B, T, ...]``."""
    pid, pm, rid = ro.prompt_ids, ro.prompt_mask, ro.response_ids
    if rows is not None:
        pid, pm, rid = pid[rows], pm[rows], rid[rows]
    P, T = pid.shape[1], rid.shape[1]
    ids = torch.cat([pid, rid], 1)
    att = torch.cat([pm, torch.ones_like(rid, dtype=torch.bool)], 1)
    out = net(ids, attention_mask=att) if isinstance(net, ValueHead) else call_model(net, ids, att)
    return out[:, P - 1:P - 1 + T]


def _critic_outputs(critic, kind, logp_all, ro, rows=None):
    """``(values [B, T], q_taken [B, T] or None)``; for the Q critic V = sum_a pi_k(a) Q(., a)."""
    out = _positions(critic, ro, rows)
    if kind == "v":
        return out, None
    y = ro.response_ids if rows is None else ro.response_ids[rows]
    v = (logp_all.exp() * out).sum(-1)
    return v, out.gather(-1, y[..., None]).squeeze(-1)


def train_lagged(model: nn.Module, tok: CharTokenizer, task: Task, cfg: RLConfig | None = None,
                 lagged: LaggedConfig | None = None, *, eval_problems: Sequence[Problem] | None = None,
                 pool=None, timeout: float = 120.0, verbose: bool = False) -> LaggedResult:
    r"""Train ``model`` (in place) with an actor-critic learner on lagged samples; return a :class:`LaggedResult`.

    The learner of the module docstring. ``cfg`` is an :class:`rlkit.llm.RLConfig` with
    ``algo="ppo"`` (its ``gamma``, ``lam``, ``lr``, ``value_lr``, ``value_coef``, ``clip_eps``,
    ``epochs``, ``minibatches``, ``prompts_per_step``, ``group_size``, ``eval_every``, ``seed``
    are used), temperature 1, no top-k/top-p, no KL term.

    Args:
        model, tok, task: as in :func:`rlkit.llm.train`.
        cfg: the trainer settings (default ``RLConfig(algo="ppo", lam=1.0)``).
        lagged: a :class:`LaggedConfig` (default: V-trace with :math:`\bar\rho=\bar c=1`, fresh data).
        eval_problems: held-out problems (default ``cfg.eval_problems`` from the test split).
        pool: ``None`` (lags simulated with a :class:`rlkit.staleness.PolicyArchive` and
            ``lagged.lag``) or a started :class:`rlkit.distributed.ActorPool` whose ``sample_fn``
            returns one group of ``cfg.group_size`` responses per sample
            (:class:`rlkit.distributed.GroupSampler` with ``prompts=1``): each step then consumes
            ``cfg.prompts_per_step`` samples from it, whatever versions they carry, and publishes the
            new weights (the lag is the pool's, and ``lagged.lag`` is not used).
        timeout: seconds to wait for the pool's samples per step.

    Chapter: 16_offpolicy_multistep.
    """
    cfg = _train_args(tok, task, RLConfig(algo="ppo", lam=1.0) if cfg is None else cfg)
    lagged = LaggedConfig() if lagged is None else V.instance_of(lagged, "lagged", LaggedConfig)
    if cfg.algo != "ppo":
        raise ValueError(f"cfg.algo must be 'ppo' for train_lagged (an actor-critic), got {cfg.algo!r}")
    if cfg.temperature != 1.0 or cfg.top_k is not None or cfg.top_p is not None or cfg.kl_coef != 0:
        raise ValueError("train_lagged samples at temperature 1 without top-k/top-p and has no KL term")
    params = list(model.parameters())
    dev = params[0].device
    rng = random.Random(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    lag_gen = torch.Generator().manual_seed(cfg.seed + 1)
    probe_gen = torch.Generator().manual_seed(cfg.seed + 2)
    opt = torch.optim.Adam(params, lr=cfg.lr)
    head = QHead if lagged.critic == "q" else ValueHead
    critic = head(copy.deepcopy(model), tok.vocab_size).to(dev)
    vopt = torch.optim.Adam(critic.parameters(), lr=cfg.value_lr)
    if eval_problems is None:
        eval_problems = task.problems(cfg.eval_problems, seed=10_000 + cfg.seed, split="test")
    G = cfg.group_size
    keys = ("reward", "accuracy", "mean_age", "staleness", "clip_fraction", "policy_loss", "value_loss",
            "train_seconds")
    hist = {k: [] for k in keys}
    evals = {"step": [], "train_seconds": [], "greedy_accuracy": []}
    probes, consumed = [], []
    archive = PolicyArchive(capacity=lagged.lag.max + 1)
    train_time = 0.0

    def run_eval(step):
        evals["step"].append(step)
        evals["train_seconds"].append(train_time)
        evals["greedy_accuracy"].append(evaluate(model, tok, task, eval_problems, greedy=True)["accuracy"])

    run_eval(0)
    version = 0
    if pool is None:
        archive.push(0, model)
    else:
        from ..distributed import merge_batches
        pool.publish(model.state_dict(), version=0)
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        model.eval()
        if pool is None:
            lags = lagged.lag.sample(cfg.prompts_per_step, lag_gen)
            group_versions = archive.behaviour_versions(version, lags)
            parts, rewards, correct, row_versions, problems = [], [], [], [], []
            for v in torch.unique(group_versions).tolist():
                b = collect(archive.get(v), tok, task, cfg, rng, gen, dev, prompts=int((group_versions == v).sum()))
                parts.append(b.rollout)
                rewards.append(b.rewards)
                correct.append(b.correct)
                problems += b.problems
                row_versions.append(torch.full((len(b.rollout),), v, dtype=torch.long))
            ro = _cat(parts)
            rewards, correct, row_versions = torch.cat(rewards).to(dev), torch.cat(correct), torch.cat(row_versions)
        else:
            got = pool.get(cfg.prompts_per_step, timeout=timeout)
            consumed += [(step, x.actor, x.seq, x.version, x.lag) for x in got]
            b, row_versions = merge_batches(got)
            if len(b.rollout) != cfg.prompts_per_step * G:
                raise ValueError(f"train_lagged: the pool's samples gave {len(b.rollout)} rows; expected one group of "
                                 f"cfg.group_size = {G} per sample (GroupSampler(group_size={G}, prompts=1))")
            ro, rewards, correct, problems = _select(b.rollout, torch.arange(len(b.rollout))), b.rewards.to(dev), \
                b.correct, b.problems
            ro = Rollout(*(x.to(dev) for x in (ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask, ro.logprobs,
                                               ro.model_logprobs, ro.finished)))
        age = (version - row_versions).to(dev)
        mask = ro.mask
        N = mask.shape[0]
        with torch.no_grad():
            lb = ro.model_logprobs
            logp_all = torch.log_softmax(_positions(model, ro).float(), -1)
            lp_k = logp_all.gather(-1, ro.response_ids[..., None]).squeeze(-1) * mask
            lp_k = torch.where((age == 0)[:, None], lb, lp_k)
            log_rhos = (lp_k - lb) * mask
            values, q_taken = _critic_outputs(critic, lagged.critic, logp_all, ro)
            values = values * mask
            q_taken = None if q_taken is None else q_taken * mask
            not_last = torch.zeros_like(mask)
            not_last[:, :-1] = mask[:, 1:]
            discounts = cfg.gamma * not_last
            next_values = _shift_left(values) * not_last
            tok_rewards = torch.zeros_like(mask)
            last = (mask.sum(-1).long() - 1).clamp_min(0)
            tok_rewards[torch.arange(N, device=dev), last] = rewards
            args = (log_rhos, tok_rewards, values, next_values, discounts)

            def targets(target, clip_rho, args=args, q_taken=q_taken):
                return offpolicy_targets(target, *args, q_taken=q_taken if target == "retrace" else None,
                                     lam=cfg.lam, clip_rho=clip_rho, clip_c=lagged.clip_c)

            q_tgt, v_tgt, adv = targets(lagged.target, lagged.clip_rho)
            q_tgt, v_tgt = q_tgt * mask, v_tgt * mask
            adv = normalize_advantages(adv, mask) if lagged.normalize else adv * mask
            s_hat = float(staleness(lp_k, lb, mask))
            if lagged.probe_every is not None and step % lagged.probe_every == 0:
                pr = torch.linspace(0, N - 1, min(lagged.probe_rows, N)).round().long().unique()
                truth = continuation_values(model, tok, task, _select(ro, pr.to(dev)), [problems[i] for i in pr],
                                            lagged.probe_continuations, probe_gen)
                est = {"critic": values[pr].cpu()}
                for name, (tgt, crho) in PROBES.items():
                    if tgt == "retrace" and q_taken is None:
                        continue
                    est[name] = (targets(tgt, crho)[1] * mask)[pr].cpu()
                probes.append(dict(step=step, age=age[pr].cpu(), mask=mask[pr].cpu(), truth=truth,
                                   n=lagged.probe_continuations, estimates=est))
        model.train()
        n_groups = N // G
        plosses, vlosses, clips = [], [], []
        for _ in range(cfg.epochs):
            order = torch.randperm(n_groups, generator=gen)
            for chunk in order.chunk(min(cfg.minibatches, max(1, n_groups))):
                rows = (chunk[:, None] * G + torch.arange(G)).flatten().to(dev)
                m = mask[rows]
                logits = _positions(model, ro, rows)
                logp = torch.log_softmax(logits.float(), -1).gather(-1, ro.response_ids[rows][..., None]).squeeze(-1)
                logp = logp * m
                loss, st = clipped_policy_loss(lagged.method, logp, lp_k[rows], lb[rows], adv[rows], cfg.clip_eps,
                                               mask=m, aggregation=cfg.aggregation)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                clip_grad(params, cfg.grad_clip)
                opt.step()
                v, q = _critic_outputs(critic, lagged.critic, logp_all[rows], ro, rows)
                pred, tgt = (v, v_tgt[rows]) if q is None else (q, q_tgt[rows])
                vloss = cfg.value_coef * 0.5 * (((pred - tgt) ** 2) * m).sum() / m.sum().clamp_min(1.0)
                vopt.zero_grad(set_to_none=True)
                vloss.backward()
                clip_grad(critic.parameters(), cfg.grad_clip)
                vopt.step()
                plosses.append(loss.item())
                vlosses.append(vloss.item())
                clips.append(float(st["clip_fraction"]))
        model.eval()
        train_time += time.perf_counter() - t0
        for k, x in (("reward", float(rewards.mean())), ("accuracy", float(correct.float().mean())),
                     ("mean_age", float(age.float().mean())), ("staleness", s_hat),
                     ("clip_fraction", float(np.mean(clips)) if clips else math.nan),
                     ("policy_loss", float(np.mean(plosses)) if plosses else math.nan),
                     ("value_loss", float(np.mean(vlosses)) if vlosses else math.nan), ("train_seconds", train_time)):
            hist[k].append(x)
        if verbose:
            print(f"step {step:3d} reward {hist['reward'][-1]:.3f} age {hist['mean_age'][-1]:.2f} "
                  f"S {s_hat:.4f} vloss {hist['value_loss'][-1]:.4f}")
        version += 1
        if pool is None:
            archive.push(version, model)
        else:
            pool.publish(model.state_dict(), version=version)
        if (step + 1) % cfg.eval_every == 0 or step == cfg.steps - 1:
            run_eval(step + 1)
    return LaggedResult(model=model, critic=critic, history=hist, evals=evals, probes=probes, config=cfg,
                        lagged=lagged, consumed=consumed)


def _select(ro: Rollout, idx) -> Rollout:
    return Rollout(*(getattr(ro, f)[idx] for f in ("prompt_ids", "prompt_mask", "response_ids", "mask",
                                                   "logprobs", "model_logprobs", "finished")))

