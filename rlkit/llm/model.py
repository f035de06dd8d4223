"""A decoder-only transformer in the style of nanoGPT, small enough to train on a laptop CPU.

Chapter: 07_tiny_llm. Read it top to bottom: configuration, attention, MLP, block, model,
and the key/value cache that makes sampling fast.

**The language-model protocol.** Everything else in :mod:`rlkit.llm` (the sampler, the RL
trainers) needs only this from a model::

    logits = model(ids)            # ids: LongTensor [batch, tokens] -> logits [batch, tokens, vocab]

where ``logits[b, t]`` scores the token at position ``t + 1`` given ``ids[b, :t + 1]``.
Two optional capabilities are used when a model declares them with class attributes:

* ``accepts_attention_mask = True``: ``model(ids, attention_mask=mask)`` with a bool mask of
  real (non-padding) tokens. Prompts of different lengths are LEFT-padded; a model without
  this capability simply sees the padding tokens.
* ``supports_kv_cache = True``: ``cache = model.new_cache(batch, max_len)`` and
  ``model(ids, attention_mask=mask, cache=cache)`` process only the new tokens and append
  their keys and values to ``cache``.

:class:`GPT` has both; :class:`~rlkit.llm.TinyGRULM` (in :mod:`rlkit.llm.gru`) has neither and is what the
tests use to show that the trainers work with any model that follows the protocol.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import _validate as V
from .tokenizer import DEFAULT_CHARS

__all__ = ["GPTConfig", "GPT", "KVCache"]


@dataclass(frozen=True)
class GPTConfig(V.ValidatedConfig):
    r"""Sizes of the model. The shipped checkpoint uses the defaults (about 0.1 M parameters).

    Validated on construction, before anything is allocated, with the same validators as every
    rlkit config (errors name the field, e.g. ``GPTConfig.n_layer must be an int in [1, 256]``):
    each field is an ``int`` within :attr:`LIMITS`, ``n_embd`` is divisible by ``n_head``, and the
    parameter count

    .. math::

        N = (V + T_{\max})\, C + L\,(12 C^2 + 13 C) + 2 C

    (:meth:`num_params`; :math:`V` = ``vocab_size``, :math:`T_{\max}` = ``block_size``, :math:`L` =
    ``n_layer``, :math:`C` = ``n_embd``; the output layer is tied to the token embedding) is at most
    :attr:`MAX_PARAMS`. A checkpoint whose JSON asks for 100,000 layers is therefore refused at once
    instead of exhausting memory. The config is frozen: ``cfg.replace(n_layer=4)`` is a checked
    copy. For a larger model, subclass and redeclare the fields with larger ranges.
    """

    #: Inclusive ``(min, max)`` of each field (each field's check).
    LIMITS: ClassVar[dict[str, tuple[int, int]]] = {
        "vocab_size": (1, 2 ** 20), "block_size": (1, 2 ** 16), "n_layer": (1, 256),
        "n_head": (1, 256), "n_embd": (1, 2 ** 14)}
    #: The largest parameter count a config may ask for (4 GB of float32 weights).
    MAX_PARAMS: ClassVar[int] = 10 ** 9

    vocab_size: int = V.int_field(len(DEFAULT_CHARS) + 2, *LIMITS["vocab_size"])  # characters, <pad>, <eos>
    block_size: int = V.int_field(32, *LIMITS["block_size"])  # longest prompt + response the model sees
    n_layer: int = V.int_field(2, *LIMITS["n_layer"])
    n_head: int = V.int_field(4, *LIMITS["n_head"])
    n_embd: int = V.int_field(64, *LIMITS["n_embd"])

    def __post_init__(self):
        super().__post_init__()
        V.divisible(self.n_embd, "GPTConfig.n_embd", self.n_head, "GPTConfig.n_head")
        V.fits(self.num_params(), "GPTConfig's parameter count", self.MAX_PARAMS, "GPTConfig.MAX_PARAMS")

    def num_params(self) -> int:
        """The parameter count of ``GPT(self)``, from the sizes alone (nothing is allocated)."""
        C = self.n_embd
        return (self.vocab_size + self.block_size) * C + self.n_layer * (12 * C * C + 13 * C) + 2 * C

    def state_shapes(self) -> dict[str, torch.Size]:
        """The shape of each tensor in ``GPT(self).state_dict()``, less the tied ``lm_head.weight``.

        From the sizes alone, so nothing is allocated: a checkpoint's tensors are compared with it
        before a model is built. The numbers add up to :meth:`num_params`.
        """
        C, S = self.n_embd, torch.Size
        shapes = {"wte.weight": S([self.vocab_size, C]), "wpe.weight": S([self.block_size, C])}
        block = {"ln_1.weight": [C], "ln_1.bias": [C], "attn.c_attn.weight": [3 * C, C], "attn.c_attn.bias": [3 * C],
                 "attn.c_proj.weight": [C, C], "attn.c_proj.bias": [C], "ln_2.weight": [C], "ln_2.bias": [C],
                 "mlp.c_fc.weight": [4 * C, C], "mlp.c_fc.bias": [4 * C], "mlp.c_proj.weight": [C, 4 * C],
                 "mlp.c_proj.bias": [C]}
        for i in range(self.n_layer):
            shapes.update({f"blocks.{i}.{k}": S(v) for k, v in block.items()})
        shapes.update({"ln_f.weight": S([C]), "ln_f.bias": S([C])})
        return shapes


class KVCache:
    """The keys and values of every token processed so far, for every layer.

    Preallocated as ``[n_layer, batch, n_head, max_len, head_dim]``; ``length`` tokens are
    filled. ``real[b, j]`` says whether cached position ``j`` of row ``b`` is a real token
    (False for left padding) and ``next_pos[b]`` is the position id the next token of row
    ``b`` gets (padding does not advance positions).
    """

    def __init__(self, config: GPTConfig, batch: int, max_len: int, device=None, dtype=torch.float32):
        V.instance_of(config, "config", GPTConfig)
        V.int_in(batch, "batch", 0)
        V.int_in(max_len, "max_len", 1, config.block_size)
        hd = config.n_embd // config.n_head
        shape = (config.n_layer, batch, config.n_head, max_len, hd)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.real = torch.zeros(batch, max_len, dtype=torch.bool, device=device)
        self.next_pos = torch.zeros(batch, dtype=torch.long, device=device)
        self.length = 0
        self.has_padding = False
        self.max_len = max_len


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where a token sees itself and the tokens before it."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)   # queries, keys, values at once
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x, allowed, cache: KVCache | None, layer: int):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # [B, T, C] -> [B, n_head, T, head_dim]
        q, k, v = (z.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for z in (q, k, v))
        if cache is not None:                         # append the new keys/values, attend to all
            end = cache.length + T
            cache.k[layer, :, :, cache.length:end] = k
            cache.v[layer, :, :, cache.length:end] = v
            k, v = cache.k[layer, :, :, :end], cache.v[layer, :, :, :end]
        if isinstance(allowed, str):                  # "causal" (a square prefix) or "all" (one new token)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=(allowed == "causal"))
        else:                                         # explicit [B, 1, T, T_keys] bool mask
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x, allowed, cache, layer):
        x = x + self.attn(self.ln_1(x), allowed, cache, layer)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token and position embeddings, ``n_layer`` blocks, a final norm and a tied output layer.

    ``forward(ids [B, T], attention_mask [B, T] bool or None, cache or None) -> logits [B, T, vocab]``.
    Chapter: 07_tiny_llm.
    """

    accepts_attention_mask = True
    supports_kv_cache = True

    def __init__(self, config: GPTConfig):
        super().__init__()
        V.instance_of(config, "config", GPTConfig)
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight          # weight tying, as in GPT-2
        self.apply(self._init_weights)
        for name, p in self.named_parameters():        # GPT-2's scaled init of residual projections
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def new_cache(self, batch: int, max_len: int | None = None) -> KVCache:
        """An empty cache for ``batch`` rows and up to ``max_len`` tokens (default: block_size)."""
        p = self.wte.weight
        max_len = self.config.block_size if max_len is None else max_len
        return KVCache(self.config, batch, max_len, p.device, p.dtype)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                cache: KVCache | None = None, return_hidden: bool = False):
        """Logits of the next token at every position.

        Args:
            ids: ``[B, T]`` int64 token ids in ``[0, vocab_size)``, LEFT-padded when rows differ in length.
            attention_mask: ``[B, T]`` bool, True at real tokens; None means no padding.
            cache: a :class:`KVCache` from :meth:`new_cache`; its keys and values are extended.
            return_hidden: also return the final hidden states :math:`h_t` (after the last layer
                norm, ``[B, T, n_embd]``), which the logits are a linear function of
                (``logits = h @ wte.weight.T``); value heads on :math:`h_t` use them
                (Chapter: 14_credit_over_tokens).

        Returns:
            ``[B, T, vocab_size]`` logits; ``B = 0`` or ``T = 0`` give an empty tensor of that shape.
            With ``return_hidden=True`` the pair ``(logits, hidden)``.
        """
        V.instance_of(return_hidden, "return_hidden", bool)
        V.index_tensor(ids, "ids", dim=2, n=self.config.vocab_size)
        B, T = ids.shape
        past = 0 if cache is None else V.instance_of(cache, "cache", KVCache).length
        V.fits(past + T, f"the sequence length ({past} cached + {T} new tokens)", self.config.block_size,
               "block_size")
        if cache is not None:
            V.same_length(ids, "ids", cache.real, "cache")
            V.fits(past + T, f"the sequence length ({past} cached + {T} new tokens)", cache.max_len,
                   "the cache's max_len")
        if attention_mask is None:
            real = torch.ones(B, T, dtype=torch.bool, device=ids.device)
            padded = False
        else:
            real = V.bool_tensor(attention_mask, "attention_mask", ids, "ids")
            padded = not bool(real.all())

        # Position ids count real tokens only, so a left-padded prompt starts at position 0.
        start = cache.next_pos if cache is not None else torch.zeros(B, dtype=torch.long, device=ids.device)
        pos = (start[:, None] + real.long().cumsum(1) - 1).clamp_min(0)
        x = self.wte(ids) + self.wpe(pos)

        # Who may attend to whom. Without padding the cheap built-in paths suffice.
        any_pad = padded or (cache is not None and cache.has_padding)
        if not any_pad and past == 0:
            allowed = "causal"
        elif not any_pad and T == 1:
            allowed = "all"
        else:
            keys_real = real if cache is None else torch.cat([cache.real[:, :past], real], dim=1)
            q_idx = past + torch.arange(T, device=ids.device)
            k_idx = torch.arange(past + T, device=ids.device)
            causal = k_idx[None, :] <= q_idx[:, None]                         # [T, past+T]
            itself = k_idx[None, :] == q_idx[:, None]                          # padding rows stay finite
            allowed = ((causal[None] & keys_real[:, None, :]) | itself[None])[:, None]   # [B,1,T,past+T]

        for layer, block in enumerate(self.blocks):
            x = block(x, allowed, cache, layer)

        if cache is not None:
            cache.real[:, past:past + T] = real
            cache.length = past + T
            cache.next_pos = start + real.long().sum(1)
            cache.has_padding = cache.has_padding or padded
        hidden = self.ln_f(x)
        logits = self.lm_head(hidden)
        return (logits, hidden) if return_hidden else logits
