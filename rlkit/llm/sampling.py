r"""Sampling responses from a language model, with the log-probabilities RL needs.

Chapter: 07_tiny_llm (and Part II, which measures the gap between the two log-probs below).

A response is a sequence of actions :math:`y_1, \dots, y_T` drawn one token at a time from a
*sampling distribution* :math:`q(\cdot \mid x, y_{<t})`. With temperature :math:`\tau`, top-k and
top-p (nucleus) filtering, :math:`q` is not the model's distribution :math:`p_\theta`:

.. math::

    q(y \mid \cdot) = \frac{\exp(z_y / \tau)\, \mathbb 1[y \in S]}{\sum_{y' \in S} \exp(z_{y'}/\tau)},

where :math:`z` are the logits and :math:`S` is the support left after top-k (the :math:`k` largest
logits) and top-p (the smallest set of most likely tokens whose probability under
:math:`\mathrm{softmax}(z/\tau)` reaches :math:`p`). The sampler therefore returns BOTH
``logprobs`` (:math:`\log q`, the behaviour policy that really produced the data) and
``model_logprobs`` (:math:`\log p_\theta`, temperature 1, full vocabulary). RL that treats the
samples as on-policy draws from :math:`p_\theta` is silently off-policy whenever they differ.

**Logits processors** (Part III: decode-time shields, value-guided decoding). A
``logits_processor`` is a callable ``f(context_ids [N, L], context_mask [N, L], logits [N, V]) ->
logits [N, V]`` that rewrites the next-token logits given the sequence so far (prompt and the
response tokens before this one). It is applied to the model's logits *before* temperature,
top-k and top-p, so the sampling distribution becomes

.. math::

    q(y \mid h) \propto \exp\big(f(h, z)_y / \tau\big)\,\mathbb 1[y \in S],

and ``logprobs`` are the log-probabilities of that processed distribution, while
``model_logprobs`` stay those of the unmodified model. :func:`~rlkit.llm.token_logprobs` accepts the same
processor and applies it at every response position, so the log-probs a trainer recomputes are
those of the distribution that really sampled the data. A processor may set logits to
:math:`-\infty` (a banned token), but not all of a row's.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import _validate as V

__all__ = ["Rollout", "cat_rollouts", "sample", "sampling_logprobs", "token_logprobs", "call_model", "LogitsProcessor",
           "apply_logits_processor"]


@dataclass
class Rollout:
    r"""A batch of sampled responses. All response tensors are ``[batch, tokens]``.

    * ``prompt_ids`` ``[B, P]`` long, left-padded; ``prompt_mask`` ``[B, P]`` bool (real tokens).
    * ``response_ids`` ``[B, T]`` long; after ``<eos>`` the row holds ``pad_id``.
    * ``mask`` ``[B, T]`` float 0/1: 1 for the response's tokens including its ``<eos>``.
    * ``logprobs`` ``[B, T]``: :math:`\log q(y_t)` under the distribution actually sampled from
      (temperature, top-k, top-p applied); 0 for greedy decoding (a point mass) and at masked positions.
    * ``model_logprobs`` ``[B, T]``: :math:`\log p_\theta(y_t)`, the unmodified model
      (temperature 1, whole vocabulary); 0 at masked positions.
    * ``finished`` ``[B]`` bool: the response ended with ``<eos>`` (False: cut at ``max_new_tokens``).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    mask: torch.Tensor
    logprobs: torch.Tensor
    model_logprobs: torch.Tensor
    finished: torch.Tensor

    @property
    def lengths(self) -> torch.Tensor:
        """Number of response tokens per row (``<eos>`` included), ``[B]`` float."""
        return self.mask.sum(-1)

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    def select(self, rows) -> Rollout:
        """The rollout of the responses ``rows`` (an index tensor, list or slice), every field indexed alike."""
        return Rollout(*(getattr(self, f)[rows] for f in _ROLLOUT_FIELDS))

    def to(self, device) -> Rollout:
        """Every field moved to ``device``."""
        return Rollout(*(getattr(self, f).to(device) for f in _ROLLOUT_FIELDS))


_ROLLOUT_FIELDS = ("prompt_ids", "prompt_mask", "response_ids", "mask", "logprobs", "model_logprobs", "finished")


def cat_rollouts(parts, pad_id: int, width: int | None = None) -> Rollout:
    """Stack rollouts: prompts LEFT-padded (with ``pad_id``) to the longest, responses right-padded to ``width``.

    ``width`` defaults to the widest response block of ``parts``. Masks and log-probs are padded
    with zeros, so a padded position is not a token. Chapter: 07_tiny_llm.
    """
    parts = list(parts)
    if not parts or not all(isinstance(p, Rollout) for p in parts):
        raise TypeError("parts must be a non-empty sequence of Rollout")
    P = max(p.prompt_ids.shape[1] for p in parts)
    T = max(p.response_ids.shape[1] for p in parts) if width is None else width
    if any(p.response_ids.shape[1] > T for p in parts):
        raise ValueError(f"width={T} is narrower than a part's responses")
    F = torch.nn.functional

    def right(x, value):
        return F.pad(x, (0, T - x.shape[1]), value=value)

    def left(x, value):
        return F.pad(x, (P - x.shape[1], 0), value=value)

    return Rollout(prompt_ids=torch.cat([left(p.prompt_ids, pad_id) for p in parts]),
                   prompt_mask=torch.cat([left(p.prompt_mask, False) for p in parts]),
                   response_ids=torch.cat([right(p.response_ids, pad_id) for p in parts]),
                   mask=torch.cat([right(p.mask, 0.0) for p in parts]),
                   logprobs=torch.cat([right(p.logprobs, 0.0) for p in parts]),
                   model_logprobs=torch.cat([right(p.model_logprobs, 0.0) for p in parts]),
                   finished=torch.cat([p.finished for p in parts]))


def _vocab_size(model) -> int | None:
    """The vocabulary size a model declares (``model.config.vocab_size``), if it declares one."""
    return getattr(getattr(model, "config", None), "vocab_size", None)


def call_model(model, ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
               name: str = "model") -> torch.Tensor:
    """Logits of any model following the protocol in :mod:`rlkit.llm.model`.

    The attention mask is passed only to models that declare ``accepts_attention_mask``.

    Args:
        model: maps ids ``[B, T]`` to logits ``[B, T, V]``.
        ids: ``[B, T]`` int64 token ids.
        attention_mask: ``[B, T]`` bool (True at real tokens) or None.
        name: what the caller calls ``model`` (e.g. ``"ref_model"``), for the error message.

    Returns:
        ``[B, T, V]`` logits. Chapter: 07_tiny_llm.
    """
    V.index_tensor(ids, "ids", dim=2)
    if attention_mask is not None:
        V.bool_tensor(attention_mask, "attention_mask", ids, "ids")
    if attention_mask is not None and getattr(model, "accepts_attention_mask", False):
        logits = model(ids, attention_mask=attention_mask)
    else:
        logits = model(ids)
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or logits.shape[:2] != ids.shape:
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise TypeError(f"{name} must map ids {tuple(ids.shape)} to logits [batch, tokens, vocab], got {got}")
    return logits


def sampling_logprobs(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                      top_p: float | None = None) -> torch.Tensor:
    r"""Log-probabilities of the sampling distribution :math:`q` over the vocabulary.

    :math:`\log q = \mathrm{log\_softmax}(z/\tau)` restricted to the support left by top-k, then
    top-p, and renormalised over it; tokens outside the support get :math:`-\infty`. Top-p keeps
    the most likely tokens in order while the probability *before* adding a token is below
    :math:`p`, so the top token is always kept.

    Args:
        logits: ``[..., V]`` float logits :math:`z`, ``V >= 1``.
        temperature: :math:`\tau`, a finite number > 0.
        top_k: an int >= 1 or None (no top-k filter).
        top_p: a number in ``(0, 1]`` or None (no top-p filter).

    Returns:
        ``[..., V]`` log-probabilities (float32 for half-precision logits, else the logits' dtype).
        Chapter: 07_tiny_llm.
    """
    V.has_categories(logits, "logits")
    V.real_in(temperature, "temperature", 0.0, lo_open=True)
    if top_k is not None:
        V.int_in(top_k, "top_k")
    if top_p is not None:
        V.real_in(top_p, "top_p", 0.0, 1.0, lo_open=True)
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    logp = F.log_softmax(logits / temperature, dim=-1)
    if top_k is not None and top_k < logp.shape[-1]:
        keep = torch.zeros_like(logp, dtype=torch.bool)
        keep.scatter_(-1, logp.topk(top_k, dim=-1).indices, True)
        logp = F.log_softmax(logp.masked_fill(~keep, float("-inf")), dim=-1)
    if top_p is not None and top_p < 1:
        sorted_logp, order = logp.sort(dim=-1, descending=True)
        probs = sorted_logp.exp()
        before = probs.cumsum(-1) - probs                      # mass of strictly more likely tokens
        keep_sorted = before < top_p
        keep_sorted[..., 0] = True
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        logp = F.log_softmax(logp.masked_fill(~keep, float("-inf")), dim=-1)
    return logp


#: The type of a logits processor (see the module docstring).
LogitsProcessor = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _check_processor(logits_processor) -> None:
    if logits_processor is not None and not callable(logits_processor):
        raise TypeError(f"logits_processor must be a callable f(context_ids, context_mask, logits) -> logits "
                        f"or None, got {type(logits_processor).__name__}")


def apply_logits_processor(logits_processor, context_ids: torch.Tensor, context_mask: torch.Tensor,
                           logits: torch.Tensor) -> torch.Tensor:
    r"""Apply a logits processor to next-token logits and check what it returns.

    Args:
        logits_processor: ``f(context_ids, context_mask, logits) -> logits`` (see the module
            docstring) or None (the logits are returned unchanged).
        context_ids: ``[N, L]`` int64, the sequence so far (left-padded prompt, then response).
        context_mask: ``[N, L]`` bool, True at real tokens.
        logits: ``[N, V]`` float, the model's logits for the next token.

    The inputs are checked (``context_ids`` int64 ``[N, L]``, ``context_mask`` bool of its shape,
    floating ``logits`` with ``N`` rows), with errors that name them.

    Returns:
        ``[N, V]`` processed logits. A result of another shape, with NaN or :math:`+\infty`, or with
        a row that is :math:`-\infty` everywhere (no token left to sample) raises ``ValueError``.
        Chapter: 18_safety_constraints.
    """
    V.has_categories(logits, "logits")
    V.index_tensor(context_ids, "context_ids", dim=2)
    V.bool_tensor(context_mask, "context_mask", context_ids, "context_ids")
    V.same_length(logits, "logits", context_ids, "context_ids")
    if logits_processor is None:
        return logits
    out = logits_processor(context_ids, context_mask, logits)
    if not isinstance(out, torch.Tensor) or out.shape != logits.shape:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"logits_processor must return logits of shape {tuple(logits.shape)}, got {got}")
    if torch.isnan(out).any() or torch.isposinf(out).any():
        raise ValueError("logits_processor returned NaN or +inf logits; ban a token with -inf instead")
    if out.shape[0] and bool(torch.isneginf(out).all(-1).any()):
        raise ValueError("logits_processor set every logit of a row to -inf: no token is left to sample")
    return out


def _gather(logp: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def sample(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None = None, *,
           max_new_tokens: int, eos_id: int | None = 1, pad_id: int = 0, temperature: float = 1.0,
           top_k: int | None = None, top_p: float | None = None, greedy: bool = False,
           generator: torch.Generator | None = None, use_cache: bool = True,
           logits_processor: LogitsProcessor | None = None) -> Rollout:
    r"""Sample one response per prompt row; return tokens, both log-probs and the mask.

    Each step draws :math:`y_t \sim q(\cdot \mid x, y_{<t})` (see :func:`sampling_logprobs`) by the
    Gumbel-max trick, :math:`y_t = \arg\max_v \log q_v - \log(-\log u_v)` with
    :math:`u_v \sim U(0,1)` from ``generator`` (so runs are reproducible on any device); with
    ``greedy=True``, :math:`y_t = \arg\max_v z_v` and ``logprobs`` are 0 (a point mass). A row
    stops at ``<eos>``; generation stops when all rows have stopped or after ``max_new_tokens``
    (``eos_id=None`` never stops early: every row gets exactly ``max_new_tokens`` tokens).

    With ``use_cache`` and a model that ``supports_kv_cache``, the prompt is processed once and
    each step feeds only the new token; otherwise every step reruns the whole sequence.

    Args:
        model: follows the protocol of :mod:`rlkit.llm.model` (ids ``[B, T]`` -> logits ``[B, T, V]``).
        prompt_ids: ``[B, P]`` int64, LEFT-padded, ``P >= 1``.
        prompt_mask: ``[B, P]`` bool (True at real tokens) or None (no padding).
        max_new_tokens: the most tokens a response gets, an int >= 1.
        eos_id: the id that ends a response, or None. pad_id: fills a row after its ``<eos>``.
        temperature, top_k, top_p: the filters of :func:`sampling_logprobs` (ignored when greedy).
        greedy: decode by argmax. generator: a ``torch.Generator`` or None. use_cache: see above.
        logits_processor: rewrites each step's logits before the filters (see the module
            docstring); greedy decoding takes the argmax of the processed logits. None: no processor.

    Returns:
        a :class:`Rollout`; an empty batch (``B = 0``) gives one with ``T = 0``. Chapter: 07_tiny_llm.
    """
    prompt_ids, prompt_mask = V.prompt_batch(prompt_ids, prompt_mask, _vocab_size(model))
    B, P = prompt_ids.shape
    V.int_in(max_new_tokens, "max_new_tokens")
    if eos_id is not None:
        V.int_in(eos_id, "eos_id", 0)
    V.int_in(pad_id, "pad_id", 0)
    V.instance_of(greedy, "greedy", bool)
    V.instance_of(use_cache, "use_cache", bool)
    if generator is not None:
        V.instance_of(generator, "generator", torch.Generator)
    _check_processor(logits_processor)
    block = getattr(getattr(model, "config", None), "block_size", None)
    if block is not None:
        V.fits(P + max_new_tokens, f"prompt length {P} + max_new_tokens {max_new_tokens}", block,
               "the model's block_size")
    dev = prompt_ids.device
    if B == 0:
        empty = torch.zeros(0, 0, device=dev)
        return Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=empty.long(), mask=empty,
                       logprobs=empty, model_logprobs=empty, finished=torch.zeros(0, dtype=torch.bool, device=dev))
    cached = use_cache and getattr(model, "supports_kv_cache", False)

    if cached:
        cache = model.new_cache(B, P + max_new_tokens)
        logits = model(prompt_ids, attention_mask=prompt_mask, cache=cache)[:, -1]
    else:
        seq, seq_mask = prompt_ids, prompt_mask
        logits = call_model(model, seq, seq_mask)[:, -1]

    done = torch.zeros(B, dtype=torch.bool, device=dev)
    toks, lq, lp, alive_cols = [], [], [], []
    ctx, ctx_mask = prompt_ids, prompt_mask              # the sequence so far, for a logits processor
    for t in range(max_new_tokens):
        model_logp = F.log_softmax(logits.float(), dim=-1)
        logits = apply_logits_processor(logits_processor, ctx, ctx_mask, logits)
        if greedy:
            tok = logits.argmax(-1)
            tok_lq = torch.zeros(B, device=dev)
        else:
            logq = sampling_logprobs(logits, temperature, top_k, top_p)
            gdev = generator.device if generator is not None else dev
            u = torch.rand(logq.shape, generator=generator, device=gdev).to(dev)
            tok = (logq - torch.log(-torch.log(u))).argmax(-1)
            tok_lq = _gather(logq, tok)
        alive = ~done
        tok = torch.where(alive, tok, torch.full_like(tok, pad_id))
        toks.append(tok)
        lq.append(torch.where(alive, tok_lq, 0.0))
        lp.append(torch.where(alive, _gather(model_logp, tok), 0.0))
        alive_cols.append(alive)
        if eos_id is not None:
            done = done | (tok == eos_id)
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        if logits_processor is not None:
            ctx = torch.cat([ctx, tok[:, None]], dim=1)
            ctx_mask = torch.cat([ctx_mask, torch.ones(B, 1, dtype=torch.bool, device=dev)], dim=1)
        if cached:
            logits = model(tok[:, None], cache=cache)[:, -1]
        else:
            seq = torch.cat([seq, tok[:, None]], dim=1)
            seq_mask = torch.cat([seq_mask, torch.ones(B, 1, dtype=torch.bool, device=dev)], dim=1)
            logits = call_model(model, seq, seq_mask)[:, -1]

    return Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                   response_ids=torch.stack(toks, 1), mask=torch.stack(alive_cols, 1).float(),
                   logprobs=torch.stack(lq, 1), model_logprobs=torch.stack(lp, 1), finished=done)


def token_logprobs(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None,
                   response_ids: torch.Tensor, mask: torch.Tensor, *, temperature: float = 1.0,
                   top_k: int | None = None, top_p: float | None = None, with_entropy: bool = False,
                   logits_processor: LogitsProcessor | None = None):
    r"""Differentiable :math:`\log q_\theta(y_t \mid x, y_{<t})` of given responses, in one forward pass.

    The model reads ``prompt + response``; the logits at position ``P - 1 + t`` score response
    token ``t``. With the defaults (temperature 1, no filtering) this is the model's own
    :math:`\log p_\theta`, which is what RL trains. With ``with_entropy`` also

    .. math::

        H_t = -\sum_v q_v \log q_v \qquad (0 \log 0 = 0),

    the entropy of the same distribution. Positions where ``mask`` is 0 get 0, in the values and in
    the gradients: their logits are replaced by zeros before the softmax, so whatever the model
    computes there (even NaN or inf) cannot leak into a loss.

    Args:
        model: follows the protocol of :mod:`rlkit.llm.model`.
        prompt_ids: ``[B, P]`` int64, LEFT-padded, ``P >= 1``; prompt_mask: ``[B, P]`` bool or None.
        response_ids: ``[B, T]`` int64 (``T = 0`` gives ``[B, 0]`` results).
        mask: ``[B, T]`` bool or 0/1, 1 at real response tokens.
        temperature, top_k, top_p: the filters of :func:`sampling_logprobs`.
        with_entropy: also return the entropies.
        logits_processor: applied at every response position ``t`` to the logits, with context
            ``prompt + response[:t]``, exactly as :func:`sample` applies it (one call per
            position); masked positions are scored with zero logits. None: no processor. When the
            model's logits carry a gradient, the processed ones must too: a processor that detaches
            them is refused (``ValueError``) instead of leaving the log-probs untrainable.

    Returns:
        ``logprobs [B, T]``, or ``(logprobs, entropy)`` both ``[B, T]``. Chapter: 07_tiny_llm.
    """
    prompt_ids, prompt_mask = V.prompt_batch(prompt_ids, prompt_mask, _vocab_size(model))
    V.index_tensor(response_ids, "response_ids", dim=2, n=_vocab_size(model))
    V.same_length(response_ids, "response_ids", prompt_ids, "prompt_ids")
    real = V.check_mask(V.given(mask, "mask", "it marks the real response tokens"), response_ids, "response_ids",
                        as_bool=True)
    V.instance_of(with_entropy, "with_entropy", bool)
    _check_processor(logits_processor)
    P, T = prompt_ids.shape[1], response_ids.shape[1]
    ids = torch.cat([prompt_ids, response_ids], dim=1)
    att = torch.cat([prompt_mask, torch.ones_like(response_ids, dtype=torch.bool)], dim=1)
    logits = call_model(model, ids, att)[:, P - 1:P - 1 + T].masked_fill(~real[..., None], 0.0)
    if logits_processor is not None and T > 0:
        cols = []
        for t in range(T):
            col = apply_logits_processor(logits_processor, ids[:, :P + t], att[:, :P + t], logits[:, t])
            if logits.requires_grad and not col.requires_grad:
                raise ValueError(f"logits_processor returned logits without a gradient (detached, or built anew) "
                                 f"at response position {t}, so the log-probs could not be trained through it; "
                                 f"edit the logits it is given with differentiable operations (masked_fill, "
                                 f"addition), not under torch.no_grad() or .detach()")
            cols.append(col)
        logits = torch.stack(cols, 1).masked_fill(~real[..., None], 0.0)
    logq = sampling_logprobs(logits, temperature, top_k, top_p)
    zero = torch.zeros((), device=logq.device, dtype=logq.dtype)
    lp = torch.where(real, _gather(logq, response_ids), zero)
    if not with_entropy:
        return lp
    q = logq.exp()
    ent = -(q * logq.masked_fill(q == 0, 0.0)).sum(-1)            # 0 log 0 = 0, with a finite gradient
    return lp, torch.where(real, ent, zero)
