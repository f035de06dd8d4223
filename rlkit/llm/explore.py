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

**Bonuses**, hooks of :func:`rlkit.llm.train` (:class:`rlkit.llm.trainer.Hook`). Two are intrinsic
rewards, one per response, added to the checker's reward as :math:`r_i + \beta\,\tilde r^{\rm int}_i`
before the group advantages (after a KL penalty in the reward, :class:`rlkit.llm.trainer.KLPenalty`):

* :class:`DiversityBonus` (:func:`group_diversity_bonus`): :math:`d_i = c_i\,\big(1-\frac{n_i-1}{m-1}\big)`,
  with :math:`n_i` the copies of response :math:`i` in its group of :math:`m` and :math:`c_i` its
  correctness: a correct answer nobody else in the group gave earns 1, one everybody gave earns 0;
* :class:`RNDBonus` (:class:`RND`): random network distillation on the hidden states of a *frozen*
  encoder, :math:`r^{\rm int} = \tfrac12\lVert f_\phi(\bar z) - f_{\rm fix}(\bar z)\rVert^2`, with
  running normalisation of its inputs and of the reward (:class:`RunningMeanStd`);
* :class:`EntropyBonus`, a term of the loss, :math:`-\alpha\,\mathrm{agg}(H_t)`.

:func:`train_explore` (kept for one release) is :func:`rlkit.llm.train` with these hooks, built
from an :class:`ExploreConfig`. :data:`FACTS` is a sparse task with many
valid answers: ``"37*"`` asks for any true fact ``"b=c"`` with ``c = 37 b``;
:func:`facts_format` is the decoding grammar that makes the pretrained model write one.
"""
from __future__ import annotations

import copy
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn

from .. import _validate as V
from ..objectives import aggregate
from .evaluation import encode_prompts
from .rl import RLConfig, check_train_args, refuse_unread
from .samplers import Fresh
from .sampling import Rollout, call_model, sample, token_logprobs
from .tasks import Problem, Task
from .tokenizer import CharTokenizer
from .trainer import Hook, KLPenalty, RLResult, train

__all__ = ["pass_at_k", "distinct_correct", "group_diversity_bonus", "RunningMeanStd", "RND",
           "DiversityBonus", "RNDBonus", "EntropyBonus", "ModelEval",
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
        shape: the feature shape (``()`` for scalars). eps: added to ``var`` in ``std``, a finite
            number >= 0.

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

@torch.no_grad()
def _hidden_width(encoder: nn.Module) -> int:
    encoder.eval()
    p = next(encoder.parameters())
    _, h = encoder(torch.zeros(1, 1, dtype=torch.long, device=p.device), return_hidden=True)
    return int(h.shape[-1])


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
        hidden_size: the encoder's hidden width (default ``encoder.config.n_embd``, else the width
            of the hidden states of a one-token forward pass, e.g. for an :class:`rlkit.llm.hf.HFCausalLM`).
        out_dim, width: the two networks' output and hidden widths. lr: Adam's for the predictor,
            a finite number > 0. seed: initialises both networks.

    Chapter: 22_exploration_diversity.
    """

    def __init__(self, encoder: nn.Module, hidden_size: int | None = None, out_dim: int = 32, width: int = 64,
                 lr: float = 1e-3, seed: int = 0):
        super().__init__()
        # every number is checked before the encoder is touched (frozen, or run to find its width)
        out_dim, width = V.int_in(out_dim, "out_dim"), V.int_in(width, "width")
        lr, seed = V.real_in(lr, "lr", 0.0, lo_open=True), V.int_in(seed, "seed", 0)
        if hidden_size is None:
            hidden_size = getattr(getattr(encoder, "config", None), "n_embd", None)
            if hidden_size is None:
                hidden_size = _hidden_width(encoder)
        d = V.int_in(hidden_size, "hidden_size")
        self.encoder = encoder
        for p in encoder.parameters():
            p.requires_grad_(False)
        g = torch.random.fork_rng(devices=[])
        with g:
            torch.manual_seed(seed)
            self.target = _mlp(d, width, out_dim)
            self.predictor = _mlp(d, width, out_dim)
        for p in self.target.parameters():
            p.requires_grad_(False)
        self.opt = torch.optim.Adam(self.predictor.parameters(), lr=lr)
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


# ------------------------------------------------------------------------------- the hooks

class DiversityBonus(Hook):
    r"""The within-group diversity bonus, a reward channel of :func:`rlkit.llm.train` (chapter 22).

    For response :math:`i` of a group of :math:`m`, with :math:`n_i` the copies of it in the group
    (itself included) and :math:`c_i` its correctness (the checker's reward :math:`> 1/2`; 1 for
    every response with ``all=True``),

    .. math::  d_i = c_i\Big(1-\frac{n_i-1}{m-1}\Big),\qquad r_i \leftarrow r_i + \beta_d\, d_i

    (:func:`group_diversity_bonus`): a correct answer nobody else in the group gave earns
    :math:`\beta_d`, one that all :math:`m` gave earns nothing, and the gate :math:`c_i` keeps the
    bonus from paying for unusual junk. The bonus goes to ``step.bonuses``, so the advantage
    estimator adds it to the reward after the penalties (a KL in the reward) and before the group
    advantages, in hook order with the other bonuses. It acts only in groups that hold two
    different correct answers.

    Logged: ``bonus_div``, the batch mean of :math:`d_i` before :math:`\beta_d` (0 with ``coef=0``,
    which neither computes nor adds it), and ``distinct_correct``, the mean over the batch's groups
    of the number of different correct responses (:func:`distinct_correct`, correct = reward > 1/2).

    Args:
        coef: :math:`\beta_d \ge 0`.
        all: pay for every distinct response, correct or not (``only_correct=False``).
    """

    def __init__(self, coef: float = 0.0, all: bool = False):
        self.coef = V.real_in(coef, "coef", 0.0)
        self.all = V.instance_of(all, "all", bool)

    @torch.no_grad()
    def on_batch(self, run, step) -> None:
        b, G = step.batch, run.cfg.group_size
        correct = (b.rewards > 0.5).cpu()
        div = torch.zeros(len(b.responses), device=run.device)
        if self.coef > 0:
            div = group_diversity_bonus(b.responses, correct, G, only_correct=not self.all).to(run.device)
            step.bonuses.append((self.coef, div))
        run.log(bonus_div=div.mean().item(), distinct_correct=float(distinct_correct(b.responses, correct, G).mean()))


class RNDBonus(Hook):
    r"""Random network distillation's novelty bonus, a reward channel of :func:`rlkit.llm.train` (chapter 22).

    A response's feature :math:`\bar z` is the mean final hidden state of a *frozen* ``encoder`` over
    its tokens, standardised by a running mean and std and clipped to :math:`\pm5`; a fixed random
    network :math:`f_{\rm fix}` and a trained predictor :math:`f_\phi` (:class:`RND`) give

    .. math::  r^{\rm int} = \tfrac12\lVert f_\phi(\bar z) - f_{\rm fix}(\bar z)\rVert^2,\qquad
               \tilde r^{\rm int}_i = \frac{r^{\rm int}_i}{\sqrt{\sigma^2_{\le s}+10^{-8}}},\qquad
               r_i \leftarrow r_i + \beta_{\rm rnd}\,\tilde r^{\rm int}_i,

    :math:`\sigma^2_{\le s}` the running variance of every raw error up to this update
    (``normalize=True``; the raw error otherwise). Each update, after sampling: the bonus of the
    batch (:meth:`RND.bonus`, which updates the running statistics) goes to ``step.bonuses``
    (added after the penalties, in hook order with the other bonuses), then the predictor takes
    ``steps`` Adam steps on the same batch (:meth:`RND.fit`), so a response is paid for its error
    *before* the predictor has seen it. The encoder must be frozen: the policy's own hidden states
    drift as it trains, which makes old states look new again.

    Logged: ``bonus_rnd`` (batch mean of :math:`\tilde r^{\rm int}` before :math:`\beta_{\rm rnd}`)
    and ``rnd_raw`` (batch mean of :math:`r^{\rm int}`); both 0 with ``coef=0``, which builds no RND.
    Result: ``rnd``, the :class:`RND` module (None with ``coef=0``).

    Args:
        coef: :math:`\beta_{\rm rnd} \ge 0`.
        lr: the predictor's Adam learning rate. steps: predictor updates per batch.
        out, width: the two networks' output and hidden widths (seeded ``RLConfig.seed``).
        normalize: divide by the running std of the raw errors.
        encoder: the frozen encoder (default: a copy of the model when training starts).
    """

    def __init__(self, coef: float = 0.0, lr: float = 1e-3, steps: int = 1, out: int = 32, width: int = 64,
                 normalize: bool = True, encoder: nn.Module | None = None):
        self.coef = V.real_in(coef, "coef", 0.0)
        self.lr = V.real_in(lr, "lr", 0.0, lo_open=True)
        self.steps = V.int_in(steps, "steps")
        self.out = V.int_in(out, "out")
        self.width = V.int_in(width, "width")
        self.normalize = V.instance_of(normalize, "normalize", bool)
        self.encoder = None if encoder is None else V.instance_of(encoder, "encoder", nn.Module)
        self.rnd = None

    def setup(self, run) -> None:
        if self.coef > 0:
            encoder = copy.deepcopy(run.model) if self.encoder is None else self.encoder
            self.rnd = RND(encoder, out_dim=self.out, width=self.width, lr=self.lr, seed=run.cfg.seed).to(run.device)

    def on_batch(self, run, step) -> None:
        if self.rnd is None:
            run.log(bonus_rnd=0.0, rnd_raw=0.0)
            return
        bonus, raw = self.rnd.bonus(step.rollout, normalize=self.normalize)
        step.bonuses.append((self.coef, bonus))
        self.rnd.fit(step.rollout, self.steps)
        run.log(bonus_rnd=bonus.mean().item(), rnd_raw=raw.mean().item())

    def result(self, run) -> dict:
        return {"rnd": self.rnd}


class EntropyBonus(Hook):
    r"""An entropy bonus, a loss term of :func:`rlkit.llm.train` (chapter 22): :math:`-\alpha\,\mathrm{agg}(H_t)`.

    :math:`H_t` is the entropy of the policy's next-token distribution at each trained response
    token, the one the loop computes with the log-probs (at the training temperature, through the
    ``logits_processor``), aggregated as the policy loss is (``RLConfig.aggregation``). Maximising
    :math:`\mathbb E_\pi[r] + \alpha H(\pi)` has the optimum :math:`\pi^\star(y) \propto e^{r(y)/\alpha}`,
    uniform over the correct answers as :math:`\alpha \to 0`; but the token bonus pays for entropy
    in *every* token, the answer's digits as much as the choice between answers. The loop logs the
    entropy (``entropy``) with or without the bonus.

    Args:
        coef: :math:`\alpha \ge 0` (0 adds nothing).
    """

    def __init__(self, coef: float = 0.0):
        self.coef = V.real_in(coef, "coef", 0.0)

    def loss(self, run, step, rows, logp, entropy):
        if self.coef > 0:
            return -(self.coef * aggregate(entropy, step.mask[rows], run.cfg.aggregation))
        return None


class ModelEval:
    """A held-out evaluation for :func:`rlkit.llm.train`'s ``evaluation=`` from ``fn(model) -> dict of numbers``.

    Called before training, every ``RLConfig.eval_every`` updates and after the last; the values
    are stored as floats in ``RLResult.evals`` (with ``step`` and ``train_seconds``).
    """

    def __init__(self, fn: Callable):
        self.fn = V.is_callable(fn, "eval_fn")

    def __call__(self, run) -> dict:
        return {k: float(v) for k, v in self.fn(run.model).items()}


# ------------------------------------------------------------------------------ the old trainer

@dataclass(frozen=True)
class ExploreConfig(V.ValidatedConfig):
    r"""The exploration bonuses of :func:`train_explore` (all off by default: plain RL).

    ``entropy_coef`` is :class:`EntropyBonus`'s :math:`\alpha`; ``diversity_coef`` and
    ``diversity_all`` are :class:`DiversityBonus`'s ``coef`` and ``all``; ``rnd_coef``,
    ``normalize``, ``rnd_lr``, ``rnd_steps``, ``rnd_out``, ``rnd_width`` are :class:`RNDBonus`'s
    ``coef``, ``normalize``, ``lr``, ``steps``, ``out``, ``width``. ``kl_coef`` is the KL term to the
    reference model (the model before training): None (the default) runs no reference; a number
    :math:`\beta \ge 0` adds ``KLPenalty(kl_coef, "k1", where="reward", processed=True)`` (k1 in the
    reward, the reference scored through the ``logits_processor``; 0 only measures the KL). It was
    ``RLConfig.kl_coef`` (and ``log_kl``) before rlkit 0.3.

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
    kl_coef: float | None = V.number_field(None, 0.0, optional=True)


@dataclass
class ExploreResult(RLResult):
    """What :func:`train_explore` returns: an :class:`rlkit.llm.RLResult` with the bonuses' settings.

    ``rnd`` (an extra) is :class:`RNDBonus`'s RND module, None without RND. Chapter: 22_exploration_diversity.
    """

    explore: ExploreConfig | None = None


_EXPLORE_UNREAD = {"eval_problems": "its evaluation is eval_fn"}


def _check_explore_args(tok, task, cfg, explore, eval_fn, eval_every) -> tuple[RLConfig, ExploreConfig]:
    """``(cfg resolved, with eval_every applied; explore)``, refusing every setting train_explore does not read."""
    cfg = RLConfig() if cfg is None else V.instance_of(cfg, "cfg", RLConfig)
    explore = ExploreConfig() if explore is None else V.instance_of(explore, "explore", ExploreConfig)
    unread = dict(_EXPLORE_UNREAD)
    if eval_fn is None:
        unread["eval_every"] = "it sets how often eval_fn runs, and no eval_fn was given"
        if eval_every is not None:
            raise ValueError("train_explore: eval_every sets how often eval_fn runs, and no eval_fn was given")
    refuse_unread(cfg, "train_explore", unread)
    cfg = check_train_args(tok, task, cfg)
    V.choice(cfg.algo, "cfg.algo", ("reinforce", "rloo", "grpo", "dr_grpo", "dapo"))
    if cfg.top_k is not None or cfg.top_p is not None:
        raise ValueError("train_explore: cfg.top_k and cfg.top_p must be None (the sampled distribution is the policy)")
    if eval_every is not None:
        cfg = cfg.replace(eval_every=V.int_in(eval_every, "eval_every"))
    return cfg, explore


def train_explore(model: nn.Module, tok: CharTokenizer, task: Task, cfg: RLConfig | None = None,
                  explore: ExploreConfig | None = None, *, encoder: nn.Module | None = None,
                  logits_processor=None, eval_fn: Callable | None = None, eval_every: int | None = None,
                  callback: Callable | None = None) -> ExploreResult:
    r"""Sequence-level RL with exploration bonuses: :func:`rlkit.llm.train` with chapter 22's hooks.

    Kept for one release; new code calls ``train(model, tok, task, cfg, hooks=[KLPenalty(beta, "k1",
    where="reward", processed=True), DiversityBonus(...), RNDBonus(...), EntropyBonus(...)])``, which
    is what this does, with ``explore.kl_coef`` (None: no KL term; 0: measure only) as the
    :class:`~rlkit.llm.trainer.KLPenalty` (k1 in the reward, the reference scored through
    ``logits_processor``) and ``explore``'s other settings as the bonuses (:class:`ExploreConfig`). At a
    temperature other than 1 it recomputes :math:`\log\pi_{old}` under the processor
    (``Fresh(recompute=True)``), as rlkit 0.2's loop did.
    ``algo`` is one of ``reinforce``, ``rloo``, ``grpo``, ``dr_grpo``, ``dapo``; ``cfg`` must not use
    top-k/top-p or ``eval_problems``, nor ``eval_every`` without ``eval_fn``.

    Args:
        model: the policy (updated in place). tok, task, cfg: as for :func:`rlkit.llm.train`.
        explore: the bonuses (default: none).
        encoder: RND's frozen encoder (default: a frozen copy of ``model`` before training).
        logits_processor: a decoding grammar or shield, part of the policy and of the reference.
        eval_fn: ``eval_fn(model) -> dict of floats`` (:class:`ModelEval`), run before training,
            every ``eval_every`` updates (default ``cfg.eval_every``) and after the last; no
            evaluation without it.
        callback: ``callback(step, history) -> bool``; True stops training.

    Returns:
        an :class:`ExploreResult`: :func:`rlkit.llm.train`'s log (``kl`` and ``kl_seq`` with a KL
        term, :class:`~rlkit.llm.trainer.KLPenalty`), the hooks' keys (``bonus_div``,
        ``distinct_correct``, ``bonus_rnd``, ``rnd_raw``), ``rnd``. Before rlkit 0.3 ``kl`` was the
        mean sequence k1, which is now ``kl_seq``.

    Chapter: 22_exploration_diversity.
    """
    cfg, explore = _check_explore_args(tok, task, cfg, explore, eval_fn, eval_every)
    hooks = [] if explore.kl_coef is None else [KLPenalty(explore.kl_coef, "k1", where="reward", processed=True)]
    hooks += [DiversityBonus(explore.diversity_coef, all=explore.diversity_all),
              RNDBonus(explore.rnd_coef, lr=explore.rnd_lr, steps=explore.rnd_steps, out=explore.rnd_out,
                       width=explore.rnd_width, normalize=explore.normalize, encoder=encoder),
              EntropyBonus(explore.entropy_coef)]
    res = train(model, tok, task, cfg, hooks=hooks,
                sampler=Fresh(recompute=cfg.temperature != 1.0), logits_processor=logits_processor,
                evaluation=False if eval_fn is None else ModelEval(eval_fn),
                callback=None if callback is None else lambda k, history, evals: callback(k, history))
    return ExploreResult(**{**vars(res), "config": cfg}, explore=explore)


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
