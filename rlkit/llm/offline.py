r"""Offline RL and off-policy evaluation on logs of a language model.

Chapter: 21_offline_rl_ope.

* :class:`LogDataset`: logged responses with the behaviour log-probs :math:`\log\mu(y_t\mid h_t)`
  of the distribution that really sampled them (temperature included), the rewards, and which
  logging policy (temperature) wrote each row. :func:`collect_logs` writes one from a model at one
  or more temperatures.
* Learners, all weighted maximum likelihood on logged tokens (:func:`train_weighted_bc`):
  behaviour cloning (weight 1), filtered BC / rejection-sampling fine-tuning (weight :math:`r`),
  sequence-level AWR (weight :math:`e^{(r - \hat V_\mu(x))/\beta}`, :func:`rlkit.offline.awr_weights`)
  and IQL's token-level extraction (weight :math:`e^{(Q(h_t,y_t) - V(h_t))/\beta}`).
* :class:`TokenCritic` and :func:`fit_token_critic`: a Q-head over the vocabulary and a V-head on
  frozen hidden states of the LM, fitted on the log with IQL's expectile loss and optionally
  CQL's penalty; :func:`q_logits_processor` decodes greedily from :math:`Q`.
* For evaluation: :func:`answer_probability` (the EXACT value :math:`V^\pi(x)` of the exact-match
  reward), :func:`response_logprobs` (sequence log-probs of logged responses under a target) and
  :class:`RewardProbe` (a reward model for the direct method: logistic regression on the LM's
  final hidden state).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import _validate as V
from ..offline import awr_weights, cql_penalty, expectile_loss
from .credit import response_mask
from .evaluation import device_of, encode_prompts
from .sampling import sample, token_logprobs
from .tasks import Problem, Task
from .tokenizer import CharTokenizer

__all__ = ["LogDataset", "collect_logs", "response_logprobs", "answer_probability", "prompt_baselines",
           "train_weighted_bc", "response_features", "TokenCritic", "fit_token_critic", "iql_token_weights",
           "q_logits_processor", "RewardProbe"]

Tensor = torch.Tensor
_TENSORS = ("prompt_ids", "prompt_mask", "response_ids", "mask", "behaviour_logprobs", "rewards", "temperature",
            "prompt_index")


@dataclass
class LogDataset:
    r"""Logged responses of a language model; row ``i`` answers ``problems[i]``.

    * ``prompt_ids`` ``[N, P]`` long, left-padded; ``prompt_mask`` ``[N, P]`` bool.
    * ``response_ids`` ``[N, T]`` long, right-padded; ``mask`` ``[N, T]`` float 0/1 (``<eos>`` included).
    * ``behaviour_logprobs`` ``[N, T]``: :math:`\log\mu(y_t\mid h_t)` under the distribution that
      sampled the row (its temperature applied), 0 at padding.
    * ``rewards`` ``[N]`` float: the task's checker on the response.
    * ``temperature`` ``[N]`` float, ``> 0``: the logging policy of the row (its sampling temperature).
    * ``prompt_index`` ``[N]`` long: rows with the same index answer the same prompt.
    * ``problems``: a list of ``N`` :class:`~rlkit.llm.tasks.Problem`.

    Every field is checked when the dataset is built (a :class:`ValueError` or :class:`TypeError` that
    names the field).

    ``len(logs)`` is ``N``; ``logs.select(idx)`` keeps some rows. Chapter: 21_offline_rl_ope.
    """

    prompt_ids: Tensor
    prompt_mask: Tensor
    response_ids: Tensor
    mask: Tensor
    behaviour_logprobs: Tensor
    rewards: Tensor
    temperature: Tensor
    prompt_index: Tensor
    problems: list

    def __post_init__(self):
        V.prompt_batch(self.prompt_ids, self.prompt_mask, ids_name="LogDataset.prompt_ids",
                       mask_name="LogDataset.prompt_mask")
        V.index_tensor(self.response_ids, "LogDataset.response_ids", dim=2)
        N = self.response_ids.shape[0]
        V.float_tensor(self.behaviour_logprobs, "LogDataset.behaviour_logprobs", min_dim=2)
        V.exact_shape(self.response_ids, "LogDataset.response_ids", self.behaviour_logprobs.shape,
                      "the shape of LogDataset.behaviour_logprobs")
        V.check_mask(self.mask, self.behaviour_logprobs, "LogDataset.behaviour_logprobs", "LogDataset.mask")
        V.same_length(self.response_ids, "LogDataset.response_ids", self.prompt_ids, "LogDataset.prompt_ids")
        for name in ("rewards", "temperature"):
            V.exact_shape(V.float_tensor(getattr(self, name), f"LogDataset.{name}"), f"LogDataset.{name}", (N,), "[N]")
        V.tensor_in(self.temperature, "LogDataset.temperature", 0.0, lo_open=True)
        V.index_tensor(self.prompt_index, "LogDataset.prompt_index", shape=(N,), shape_of="[N]")
        V.tuple_of(self.problems, "LogDataset.problems", Problem)
        V.same_length(self.problems, "LogDataset.problems", self.response_ids, "LogDataset.response_ids")

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    def select(self, idx) -> LogDataset:
        """The rows ``idx`` (a 1-D int64 tensor, a list of ints, or a bool mask ``[N]``)."""
        V.instance_of(idx, "idx", (Tensor, list, tuple, range), "1-D int64 tensor, a list of ints or a bool mask")
        if not isinstance(idx, Tensor):
            items = list(idx)
            mask = bool(items) and all(isinstance(x, bool) for x in items)
            if not mask:
                for i, x in enumerate(items):
                    V.int_in(x, f"idx[{i}]", 0)
            idx = torch.tensor(items, dtype=torch.bool if mask else torch.long)
        if idx.dtype == torch.bool:
            V.exact_shape(idx, "idx", (len(self),), "a bool mask [N]")
            idx = idx.nonzero().flatten()
        V.index_tensor(idx, "idx", dim=1, n=len(self))
        keep = {f.name: getattr(self, f.name)[idx.to(getattr(self, f.name).device)] for f in fields(self)
                if f.name in _TENSORS}
        return LogDataset(**keep, problems=[self.problems[i] for i in idx.tolist()])


@torch.no_grad()
def collect_logs(model, tok: CharTokenizer, task: Task, problems: Sequence[Problem], *,
                 temperatures: Sequence[float] = (1.0,), samples_per_temperature: int = 1,
                 generator: torch.Generator | None = None) -> LogDataset:
    r"""Sample a log: for each prompt, ``samples_per_temperature`` responses at each temperature.

    The behaviour policy of a row is :math:`\mu_T(\cdot\mid h) = \mathrm{softmax}(z/T)`, and its
    log-probs are stored (``Rollout.logprobs``), so importance ratios to any target are exact.
    Rows are ordered prompt by prompt, then by temperature.

    Args:
        model, tok: the logging model and its tokenizer. task: gives the checker and the budget.
        problems: the prompts (a non-empty list). temperatures: one or more positive numbers.
        samples_per_temperature: responses per prompt and temperature, >= 1.
        generator: a seeded ``torch.Generator`` for reproducibility.

    Returns: a :class:`LogDataset` of ``len(problems) * len(temperatures) * samples_per_temperature`` rows.
    Chapter: 21_offline_rl_ope.
    """
    V.is_callable(model, "model")
    V.instance_of(tok, "tok", CharTokenizer)
    V.instance_of(task, "task", Task)
    problems = V.tuple_of(problems, "problems", Problem)
    V.int_in(len(problems), "len(problems)")
    temps = [V.real_in(t, f"temperatures[{i}]", 0.0, lo_open=True)
             for i, t in enumerate(V.real_list(temperatures, "temperatures"))]
    V.int_in(len(temps), "len(temperatures)")
    k = V.int_in(samples_per_temperature, "samples_per_temperature")
    rows = [(j, p, t) for j, p in enumerate(problems) for t in temps for _ in range(k)]
    dev = device_of(model)
    parts = []
    for t in temps:
        sel = [r for r in rows if r[2] == t]
        ids, pm = encode_prompts([r[1] for r in sel], tok, dev)
        ro = sample(model, ids, pm, max_new_tokens=task.max_new_tokens, eos_id=tok.eos_id, pad_id=tok.pad_id,
                    temperature=t, generator=generator)
        parts.append((sel, ro))
    # put the rows back in prompt order, responses padded to the full budget
    Tm = task.max_new_tokens
    order = {id(r): n for n, r in enumerate(rows)}
    N = len(rows)
    ids, pm = encode_prompts([r[1] for r in rows], tok, dev)
    resp = torch.full((N, Tm), tok.pad_id, dtype=torch.long, device=dev)
    mask = torch.zeros(N, Tm, device=dev)
    blp = torch.zeros(N, Tm, device=dev)
    for sel, ro in parts:
        pos = torch.tensor([order[id(r)] for r in sel], device=dev)
        T = ro.response_ids.shape[1]
        resp[pos, :T], mask[pos, :T], blp[pos, :T] = ro.response_ids, ro.mask, ro.logprobs
    texts = tok.decode_batch(resp.cpu())
    probs = [r[1] for r in rows]
    return LogDataset(prompt_ids=ids, prompt_mask=pm, response_ids=resp, mask=mask, behaviour_logprobs=blp,
                      rewards=task.score(texts, probs).to(dev),
                      temperature=torch.tensor([r[2] for r in rows], device=dev),
                      prompt_index=torch.tensor([r[0] for r in rows], device=dev), problems=probs)


def response_logprobs(model, logs: LogDataset, temperature: float = 1.0, batch_size: int = 2048) -> Tensor:
    r"""Per-token :math:`\log\pi(y_t\mid h_t)` of the logged responses under a target model, ``[N, T]``.

    ``temperature`` is the target's sampling temperature (1: the model itself). No gradient.
    Chapter: 21_offline_rl_ope.
    """
    V.is_callable(model, "model")
    V.instance_of(logs, "logs", LogDataset)
    V.int_in(batch_size, "batch_size")
    out = []
    with torch.no_grad():
        for i in range(0, len(logs), batch_size):
            s = slice(i, i + batch_size)
            out.append(token_logprobs(model, logs.prompt_ids[s], logs.prompt_mask[s], logs.response_ids[s],
                                      logs.mask[s], temperature=temperature))
    return torch.cat(out) if out else logs.behaviour_logprobs.new_zeros(logs.behaviour_logprobs.shape)


@torch.no_grad()
def answer_probability(model, tok: CharTokenizer, problems: Sequence[Problem], temperature: float = 1.0) -> Tensor:
    r"""The exact value of the exact-match reward under a sampled policy, one per prompt, ``[n]``.

    .. math::  V^\pi(x) = \Pr_{y\sim\pi(\cdot\mid x)}[y = a] = \prod_{t} \pi(a_t\mid x, a_{<t}),

    with :math:`a` the reference answer followed by ``<eos>``: only one response earns the reward,
    so the on-policy truth needs no sampling at all (chapter 14's eq. ``eq-ch14-exact`` at
    :math:`h_0`). ``temperature`` is the policy's sampling temperature. Chapter: 21_offline_rl_ope.
    """
    V.is_callable(model, "model")
    V.instance_of(tok, "tok", CharTokenizer)
    problems = V.tuple_of(problems, "problems", Problem)
    V.int_in(len(problems), "len(problems)")
    dev = device_of(model)
    ids, pm = encode_prompts(problems, tok, dev)
    tgt = [tok.encode(p.answer, eos=True) for p in problems]
    U = max(len(t) for t in tgt)
    resp = torch.full((len(problems), U), tok.pad_id, dtype=torch.long, device=dev)
    m = torch.zeros(len(problems), U, device=dev)
    for i, t in enumerate(tgt):
        resp[i, :len(t)] = torch.tensor(t, device=dev)
        m[i, :len(t)] = 1.0
    lp = token_logprobs(model, ids, pm, resp, m, temperature=temperature)
    return lp.sum(-1).exp()


def prompt_baselines(logs: LogDataset, leave_one_out: bool = True) -> Tensor:
    r"""A Monte Carlo :math:`\hat V_\mu(x_i)`: the mean logged reward of the other rows for the same prompt.

    .. math::  b_i = \frac{1}{|S_i| - 1}\sum_{j \in S_i,\, j\ne i} r_j \quad(\text{leave-one-out}),\qquad
               S_i = \{j : x_j = x_i\},

    (with ``leave_one_out=False``, the mean over all of :math:`S_i`). A prompt logged once gets the
    mean reward of the whole log. The sequence-level advantage of AWR is :math:`r_i - b_i`.
    Returns ``[N]``. Chapter: 21_offline_rl_ope.
    """
    V.instance_of(logs, "logs", LogDataset)
    V.boolean(leave_one_out, "leave_one_out")
    r, g = logs.rewards, logs.prompt_index
    if len(logs) == 0:
        return r.clone()
    n = int(g.max()) + 1
    s = torch.zeros(n, dtype=r.dtype, device=r.device).index_add_(0, g, r)
    c = torch.zeros(n, dtype=r.dtype, device=r.device).index_add_(0, g, torch.ones_like(r))
    num, den = s[g], c[g]
    if leave_one_out:
        num, den = num - r, den - 1
    return torch.where(den > 0, num / den.clamp_min(1), r.mean())


def train_weighted_bc(model: nn.Module, logs: LogDataset, weights: Tensor | None = None, *, steps: int = 50,
                      batch_size: int = 128, lr: float = 1e-3, seed: int = 0, grad_clip: float = 1.0) -> list:
    r"""Weighted maximum likelihood on logged tokens (BC, filtered BC, AWR, IQL extraction), in place.

    Each step draws ``batch_size`` distinct rows uniformly (all rows if there are fewer) and minimises
    the self-normalised weighted NLL

    .. math::  L(\theta) = \frac{\sum_{i,t} w_{i,t}\, m_{i,t}\,\big(-\log\pi_\theta(y_{i,t}\mid h_{i,t})\big)}
                                {\sum_{i,t} w_{i,t}\, m_{i,t}}

    (eq. ``eq-ch21-wbc``) with Adam. Weights 1 are behaviour cloning; :math:`w = r` is filtered BC
    (BC on the successes only); sequence weights ``[N]`` are spread over the row's tokens, token
    weights ``[N, T]`` are used as they are. A minibatch whose weights are all 0 is skipped.

    Args:
        model: the policy (trained in place). logs: a :class:`LogDataset`.
        weights: None (BC), ``[N]`` or ``[N, T]`` finite non-negative weights (detached).
        steps, batch_size, lr, grad_clip: the optimisation (``grad_clip > 0``, ``inf``: no clipping).
        seed: which rows each step draws.

    Returns: the list of per-step losses (NaN for a skipped step). Chapter: 21_offline_rl_ope.
    """
    V.instance_of(model, "model", nn.Module)
    V.instance_of(logs, "logs", LogDataset)
    N, T = logs.response_ids.shape
    V.int_in(N, "len(logs)")
    grad_clip = V.real_in(grad_clip, "grad_clip", 0.0, lo_open=True, allow_inf=True)
    if weights is None:
        w = torch.ones(N, T, device=logs.mask.device)
    else:
        V.float_tensor(weights, "weights")
        if weights.shape == (N,):
            w = weights[:, None].expand(N, T)
        else:
            V.exact_shape(weights, "weights", (N, T), "[N] or [N, T]")
            w = weights
        w = w.detach().to(logs.mask.dtype)
        V.tensor_in(w * logs.mask, "weights", 0.0)
    steps = V.int_in(steps, "steps", 0)
    batch_size = V.int_in(batch_size, "batch_size")
    lr = V.real_in(lr, "lr", 0.0, lo_open=True)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(V.int_in(seed, "seed", 0))
    model.train()
    losses = []
    for _ in range(steps):
        idx = torch.randperm(N, generator=g)[:batch_size].to(logs.mask.device)   # without replacement
        wm = w[idx] * logs.mask[idx]
        if float(wm.sum()) <= 0:
            losses.append(float("nan"))
            continue
        lp = token_logprobs(model, logs.prompt_ids[idx], logs.prompt_mask[idx], logs.response_ids[idx],
                            logs.mask[idx])
        loss = -(wm * lp).sum() / wm.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


@torch.no_grad()
def response_features(model, logs: LogDataset, batch_size: int = 2048) -> Tensor:
    r"""Final hidden states :math:`z(h_t)` of the states that emit each logged token, ``[N, T, d]``.

    ``[:, t]`` is the hidden state after reading the prompt and :math:`y_{<t}` (the state
    :math:`h_t` whose next token is :math:`y_t`), from ``model(ids, return_hidden=True)``;
    padding holds zeros. Computed once, a frozen feature map for critics fitted on the log.
    Chapter: 21_offline_rl_ope.
    """
    V.is_callable(model, "model")
    V.instance_of(logs, "logs", LogDataset)
    batch_size = V.int_in(batch_size, "batch_size")
    P = logs.prompt_ids.shape[1]
    T = logs.response_ids.shape[1]
    out = []
    for i in range(0, len(logs), batch_size):
        s = slice(i, i + batch_size)
        ids = torch.cat([logs.prompt_ids[s], logs.response_ids[s]], 1)
        att = torch.cat([logs.prompt_mask[s], torch.ones_like(logs.response_ids[s], dtype=torch.bool)], 1)
        _, z = model(ids, attention_mask=att, return_hidden=True)
        out.append(z[:, P - 1:P - 1 + T] * logs.mask[s, :, None])
    return torch.cat(out)


class TokenCritic(nn.Module):
    r"""Linear Q- and V-heads on frozen hidden states: :math:`Q(h,\cdot) = W_Q z(h) + b_Q \in \mathbb R^{|\mathcal V|}`,
    :math:`V(h) = w_V^\top z(h) + b_V`.

    ``forward(z [..., d]) -> (q [..., vocab], v [...])``. The heads keep PyTorch's default
    initialisation, so the Q-values of tokens the log never shows are whatever that random
    start says: the out-of-distribution actions CQL is about. Chapter: 21_offline_rl_ope.
    """

    def __init__(self, hidden_size: int, vocab_size: int, seed: int = 0):
        super().__init__()
        g = torch.random.fork_rng()
        with g:
            torch.manual_seed(V.int_in(seed, "seed", 0))
            self.q = nn.Linear(V.int_in(hidden_size, "hidden_size"), V.int_in(vocab_size, "vocab_size"))
            self.v = nn.Linear(hidden_size, 1)

    def forward(self, z: Tensor):
        V.feature_tensor(z, "z", self.q.in_features, like=self.q.weight)
        return self.q(z), self.v(z).squeeze(-1)


def fit_token_critic(critic: TokenCritic, features: Tensor, logs: LogDataset, *, kappa: float = 0.7,
                     cql_alpha: float = 0.0, steps: int = 300, lr: float = 1e-2, gamma: float = 1.0) -> dict:
    r"""Fit a :class:`TokenCritic` on a log with IQL's losses and, optionally, CQL's penalty (full batch).

    With terminal rewards :math:`r_t = r\,\mathbf 1[t = L-1]` and :math:`V(h_L) = 0`,

    .. math::  L_Q = \hat{\mathbb E}\big(r_t + \gamma_t\,\mathrm{sg}[V(h_{t+1})] - Q(h_t, y_t)\big)^2
               + \alpha_{\rm CQL}\,\hat{\mathbb E}\Big[\log\sum_a e^{Q(h_t,a)} - Q(h_t,y_t)\Big],
               \qquad L_V = \hat{\mathbb E}\,L_\kappa\big(\mathrm{sg}[Q(h_t,y_t)] - V(h_t)\big)

    (eqs. ``eq-ch21-iql`` and ``eq-ch21-cql``): :math:`V` is an upper expectile of the logged
    actions' :math:`Q`, and :math:`Q` bootstraps from :math:`V` only, never from a maximum over
    actions, so no unseen token enters the targets. Adam on both heads.

    Args:
        critic: the heads (trained in place). features: ``[N, T, d]`` from :func:`response_features`.
        logs: the :class:`LogDataset` the features belong to.
        kappa: the expectile level, in ``(0, 1)``. cql_alpha: :math:`\alpha_{\rm CQL} \ge 0` (0: plain IQL).
        steps, lr: full-batch Adam steps. gamma: the per-token discount.

    Returns: ``{"q_loss": [...], "v_loss": [...], "cql": [...]}`` per step. Chapter: 21_offline_rl_ope.
    """
    V.instance_of(critic, "critic", TokenCritic)
    V.instance_of(logs, "logs", LogDataset)
    _check_features(features, critic, logs)
    V.real_in(kappa, "kappa", 0.0, 1.0, lo_open=True, hi_open=True)
    cql_alpha = V.real_in(cql_alpha, "cql_alpha", 0.0)
    gamma = V.real_in(gamma, "gamma", 0.0, 1.0)
    steps = V.int_in(steps, "steps", 0)
    m = logs.mask > 0
    nxt = torch.zeros_like(m)
    nxt[:, :-1] = m[:, 1:]
    last = m & ~nxt
    r = torch.where(last, logs.rewards[:, None].to(features.dtype), torch.zeros((), dtype=features.dtype))
    opt = torch.optim.Adam(critic.parameters(), lr=V.real_in(lr, "lr", 0.0, lo_open=True))
    hist = {"q_loss": [], "v_loss": [], "cql": []}
    for _ in range(steps):
        q, v = critic(features)
        q_taken = q.gather(-1, logs.response_ids.unsqueeze(-1)).squeeze(-1)
        v_next = torch.zeros_like(v)
        v_next[:, :-1] = v[:, 1:]
        target = r + gamma * nxt.to(v.dtype) * v_next.detach()
        q_loss = torch.where(m, (target - q_taken) ** 2, 0.0).sum() / m.sum().clamp_min(1)
        v_loss = expectile_loss(q_taken.detach() - v, kappa, mask=m)
        pen = cql_penalty(q, logs.response_ids, mask=m) if cql_alpha > 0 else q.new_zeros(())
        loss = q_loss + v_loss + cql_alpha * pen
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        hist["q_loss"].append(float(q_loss.detach()))
        hist["v_loss"].append(float(v_loss.detach()))
        hist["cql"].append(float(pen.detach()))
    return hist


def _check_features(features, critic: TokenCritic, logs: LogDataset) -> None:
    """``features`` must be ``[N, T, d]`` for ``logs`` (``[N, T]``), with the critic's width, dtype and device."""
    N, T = logs.response_ids.shape
    d = critic.q.in_features
    V.feature_tensor(features, "features", d, like=critic.q.weight)
    if tuple(features.shape) != (N, T, d):
        raise ValueError(f"features must be [N, T, d] = [{N}, {T}, {d}] for these logs and this critic, "
                         f"got {tuple(features.shape)}")


@torch.no_grad()
def iql_token_weights(critic: TokenCritic, features: Tensor, logs: LogDataset, beta: float = 1 / 3,
                      max_weight: float = 100.0) -> Tensor:
    r"""IQL's policy-extraction weights on the logged tokens, ``[N, T]`` (0 at padding).

    .. math::  w_{i,t} = \min\big(e^{(Q(h_t, y_t) - V(h_t))/\beta},\ w_{\max}\big)

    (:func:`rlkit.offline.awr_weights`; IQL's inverse temperature 3 is :math:`\beta = 1/3`).
    Chapter: 21_offline_rl_ope.
    """
    V.instance_of(critic, "critic", TokenCritic)
    V.instance_of(logs, "logs", LogDataset)
    _check_features(features, critic, logs)
    q, v = critic(features)
    adv = q.gather(-1, logs.response_ids.unsqueeze(-1)).squeeze(-1) - v
    real = logs.mask > 0
    V.tensor_in(torch.where(real, adv, torch.zeros((), dtype=adv.dtype)), "Q(h, y) - V(h) of the critic on features "
                                                                          "(at real tokens)")
    return awr_weights(adv, beta, max_weight, mask=real)


def q_logits_processor(critic: TokenCritic, model) -> Callable:
    r"""A logits processor (:mod:`rlkit.llm.sampling`) that replaces the logits by :math:`Q(h, \cdot)`.

    At each step it reruns the frozen ``model`` on the context to get :math:`z(h)` and returns the
    critic's Q-values, so ``greedy=True`` decodes :math:`y_t = \arg\max_a Q(h_t, a)` over the whole
    vocabulary: the policy a Q-learner would act with, unseen tokens included.
    Chapter: 21_offline_rl_ope.
    """
    V.instance_of(critic, "critic", TokenCritic)
    V.is_callable(model, "model")
    vocab = critic.q.out_features

    @torch.no_grad()
    def proc(ctx_ids, ctx_mask, logits):
        V.index_tensor(ctx_ids, "ctx_ids", dim=2)
        V.bool_tensor(ctx_mask, "ctx_mask", ctx_ids, "ctx_ids")
        V.has_categories(logits, "logits")
        V.exact_shape(logits, "logits", (ctx_ids.shape[0], vocab), "[N, vocab_size of the critic]")
        _, z = model(ctx_ids, attention_mask=ctx_mask, return_hidden=True)
        q, _ = critic(z[:, -1])
        return q.to(logits.dtype)

    return proc


class RewardProbe(nn.Module):
    r"""A reward model for the direct method: logistic regression on the LM's last hidden state.

    .. math::  \hat r(x, y) = \sigma\big(w^\top z(x, y) + b\big),

    with :math:`z(x,y)` the final hidden state of a frozen ``model`` at the response's last real
    token (its ``<eos>``). Deliberately small: a misspecified :math:`\hat r` is what makes the
    direct method biased and doubly robust worth having. ``fit(logs)`` trains it on logged rewards
    (full-batch Adam on the binary cross-entropy); ``predict(prompt_ids, prompt_mask, response_ids,
    mask) -> [N]`` scores any responses. Chapter: 21_offline_rl_ope.
    """

    def __init__(self, model, seed: int = 0):
        super().__init__()
        V.is_callable(model, "model")
        d = getattr(getattr(model, "config", None), "n_embd", None)
        if d is None:
            raise TypeError(f"model must have config.n_embd (the width of its hidden states, as rlkit.llm.GPT has), "
                            f"got {type(model).__name__}")
        self.model = model
        with torch.random.fork_rng():
            torch.manual_seed(V.int_in(seed, "seed", 0))
            self.head = nn.Linear(d, 1)

    @torch.no_grad()
    def features(self, prompt_ids, prompt_mask, response_ids, mask) -> Tensor:
        """``[N, d]`` hidden states at each response's last real token.

        ``prompt_ids [N, P]`` int64 and ``prompt_mask [N, P]`` bool (left-padded), ``response_ids [N, T]``
        int64 and ``mask [N, T]`` (a prefix mask of the real tokens, bool or 0/1), as in a rollout.
        """
        V.prompt_batch(prompt_ids, prompt_mask)
        V.index_tensor(response_ids, "response_ids", dim=2)
        V.same_length(response_ids, "response_ids", prompt_ids, "prompt_ids")
        response_mask(mask, response_ids.float(), "response_ids")
        P = prompt_ids.shape[1]
        ids = torch.cat([prompt_ids, response_ids], 1)
        att = torch.cat([prompt_mask, torch.ones_like(response_ids, dtype=torch.bool)], 1)
        _, z = self.model(ids, attention_mask=att, return_hidden=True)
        last = (mask.sum(-1).long() - 1).clamp_min(0) + P
        return z[torch.arange(len(ids), device=ids.device), last]

    def predict(self, prompt_ids, prompt_mask, response_ids, mask) -> Tensor:
        """:math:`\\hat r` of each response, ``[N]`` in (0, 1)."""
        with torch.no_grad():
            return torch.sigmoid(self.head(self.features(prompt_ids, prompt_mask, response_ids, mask))).squeeze(-1)

    def fit(self, logs: LogDataset, steps: int = 300, lr: float = 0.05, weight_decay: float = 0.0) -> list:
        """Fit on ``logs.rewards`` in [0, 1] (``steps >= 0`` Adam steps, ``lr > 0``, ``weight_decay >= 0``);
        returns the per-step losses."""
        V.instance_of(logs, "logs", LogDataset)
        V.tensor_in(logs.rewards, "logs.rewards", 0.0, 1.0)
        steps = V.int_in(steps, "steps", 0)
        lr = V.real_in(lr, "lr", 0.0, lo_open=True)
        weight_decay = V.real_in(weight_decay, "weight_decay", 0.0)
        z = self.features(logs.prompt_ids, logs.prompt_mask, logs.response_ids, logs.mask)
        opt = torch.optim.Adam(self.head.parameters(), lr=lr, weight_decay=weight_decay)
        out = []
        for _ in range(steps):
            loss = F.binary_cross_entropy_with_logits(self.head(z).squeeze(-1), logs.rewards.to(z.dtype))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            out.append(float(loss.detach()))
        return out
