r"""Actor-critic learning of the tiny LLM on lagged data, with corrections of the *value target*.

Chapter: 16_offpolicy_multistep.

Part II (chapters 11-12) corrects the *policy ratio* of a stale sample: the clipped objective
reweights the sampled token :math:`y_t` by :math:`\pi_\theta/\mu` (or a variant of it). That
leaves the advantage :math:`\hat A_t` the ratio multiplies, and the critic's regression targets,
computed on a trajectory whose *later* tokens :math:`y_{t+1}, y_{t+2},\dots` were drawn by the old
version :math:`\mu`. {prf:ref}`prop-ch11-current-advantage` asks for :math:`A^{\pi_k}`, so the later
tokens must be corrected too, with the off-policy multi-step targets of :mod:`rlkit.offpolicy`
(:func:`offpolicy_targets`: none, V-trace or Retrace).

The chapter's learner is :func:`rlkit.llm.train` with four parts::

    train(model, tok, ADDITION, RLConfig(algo="ppo"),
          sampler=Lagged(LagDistribution.uniform(8)),          # or Pool(pool): real actors
          advantages=OffPolicy("vtrace", critic="q"),
          loss=ClippedLoss("standard"),
          hooks=[ValueProbes(every=4, rows=16, continuations=16)],
          evaluation=HeldOut(sampled=False, rewards=False))

* :class:`rlkit.llm.samplers.Lagged` samples each *group* of ``group_size`` responses with version
  :math:`k-\ell`, :math:`\ell\sim` ``lag`` (a :class:`rlkit.staleness.PolicyArchive`);
  :class:`rlkit.llm.samplers.Pool` takes the groups of an :class:`rlkit.distributed.ActorPool`
  instead, with whatever lag the actors produce, and :class:`HeldBack` (a ``Pool`` that publishes each
  version ``delay`` updates late) forces a larger one on real actors;
* :class:`rlkit.llm.advantages.OffPolicy` computes the targets and the advantages, and fits the
  critic (a Q-value over the vocabulary or a value) after every policy step;
* :class:`ClippedLoss` is the clipped policy loss of chapter 12 (``method``: the ratio correction);
* :class:`ValueProbes` measures, every few updates, how far each target's estimate of
  :math:`V^{\pi_k}(h_t)` is from the truth, estimated by on-policy continuations
  (:func:`continuation_values`, :func:`target_errors`).

:func:`train_lagged` is the same call under its rlkit 0.2 name, kept for one release.
"""
from __future__ import annotations

import copy
import math
import numbers
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn

from .. import _validate as V
from ..objectives import CLIP_METHODS, clipped_policy_loss
from ..offpolicy import retrace, trace_coefficients, vtrace
from ..returns import gae
from ..staleness import LagDistribution
from .advantages import OffPolicy
from .heads import LogitHead
from .rl import RLConfig, refuse_unread
from .samplers import Lagged, Pool
from .sampling import Rollout, sample, token_logprobs
from .tasks import Problem, Task
from .tokenizer import CharTokenizer
from .trainer import HeldOut, Hook, RLResult, Step, train

__all__ = ["TARGETS", "PROBES", "QHead", "LaggedConfig", "LaggedResult", "offpolicy_targets", "continuation_values",
           "target_errors", "ValueProbes", "ClippedLoss", "HeldBack", "train_lagged"]

#: The value-target corrections of :class:`rlkit.llm.advantages.OffPolicy` (``LaggedConfig.target``).
TARGETS = ("none", "vtrace", "retrace")

#: The estimates of :math:`V^{\pi_k}(h_t)` that a probe compares, as ``name: (target, clip_rho)``.
PROBES = {"none": ("none", 1.0), "vtrace(1)": ("vtrace", 1.0), "vtrace(2)": ("vtrace", 2.0),
          "retrace": ("retrace", 1.0)}


class QHead(LogitHead):
    r"""A critic over the vocabulary, :math:`Q(h_t, \cdot) = W\,\mathrm{logits}_t + b`: ``LogitHead(lm, V, (V,))``.

    ``forward(ids [B, T], attention_mask=None) -> q [B, T, |V|]``. The rlkit 0.2 name, kept for one
    release; use :class:`rlkit.llm.heads.LogitHead` with ``shape=(vocab_size,)``.

    Chapter: 16_offpolicy_multistep.
    """

    def __init__(self, lm: nn.Module, vocab_size: int):   # TODO(0.4): remove (rlkit 0.2's name)
        vocab_size = V.int_in(vocab_size, "vocab_size")
        super().__init__(lm, vocab_size, (vocab_size,))


def _as_lag(x, name: str) -> LagDistribution:
    V.instance_of(x, name, (LagDistribution, numbers.Integral), "LagDistribution or an int >= 0")
    return x if isinstance(x, LagDistribution) else LagDistribution.fixed(V.int_in(x, name, 0))


@dataclass(frozen=True)
class LaggedConfig(V.ValidatedConfig):
    r"""The off-policy knobs of :func:`train_lagged`, checked when built.

    Fields: ``target`` (one of :data:`TARGETS`); ``clip_rho`` :math:`\bar\rho > 0` and ``clip_c``
    :math:`\bar c > 0` (V-trace only); ``lag`` (a :class:`rlkit.staleness.LagDistribution` or an int);
    ``method`` (the policy-ratio correction, one of :data:`rlkit.objectives.CLIP_METHODS`);
    ``critic`` (``"q"``: a Q-value over the vocabulary; ``"v"``: :class:`rlkit.llm.ValueHead`, not
    with Retrace); ``normalize`` (whiten the advantages); ``probe_every`` (``None`` or updates
    between probes), ``probe_rows``, ``probe_continuations`` (:class:`ValueProbes`; only with
    ``probe_every``); the critic's ``gamma`` :math:`\gamma` and ``lam`` :math:`\lambda` (in
    ``[0, 1]``), ``value_lr`` (its learning rate, ``> 0``; ``None``: ``RLConfig.lr``) and
    ``value_coef`` (``>= 0``), passed to :class:`rlkit.llm.advantages.OffPolicy` (``gamma``, ``lam``,
    ``lr``, ``coef``; they were RLConfig's in rlkit 0.2).

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
    gamma: float = V.number_field(1.0, 0.0, 1.0)
    lam: float = V.number_field(1.0, 0.0, 1.0)
    value_lr: float | None = V.number_field(None, 0.0, lo_open=True, optional=True)   # None: RLConfig.lr
    value_coef: float = V.number_field(1.0, 0.0)

    def __post_init__(self):
        super().__post_init__()
        if self.target == "retrace" and self.critic != "q":
            raise ValueError("LaggedConfig.target = 'retrace' needs Q over the vocabulary: use critic='q' "
                             "(a ValueHead gives only V)")
        if self.target != "vtrace" and (self.clip_rho != 1.0 or self.clip_c != 1.0):
            raise ValueError(f"LaggedConfig.clip_rho and clip_c are only used by target='vtrace'; with "
                             f"target={self.target!r} they would be ignored, so leave them at 1.0")
        if self.probe_every is None and (self.probe_rows != 32 or self.probe_continuations != 16):
            raise ValueError("LaggedConfig.probe_rows and probe_continuations are only used with probe_every; "
                             "without it there is no probe, so leave them at their defaults (32, 16)")


@dataclass
class LaggedResult(RLResult):
    r"""What :func:`train_lagged` returns: an :class:`rlkit.llm.RLResult` with its :class:`LaggedConfig`.

    Its extras: ``probes`` (:class:`ValueProbes`; empty without ``probe_every``) and ``consumed``
    (:class:`rlkit.llm.samplers.Pool`: ``(update, actor, seq, version, lag)`` of every sample taken
    from the actor pool; empty for simulated lags).
    """

    lagged: LaggedConfig | None = None

    def target_errors(self, name: str, ages: Sequence[int] | None = None) -> tuple[float, int]:
        """:func:`target_errors` of this run's probes."""
        return target_errors(self.probes, name, ages)


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
        log_rhos, rewards, values, next_values, discounts: ``[..., T]`` (0 at padding); ``log_rhos``
            without NaN (it is not read by ``"none"``).
        q_taken: ``[..., T]``, ``"retrace"`` only.
        lam: :math:`\lambda \in [0, 1]`. clip_rho, clip_c: finite, ``> 0`` (checked always), read by
            ``"vtrace"`` only.

    Returns:
        Three ``[..., T]`` tensors without gradient.

    Chapter: 16_offpolicy_multistep, eq-ch16-llm-targets.
    """
    V.choice(target, "target", TARGETS)
    V.matching_floats(log_rhos=log_rhos, rewards=rewards, values=values, next_values=next_values,
                      discounts=discounts)
    lam = V.real_in(lam, "lam", 0.0, 1.0)
    V.real_in(clip_rho, "clip_rho", 0.0, lo_open=True)
    V.real_in(clip_c, "clip_c", 0.0, lo_open=True)
    if target != "none" and log_rhos.numel() and bool(torch.isnan(log_rhos).any()):
        raise ValueError(f"log_rhos must not hold NaN (target={target!r} reads the ratios; -inf, a token the "
                         f"learner never takes, is fine)")
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
        problems: a list of the ``N`` problems of the rows.
        n: continuations per prefix, ``>= 1``.
        generator: for the sampler.

    Returns:
        ``[N, T]`` float32, 0 at masked positions.

    Chapter: 16_offpolicy_multistep.
    """
    V.is_callable(model, "model")
    V.instance_of(tok, "tok", CharTokenizer)
    V.instance_of(task, "task", Task)
    V.instance_of(rollout, "rollout", Rollout)
    n = V.int_in(n, "n")
    problems = V.tuple_of(problems, "problems", Problem)
    V.same_length(problems, "problems", list(range(len(rollout))), "rollout")
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


def target_errors(probes: Sequence[dict], name: str, ages: Sequence[int] | None = None) -> tuple[float, int]:
    r"""Mean squared error of estimate ``name`` against :math:`V^{\pi_k}` over the probed tokens of ``probes``.

    .. math:: \widehat{\mathrm{MSE}} = \frac1n\sum\Big[(\hat v - \hat p)^2 - \frac{\hat p(1-\hat p)}{K-1}\Big],

    with :math:`\hat p` the mean of :math:`K` continuation rewards (0/1): the second term removes
    the truth's own sampling variance, so the estimate is unbiased for the error against the
    exact :math:`V^{\pi_k}`. ``probes`` are :class:`ValueProbes`' (``result.probes``); only rows
    whose age is in ``ages`` (a list of ints, or ``None``: all) count. Returns ``(mse, n_tokens)``;
    ``(nan, 0)`` when nothing matches. A ``name`` that is not an estimate of the probes raises ``ValueError``.

    Chapter: 16_offpolicy_multistep.
    """
    V.instance_of(probes, "probes", (list, tuple), "list of ValueProbes' probe dicts (result.probes)")
    V.nonempty_str(name, "name")
    if ages is not None:
        V.instance_of(ages, "ages", (list, tuple, range), "list of ints")
        for i, a in enumerate(ages):
            V.int_in(a, f"ages[{i}]", 0)
    tot, n = 0.0, 0
    for i, p in enumerate(probes):
        V.dict_keys(p, f"probes[{i}]", required=["age", "mask", "truth", "n", "estimates"], optional=["step"])
        if name not in p["estimates"]:
            raise ValueError(f"name={name!r} is not an estimate of probes[{i}] (it has {sorted(p['estimates'])})")
        rows = torch.ones_like(p["age"], dtype=torch.bool) if ages is None else \
            torch.isin(p["age"], torch.as_tensor(list(ages), dtype=p["age"].dtype))
        m = (p["mask"] > 0) & rows[:, None]
        if not m.any():
            continue
        t, e = p["truth"][m].double(), p["estimates"][name][m].double()
        tot += float(((e - t) ** 2 - t * (1 - t) / (p["n"] - 1)).sum())
        n += int(m.sum())
    return (tot / n if n else math.nan), n


class ValueProbes(Hook):
    r"""Every ``every`` updates, measure each target's estimate of :math:`V^{\pi_k}(h_t)` against the truth.

    Before the update (after the advantages), for ``rows`` responses evenly spaced over the batch
    (so over all ages): the true :math:`V^{\pi_k}(h_t)` of every prefix, estimated by
    ``continuations`` on-policy continuations from :math:`\pi_k` (:func:`continuation_values`,
    its own generator seeded ``RLConfig.seed + 2``), and the estimate of it that each target of
    :data:`PROBES` gives with the same critic on the same data (a paired comparison): the return
    (``"none"``), V-trace's :math:`v_t` with :math:`\bar\rho = 1, 2`, and for a Q critic
    :math:`V(h_t) + \lambda c_t(G_t - Q(h_t, y_t))`, the bracket of the Retrace recursion; plus
    ``"critic"``, :math:`V(h_t)` itself. The estimates come from the estimator through
    ``step.data["value_estimate"]`` (:class:`rlkit.llm.advantages.OffPolicy`).

    ``result.probes`` is a list of dicts, one per probe: ``step`` (the update), ``age`` ``[R]``
    (versions behind the learner), ``mask`` ``[R, T]``, ``truth`` ``[R, T]``, ``n``
    (continuations per prefix) and ``estimates`` (``name -> [R, T]``); :func:`target_errors`
    turns them into squared errors. With value channels (a cost beside the reward) the probes compare
    the reward's estimates: the truth is the value of the checker's reward.

    Args:
        every: updates between probes (the first at update 0).
        rows: responses probed (at most the batch).
        continuations: continuations per prefix, ``>= 2``.
    """

    def __init__(self, every: int = 4, rows: int = 32, continuations: int = 16):
        self.every = V.int_in(every, "every")
        self.rows = V.int_in(rows, "rows")
        self.continuations = V.int_in(continuations, "continuations", 2)
        self.probes: list = []

    def setup(self, run) -> None:
        self.gen = run.generator(2)
        self.probes = []

    def on_step_start(self, run, k: int) -> None:
        self.k = k

    def on_advantages(self, run, step: Step) -> None:
        if self.k % self.every:
            return
        estimate = step.data.get("value_estimate")
        if estimate is None:
            raise RuntimeError("ValueProbes needs an estimator that hands step.data['value_estimate'] "
                               "(rlkit.llm.advantages.OffPolicy)")
        ro, mask = step.rollout, step.rollout.mask
        N = mask.shape[0]
        pr = torch.linspace(0, N - 1, min(self.rows, N)).round().long().unique()
        truth = continuation_values(run.model, run.tok, run.task, ro.select(pr.to(run.device)),
                                    [step.batch.problems[i] for i in pr], self.continuations, self.gen)
        est = {"critic": step.data["values"][pr].cpu()}
        for name, (target, clip_rho) in PROBES.items():
            v = estimate(target, clip_rho)
            if v is not None:
                est[name] = v[pr].cpu()
        self.probes.append(dict(step=self.k, age=step.age[pr].cpu(), mask=mask[pr].cpu(), truth=truth,
                                n=self.continuations, estimates=est))

    def result(self, run) -> dict:
        return {"probes": list(self.probes)}


class ClippedLoss:
    r"""The clipped policy loss of a stale-data learner, ``method`` of :func:`rlkit.objectives.clipped_policy_loss`.

    With :math:`\mu` the version that sampled each token (``step.logp_behav``) and :math:`\pi_k`
    the policy at the start of the update (``step.logp_old``): ``"standard"`` clips
    :math:`\pi_\theta/\mu` to :math:`1\pm\epsilon`; ``"adaptive"`` (method 1) the window
    :math:`[\rho_k-\epsilon, \rho_k+\epsilon]` around :math:`\rho_k = \pi_k/\mu`; ``"decoupled"``
    (method 2) clips :math:`\pi_\theta/\pi_k` to :math:`1\pm\epsilon` and multiplies by
    :math:`\rho_k`. :math:`\epsilon` is ``RLConfig.clip_eps``, the aggregation ``RLConfig.aggregation``.

    Chapter: 16_offpolicy_multistep (the ratio correction of chapter 12, the same for every target).
    """

    def __init__(self, method: str = "standard"):
        self.method = V.choice(method, "method", CLIP_METHODS)

    def setup(self, run) -> None:
        pass

    def __call__(self, run, step: Step, rows, logp):
        """``(loss, clip_fraction)`` on the minibatch ``rows``."""
        loss, st = clipped_policy_loss(self.method, logp, step.logp_old[rows], step.logp_behav[rows],
                                       step.adv[rows], run.cfg.clip_eps, mask=step.mask[rows],
                                       aggregation=run.cfg.aggregation)
        return loss, float(st["clip_fraction"])


class HeldBack(Pool):
    r"""Real actors with a forced lag: the :class:`rlkit.llm.samplers.Pool` sampler, publishing each version late.

    Each version reaches the actors ``delay`` updates after the learner made it.

    Two CPU cores cannot make real actors lag far behind a learner: sampling a group is much
    cheaper than an update, so the actors wait at the bounded queue and the lag stays at 0-1
    versions. ``HeldBack`` forces a larger lag without touching the actors or the pool. It keeps
    the learner's weights after each update and hands version :math:`v` to ``pool.publish`` only
    once the learner has reached version :math:`v + d` (``delay`` :math:`d`); until then the actors
    go on sampling with the newest version they were given. Every sample still carries the version
    whose weights drew it, and its age is the learner's version minus that one, so at update
    :math:`k` the data are :math:`\min(k, d)` versions old plus the pool's own lag (0-1 here).
    ``delay=0`` is :class:`~rlkit.llm.samplers.Pool`.

    One pool can serve several runs (its actors start once): the sampler numbers the run's versions
    from ``pool.version + 1`` on, and throws away (counts in ``result.discarded``) the samples an
    earlier run's weights drew that are still queued.

    ``result.consumed`` lists ``(update, actor, seq, version, age)`` of every consumed sample, the
    version in the run's numbering; with ``verify=True`` ``result.behaviour_gaps`` holds, for the
    first sample of every update, the largest :math:`|\log\mu(y_t) - \log\pi_v(y_t)|` between the
    log-probs the actor recorded and the learner's recomputation with the weights of the
    sample's recorded version :math:`v` (round-off, if the version tag is right).

    Args:
        pool: a started :class:`rlkit.distributed.ActorPool` (``with ActorPool(...) as pool``).
        delay: :math:`d \ge 0`, the updates a version waits before the actors get it.
        timeout: seconds to wait for an update's samples (``TimeoutError`` after it, also when every sample
            that arrives is an earlier run's).
        verify: recompute the behaviour log-probs of one sample per update (one forward pass).

    Chapter: 16_offpolicy_multistep (real actors in the lag regime of the simulated runs).
    """

    def __init__(self, pool, delay: int, timeout: float = 120.0, verify: bool = False):
        super().__init__(pool, timeout)
        self.delay = V.int_in(delay, "delay", 0)
        self.verify = V.boolean(verify, "verify")
        self.discarded = 0
        self.behaviour_gaps: list = []

    @staticmethod
    def _cpu_state(model) -> dict:
        return {k: v.detach().to("cpu").clone() for k, v in model.state_dict().items()}

    def setup(self, run) -> None:
        self.consumed, self.discarded, self.behaviour_gaps = [], 0, []
        self.base = self.pool.version + 1                # this run's version v is the pool's base + v
        self.waiting: deque = deque()                    # (version, weights) not yet given to the actors
        first = self._cpu_state(run.model)
        self.states = {run.version: first}               # the published weights by version (verify)
        self.scratch = copy.deepcopy(run.model) if self.verify else None
        self.pool.publish(first, version=self.base + run.version)

    def __call__(self, run):
        from .actors import merge_batches
        from .trainer import Step
        cfg, G, dev = run.cfg, run.cfg.group_size, run.device
        got, deadline = [], time.monotonic() + self.timeout
        while len(got) < cfg.prompts_per_step:
            if time.monotonic() > deadline:
                raise TimeoutError(f"HeldBack: {len(got)} of {cfg.prompts_per_step} samples of this run arrived in "
                                   f"{self.timeout} s; {self.discarded} were drawn with an earlier run's weights and "
                                   f"discarded (a pool whose lags reach back before this run's first version cannot "
                                   f"serve it: use a fresh pool or pool lags of 0)")
            for x in self.pool.get(cfg.prompts_per_step - len(got), timeout=self.timeout):
                if x.version < self.base:                # drawn with an earlier run's weights
                    self.discarded += 1
                else:
                    got.append(x)
        versions = [x.version - self.base for x in got]
        self.consumed += [(run.version, x.actor, x.seq, v, run.version - v) for x, v in zip(got, versions)]
        batch, _ = merge_batches(got, run.tok)
        if len(batch.rollout) != cfg.prompts_per_step * G:
            raise ValueError(f"HeldBack: the pool's samples gave {len(batch.rollout)} rows; expected one group of "
                             f"RLConfig.group_size = {G} per sample (GroupSampler(group_size={G}, prompts=1))")
        batch.rollout = ro = batch.rollout.to(dev)
        age = (run.version - torch.tensor(versions).repeat_interleave(G)).to(dev)
        with torch.no_grad():
            lp_k = token_logprobs(run.model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask)
            lp_k = torch.where((age == 0)[:, None], ro.model_logprobs, lp_k)
            if self.verify:
                self.scratch.load_state_dict(self.states[versions[0]])
                first = ro.select(slice(0, G))
                lp_v = token_logprobs(self.scratch, first.prompt_ids, first.prompt_mask, first.response_ids,
                                      first.mask)
                self.behaviour_gaps.append(float(((lp_v - first.model_logprobs) * first.mask).abs().max()))
        return Step(batch=batch, logp_old=lp_k, logp_behav=ro.model_logprobs, age=age, mask=ro.mask,
                    rewards=batch.rewards.to(dev))

    def publish(self, run) -> None:
        run.version += 1
        self.waiting.append((run.version, self._cpu_state(run.model)))
        while self.waiting and self.waiting[0][0] <= run.version - self.delay:
            v, state = self.waiting.popleft()
            if self.verify:
                self.states[v] = state                   # kept for the run (the tiny model: small)
            self.pool.publish(state, version=self.base + v)

    def result(self, run) -> dict:
        return {"consumed": list(self.consumed), "discarded": self.discarded,
                "behaviour_gaps": list(self.behaviour_gaps)}


#: RLConfig fields train_lagged does not read, and why (rlkit.llm.rl.refuse_unread).
_UNREAD = {
    "temperature": "it samples at temperature 1",
    "top_k": "it samples from the whole vocabulary",
    "top_p": "it samples from the whole vocabulary",
    "clip_eps_high": "its clip radius is the symmetric RLConfig.clip_eps",
}
#: ... and those it does not read with an actor pool, whose GroupSampler samples and scores.
_UNREAD_WITH_POOL = {
    "checker": "with a pool, the pool's GroupSampler scores the samples",
    "dynamic_sampling": ("with a pool, the pool's GroupSampler samples", (None, False)),
    "max_sample_rounds": "with a pool, the pool's GroupSampler samples",
}


def _check_lagged_args(cfg, lagged, pool, timeout) -> tuple[RLConfig, LaggedConfig]:
    """The checks of :func:`train_lagged`: ``(cfg, lagged)`` with their defaults, every unread setting refused."""
    cfg = RLConfig(algo="ppo") if cfg is None else V.instance_of(cfg, "cfg", RLConfig)
    lagged = LaggedConfig() if lagged is None else V.instance_of(lagged, "lagged", LaggedConfig)
    if cfg.algo != "ppo":
        raise ValueError(f"cfg.algo must be 'ppo' for train_lagged (an actor-critic), got {cfg.algo!r}")
    refuse_unread(cfg, "train_lagged", {**_UNREAD, **(_UNREAD_WITH_POOL if pool is not None else {})})
    if pool is not None and lagged.lag.max != 0:
        raise ValueError("LaggedConfig.lag is not used with a pool (the pool's actors make the lag); leave it at 0")
    if pool is None and timeout != 120.0:
        raise ValueError("timeout is only used with a pool (pool.get); without one leave it at 120.0")
    return cfg, lagged


def train_lagged(model: nn.Module, tok: CharTokenizer, task: Task, cfg: RLConfig | None = None,
                 lagged: LaggedConfig | None = None, *, eval_problems: Sequence[Problem] | None = None,
                 pool=None, timeout: float = 120.0, verbose: bool = False) -> LaggedResult:
    r"""Actor-critic learning on lagged samples: :func:`rlkit.llm.train` with the parts of the module docstring.

    The rlkit 0.2 name of the chapter's call (kept for one release): ``sampler=Lagged(lagged.lag)``
    (or ``Pool(pool, timeout)`` with an :class:`rlkit.distributed.ActorPool`, whose actors then
    make the lag), ``advantages=OffPolicy(lagged.target, lagged.critic, ...)`` with ``lagged``'s
    ``gamma``, ``lam``, ``value_lr`` (as ``lr``) and ``value_coef`` (as ``coef``),
    ``loss=ClippedLoss(lagged.method)``, ``hooks=[ValueProbes(...)]`` when ``lagged.probe_every`` is
    set, and a greedy held-out evaluation. ``cfg`` (default ``RLConfig(algo="ppo")``) must have
    ``algo="ppo"``; the :class:`rlkit.llm.RLConfig` fields it does not read (temperature and
    truncation, the asymmetric clip; with a pool also the checker and dynamic sampling) must keep
    their defaults. ``history["loss"]`` is the policy loss (rlkit 0.2's
    ``policy_loss``).

    Chapter: 16_offpolicy_multistep.
    """
    V.instance_of(model, "model", nn.Module)
    V.boolean(verbose, "verbose")
    cfg, lagged = _check_lagged_args(cfg, lagged, pool, timeout)
    if eval_problems is not None:
        V.tuple_of(eval_problems, "eval_problems", Problem)
    probes = [] if lagged.probe_every is None else \
        [ValueProbes(lagged.probe_every, lagged.probe_rows, lagged.probe_continuations)]
    res = train(model, tok, task, cfg,
                sampler=Lagged(lagged.lag) if pool is None else Pool(pool, timeout),
                advantages=OffPolicy(lagged.target, lagged.critic, clip_rho=lagged.clip_rho, clip_c=lagged.clip_c,
                                     normalize=lagged.normalize, gamma=lagged.gamma, lam=lagged.lam,
                                     lr=lagged.value_lr, coef=lagged.value_coef),
                loss=ClippedLoss(lagged.method), hooks=probes,
                evaluation=HeldOut(eval_problems, sampled=False, rewards=False), verbose=verbose)
    res.extras = {"probes": [], "consumed": [], **res.extras}
    return LaggedResult(**vars(res), lagged=lagged)
