r"""Exploration and diversity for LLM RL: pass@k, distinct correct answers, and three bonuses.

Chapter: 22_exploration_diversity.

**Metrics.** From :math:`n` samples of one prompt of which :math:`c` are correct, the unbiased
estimator of pass@k (the probability that at least one of :math:`k` independent samples is
correct) is (Chen et al. 2021)

.. math::  \widehat{\text{pass@}k} = 1 - \binom{n-c}{k}\Big/\binom{n}{k}
           = 1 - \prod_{i=n-c+1}^{n}\Big(1-\frac{k}{i}\Big),

the share of the :math:`k`-subsets of the :math:`n` samples that contain a correct one
(:func:`pass_at_k`). The same argument per answer gives the expected number of *distinct* correct
answers among :math:`k` samples: with :math:`n_a` copies of correct answer :math:`a`,
:math:`\widehat D_k = \sum_a \big[1-\binom{n-n_a}{k}/\binom{n}{k}\big]` (:func:`distinct_correct`),
unbiased for :math:`\sum_a [1-(1-p_a)^k]` by linearity.

**Bonuses** (intrinsic rewards :math:`r^{\rm int}_i`, one per response, added to the checker's
reward as :math:`r_i + \beta\,\tilde r^{\rm int}_i` before the group advantages):

* :func:`group_diversity_bonus`: :math:`d_i = c_i\,\big(1-\frac{n_i-1}{m-1}\big)`, with :math:`n_i`
  the copies of response :math:`i` in its group of :math:`m` and :math:`c_i` its correctness: a
  correct answer nobody else in the group gave earns 1, one everybody gave earns 0;
* :class:`RND`: random network distillation on the hidden states of a *frozen* encoder,
  :math:`r^{\rm int} = \tfrac12\lVert f_\phi(\bar z) - f_{\rm fix}(\bar z)\rVert^2`, with running
  normalisation of its inputs and of the reward (:class:`RunningMeanStd`);
* an entropy bonus in the loss, :math:`-\alpha\,\mathrm{agg}(H_t)` (:class:`ExploreConfig`).

:func:`train_explore` is :func:`rlkit.llm.train`'s sequence-level loop (it reuses
:func:`~rlkit.llm.collect`, :func:`~rlkit.llm.sequence_advantages` and
:func:`~rlkit.llm.policy_loss`) with these bonuses added. :data:`FACTS` is a sparse task with many
valid answers: ``"37*"`` asks for any true fact ``"b=c"`` with ``c = 37 b``;
:func:`facts_format` is the decoding grammar that makes the pretrained model write one.
"""
from __future__ import annotations

import copy
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

from .. import _validate as V
from ..objectives import aggregate
from ..utils import clip_grad
from .evaluation import encode_prompts
from .rl import RLConfig, collect, policy_loss, sequence_advantages
from .sampling import Rollout, call_model, sample, token_logprobs
from .tasks import Problem, Task
from .tokenizer import CharTokenizer

__all__ = ["pass_at_k", "distinct_correct", "group_diversity_bonus", "RunningMeanStd", "RND",
           "ExploreConfig", "ExploreResult", "train_explore", "sample_groups", "coverage_metrics",
           "facts_check", "facts_format", "facts_exact", "FACTS"]


# ------------------------------------------------------------------------------------ metrics

def pass_at_k(n, c, k: int) -> torch.Tensor:
    r"""Unbiased pass@k from ``n`` samples with ``c`` correct (Chen et al. 2021), elementwise.

    .. math::  \widehat{\text{pass@}k} = 1-\binom{n-c}{k}\Big/\binom{n}{k}
               = 1-\prod_{i=n-c+1}^{n}\Big(1-\frac{k}{i}\Big)\quad(n-c \ge k),\qquad 1 \quad (n-c<k),

    computed as the product (no huge binomials). Unbiased: it is the share of the
    :math:`\binom nk` subsets of size :math:`k` that hold at least one correct sample, and each
    subset is a draw of :math:`k` independent samples.

    Args:
        n: samples per prompt, an int or an int tensor ``[...]`` (every entry ``>= k``).
        c: correct samples, an int or an int tensor broadcastable with ``n``, ``0 <= c <= n``.
        k: an int ``>= 1``.

    Returns:
        ``[...]`` float64 tensor in ``[0, 1]`` (a 0-d tensor for int inputs; an empty input gives
        an empty result). Chapter: 22_exploration_diversity.
    """
    k = V.int_in(k, "k")
    n_t = torch.as_tensor(n)
    c_t = torch.as_tensor(c)
    for x, name in ((n_t, "n"), (c_t, "c")):
        if x.dtype.is_floating_point or x.dtype == torch.bool or x.is_complex():
            raise TypeError(f"pass_at_k: {name} must be an int or an integer tensor, got dtype {x.dtype}")
    if n_t.shape != c_t.shape:
        if n_t.dim() == 0:
            n_t = n_t.expand_as(c_t)
        elif c_t.dim() == 0:
            c_t = c_t.expand_as(n_t)
        else:
            raise ValueError(f"pass_at_k: n {tuple(n_t.shape)} and c {tuple(c_t.shape)} must have the same shape "
                             f"(or one be a scalar)")
    if n_t.numel() and bool((n_t < k).any()):
        raise ValueError(f"pass_at_k: every n must be >= k = {k} (an estimate of pass@{k} needs at least {k} "
                         f"samples), got min n = {int(n_t.min())}")
    if c_t.numel() and bool(((c_t < 0) | (c_t > n_t)).any()):
        raise ValueError("pass_at_k: c must satisfy 0 <= c <= n for every entry")
    n_f, c_f = n_t.double(), c_t.double()
    if n_t.numel() == 0:
        return n_f.clone()
    width = int(c_t.max()) if c_t.numel() else 0
    j = torch.arange(width, dtype=torch.float64)                       # i = n - j, j = 0..c-1
    i = n_f[..., None] - j
    terms = torch.where(j < c_f[..., None], 1.0 - k / i.clamp_min(1.0), torch.ones((), dtype=torch.float64))
    prod = terms.clamp_min(0.0).prod(-1)
    return torch.where(n_f - c_f < k, torch.ones_like(n_f), 1.0 - prod)


def distinct_correct(responses: Sequence[str], correct, group_size: int, k: int | None = None) -> torch.Tensor:
    r"""Distinct correct answers per prompt: counted in all ``n`` samples, or expected among ``k``.

    With ``k=None``: :math:`D = |\{y_i : c_i = 1\}|`, the number of different correct responses
    among the group's :math:`n` samples. With ``k``: the unbiased estimate of the expected number
    of distinct correct answers among :math:`k` independent samples,

    .. math::  \widehat D_k = \sum_{a\ \text{correct}} \Big[1-\binom{n-n_a}{k}\Big/\binom{n}{k}\Big],

    :math:`n_a` the copies of answer :math:`a` (each term is :func:`pass_at_k` with :math:`c=n_a`;
    the sum is the mean number of distinct correct answers over all :math:`k`-subsets).

    Args:
        responses: ``N = P * n`` strings, the ``n`` samples of each prompt consecutive.
        correct: ``[N]`` bool or 0/1 tensor (or list), whether each response is correct.
        group_size: :math:`n \ge 1`, dividing ``N``.
        k: None, or an int in ``[1, n]``.

    Returns:
        ``[P]`` float64 tensor. Chapter: 22_exploration_diversity.
    """
    responses = V.str_list(responses, "responses")
    n = V.int_in(group_size, "group_size")
    c = _flags(correct, "correct", len(responses))
    V.divisible(len(responses), "len(responses)", n, "group_size")
    if k is not None:
        V.int_in(k, "k", 1, n)
    out = []
    for g in range(len(responses) // n):
        counts = Counter(r for r, ok in zip(responses[g * n:(g + 1) * n], c[g * n:(g + 1) * n].tolist()) if ok)
        if k is None:
            out.append(float(len(counts)))
        else:
            na = torch.tensor(list(counts.values()), dtype=torch.long)
            out.append(float(pass_at_k(n, na, k).sum()) if len(counts) else 0.0)
    return torch.tensor(out, dtype=torch.float64)


def _flags(x, name: str, n: int) -> torch.Tensor:
    t = torch.as_tensor(x)
    if t.dim() != 1 or t.shape[0] != n:
        raise ValueError(f"{name} must be a 1-D sequence of {n} flags (one per response), got shape {tuple(t.shape)}")
    if t.numel() and not bool(((t == 0) | (t == 1)).all()):
        raise ValueError(f"{name} must hold only 0/1 (or True/False)")
    return t.bool()


def group_diversity_bonus(responses: Sequence[str], correct, group_size: int,
                          only_correct: bool = True) -> torch.Tensor:
    r"""Within-group diversity bonus: how few of the other :math:`m-1` responses repeat this one.

    .. math::  d_i = c_i\Big(1-\frac{n_i-1}{m-1}\Big),

    :math:`n_i` = the number of responses in :math:`i`'s group identical to it (itself included),
    :math:`c_i` = its correctness (1 for every response with ``only_correct=False``). A correct
    answer nobody else in the group gave earns 1, one that all :math:`m` gave earns 0. Gating by
    correctness makes the bonus reward *different right answers*, not different junk.

    Args:
        responses: ``N = P * m`` strings, groups consecutive; correct: ``[N]`` flags.
        group_size: :math:`m \ge 2`, dividing ``N``. only_correct: gate by ``correct``.

    Returns:
        ``[N]`` float32 in ``[0, 1]`` (empty for ``N = 0``). Chapter: 22_exploration_diversity.
    """
    responses = V.str_list(responses, "responses")
    m = V.int_in(group_size, "group_size", 2)
    c = _flags(correct, "correct", len(responses))
    V.divisible(len(responses), "len(responses)", m, "group_size")
    V.instance_of(only_correct, "only_correct", bool)
    out = torch.zeros(len(responses))
    for g in range(len(responses) // m):
        grp = responses[g * m:(g + 1) * m]
        counts = Counter(grp)
        for j, r in enumerate(grp):
            out[g * m + j] = 1.0 - (counts[r] - 1) / (m - 1)
    return out * c.float() if only_correct else out


# ------------------------------------------------------------------------------ normalisation

class RunningMeanStd:
    r"""Running mean and variance of a stream of batches (Chan et al.'s parallel update).

    After batches :math:`x^{(1)},\dots` with :math:`N` values in all, ``mean`` and ``var`` equal
    the mean and the population variance (divide by :math:`N`) of everything seen, exactly, for
    ``[..., d]`` batches reduced over all leading dimensions. ``std = sqrt(var + eps)``.
    Merging a batch of size :math:`b`, mean :math:`\mu_b`, variance :math:`\sigma^2_b`:

    .. math::  \delta = \mu_b-\mu,\quad \mu \leftarrow \mu + \delta\frac{b}{N+b},\quad
               \sigma^2 \leftarrow \frac{N\sigma^2 + b\sigma_b^2 + \delta^2\frac{Nb}{N+b}}{N+b}.

    Args:
        shape: the feature shape (``()`` for scalars). eps: added to ``var`` in ``std``.

    Chapter: 22_exploration_diversity.
    """

    def __init__(self, shape: Sequence[int] = (), eps: float = 1e-8):
        self.shape = tuple(V.int_in(s, "a dimension of shape") for s in shape)
        self.eps = V.real_in(eps, "eps", 0.0)
        self.mean = torch.zeros(self.shape, dtype=torch.float64)
        self.var = torch.zeros(self.shape, dtype=torch.float64)
        self.count = 0

    def update(self, x: torch.Tensor) -> RunningMeanStd:
        """Add the values of ``x`` (``[..., *shape]``, finite); an empty batch changes nothing."""
        x = V.float_tensor(x, "x", min_dim=len(self.shape))
        if tuple(x.shape[x.dim() - len(self.shape):]) != self.shape:
            raise ValueError(f"RunningMeanStd.update: x's trailing shape must be {self.shape}, got {tuple(x.shape)}")
        flat = x.detach().double().reshape(-1, *self.shape)
        b = flat.shape[0]
        if b == 0:
            return self
        V.tensor_in(flat, "x")
        mb, vb = flat.mean(0).cpu(), flat.var(0, unbiased=False).cpu()
        n = self.count
        delta = mb - self.mean
        tot = n + b
        self.mean = self.mean + delta * b / tot
        self.var = (n * self.var + b * vb + delta ** 2 * n * b / tot) / tot
        self.count = tot
        return self

    @property
    def std(self) -> torch.Tensor:
        return (self.var + self.eps).sqrt()


# ------------------------------------------------------------------------------------------ RND

def _mlp(d_in: int, width: int, d_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, d_out))


class RND(nn.Module):
    r"""Random network distillation on the hidden states of a frozen encoder (Burda et al. 2019).

    A response's feature :math:`\bar z` is the mean over its tokens of the encoder's final hidden
    states (``encoder(ids, attention_mask, return_hidden=True)``, prompt and response read
    together), standardised by a running mean and std and clipped to :math:`\pm5`. A fixed random
    network :math:`f_{\rm fix}` and a trained predictor :math:`f_\phi` map it to ``out_dim``
    numbers, and

    .. math::  r^{\rm int} = \tfrac12\lVert f_\phi(\bar z) - f_{\rm fix}(\bar z)\rVert^2,

    large where the predictor has seen few similar states. :meth:`bonus` returns it raw or divided
    by the running std of the raw rewards (``normalize=True``), which is what keeps its scale
    fixed while the predictor learns (raw errors shrink as states become familiar, and their
    initial size depends on the random networks, not on the task).

    The encoder should be frozen (the reference model): the policy's own hidden states drift as
    it trains, which makes old states look novel again.

    Args:
        encoder: a model with ``return_hidden=True`` (e.g. a frozen copy of the base GPT).
        hidden_size: the encoder's hidden width (default ``encoder.config.n_embd``).
        out_dim, width: the two networks' output and hidden widths. lr: Adam's for the predictor.
        seed: initialises both networks.

    Chapter: 22_exploration_diversity.
    """

    def __init__(self, encoder: nn.Module, hidden_size: int | None = None, out_dim: int = 32, width: int = 64,
                 lr: float = 1e-3, seed: int = 0):
        super().__init__()
        if hidden_size is None:
            hidden_size = getattr(getattr(encoder, "config", None), "n_embd", None)
            V.given(hidden_size, "hidden_size", "the encoder has no config.n_embd")
        d = V.int_in(hidden_size, "hidden_size")
        self.encoder = encoder
        for p in encoder.parameters():
            p.requires_grad_(False)
        g = torch.random.fork_rng(devices=[])
        with g:
            torch.manual_seed(V.int_in(seed, "seed", 0))
            self.target = _mlp(d, V.int_in(width, "width"), V.int_in(out_dim, "out_dim"))
            self.predictor = _mlp(d, width, out_dim)
        for p in self.target.parameters():
            p.requires_grad_(False)
        self.opt = torch.optim.Adam(self.predictor.parameters(), lr=V.real_in(lr, "lr", 0.0, lo_open=True))
        self.obs_rms = RunningMeanStd((d,))
        self.rew_rms = RunningMeanStd(())

    @torch.no_grad()
    def features(self, ro: Rollout) -> torch.Tensor:
        r""":math:`\bar z` ``[N, d]``: mean final hidden state over each response's real tokens (0 for none)."""
        P = ro.prompt_ids.shape[1]
        ids = torch.cat([ro.prompt_ids, ro.response_ids], 1)
        att = torch.cat([ro.prompt_mask, torch.ones_like(ro.response_ids, dtype=torch.bool)], 1)
        self.encoder.eval()
        _, h = self.encoder(ids, attention_mask=att, return_hidden=True)
        # hidden state at position P - 1 + t has read the prompt and response[:t + 1]
        h = h[:, P:P + ro.response_ids.shape[1]]
        m = ro.mask.to(h.dtype)
        return (h * m[..., None]).sum(1) / m.sum(1, keepdim=True).clamp_min(1.0)

    def _inputs(self, z: torch.Tensor, update_stats: bool) -> torch.Tensor:
        if update_stats:
            self.obs_rms.update(z)
        mu, sd = self.obs_rms.mean.to(z), self.obs_rms.std.to(z)
        if self.obs_rms.count == 0:
            mu, sd = torch.zeros_like(mu), torch.ones_like(sd)
        return ((z - mu) / sd).clamp(-5.0, 5.0)

    def raw(self, z: torch.Tensor, update_stats: bool = False) -> torch.Tensor:
        r"""Raw :math:`r^{\rm int}` ``[N]`` of features ``z`` ``[N, d]`` (no gradient)."""
        z = V.float_tensor(z, "z", min_dim=2)
        with torch.no_grad():
            x = self._inputs(z, update_stats)
            return 0.5 * (self.predictor(x) - self.target(x)).pow(2).sum(-1)

    def bonus(self, ro: Rollout, normalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        r"""``(bonus [N], raw [N])`` for a rollout; updates the running statistics.

        ``bonus = raw / std(raw so far)`` with ``normalize``, else ``raw``.
        """
        z = self.features(ro)
        raw = self.raw(z, update_stats=True)
        self.rew_rms.update(raw)
        if not normalize:
            return raw, raw
        return raw / self.rew_rms.std.to(raw).clamp_min(1e-8), raw

    def fit(self, ro: Rollout, steps: int = 1) -> float:
        """``steps`` Adam steps of the predictor on the rollout's states; returns the last loss."""
        z = self.features(ro)
        x = self._inputs(z, update_stats=False)
        loss = torch.zeros(())
        for _ in range(V.int_in(steps, "steps")):
            loss = 0.5 * (self.predictor(x) - self.target(x)).pow(2).sum(-1).mean()
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
        return float(loss.detach())


# ------------------------------------------------------------------------------------- trainer

@dataclass(frozen=True)
class ExploreConfig(V.ValidatedConfig):
    r"""The exploration bonuses of :func:`train_explore` (all off by default: plain RL).

    * ``entropy_coef`` :math:`\alpha \ge 0`: the loss gets :math:`-\alpha\,\mathrm{agg}(H_t)`,
      the per-token entropy of the policy aggregated as the policy loss is;
    * ``diversity_coef`` :math:`\beta_d \ge 0`: the reward gets :math:`\beta_d\, d_i`
      (:func:`group_diversity_bonus`, gated by correctness unless ``diversity_all``);
    * ``rnd_coef`` :math:`\beta_{\rm rnd} \ge 0`: the reward gets :math:`\beta_{\rm rnd}\,\tilde r^{\rm int}_i`,
      RND's bonus, divided by its running std when ``normalize`` (the default); ``rnd_lr``,
      ``rnd_steps`` (predictor updates per batch), ``rnd_out``, ``rnd_width``.

    Chapter: 22_exploration_diversity.
    """

    entropy_coef: float = V.number_field(0.0, 0.0)
    diversity_coef: float = V.number_field(0.0, 0.0)
    diversity_all: bool = V.bool_field(False)
    rnd_coef: float = V.number_field(0.0, 0.0)
    normalize: bool = V.bool_field(True)
    rnd_lr: float = V.number_field(1e-3, 0.0, lo_open=True)
    rnd_steps: int = V.int_field(1)
    rnd_out: int = V.int_field(32)
    rnd_width: int = V.int_field(64)


@dataclass
class ExploreResult:
    """What :func:`train_explore` returns: the model, the per-step log, the evaluations, the RND module.

    Chapter: 22_exploration_diversity.
    """

    model: nn.Module
    history: dict
    evals: dict
    config: RLConfig
    explore: ExploreConfig
    rnd: RND | None = None

    def array(self, key: str) -> np.ndarray:
        """``history[key]`` or ``evals[key]`` as a float array."""
        src = self.history if key in self.history else self.evals
        return np.asarray(src[key], dtype=float)


def train_explore(model: nn.Module, tok: CharTokenizer, task: Task, cfg: RLConfig | None = None,
                  explore: ExploreConfig | None = None, *, encoder: nn.Module | None = None,
                  logits_processor=None, eval_fn: Callable | None = None, eval_every: int | None = None,
                  callback: Callable | None = None) -> ExploreResult:
    r"""Sequence-level RL (``reinforce``, ``rloo``, ``grpo``, ``dr_grpo``, ``dapo``) with exploration bonuses.

    Each step: :func:`~rlkit.llm.collect` a batch; the reward of response :math:`i` becomes

    .. math::  r_i + \beta_d\,d_i + \beta_{\rm rnd}\,\tilde r^{\rm int}_i

    (:class:`ExploreConfig`), from which :func:`~rlkit.llm.sequence_advantages` forms the group
    advantages (minus :math:`\beta\sum_t\log\frac{\pi_{\rm old}}{\pi_{\rm ref}}(y_{i,t})` when
    ``cfg.kl_coef`` :math:`\beta>0`, the k1 KL in the reward, with the reference = ``model`` before
    training and the same ``logits_processor``); then ``cfg.epochs`` passes of :func:`~rlkit.llm.policy_loss` over
    ``cfg.minibatches`` minibatches, minus :math:`\alpha\,\mathrm{agg}(H_t)`. RND's predictor is
    fitted on the batch *after* its bonus is computed. A KL term must be ``kl_in="reward"`` with
    ``kl_estimator="k1"``, and ``cfg`` must not use top-k/top-p.

    Args:
        model: the policy (updated in place). tok, task, cfg: as for :func:`rlkit.llm.train`.
        explore: the bonuses (default: none).
        encoder: RND's frozen encoder (default: a frozen copy of ``model`` before training).
        logits_processor: a decoding grammar or shield, part of the policy (sampling and
            log-probs, as in :func:`rlkit.llm.train`).
        eval_fn: ``eval_fn(model) -> dict of floats``, run before training, every ``eval_every``
            updates and after the last; its values are stored in ``evals`` (with ``"step"``).
        callback: ``callback(step, history) -> bool``; True stops training.

    Returns:
        an :class:`ExploreResult`. ``history`` per step: ``reward`` (the checker's), ``kl`` (mean
        sequence k1, NaN without a KL term), ``bonus_div``,
        ``bonus_rnd`` (as added, before :math:`\beta`), ``rnd_raw`` (mean raw RND error),
        ``entropy``, ``zero_var_share`` (groups with equal checker rewards), ``distinct_correct``
        (mean over the batch's groups), ``loss``, ``train_seconds``.

    Chapter: 22_exploration_diversity.
    """
    cfg = RLConfig() if cfg is None else V.instance_of(cfg, "cfg", RLConfig)
    explore = ExploreConfig() if explore is None else V.instance_of(explore, "explore", ExploreConfig)
    V.instance_of(task, "task", Task, "rlkit.llm.tasks.Task")
    V.instance_of(tok, "tok", CharTokenizer)
    cfg = cfg.resolved()
    V.choice(cfg.algo, "cfg.algo", ("reinforce", "rloo", "grpo", "dr_grpo", "dapo"))
    if cfg.token_rewards or (cfg.kl_coef > 0 and (cfg.kl_in != "reward" or cfg.kl_estimator != "k1")):
        raise ValueError("train_explore: cfg.token_rewards must be False, and a KL term (cfg.kl_coef > 0) must be "
                         "kl_in='reward' with kl_estimator='k1' (use rlkit.llm.train for the other forms)")
    if cfg.top_k is not None or cfg.top_p is not None:
        raise ValueError("train_explore: cfg.top_k and cfg.top_p must be None (the sampled distribution is the policy)")
    if cfg.checker not in task.checkers:
        raise ValueError(f"RLConfig.checker {cfg.checker!r} is not one of the task's checkers {list(task.checkers)}")
    if logits_processor is not None:
        V.is_callable(logits_processor, "logits_processor")
    if eval_fn is not None:
        V.is_callable(eval_fn, "eval_fn")
    every = cfg.eval_every if eval_every is None else V.int_in(eval_every, "eval_every")
    G = cfg.group_size
    params = list(model.parameters())
    dev = params[0].device
    rng = random.Random(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.Adam(params, lr=cfg.lr)
    ref_model = None
    if cfg.kl_coef > 0:
        ref_model = copy.deepcopy(model).eval()
        for p in ref_model.parameters():
            p.requires_grad_(False)
    rnd = None
    if explore.rnd_coef > 0:
        if encoder is None:
            encoder = copy.deepcopy(model)
        rnd = RND(encoder, out_dim=explore.rnd_out, width=explore.rnd_width, lr=explore.rnd_lr, seed=cfg.seed).to(dev)
    keys = ("reward", "kl", "bonus_div", "bonus_rnd", "rnd_raw", "entropy", "zero_var_share", "distinct_correct",
            "loss", "train_seconds")
    hist = {k: [] for k in keys}
    evals: dict = {"step": []}
    train_time = 0.0

    def run_eval(step):
        if eval_fn is None:
            return
        out = eval_fn(model)
        evals["step"].append(step)
        for k, v in out.items():
            evals.setdefault(k, []).append(float(v))

    run_eval(0)
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        model.eval()
        batch = collect(model, tok, task, cfg, rng, gen, dev, logits_processor=logits_processor)
        ro, mask = batch.rollout, batch.rollout.mask
        with torch.no_grad():
            if cfg.temperature == 1.0:                   # log pi_old of the sampled tokens, as sampled
                old = ro.model_logprobs if logits_processor is None else ro.logprobs
            else:
                old = token_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, mask,
                                     temperature=cfg.temperature, logits_processor=logits_processor)
        rewards = batch.rewards.to(dev).float()
        correct = batch.rewards > 0.5
        total = rewards.clone()
        kl_seq = torch.zeros_like(total)
        if ref_model is not None:                     # k1 in the reward: r_i - beta * sum_t log(pi / pi_ref)
            with torch.no_grad():
                ref = token_logprobs(ref_model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, mask,
                                     temperature=cfg.temperature, logits_processor=logits_processor)
            kl_seq = ((old - ref) * mask).sum(-1)
            total = total - cfg.kl_coef * kl_seq
        div = torch.zeros_like(total)
        if explore.diversity_coef > 0:
            div = group_diversity_bonus(batch.responses, correct, G, only_correct=not explore.diversity_all).to(dev)
            total = total + explore.diversity_coef * div
        b_rnd = raw = torch.zeros_like(total)
        if rnd is not None:
            b_rnd, raw = rnd.bonus(ro, normalize=explore.normalize)
            total = total + explore.rnd_coef * b_rnd
            rnd.fit(ro, explore.rnd_steps)
        adv = sequence_advantages(total, cfg.algo, G)
        adv_tok = adv[:, None].expand_as(mask) * mask
        model.train()
        n_groups = mask.shape[0] // G
        losses, ents = [], []
        for _ in range(cfg.epochs):
            order = torch.randperm(n_groups, generator=gen)
            for chunk in order.chunk(min(cfg.minibatches, max(1, n_groups))):
                rows = (chunk[:, None] * G + torch.arange(G)).flatten().to(dev)
                m = mask[rows]
                logp, ent = token_logprobs(model, ro.prompt_ids[rows], ro.prompt_mask[rows], ro.response_ids[rows],
                                           m, temperature=cfg.temperature, with_entropy=True,
                                           logits_processor=logits_processor)
                loss, _ = policy_loss(cfg, logp, old[rows], adv_tok[rows], m)
                if explore.entropy_coef > 0:
                    loss = loss - explore.entropy_coef * aggregate(ent, m, cfg.aggregation)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                clip_grad(params, cfg.grad_clip)
                opt.step()
                losses.append(loss.item())
                ents.append((ent.detach() * m).sum().item() / max(1.0, m.sum().item()))
        train_time += time.perf_counter() - t0
        model.eval()
        hist["reward"].append(batch.rewards.mean().item())
        hist["kl"].append(kl_seq.mean().item() if ref_model is not None else float("nan"))
        hist["bonus_div"].append(div.mean().item())
        hist["bonus_rnd"].append(b_rnd.mean().item())
        hist["rnd_raw"].append(raw.mean().item())
        hist["entropy"].append(float(np.mean(ents)) if ents else float("nan"))
        hist["zero_var_share"].append(batch.zero_var_share)
        hist["distinct_correct"].append(float(distinct_correct(batch.responses, correct, G).mean()))
        hist["loss"].append(float(np.mean(losses)) if losses else float("nan"))
        hist["train_seconds"].append(train_time)
        if (step + 1) % every == 0 or step == cfg.steps - 1:
            run_eval(step + 1)
        if callback is not None and callback(step, hist):
            if evals["step"] and evals["step"][-1] != step + 1:
                run_eval(step + 1)
            break
    return ExploreResult(model=model, history=hist, evals=evals, config=cfg, explore=explore, rnd=rnd)


# ------------------------------------------------------------------------------- sampling, eval

@torch.no_grad()
def sample_groups(model, tok: CharTokenizer, task: Task, problems: Sequence[Problem], n: int, *,
                  temperature: float = 1.0, generator: torch.Generator | None = None,
                  logits_processor=None, checker: str = "exact") -> tuple[list, torch.Tensor]:
    r"""``n`` samples for each problem: ``(responses [P * n], correct [P * n] bool)``, groups consecutive.

    Chapter: 22_exploration_diversity.
    """
    V.instance_of(tok, "tok", CharTokenizer)
    V.instance_of(task, "task", Task)
    n = V.int_in(n, "n")
    V.int_in(len(problems), "len(problems)")
    rows = [p for p in problems for _ in range(n)]
    dev = next(model.parameters()).device
    ids, mask = encode_prompts(rows, tok, dev)
    ro = sample(model, ids, mask, max_new_tokens=task.max_new_tokens, eos_id=tok.eos_id, pad_id=tok.pad_id,
                temperature=temperature, generator=generator, logits_processor=logits_processor)
    resp = tok.decode_batch(ro.response_ids.cpu())
    return resp, task.score(resp, rows, checker) > 0.5


def coverage_metrics(responses: Sequence[str], correct, n: int, ks: Sequence[int] = (1, 8)) -> dict:
    r"""Per-prompt means of pass@k (:func:`pass_at_k`) and distinct correct answers (:func:`distinct_correct`).

    Returns ``{"pass@k": float for k in ks, "distinct@k": float for k in ks, "distinct": float (all n),
    "prompts": P}``; every ``k`` must be ``<= n``, and an empty ``responses`` is refused (a mean over no
    prompts is not a number). Chapter: 22_exploration_diversity.
    """
    responses = V.str_list(responses, "responses")
    V.int_in(len(responses), "len(responses)")
    n = V.int_in(n, "n")
    V.divisible(len(responses), "len(responses)", n, "n")
    c = _flags(correct, "correct", len(responses)).view(-1, n)
    out: dict = {"prompts": c.shape[0]}
    for k in ks:
        out[f"pass@{k}"] = float(pass_at_k(n, c.sum(1).long(), k).mean())
        out[f"distinct@{k}"] = float(distinct_correct(responses, c.flatten(), n, k).mean())
    out["distinct"] = float(distinct_correct(responses, c.flatten(), n).mean())
    return out


# ------------------------------------------------------------------------------ the FACTS task

def facts_check(response: str, problem: Problem) -> float:
    r"""1.0 if ``response`` is a true fact ``"b=c"`` about the prompt ``"a*"``: ``b`` in 10..99 and ``c = a b``.

    The answer is not unique: every two-digit ``b`` gives one (90 valid answers per prompt).
    ``problem.info["a"]`` holds :math:`a`. Chapter: 22_exploration_diversity.
    """
    V.instance_of(response, "response", str)
    V.instance_of(problem, "problem", Problem)
    a = problem.info.get("a")
    if not isinstance(a, int):
        raise ValueError(f"facts_check: problem.info['a'] must hold the prompt's int a, got {a!r}")
    b, eq, c = response.partition("=")
    if not eq or len(b) != 2 or not b.isdigit() or b[0] == "0":
        return 0.0
    return float(c == str(a * int(b)))


def _facts_problem(rng: random.Random) -> Problem:
    a = rng.randint(10, 99)
    return Problem(f"{a}*", "", {"a": a})


def facts_format(tok: CharTokenizer) -> Callable:
    r"""The decoding grammar of :data:`FACTS`: a logits processor that makes a response start ``"dd="``.

    With :math:`t` the number of tokens after the prompt's ``*``: at :math:`t=0` only the digits
    1-9 are allowed, at :math:`t=1` the digits 0-9, at :math:`t=2` only ``=``; after that the
    model is free. The pretrained model never learned to write an operand (its corpus scored only
    answers), so the grammar supplies the format; the model's own logits still choose the
    digits, so RL can change which operand it picks. The grammar is part of the policy: pass it
    to sampling and to :func:`train_explore` alike.

    Returns:
        ``f(context_ids [N, L], context_mask [N, L], logits [N, V]) -> logits [N, V]``.
        Chapter: 22_exploration_diversity.
    """
    V.instance_of(tok, "tok", CharTokenizer)
    star, eq = tok.encode("*")[0], tok.encode("=")[0]
    digits = torch.tensor(tok.encode("0123456789"))
    allowed = torch.zeros(3, tok.vocab_size, dtype=torch.bool)
    allowed[0, digits[1:]] = True
    allowed[1, digits] = True
    allowed[2, eq] = True

    def processor(context_ids, context_mask, logits):
        L = context_ids.shape[1]
        idx = torch.arange(L, device=context_ids.device)
        last = torch.where((context_ids == star) & context_mask, idx, torch.full_like(idx, -1)).amax(1)
        t = torch.where(last >= 0, L - 1 - last, torch.full_like(last, 99))
        rows = t < 3
        if not bool(rows.any()):
            return logits
        keep = torch.ones_like(logits, dtype=torch.bool)
        keep[rows] = allowed.to(logits.device)[t[rows]]
        return logits.masked_fill(~keep, float("-inf"))

    return processor


@torch.no_grad()
def facts_exact(model, tok: CharTokenizer, a_values: Sequence[int] = tuple(range(10, 100)),
                ks: Sequence[int] = (1, 8, 64), logits_processor=None) -> dict:
    r"""Exact coverage of :data:`FACTS` under ``model``: the probability of every correct answer.

    With the grammar :func:`facts_format` (the default ``logits_processor``), the probability that
    a response to ``"a*"`` is the true fact about :math:`b` is one product of token probabilities,
    :math:`q_{ab} = \pi(\texttt{"}b\texttt{="}\,c_{ab}\,\langle\mathrm{eos}\rangle \mid a)`, scored for
    all 90 :math:`b` in one forward pass. Then, exactly, per prompt,

    .. math::  \text{pass@}k = 1-\Big(1-\sum_b q_{ab}\Big)^k,\qquad
               \mathbb E[D_k] = \sum_b \big[1-(1-q_{ab})^k\big],

    the expected number of distinct correct answers among :math:`k` independent samples (the
    quantity :func:`distinct_correct` estimates from samples).

    Args:
        model: the policy. tok: its tokenizer. a_values: the prompts' :math:`a` (ints in 10..99).
        ks: the :math:`k` to report (ints >= 1). logits_processor: default ``facts_format(tok)``.

    Returns:
        ``{"q": [P, 90] float64 (q[i, b - 10]), "pass@k": [P], "distinct@k": [P] for k in ks}``.
        Chapter: 22_exploration_diversity.
    """
    V.instance_of(tok, "tok", CharTokenizer)
    a_values = [V.int_in(a, "an entry of a_values", 10, 99) for a in a_values]
    V.int_in(len(a_values), "len(a_values)")
    ks = [V.int_in(k, "an entry of ks") for k in ks]
    proc = facts_format(tok) if logits_processor is None else V.is_callable(logits_processor, "logits_processor")
    bs = list(range(10, 100))
    prompts = [f"{a}*" for a in a_values for _ in bs]
    responses = [f"{b}={a * b}" for a in a_values for b in bs]
    dev = next(model.parameters()).device
    pid, pm = tok.encode_batch(prompts, device=dev)
    T = max(len(r) for r in responses) + 1
    rid = torch.full((len(responses), T), tok.pad_id, dtype=torch.long, device=dev)
    mask = torch.zeros(len(responses), T, device=dev)
    for i, r in enumerate(responses):
        e = tok.encode(r) + [tok.eos_id]
        rid[i, :len(e)] = torch.tensor(e, device=dev)
        mask[i, :len(e)] = 1.0
    if logits_processor is None:                 # the grammar acts on the first three tokens only: mask them here
        P = pid.shape[1]
        ids = torch.cat([pid, rid], 1)
        att = torch.cat([pm, torch.ones_like(rid, dtype=torch.bool)], 1)
        logits = call_model(model, ids, att)[:, P - 1:P - 1 + T].float()
        digits = torch.tensor(tok.encode("0123456789"), device=dev)
        allowed = torch.zeros(3, logits.shape[-1], dtype=torch.bool, device=dev)
        allowed[0, digits[1:]] = True
        allowed[1, digits] = True
        allowed[2, tok.encode("=")[0]] = True
        logits[:, :3] = logits[:, :3].masked_fill(~allowed[None], float("-inf"))
        logq = torch.log_softmax(logits, -1).gather(-1, rid[..., None]).squeeze(-1)
        lp = torch.where(mask > 0, logq, torch.zeros((), device=dev))
    else:
        lp = token_logprobs(model, pid, pm, rid, mask, logits_processor=proc)
    q = lp.sum(-1).double().exp().view(len(a_values), len(bs)).cpu()
    out: dict = {"q": q}
    tot = q.sum(1).clamp(0.0, 1.0)
    for k in ks:
        out[f"pass@{k}"] = 1.0 - (1.0 - tot) ** k
        out[f"distinct@{k}"] = (1.0 - (1.0 - q) ** k).sum(1)
    return out


#: ``"a*"`` -> any true fact ``"b=c"`` (``c = a b``, ``b`` two digits): 90 prompts, 90 valid answers each,
#: a correct one about 7% of the time under the pretrained model with :func:`facts_format`.
FACTS = Task("facts", _facts_problem, facts_check, max_new_tokens=8, heldout_fraction=0.0,
             description="a*: write any true multiplication fact b=c about a (many valid answers)")
