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
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["Rollout", "sample", "sampling_logprobs", "token_logprobs", "call_model"]


@dataclass
class Rollout:
    """A batch of sampled responses. All response tensors are ``[batch, tokens]``.

    * ``prompt_ids`` ``[B, P]`` long, left-padded; ``prompt_mask`` ``[B, P]`` bool (real tokens).
    * ``response_ids`` ``[B, T]`` long; after ``<eos>`` the row holds ``pad_id``.
    * ``mask`` ``[B, T]`` float 0/1: 1 for the response's tokens including its ``<eos>``.
    * ``logprobs`` ``[B, T]``: :math:`\\log q(y_t)` under the distribution actually sampled from
      (temperature, top-k, top-p applied); 0 for greedy decoding (a point mass) and at masked positions.
    * ``model_logprobs`` ``[B, T]``: :math:`\\log p_\\theta(y_t)`, the unmodified model
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


def call_model(model, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Logits ``[B, T, V]`` of any model following the protocol in :mod:`rlkit.llm.model`.

    The attention mask is passed only to models that declare ``accepts_attention_mask``.
    """
    if attention_mask is not None and getattr(model, "accepts_attention_mask", False):
        logits = model(ids, attention_mask=attention_mask)
    else:
        logits = model(ids)
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or logits.shape[:2] != ids.shape:
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise TypeError(f"the model must map ids {tuple(ids.shape)} to logits [batch, tokens, vocab], got {got}")
    return logits


def _check_filters(temperature, top_k, top_p):
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature must be a number > 0 (use greedy=True for argmax), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be None or a number in (0, 1], got {top_p!r}")


def sampling_logprobs(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                      top_p: float | None = None) -> torch.Tensor:
    r"""Log-probabilities of the sampling distribution :math:`q` over the vocabulary.

    :math:`\log q = \mathrm{log\_softmax}(z/\tau)` restricted to the support left by top-k, then
    top-p, and renormalised over it; tokens outside the support get :math:`-\infty`. Top-p keeps
    the most likely tokens in order while the probability *before* adding a token is below
    :math:`p`, so the top token is always kept.

    Args: ``logits`` ``[..., V]``; ``temperature`` > 0; ``top_k`` int or None; ``top_p`` in (0, 1] or None.
    Returns: ``[..., V]`` log-probabilities (float32 or the logits' float dtype). Chapter: 07_tiny_llm.
    """
    _check_filters(temperature, top_k, top_p)
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


def _gather(logp: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def sample(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None = None, *,
           max_new_tokens: int, eos_id: int | None = 1, pad_id: int = 0, temperature: float = 1.0,
           top_k: int | None = None, top_p: float | None = None, greedy: bool = False,
           generator: torch.Generator | None = None, use_cache: bool = True) -> Rollout:
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
        prompt_ids: ``[B, P]`` long, LEFT-padded; ``prompt_mask``: ``[B, P]`` bool or None (no padding).
    Returns: a :class:`Rollout`. Chapter: 07_tiny_llm.
    """
    if not isinstance(prompt_ids, torch.Tensor) or prompt_ids.dtype != torch.long or prompt_ids.dim() != 2:
        raise TypeError("sample: prompt_ids must be a LongTensor [batch, prompt_len]")
    B, P = prompt_ids.shape
    if prompt_mask is None:
        prompt_mask = torch.ones_like(prompt_ids, dtype=torch.bool)
    if not isinstance(prompt_mask, torch.Tensor) or prompt_mask.shape != prompt_ids.shape or prompt_mask.dtype != torch.bool:
        raise ValueError(f"sample: prompt_mask must be a bool tensor of shape {tuple(prompt_ids.shape)}")
    if not bool(prompt_mask[:, -1].all()):
        raise ValueError("sample: prompts must be LEFT-padded (the last column must be real tokens); "
                         "use CharTokenizer.encode_batch")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"sample: max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if not greedy:
        _check_filters(temperature, top_k, top_p)
    block = getattr(getattr(model, "config", None), "block_size", None)
    if block is not None and P + max_new_tokens > block:
        raise ValueError(f"sample: prompt length {P} + max_new_tokens {max_new_tokens} exceeds the "
                         f"model's block_size {block}")
    dev = prompt_ids.device
    cached = use_cache and getattr(model, "supports_kv_cache", False)

    if cached:
        cache = model.new_cache(B, P + max_new_tokens)
        logits = model(prompt_ids, attention_mask=prompt_mask, cache=cache)[:, -1]
    else:
        seq, seq_mask = prompt_ids, prompt_mask
        logits = call_model(model, seq, seq_mask)[:, -1]

    done = torch.zeros(B, dtype=torch.bool, device=dev)
    toks, lq, lp, alive_cols = [], [], [], []
    for t in range(max_new_tokens):
        model_logp = F.log_softmax(logits.float(), dim=-1)
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
                   top_k: int | None = None, top_p: float | None = None, with_entropy: bool = False):
    r"""Differentiable :math:`\log q_\theta(y_t \mid x, y_{<t})` of given responses, in one forward pass.

    The model reads ``prompt + response``; the logits at position ``P - 1 + t`` score response
    token ``t``. With the defaults (temperature 1, no filtering) this is the model's own
    :math:`\log p_\theta`, which is what RL trains. Positions where ``mask`` is 0 get 0.

    Args: ``prompt_ids``/``prompt_mask`` ``[B, P]``; ``response_ids`` ``[B, T]``; ``mask`` ``[B, T]`` 0/1.
    Returns: ``logprobs [B, T]``, and with ``with_entropy`` also the per-token entropy
    :math:`H_t = -\sum_v q_v \log q_v` ``[B, T]`` of the same distribution. Chapter: 07_tiny_llm.
    """
    if response_ids.dim() != 2 or response_ids.shape[0] != prompt_ids.shape[0]:
        raise ValueError(f"token_logprobs: response_ids must be [B, T] with B={prompt_ids.shape[0]}, "
                         f"got {tuple(response_ids.shape)}")
    if mask.shape != response_ids.shape:
        raise ValueError(f"token_logprobs: mask must have the shape of response_ids {tuple(response_ids.shape)}, "
                         f"got {tuple(mask.shape)}")
    B, P = prompt_ids.shape
    T = response_ids.shape[1]
    if prompt_mask is None:
        prompt_mask = torch.ones_like(prompt_ids, dtype=torch.bool)
    ids = torch.cat([prompt_ids, response_ids], dim=1)
    att = torch.cat([prompt_mask, torch.ones_like(response_ids, dtype=torch.bool)], dim=1)
    logits = call_model(model, ids, att)[:, P - 1:P - 1 + T]
    logq = sampling_logprobs(logits, temperature, top_k, top_p)
    real = mask.bool()
    lp = torch.where(real, _gather(logq, response_ids), torch.zeros((), device=logq.device, dtype=logq.dtype))
    if not with_entropy:
        return lp
    q = logq.exp()
    ent = -(torch.where(q > 0, q * logq, torch.zeros((), device=q.device, dtype=q.dtype))).sum(-1)
    return lp, torch.where(real, ent, torch.zeros((), device=ent.device, dtype=ent.dtype))
