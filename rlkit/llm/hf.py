r"""A bridge from rlkit's LLM trainers to Hugging Face ``transformers`` causal language models.

Chapter: 25_hugging_face_models (the appendix). Optional: ``pip install -e ".[hf]"`` installs
``transformers``; this module imports it only when a function needs it.

rlkit's trainers ask a model for one thing, ``logits = model(ids)`` (the protocol of
:mod:`rlkit.llm.model`), and use a KV cache and an attention mask when the model declares them.
:class:`HFCausalLM` wraps any ``AutoModelForCausalLM`` so that it follows that protocol:

* **ids -> logits**, returned as float32 whatever the model computes in (bf16 under autocast on
  a GPU by default);
* **precision** (``precision=``): by default (``"auto"``) the weights, their gradients and Adam's
  state stay float32 and, on a CUDA GPU with bf16, the forward pass runs under bf16 autocast
  (``"bf16-mixed"``); on a CPU everything is float32 (``"fp32"``). ``"bf16"`` stores the weights
  themselves in bf16 and is an explicit opt-in: an update smaller than about :math:`|w|/256`
  rounds back to :math:`w`, so at a full fine-tuning learning rate (about :math:`10^{-6}`) almost
  no weight moves (:data:`PRECISIONS`);
* **left padding**: the attention mask hides padding and the **position ids are computed from the
  mask**, so the first real token of every row gets position 0,

  .. math:: \mathrm{pos}_{b,t} = \max\Big(0,\; s_b + \sum_{j \le t} m_{b,j} - 1\Big),
     :label: eq-llm-hf-positions

  with :math:`m_{b,j} \in \{0, 1\}` the mask and :math:`s_b` the number of real tokens already
  in the cache. A forward pass that leaves the position ids out (as TRL's loss does) scores a
  left-padded prompt at positions shifted by its padding, so the log-probs of the loss differ
  from those the tokens were sampled with; here both use :eq:`eq-llm-hf-positions`;
* **KV cache** through ``past_key_values`` (:class:`HFCache`, ``new_cache``), which
  :func:`rlkit.llm.sample` uses as it uses the tiny GPT's cache;
* **EOS and stop tokens**: ``stop_ids`` (for example a chat model's end-of-turn token) end a
  response exactly like ``eos_id``; their probability mass is merged into ``eos_id``'s logit,

  .. math:: z'_{\mathrm{eos}} = \log\sum_{s \in \{\mathrm{eos}\}\cup S} e^{z_s},\qquad
            z'_s = -\infty \;(s \in S),
     :label: eq-llm-hf-stop

  so the probability of stopping is unchanged and sampling and training see the same
  distribution.

:class:`HFTokenizer` wraps a Hugging Face tokenizer in the interface of
:class:`~rlkit.llm.CharTokenizer` (encode, decode, left-padded ``encode_batch``, ``pad_id``,
``eos_id``, ``vocab_size``); it subclasses it so that every trainer's type check accepts it.
:func:`char_tokenizer_to_hf` goes the other way (a ``PreTrainedTokenizerFast`` with the same ids,
which TRL needs), and :func:`gpt_to_hf` copies the tiny GPT's weights into an HF GPT-2 that
computes the same logits. A LLaMA-style model cannot hold them; :data:`UNMAPPABLE` says why.
"""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn as nn

from .. import _validate as V
from .model import GPT
from .tokenizer import CharTokenizer, left_pad

__all__ = ["UNMAPPABLE", "PRECISIONS", "require_transformers", "position_ids", "HFModelInfo", "HFCache", "HFCausalLM",
           "HFTokenizer", "char_tokenizer_to_hf", "gpt_to_hf"]

#: Why the tiny GPT's weights do not map onto each architecture that cannot hold them exactly.
UNMAPPABLE = {
    "llama": ("LLaMA uses RMSNorm without a bias (the tiny GPT: LayerNorm with a bias), rotary position "
              "embeddings inside attention (the tiny GPT: a learned position table added to the token "
              "embedding), a gated SiLU MLP with three bias-free matrices (the tiny GPT: GELU with two "
              "matrices and biases) and bias-free attention projections; no weight copy reproduces "
              "those functions, so the logits could not be equal"),
}


def require_transformers():
    """Import and return ``transformers``, or raise ``ImportError`` saying how to install it.

    Chapter: 25_hugging_face_models.
    """
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError('rlkit.llm.hf needs transformers: pip install -e ".[hf]"') from e
    return transformers


def position_ids(mask: torch.Tensor, start: torch.Tensor | None = None) -> torch.Tensor:
    r"""Position ids of a left-padded batch, :eq:`eq-llm-hf-positions`.

    Args:
        mask: ``[B, T]`` bool, True at real tokens.
        start: ``[B]`` int64, the positions already used by each row (its real tokens in a KV
            cache), or None (zeros).

    Returns:
        ``[B, T]`` int64; padding before a row's first new real token gets :math:`\max(0, s_b - 1)`
        (its value does not matter: attention hides it). Chapter: 25_hugging_face_models.
    """
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 2:
        got = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"mask must be a [B, T] bool tensor, got {got}")
    pos = mask.long().cumsum(1) - 1
    if start is not None:
        if not isinstance(start, torch.Tensor) or start.shape != mask.shape[:1]:
            raise ValueError(f"start must be a [{mask.shape[0]}] int64 tensor, got "
                             f"{tuple(start.shape) if isinstance(start, torch.Tensor) else type(start).__name__}")
        pos = pos + start[:, None].to(pos)
    return pos.clamp_min(0)


@dataclass(frozen=True)
class HFModelInfo:
    """What rlkit's sampler reads from ``model.config``: the logits' width and the longest sequence.

    Chapter: 25_hugging_face_models.
    """

    vocab_size: int
    block_size: int | None


class HFCache:
    r"""The KV cache of an :class:`HFCausalLM`: the model's ``past_key_values`` and the mask so far.

    ``real [B, L]`` says which cached positions are real tokens, ``next_pos [B]`` is the position
    id the next token of each row gets (:eq:`eq-llm-hf-positions`), ``length`` the cached tokens.
    Chapter: 25_hugging_face_models.
    """

    def __init__(self, batch: int, max_len: int | None, device=None):
        V.int_in(batch, "batch", 0)
        if max_len is not None:
            V.int_in(max_len, "max_len")
        self.past = None
        self.real = torch.zeros(batch, 0, dtype=torch.bool, device=device)
        self.next_pos = torch.zeros(batch, dtype=torch.long, device=device)
        self.length = 0
        self.has_padding = False
        self.max_len = max_len


#: The values of :class:`HFCausalLM`'s ``precision``: how the weights are stored and the forward pass computed.
PRECISIONS = {
    "auto": "bf16-mixed on a CUDA device that supports bfloat16, else fp32",
    "fp32": "float32 weights, float32 forward pass",
    "bf16-mixed": "float32 weights (so gradients and Adam's moments are float32 too), forward pass under "
                  "torch.autocast(dtype=torch.bfloat16)",
    "bf16": "bfloat16 weights, gradients and Adam moments (an explicit opt-in: updates below about |w|/256 "
            "round away, so at lr ~1e-6 almost no weight changes)",
}

class _Unset:
    def __repr__(self) -> str:
        return "<not given>"


_UNSET = _Unset()       # dtype not given: precision decides


def _cuda_bf16(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_bf16_supported()


def _resolve_precision(precision, dtype, device: torch.device) -> tuple[str | None, torch.dtype | None, bool]:
    """``(precision, dtype to cast the model to or None, autocast or not)`` from the two arguments."""
    if dtype is not _UNSET:                                          # the older spelling
        if precision != "auto":
            raise ValueError(f"pass precision or dtype, not both (got precision={precision!r}, dtype={dtype!r}); "
                             f"dtype is the older spelling, precision the one to use")
        if isinstance(dtype, str) and dtype == "auto":
            return _resolve_precision("auto", _UNSET, device)
        if dtype is not None:
            V.instance_of(dtype, "dtype", torch.dtype, 'torch dtype, "auto" or None')
        named = {torch.float32: "fp32", torch.bfloat16: "bf16"}.get(dtype)
        return named, dtype, False
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}"
                         + (" (a torch dtype goes to dtype=)" if isinstance(precision, torch.dtype) else ""))
    if precision == "auto":
        precision = "bf16-mixed" if _cuda_bf16(device) else "fp32"
    if precision == "bf16-mixed":
        if not torch.amp.is_autocast_available(device.type) or (device.type == "cuda" and not _cuda_bf16(device)):
            raise ValueError(f"precision='bf16-mixed' needs bfloat16 autocast on the model's device ({device}), "
                             f"which this torch or device does not offer; use precision='fp32'")
        return precision, torch.float32, True
    return precision, {"fp32": torch.float32, "bf16": torch.bfloat16}[precision], False


class HFCausalLM(nn.Module):
    r"""A ``transformers`` causal LM in rlkit's model protocol (ids -> float32 logits, mask, cache).

    ``forward(ids [B, T], attention_mask [B, T] bool or None, cache=None, return_hidden=False) ->
    logits [B, T, V]`` with ``logits[b, t]`` scoring the token after ``ids[b, :t + 1]``. Position
    ids come from the mask (:eq:`eq-llm-hf-positions`); stop tokens are merged into ``eos_id``
    (:eq:`eq-llm-hf-stop`).

    Args:
        model: a ``transformers`` causal LM (``model(input_ids, attention_mask, position_ids,
            past_key_values, use_cache)`` returns ``.logits``), e.g. ``AutoModelForCausalLM``.
        precision: how the weights are stored and the forward pass computed (:data:`PRECISIONS`),
            resolved once, here, from the device of the model's parameters (move the model to the
            GPU before wrapping it):

            * ``"auto"`` (the default): ``"bf16-mixed"`` on a CUDA device that supports bfloat16,
              else ``"fp32"``;
            * ``"fp32"``: the model is cast to float32 and computes in float32;
            * ``"bf16-mixed"``: the model is cast to float32, frozen weights included (the
              optimiser updates float32 weights, with float32 gradients and Adam moments) and each
              forward pass runs under ``torch.autocast(device, dtype=torch.bfloat16)``, so the
              matrix products (the output layer's too) are bf16;
            * ``"bf16"``: the model is cast to bfloat16, weights, gradients and Adam's moments
              included; half the memory of ``"bf16-mixed"``'s weights, and an explicit opt-in.
              **Warning**: a bf16 weight :math:`w` changes only by an update larger than half its
              spacing, between :math:`|w|/512` and :math:`|w|/256`; Adam's first steps move every
              weight by about the learning rate, so at :math:`10^{-6}` (the usual full fine-tuning
              rate) almost no weight changes and the model does not train: one GRPO step of a tiny
              GPT-2 changes 5% of its entries (half of them biases that start at 0, the rest
              weights near 0), against 97.5% in ``"fp32"`` and ``"bf16-mixed"``
              (``tests/test_mixed_precision.py``). Use it for inference, or only where every
              update is far above :math:`|w|/256`.

            In every case the logits (and ``return_hidden``'s states) come back as float32.
        dtype: the older spelling, kept for existing code; give it or ``precision``, not both.
            ``"auto"`` is ``precision="auto"``, ``torch.float32`` ``"fp32"``, ``torch.bfloat16``
            ``"bf16"`` (pure bf16 weights, see the warning above), another torch dtype casts the
            model to it without autocast, None leaves the model exactly as it is (no cast, no
            autocast: for a model already prepared, e.g. quantised).
        eos_id: the id that ends a response (needed with ``stop_ids``).
        stop_ids: more ids that end a response like ``eos_id`` (merged into it), or empty.
        vocab_size: the logits' width (default: the output layer's rows).
        block_size: the longest sequence (default: the config's ``max_position_embeddings`` or
            ``n_positions``; None if it has neither).

    Chapter: 25_hugging_face_models.
    """

    accepts_attention_mask = True
    supports_kv_cache = True

    def __init__(self, model: nn.Module, *, precision: str = "auto", dtype=_UNSET, eos_id: int | None = None,
                 stop_ids: Sequence[int] = (), vocab_size: int | None = None, block_size: int | None = None):
        super().__init__()
        V.instance_of(model, "model", nn.Module, "transformers causal LM (an nn.Module)")
        self.hf = model
        p = next(model.parameters())
        #: the resolved precision ("fp32", "bf16-mixed" or "bf16"; None when ``dtype`` chose another)
        self.precision, dtype, self.autocast = _resolve_precision(precision, dtype, p.device)
        if dtype is not None:
            model.to(dtype)
        cfg = getattr(model, "config", None)
        if vocab_size is None:
            out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
            vocab_size = out.weight.shape[0] if out is not None else getattr(cfg, "vocab_size", None)
        V.int_in(vocab_size, "vocab_size")
        if block_size is None:
            block_size = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
        if block_size is not None:
            V.int_in(block_size, "block_size")
        self.config = HFModelInfo(int(vocab_size), block_size)
        stop = [V.int_in(s, f"stop_ids[{i}]", 0, vocab_size - 1) for i, s in enumerate(stop_ids)]
        if stop and eos_id is None:
            raise ValueError("stop_ids need eos_id: the stop tokens' probability is merged into eos_id's")
        if eos_id is not None:
            V.int_in(eos_id, "eos_id", 0, vocab_size - 1)
        self.eos_id = eos_id
        self.stop_ids = tuple(s for s in stop if s != eos_id)

    def new_cache(self, batch: int, max_len: int | None = None) -> HFCache:
        """An empty :class:`HFCache` for ``batch`` rows (``max_len`` is checked, nothing is preallocated)."""
        return HFCache(batch, max_len, next(self.hf.parameters()).device)

    def _merge_stops(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.stop_ids:
            return logits
        idx = torch.tensor((self.eos_id,) + self.stop_ids, device=logits.device)
        merged = torch.logsumexp(logits.index_select(-1, idx), dim=-1)
        logits = logits.index_fill(-1, idx[1:], float("-inf"))
        return logits.index_copy(-1, idx[:1], merged.unsqueeze(-1))

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None, cache: HFCache | None = None,
                return_hidden: bool = False):
        """Float32 logits ``[B, T, V]`` (and the last hidden states ``[B, T, d]`` with ``return_hidden``).

        With ``precision="bf16-mixed"`` the model runs under bf16 autocast and its outputs are cast
        to float32 afterwards, so the trainers' log-probs, ratios and KL are float32.
        """
        V.index_tensor(ids, "ids", dim=2, n=self.config.vocab_size)
        V.instance_of(return_hidden, "return_hidden", bool)
        B, T = ids.shape
        real = (torch.ones(B, T, dtype=torch.bool, device=ids.device) if attention_mask is None
                else V.bool_tensor(attention_mask, "attention_mask", ids, "ids"))
        past = 0 if cache is None else V.instance_of(cache, "cache", HFCache).length
        if self.config.block_size is not None:
            V.fits(past + T, f"the sequence length ({past} cached + {T} new tokens)", self.config.block_size,
                   "block_size")
        if cache is not None:
            V.same_length(ids, "ids", cache.real, "cache")
            if cache.max_len is not None:
                V.fits(past + T, f"the sequence length ({past} cached + {T} new tokens)", cache.max_len,
                       "the cache's max_len")
        if B == 0 or T == 0:
            empty = torch.zeros(B, T, self.config.vocab_size, device=ids.device)
            return (empty, torch.zeros(B, T, 0, device=ids.device)) if return_hidden else empty
        padded = not bool(real.all())
        start = cache.next_pos if cache is not None else None
        pos = position_ids(real, start)
        keys_real = real if cache is None else torch.cat([cache.real, real], dim=1)
        need_mask = padded or (cache is not None and cache.has_padding)
        mixed = torch.autocast(ids.device.type, dtype=torch.bfloat16) if self.autocast else nullcontext()
        with mixed:                  # not autocast(enabled=False): that would switch off a caller's autocast
            out = self.hf(input_ids=ids, attention_mask=keys_real.long() if need_mask else None, position_ids=pos,
                          past_key_values=None if cache is None else cache.past, use_cache=cache is not None,
                          output_hidden_states=return_hidden)
        if cache is not None:
            cache.past = out.past_key_values
            cache.real = keys_real
            cache.next_pos = cache.next_pos + real.long().sum(1)
            cache.length = past + T
            cache.has_padding = cache.has_padding or padded
        logits = self._merge_stops(out.logits[..., :self.config.vocab_size].float())
        if return_hidden:
            return logits, out.hidden_states[-1].float()
        return logits


class HFTokenizer(CharTokenizer):
    r"""A Hugging Face tokenizer behind :class:`~rlkit.llm.CharTokenizer`'s interface.

    The trainers call ``encode``, ``decode``, ``decode_batch``, ``encode_batch`` (LEFT-padded
    prompts and their bool mask), ``pad_id``, ``eos_id`` and ``vocab_size``; this class provides
    them on top of ``tokenizer`` (no special tokens added). Decoding stops at ``eos_id`` (and at
    any id of ``stop_ids``), drops padding and special tokens, then cuts the text at the first of
    ``stop_strings``, so a checker sees only the answer. ``prompt_template`` (a string
    with one ``{}``, replaced by the prompt; other braces are left alone, so a chat template's text
    may be used) wraps every prompt that ``encode_batch`` encodes, e.g. an instruction for an
    instruct model. Parts of rlkit that read single characters (``itos``: chapter 14's per-digit
    rewards) need the :class:`~rlkit.llm.CharTokenizer` itself.

    Args:
        tokenizer: a ``transformers`` tokenizer (``encode(text, add_special_tokens=False)``,
            ``decode(ids, skip_special_tokens=True)``).
        vocab_size: the model's logits width (default ``len(tokenizer)``); ids up to it decode.
        eos_id: default the tokenizer's ``eos_token_id``. pad_id: default its ``pad_token_id``,
            else ``eos_id`` (padding after a response is never read).
        stop_ids, stop_strings, prompt_template: see above.

    Chapter: 25_hugging_face_models.
    """

    def __init__(self, tokenizer, *, vocab_size: int | None = None, eos_id: int | None = None,
                 pad_id: int | None = None, stop_ids: Sequence[int] = (), stop_strings: Sequence[str] = (),
                 prompt_template: str = "{}"):
        for name in ("encode", "decode"):
            if not callable(getattr(tokenizer, name, None)):
                raise TypeError(f"tokenizer must have a callable {name}(), got {type(tokenizer).__name__}")
        self.tokenizer = tokenizer
        n = len(tokenizer) if vocab_size is None else vocab_size
        self._vocab = V.int_in(n, "vocab_size")
        eos_id = getattr(tokenizer, "eos_token_id", None) if eos_id is None else eos_id
        if eos_id is None:
            raise ValueError("eos_id: the tokenizer has no eos_token_id; pass the id that ends a response")
        self.eos_id = V.int_in(eos_id, "eos_id", 0, self._vocab - 1)
        pad_id = getattr(tokenizer, "pad_token_id", None) if pad_id is None else pad_id
        self.pad_id = V.int_in(self.eos_id if pad_id is None else pad_id, "pad_id", 0, self._vocab - 1)
        self.stop_ids = frozenset([self.eos_id] + [V.int_in(s, f"stop_ids[{i}]", 0, self._vocab - 1)
                                                   for i, s in enumerate(stop_ids)])
        self.stop_strings = tuple(V.nonempty_str(s, f"stop_strings[{i}]") for i, s in enumerate(stop_strings))
        V.instance_of(prompt_template, "prompt_template", str)
        if prompt_template.count("{}") != 1:
            raise ValueError(f"prompt_template must contain exactly one '{{}}', got {prompt_template!r}")
        self.prompt_template = prompt_template
        self.chars = ""
        self.itos, self.stoi = [], {}

    @property
    def vocab_size(self) -> int:
        return self._vocab

    def encode(self, text: str, eos: bool = False) -> list[int]:
        """Token ids of ``text`` (no special tokens); ``eos=True`` appends ``eos_id``."""
        V.instance_of(text, "text", str)
        V.instance_of(eos, "eos", bool)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        return ids + [self.eos_id] if eos else ids

    def _text(self, ids: list[int], stop_at_eos: bool) -> str:
        keep = []
        for i in ids:
            if stop_at_eos and i in self.stop_ids:
                break
            if i == self.pad_id and not (i == self.eos_id and not stop_at_eos):
                continue
            keep.append(i)
        text = self.tokenizer.decode(keep, skip_special_tokens=True)
        if stop_at_eos:
            for s in self.stop_strings:
                text = text.split(s, 1)[0]
        return text

    def encode_batch(self, texts: Sequence[str], device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """LEFT-padded ``[batch, max_len]`` ids of each text put into ``prompt_template`` and their bool mask."""
        # a GRPO batch repeats each prompt group_size times: each distinct text is encoded once
        texts = V.str_list(texts, "texts")
        ids_of = {t: self.encode(self.prompt_template.replace("{}", t, 1)) for t in dict.fromkeys(texts)}
        rows = [ids_of[t] for t in texts]
        for i, r in enumerate(rows):
            if not r:
                raise ValueError(f"texts[{i}] encodes to no token: every prompt needs at least one")
        return left_pad(rows, self.pad_id, device)

    def to_dict(self) -> dict:
        raise NotImplementedError("an HFTokenizer is saved with its Hugging Face tokenizer (save_pretrained)")

    def __repr__(self) -> str:
        return f"HFTokenizer({type(self.tokenizer).__name__}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"


def char_tokenizer_to_hf(tok: CharTokenizer):
    """A ``transformers.PreTrainedTokenizerFast`` with exactly ``tok``'s ids (one token per character).

    ``<pad>`` is its pad token and ``<eos>`` its eos token; TRL's trainers need such a tokenizer.
    Chapter: 25_hugging_face_models.
    """
    V.instance_of(tok, "tok", CharTokenizer)
    if isinstance(tok, HFTokenizer):
        raise TypeError("tok is already an HFTokenizer: use tok.tokenizer")
    require_transformers()
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {s: i for i, s in enumerate(tok.itos)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=tok.PAD))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token=tok.PAD, eos_token=tok.EOS,
                                   padding_side="left")


def gpt_to_hf(model: GPT, arch: str = "gpt2"):
    r"""An HF ``GPT2LMHeadModel`` holding the tiny GPT's weights, with the same logits.

    The map is one to one: token and position tables, per block ``ln_1``, the fused query/key/value
    projection ``c_attn`` and ``c_proj`` (transposed: HF's ``Conv1D`` stores ``[in, out]``),
    ``ln_2``, the MLP's ``c_fc`` and ``c_proj``, the final ``ln_f``, the output layer tied to the
    token table; exact GELU (``activation_function="gelu"``), LayerNorm :math:`\epsilon=10^{-5}`, no
    dropout, eager attention. ``arch="llama"`` (or any other) raises ``ValueError`` with the
    reason in :data:`UNMAPPABLE`.

    Args:
        model: an :class:`rlkit.llm.GPT`. arch: the target architecture, ``"gpt2"``.

    Returns:
        a ``transformers.GPT2LMHeadModel`` in eval mode, on ``model``'s device, float32.
        Chapter: 25_hugging_face_models.
    """
    V.instance_of(model, "model", GPT)
    V.nonempty_str(arch, "arch")
    if arch != "gpt2":
        why = UNMAPPABLE.get(arch, f"no mapping is defined for {arch!r}; only 'gpt2' holds the tiny GPT exactly")
        raise ValueError(f"gpt_to_hf: the tiny GPT's weights cannot be mapped onto {arch!r}: {why}")
    require_transformers()
    from transformers import GPT2Config, GPT2LMHeadModel

    c = model.config
    hcfg = GPT2Config(vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.n_embd, n_layer=c.n_layer,
                      n_head=c.n_head, activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0,
                      attn_pdrop=0.0, layer_norm_epsilon=1e-5, bos_token_id=1, eos_token_id=1, pad_token_id=0,
                      tie_word_embeddings=True, use_cache=True)
    hf = GPT2LMHeadModel(hcfg)
    sd = {"transformer.wte.weight": model.wte.weight, "transformer.wpe.weight": model.wpe.weight,
          "transformer.ln_f.weight": model.ln_f.weight, "transformer.ln_f.bias": model.ln_f.bias}
    for i, b in enumerate(model.blocks):
        h = f"transformer.h.{i}."
        sd.update({h + "ln_1.weight": b.ln_1.weight, h + "ln_1.bias": b.ln_1.bias,
                   h + "ln_2.weight": b.ln_2.weight, h + "ln_2.bias": b.ln_2.bias,
                   h + "attn.c_attn.weight": b.attn.c_attn.weight.T, h + "attn.c_attn.bias": b.attn.c_attn.bias,
                   h + "attn.c_proj.weight": b.attn.c_proj.weight.T, h + "attn.c_proj.bias": b.attn.c_proj.bias,
                   h + "mlp.c_fc.weight": b.mlp.c_fc.weight.T, h + "mlp.c_fc.bias": b.mlp.c_fc.bias,
                   h + "mlp.c_proj.weight": b.mlp.c_proj.weight.T, h + "mlp.c_proj.bias": b.mlp.c_proj.bias})
    own = hf.state_dict()
    with torch.no_grad():
        for k, v in sd.items():
            if own[k].shape != v.shape:                 # pragma: no cover - a transformers layout change
                raise RuntimeError(f"gpt_to_hf: {k} has shape {tuple(own[k].shape)} in transformers, "
                                   f"{tuple(v.shape)} from the tiny GPT")
            own[k].copy_(v.detach())
    hf.tie_weights()
    dev = model.wte.weight.device
    return hf.to(dev).eval()
