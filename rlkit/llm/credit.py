r"""Credit over tokens: per-token rewards, value targets and advantages for a response.

Chapter: 14_credit_over_tokens.

A response :math:`y = (y_0, \dots, y_{T-1})` to a prompt :math:`x` is an episode of :math:`T`
steps: the state :math:`h_t` is the prompt and :math:`y_{<t}`, the action is :math:`y_t`, and the
transition (append the token) is deterministic. Response tensors are ``[N, T]`` and RIGHT-padded:
``mask[i, t] = 1`` for the :math:`T_i` real tokens of row ``i``, which come first. Everything here
puts the book's return machinery (:mod:`rlkit.returns`) on such tensors:

* rewards per token: :func:`~rlkit.llm.terminal_rewards` (the checker's score on the last token),
  :func:`~rlkit.llm.dense_rewards` (a task's token checker, e.g. :func:`~rlkit.llm.digit_rewards`) and
  :func:`~rlkit.llm.kl_token_rewards` (the KL-regularised reward
  :math:`r_t = -\beta(\log\pi_\theta - \log\pi_{\text{ref}})(y_t)` plus the task reward at the end);
* :func:`~rlkit.llm.response_discounts`: :math:`\gamma_t = \gamma` while another token follows, 0 at the last
  (the response ends the episode: nothing is bootstrapped after ``<eos>``);
* :func:`~rlkit.llm.value_targets` for a critic (``"nstep"``, ``"lambda"``, ``"mc"``, ``"gae"``) and
  :func:`~rlkit.llm.token_advantages` (GAE);
* the analysis of chapter 14: :func:`~rlkit.llm.first_wrong_token`, :func:`~rlkit.llm.most_negative_token`,
  :func:`~rlkit.llm.exact_match_values` (the exact :math:`V^\pi(h_t)` of the exact-match reward),
  :func:`~rlkit.llm.mc_prefix_values` (the same by sampled continuations, for any checker),
  :func:`~rlkit.llm.token_kl_exact`, and :class:`~rlkit.llm.HiddenValueHead` (a critic on the LM's hidden states).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn as nn

from .. import _validate as V
from ..returns import discounted_returns, gae, lambda_returns, n_step_returns
from .evaluation import device_of
from .heads import HiddenValueHead
from .sampling import Rollout, call_model, sample
from .tasks import Problem, Task
from .tokenizer import CharTokenizer

__all__ = ["VALUE_TARGETS", "response_mask", "terminal_rewards", "dense_rewards", "kl_token_rewards",
           "response_discounts", "value_targets", "token_advantages", "state_values", "first_wrong_token",
           "most_negative_token", "exact_match_values", "mc_prefix_values", "token_kl_exact", "HiddenValueHead"]

#: The critic targets :func:`~rlkit.llm.value_targets` (and the critic's ``TokenGAE(target=...)``) know.
VALUE_TARGETS = ("gae", "nstep", "mc", "lambda")

Tensor = torch.Tensor


def response_mask(mask, ref: Tensor, ref_name: str, name: str = "mask") -> Tensor:
    r"""Check a mask of response tokens and return it as ``ref``'s float dtype.

    It must have ``ref``'s shape and device, hold only 0/1 (or be bool), and be a PREFIX mask
    along the last dimension (real tokens first, then padding: :math:`m_{t+1} \le m_t`), which is
    how :func:`rlkit.llm.sample` lays out responses. ``ref`` is a floating tensor; ``ref_name`` and
    ``name`` (non-empty strs) are how errors name ``ref`` and ``mask``.

    Chapter: 14_credit_over_tokens.
    """
    V.nonempty_str(ref_name, "ref_name")
    V.nonempty_str(name, "name")
    V.float_tensor(ref, ref_name, min_dim=0)
    m = V.check_mask(mask, ref, ref_name, name)
    if m is None:
        raise TypeError(f"{name} must be a tensor of real response tokens, got None")
    if m.shape[-1] > 1 and bool((m[..., 1:] > m[..., :-1]).any()):
        raise ValueError(f"{name} must mark the real tokens of each row as a prefix (1s, then 0s: "
                         "responses are right-padded)")
    return m


def _zero_pad(x: Tensor, m: Tensor) -> Tensor:
    """``x`` with padding replaced by exact zeros (NaN or inf in padding cannot leak)."""
    return torch.where(m > 0, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _last_index(m: Tensor) -> Tensor:
    return (m.sum(-1).long() - 1).clamp_min(0)


def terminal_rewards(rewards: Tensor, mask) -> Tensor:
    r"""A sequence reward placed on the last real token: ``[N]`` and ``[N, T]`` -> ``[N, T]``.

    .. math::  r_{i,t} = R_i\,\mathbf 1[t = T_i - 1],

    the sparse reward of a checker that scores the whole response. Rows without real tokens get
    all zeros. Chapter: 14_credit_over_tokens.
    """
    V.float_tensor(rewards, "rewards")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N] (one per response), got shape {tuple(rewards.shape)}")
    if not isinstance(mask, Tensor) or mask.dim() != 2 or mask.shape[0] != rewards.shape[0]:
        raise ValueError(f"mask must be [N, T] with N = {rewards.shape[0]} (the length of rewards), got "
                         f"{tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__}")
    like = torch.zeros(mask.shape, dtype=rewards.dtype, device=rewards.device)
    m = response_mask(mask, like, "an [N, T] response tensor")
    out = torch.zeros_like(like)
    if out.numel() == 0:
        return out
    has = m.sum(-1) > 0
    out[torch.arange(out.shape[0], device=out.device), _last_index(m)] = torch.where(
        has, rewards, torch.zeros_like(rewards))
    return out


def _token_text(tok: CharTokenizer, ids: list[int]) -> str:
    """One character per token: the character, ``"\n"`` for ``<eos>``, ``"\0"`` for ``<pad>``."""
    return "".join("\n" if i == tok.eos_id else "\0" if i == tok.pad_id else tok.itos[i] for i in ids)


def dense_rewards(task: Task, tok: CharTokenizer, response_ids: Tensor, mask, problems: Sequence[Problem],
                  checker: str = "exact") -> Tensor:
    r"""Per-token rewards ``[N, T]`` from the task's token checker ``task.token_checkers[checker]``.

    Row ``i``'s real tokens are passed to the checker as a string with one character per token
    (``"\n"`` for ``<eos>``); its ``L_i`` floats fill ``r[i, :L_i]``, padding gets 0. For
    :data:`~rlkit.llm.tasks.ADDITION` the ``"exact"`` token checker is
    :func:`~rlkit.llm.digit_rewards`, whose per-response sum is exact match.

    Args:
        task: a :class:`~rlkit.llm.tasks.Task` with ``token_checkers``.
        tok: the tokenizer of the responses.
        response_ids: ``[N, T]`` int64; mask: ``[N, T]`` prefix mask of real tokens.
        problems: a list of ``N`` problems, ``problems[i]`` answered by row ``i``.
        checker: which token checker.

    Returns:
        ``[N, T]`` float32 rewards. Chapter: 14_credit_over_tokens.
    """
    V.instance_of(task, "task", Task)
    V.instance_of(tok, "tok", CharTokenizer)
    V.index_tensor(response_ids, "response_ids", dim=2, n=tok.vocab_size)
    m = response_mask(mask, response_ids.float(), "response_ids")
    problems = V.tuple_of(problems, "problems", Problem)
    V.same_length(problems, "problems", response_ids, "response_ids")
    if checker not in task.token_checkers:
        raise ValueError(f"checker {checker!r} is not one of the token checkers of task {task.name!r} "
                         f"({list(task.token_checkers)})")
    fn = task.token_checkers[checker]
    if len(tok.itos) < tok.vocab_size:
        raise ValueError(f"dense_rewards reads one character per token, so tok must be a character tokenizer "
                         f"(rlkit.llm.CharTokenizer); {type(tok).__name__} has no character for its "
                         f"{tok.vocab_size} ids (a Hugging Face tokenizer's tokens are not single characters)")
    out = torch.zeros(response_ids.shape, dtype=torch.float32)
    lengths = m.sum(-1).long().tolist()
    for i, (row, L, p) in enumerate(zip(response_ids.tolist(), lengths, problems)):
        r = list(fn(_token_text(tok, row[:L]), p))
        if len(r) != L:
            raise ValueError(f"token checker {checker!r} returned {len(r)} rewards for row {i}, which has "
                             f"{L} real tokens")
        if L:
            out[i, :L] = torch.tensor([float(v) for v in r])
    if not bool(torch.isfinite(out).all()):
        raise ValueError(f"token checker {checker!r} returned a non-finite reward")
    return out.to(response_ids.device)


def kl_token_rewards(logp: Tensor, logp_ref: Tensor, mask, beta: float, rewards: Tensor | None = None) -> Tensor:
    r"""The KL-regularised per-token reward of RLHF.

    .. math::  r_t = -\beta\,\big(\log\pi_\theta(y_t\mid h_t) - \log\pi_{\text{ref}}(y_t\mid h_t)\big)
               + \mathbf 1[t = T-1]\,R(x, y),

    whose sum over the response is :math:`R - \beta\log\frac{\pi_\theta(y\mid x)}{\pi_{\text{ref}}(y\mid x)}`:
    the sum of the per-token k1 estimates is the k1 estimate of the *sequence* KL, since the
    sequence log-ratio is the sum of the token log-ratios (chapter 14, eq. ``eq-ch14-kl-reward``).

    Args:
        logp, logp_ref: ``[N, T]`` log-probs of the sampled tokens under the policy and the reference,
            finite at the real tokens.
        mask: ``[N, T]`` prefix mask of real tokens (padding may hold anything, even NaN).
        beta: the KL coefficient, a finite number ``>= 0``.
        rewards: ``[N]`` floating task rewards put on the last real token, or None (KL part only).

    Returns:
        ``[N, T]``, 0 at padding. Chapter: 14_credit_over_tokens.
    """
    V.matching_floats(logp=logp, logp_ref=logp_ref, min_dim=2)
    m = response_mask(mask, logp, "logp")
    beta = V.real_in(beta, "beta", 0.0)
    V.tensor_in(_zero_pad(logp, m), "logp (at real tokens)")
    V.tensor_in(_zero_pad(logp_ref, m), "logp_ref (at real tokens)")
    out = -beta * (_zero_pad(logp, m) - _zero_pad(logp_ref, m))
    V.tensor_in(_zero_pad(out, m), "beta * (logp - logp_ref) at real tokens")
    if rewards is not None:
        V.float_tensor(rewards, "rewards")
        if logp.dim() != 2:
            raise ValueError(f"with rewards, logp must be [N, T], got shape {tuple(logp.shape)}")
        out = out + terminal_rewards(rewards.to(logp.dtype), m)
    return out


def response_discounts(mask, gamma: float = 1.0, like: Tensor | None = None) -> Tensor:
    r"""Per-step discounts of a response: :math:`\gamma_t = \gamma\,m_{t+1}`.

    :math:`\gamma` while another real token follows, 0 on the last real token (the episode ends
    there, so no value is bootstrapped after it) and on padding. ``like`` (optional): a floating
    tensor of the mask's shape whose dtype the discounts take (default: the mask's, or float32).
    Chapter: 14_credit_over_tokens.
    """
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if like is not None:
        m = response_mask(mask, V.float_tensor(like, "like", min_dim=0), "like")
    else:
        m = response_mask(mask, mask if mask.is_floating_point() else mask.float(), "the response tensors")
    gamma = V.real_in(gamma, "gamma", 0.0, 1.0)
    nxt = torch.zeros_like(m)
    nxt[..., :-1] = m[..., 1:]
    return gamma * nxt


def _next_values(values: Tensor, m: Tensor) -> Tensor:
    """:math:`V(h_{t+1})` inside the response, 0 after its last token (the terminal state)."""
    nv = torch.zeros_like(values)
    nv[..., :-1] = values[..., 1:]
    nxt = torch.zeros_like(m)
    nxt[..., :-1] = m[..., 1:]
    return nv * nxt


def _rv(rewards, values, mask):
    V.matching_floats(rewards=rewards, values=values)
    m = response_mask(mask, rewards, "rewards")
    return _zero_pad(rewards, m), _zero_pad(values, m), m


def value_targets(rewards: Tensor, values: Tensor, mask, kind: str = "gae", *, gamma: float = 1.0,
                  lam: float = 0.95, n: int = 1) -> Tensor:
    r"""Targets :math:`G_t` for a token-level critic :math:`V_\phi(h_t)` over a response.

    With :math:`\gamma_t` from :func:`response_discounts` (0 on the last token, so :math:`V` after
    ``<eos>`` is 0) and :math:`V(h_{t+1})` = ``values`` shifted by one:

    * ``"nstep"``: :math:`G^{(n)}_t = \sum_{j<n_t}\gamma^j r_{t+j} + \gamma^{n} V(h_{t+n})\,\mathbf 1[t+n < T]`,
      :math:`n_t = \min(n, T-t)` (:func:`rlkit.returns.n_step_returns`; ``n=1`` is TD(0));
    * ``"lambda"``: :math:`G^\lambda_t = r_t + \gamma_t[(1-\lambda)V(h_{t+1}) + \lambda G^\lambda_{t+1}]`
      (:func:`rlkit.returns.lambda_returns`);
    * ``"mc"``: :math:`G_t = \sum_{k\ge 0}\gamma^k r_{t+k}` (:func:`rlkit.returns.discounted_returns`);
    * ``"gae"``: :math:`\hat A_t + V(h_t)` with GAE's :math:`\hat A_t` (:func:`rlkit.returns.gae`),
      which equals ``"lambda"`` exactly (the identity of chapter 2), and is what PPO used before.

    Args:
        rewards, values: ``[N, T]`` float tensors (``values[:, t]`` = :math:`V(h_t)`); padding may
            hold anything.
        mask: ``[N, T]`` prefix mask of real tokens.
        kind: one of :data:`~rlkit.llm.credit.VALUE_TARGETS`.
        gamma: in ``[0, 1]``; lam: in ``[0, 1]`` (``"lambda"``, ``"gae"``); n: int ``>= 1`` (``"nstep"``; checked
            for every kind).

    Returns:
        ``[N, T]`` targets, 0 at padding. Chapter: 14_credit_over_tokens (eqs. ``eq-ch14-nstep``, ``eq-ch14-lambda``).
    """
    kind = V.choice(kind, "kind", VALUE_TARGETS)
    r, v, m = _rv(rewards, values, mask)
    disc = response_discounts(m, gamma)
    nv = _next_values(v, m)
    lam = V.real_in(lam, "lam", 0.0, 1.0)
    n = V.int_in(n, "n")
    if kind == "nstep":
        out = n_step_returns(r, disc, nv, n)
    elif kind == "lambda":
        out = lambda_returns(r, disc, nv, lam)
    elif kind == "mc":
        out = discounted_returns(r, disc, 0.0)
    else:
        out = gae(r, v, nv, disc, lam)[1]
    return _zero_pad(out, m)


def token_advantages(rewards: Tensor, values: Tensor, mask, *, gamma: float = 1.0,
                     lam: float = 0.95) -> tuple[Tensor, Tensor]:
    r"""GAE over the tokens of a response: ``(advantages, returns)``, both ``[N, T]``, 0 at padding.

    .. math::  \delta_t = r_t + \gamma_t V(h_{t+1}) - V(h_t), \qquad
               \hat A_t = \sum_{l\ge 0}(\gamma\lambda)^l\,\delta_{t+l}\ \text{(within the response)},

    :func:`rlkit.returns.gae` with :func:`response_discounts`. ``lam=0`` gives :math:`\delta_t`,
    ``lam=1`` the Monte Carlo return minus :math:`V(h_t)`. Chapter: 14_credit_over_tokens.
    """
    r, v, m = _rv(rewards, values, mask)
    lam = V.real_in(lam, "lam", 0.0, 1.0)
    adv, ret = gae(r, v, _next_values(v, m), response_discounts(m, gamma), lam)
    return _zero_pad(adv, m), _zero_pad(ret, m)


def state_values(critic: nn.Module, rollout: Rollout) -> Tensor:
    r"""``critic``'s :math:`V(h_t)` for every response position ``t`` of ``rollout``: ``[N, T]``.

    :math:`h_t` is the prompt and :math:`y_{<t}`, so ``values[:, t]`` is read at the column of the
    token BEFORE :math:`y_t` (the last prompt token for ``t = 0``). ``critic(ids, attention_mask)``
    returns ``[N, P + T]`` (:class:`~rlkit.llm.ValueHead`, :class:`HiddenValueHead`).
    Chapter: 14_credit_over_tokens.
    """
    V.is_callable(critic, "critic")
    V.instance_of(rollout, "rollout", Rollout)
    P, T = rollout.prompt_ids.shape[1], rollout.response_ids.shape[1]
    ids = torch.cat([rollout.prompt_ids, rollout.response_ids], 1)
    att = torch.cat([rollout.prompt_mask, torch.ones_like(rollout.response_ids, dtype=torch.bool)], 1)
    out = V.instance_of(critic(ids, attention_mask=att), "the values critic returned", Tensor)
    V.exact_shape(out, "the values critic returned", ids.shape, "[N, P + T]")
    return out[:, P - 1:P - 1 + T]


def _targets(tok: CharTokenizer, problems: Sequence[Problem], device=None) -> list[list[int]]:
    return [tok.encode(p.answer, eos=True) for p in problems]


def first_wrong_token(tok: CharTokenizer, response_ids: Tensor, mask, problems: Sequence[Problem]) -> Tensor:
    r"""Index of the first response token that differs from the target (answer + ``<eos>``): ``[N]`` int64.

    :math:`w = \min\{t : y_t \ne a_t\}` over the real tokens (a response that stops early is wrong
    at its ``<eos>``); ``-1`` for an exactly correct response. Chapter: 14_credit_over_tokens.
    """
    V.instance_of(tok, "tok", CharTokenizer)
    V.index_tensor(response_ids, "response_ids", dim=2, n=tok.vocab_size)
    m = response_mask(mask, response_ids.float(), "response_ids")
    problems = V.tuple_of(problems, "problems", Problem)
    V.same_length(problems, "problems", response_ids, "response_ids")
    out = []
    for row, L, tgt in zip(response_ids.tolist(), m.sum(-1).long().tolist(), _targets(tok, problems)):
        w = next((t for t in range(L) if t >= len(tgt) or row[t] != tgt[t]), None)
        if w is None and L < len(tgt):          # cut off by the budget before the answer ended
            w = max(L - 1, 0)
        out.append(-1 if w is None else w)
    return torch.tensor(out, dtype=torch.long, device=response_ids.device)


def most_negative_token(advantages: Tensor, mask, tol: float = 0.0) -> Tensor:
    r"""The token with the most negative advantage, when one token stands out: ``[N]`` int64.

    :math:`w^\star = \arg\min_t \hat A_t` over each row's real tokens if that minimum is below every
    other real token's advantage by more than ``tol``; ``-1`` if two or more tokens tie within
    ``tol`` (or the row is empty). A flat, sequence-level advantage (the same number on every token
    of a response with two or more tokens) therefore never singles out a token.

    Args:
        advantages: ``[N, T]`` float, finite at the real tokens; mask: ``[N, T]`` prefix mask; tol: a finite
            number ``>= 0``.

    Chapter: 14_credit_over_tokens.
    """
    V.float_tensor(advantages, "advantages", 2)
    m = response_mask(mask, advantages, "advantages")
    V.tensor_in(_zero_pad(advantages, m), "advantages (at real tokens)")
    tol = V.real_in(tol, "tol", 0.0)
    N, T = advantages.shape[0], advantages.shape[-1]
    if T == 0 or N == 0:
        return torch.full(advantages.shape[:-1], -1, dtype=torch.long, device=advantages.device)
    a = torch.where(m > 0, advantages, torch.full((), math.inf, dtype=advantages.dtype, device=advantages.device))
    low = a.topk(min(2, T), dim=-1, largest=False)
    idx = low.indices[..., 0]
    alone = (low.values[..., 1] - low.values[..., 0] > tol) if T > 1 else torch.ones_like(idx, dtype=torch.bool)
    ok = (m.sum(-1) > 0) & alone
    return torch.where(ok, idx, torch.full_like(idx, -1))


@torch.no_grad()
def exact_match_values(model, tok: CharTokenizer, rollout: Rollout, problems: Sequence[Problem]) -> Tensor:
    r"""The exact value :math:`V^\pi(h_t)` of the exact-match reward at every response prefix: ``[N, T]``.

    The transitions are deterministic and only one continuation is rewarded, so

    .. math::  V^\pi(h_t) = \begin{cases}\prod_{s=t}^{T^\star-1}\pi(a_s\mid x, a_{<s}) & y_{<t} = a_{<t},\\
               0 & \text{otherwise,}\end{cases}

    with :math:`a` = answer + ``<eos>`` of length :math:`T^\star` and :math:`\pi` the model at
    temperature 1 (one forward pass over prompt + target). Padding gets 0.

    Args:
        model: the policy (LM protocol); tok: its tokenizer.
        rollout: responses (:func:`rlkit.llm.sample`); problems: ``N`` problems, one per row.

    Returns:
        ``[N, T]`` float32. Chapter: 14_credit_over_tokens.
    """
    V.is_callable(model, "model")
    V.instance_of(tok, "tok", CharTokenizer)
    V.instance_of(rollout, "rollout", Rollout)
    problems = V.tuple_of(problems, "problems", Problem)
    V.same_length(problems, "problems", rollout.response_ids, "rollout.response_ids")
    m = response_mask(rollout.mask, rollout.mask.float(), "rollout.mask")
    N, T = rollout.response_ids.shape
    out = torch.zeros(N, T)
    if N == 0 or T == 0:
        return out.to(rollout.mask.device)
    tgts = _targets(tok, problems)
    U = max(len(t) for t in tgts)
    tid = torch.full((N, U), tok.pad_id, dtype=torch.long)
    tm = torch.zeros(N, U)
    for i, t in enumerate(tgts):
        tid[i, :len(t)] = torch.tensor(t)
        tm[i, :len(t)] = 1.0
    dev = rollout.prompt_ids.device
    P = rollout.prompt_ids.shape[1]
    ids = torch.cat([rollout.prompt_ids, tid.to(dev)], 1)
    att = torch.cat([rollout.prompt_mask, torch.ones(N, U, dtype=torch.bool, device=dev)], 1)
    logits = call_model(model, ids, att)[:, P - 1:P - 1 + U].float().cpu()
    lp = torch.log_softmax(logits, -1).gather(-1, tid[..., None]).squeeze(-1) * tm     # log pi(a_s | a_<s)
    suffix = torch.flip(torch.cumsum(torch.flip(lp, [1]), 1), [1])                      # sum_{s >= t}
    resp = rollout.response_ids.cpu().tolist()
    for i in range(N):
        L = int(m[i].sum())
        for t in range(min(L, T)):
            on_target = t < len(tgts[i]) and all(resp[i][s] == tgts[i][s] for s in range(t))
            out[i, t] = float(suffix[i, t].exp()) if on_target else 0.0
    return out.to(rollout.mask.device)


@torch.no_grad()
def mc_prefix_values(model, tok: CharTokenizer, task: Task, problems: Sequence[Problem], prefixes: Sequence[str],
                     k: int, *, checker: str = "exact", token_checker: bool = False,
                     generator: torch.Generator | None = None, batch_rows: int = 8192) -> tuple[Tensor, Tensor]:
    r"""Monte Carlo :math:`V^\pi(h)` of response prefixes from ``k`` sampled continuations each.

    For prefix :math:`h = (x, y_{<t})` draw :math:`y^{(j)}_{\ge t} \sim \pi(\cdot\mid h)`, ``j < k``, at
    temperature 1 with the remaining budget ``task.max_new_tokens - t``, and average the reward
    still to come, :math:`\hat V(h) = \frac1k\sum_j G^{(j)}`, with standard error
    :math:`\hat\sigma/\sqrt k`. The reward to come is the checker's score of prefix + continuation
    (a sequence checker: all of it arrives at the end), or with ``token_checker=True`` the sum of
    ``task.token_checkers[checker]`` over the continuation's tokens only.

    Args:
        model, tok: the policy and its tokenizer.
        task: the task (its checker, token checker and budget).
        problems: a list of ``M`` problems; prefixes: a list of ``M`` strings, the response so far (no ``<eos>``).
        k: continuations per prefix, an int ``>= 2``.
        generator: a ``torch.Generator`` for the sampler.
        batch_rows: rows per call of the sampler.

    Returns:
        ``(values [M], standard_errors [M])`` float32. Chapter: 14_credit_over_tokens.
    """
    V.is_callable(model, "model")
    V.instance_of(tok, "tok", CharTokenizer)
    V.instance_of(task, "task", Task)
    problems, prefixes = V.tuple_of(problems, "problems", Problem), V.str_list(prefixes, "prefixes")
    V.same_length(problems, "problems", prefixes, "prefixes")
    k = V.int_in(k, "k", 2)
    batch_rows = V.int_in(batch_rows, "batch_rows")
    V.boolean(token_checker, "token_checker")
    fn = (task.token_checkers if token_checker else task.checkers).get(checker)
    if fn is None:
        kind = "token checker" if token_checker else "checker"
        raise ValueError(f"checker {checker!r} is not a {kind} of task {task.name!r}")
    for i, pre in enumerate(prefixes):
        if len(pre) >= task.max_new_tokens:
            raise ValueError(f"prefixes[{i}] has {len(pre)} tokens: it leaves no budget "
                             f"(max_new_tokens = {task.max_new_tokens})")
    dev = device_of(model)
    by_len: dict[int, list] = {}
    for i in range(len(problems)):
        by_len.setdefault(len(prefixes[i]), []).extend([i] * k)
    out = torch.zeros(len(problems), k)
    filled = [0] * len(problems)
    for plen, idx in sorted(by_len.items()):
        for s in range(0, len(idx), batch_rows):
            chunk = idx[s:s + batch_rows]
            texts = [problems[i].prompt + prefixes[i] for i in chunk]
            ids, msk = tok.encode_batch(texts, dev)
            ro = sample(model, ids, msk, max_new_tokens=task.max_new_tokens - plen, eos_id=tok.eos_id,
                        pad_id=tok.pad_id, generator=generator)
            L = ro.mask.sum(-1).long().tolist()
            for row, i, n in zip(ro.response_ids.cpu().tolist(), chunk, L):
                cont = _token_text(tok, row[:n])
                if token_checker:
                    g = sum(fn(prefixes[i] + cont, problems[i])[plen:])
                else:
                    g = fn(prefixes[i] + cont.split("\n")[0].replace("\0", ""), problems[i])
                out[i, filled[i]] = float(g)
                filled[i] += 1
    return out.mean(1), out.std(1, unbiased=True) / math.sqrt(k)


@torch.no_grad()
def token_kl_exact(model, ref_model, rollout: Rollout) -> Tensor:
    r"""The exact next-token KL at every visited state: ``[N, T]``, 0 at padding.

    .. math::  \mathrm{KL}_t = \sum_v \pi_\theta(v\mid h_t)\,
               \log\frac{\pi_\theta(v\mid h_t)}{\pi_{\text{ref}}(v\mid h_t)}
               = \mathbb E_{y_t\sim\pi_\theta}\big[\log\pi_\theta(y_t\mid h_t) - \log\pi_{\text{ref}}(y_t\mid h_t)\big].

    By the chain rule of KL, :math:`\mathbb E_{y\sim\pi_\theta}[\sum_t \mathrm{KL}_t] =
    \mathrm{KL}(\pi_\theta(\cdot\mid x)\,\|\,\pi_{\text{ref}}(\cdot\mid x))`, the same expectation as the sum
    of the sampled k1 terms, with less variance (only the sampled path is random).
    Chapter: 14_credit_over_tokens.
    """
    V.is_callable(model, "model")
    V.is_callable(ref_model, "ref_model")
    V.instance_of(rollout, "rollout", Rollout)
    m = response_mask(rollout.mask, rollout.mask.float(), "rollout.mask")
    P, T = rollout.prompt_ids.shape[1], rollout.response_ids.shape[1]
    ids = torch.cat([rollout.prompt_ids, rollout.response_ids], 1)
    att = torch.cat([rollout.prompt_mask, torch.ones_like(rollout.response_ids, dtype=torch.bool)], 1)
    lp = torch.log_softmax(call_model(model, ids, att)[:, P - 1:P - 1 + T].float(), -1)
    lq = torch.log_softmax(call_model(ref_model, ids, att, name="ref_model")[:, P - 1:P - 1 + T].float(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    return _zero_pad(kl, m.to(kl.device))
