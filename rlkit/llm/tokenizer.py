"""A character tokenizer: one token per character, plus a padding and an end-of-text token.

Chapter: 07_tiny_llm. A character vocabulary keeps the model tiny and makes every token a
human-readable action: the answer "82" to the prompt "37+45=" is the three actions
``'8'``, ``'2'``, ``<eos>``.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from .. import _validate as V

__all__ = ["CharTokenizer", "DEFAULT_CHARS"]

#: The characters of the shipped tokenizer. Digits and operators are what the pretraining corpus
#: uses; the letters and punctuation are there so a reader can define new tasks without changing
#: the vocabulary (their embeddings are untrained in the shipped checkpoint).
DEFAULT_CHARS = "0123456789+-*/=<>()[].,:;?! abcdefghijklmnopqrstuvwxyz"


class CharTokenizer:
    """Map text to token ids and back, one id per character.

    Ids: ``0`` is ``<pad>`` (fills unused positions, never predicted), ``1`` is ``<eos>``
    (ends a response; written as a newline in corpus text), then one id per character of
    ``chars`` in order.

    >>> tok = CharTokenizer()
    >>> tok.decode(tok.encode("37+45=82", eos=True))
    '37+45=82'
    """

    PAD, EOS = "<pad>", "<eos>"

    def __init__(self, chars: str = DEFAULT_CHARS):
        V.nonempty_str(chars, "chars")
        V.distinct(chars, "chars", reserved=["\n"])          # '\n' is how <eos> is written
        self.chars = chars
        self.pad_id = 0
        self.eos_id = 1
        self.itos = [self.PAD, self.EOS] + list(chars)
        self.stoi = {c: i + 2 for i, c in enumerate(chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str, eos: bool = False) -> list[int]:
        """Token ids of ``text`` (a newline becomes ``<eos>``); ``eos=True`` appends ``<eos>``."""
        V.instance_of(text, "text", str)
        V.instance_of(eos, "eos", bool)
        ids = []
        for i, c in enumerate(text):
            if c == "\n":
                ids.append(self.eos_id)
            elif c in self.stoi:
                ids.append(self.stoi[c])
            else:
                raise ValueError(f"text: character {c!r} at position {i} of {text!r} is not in the "
                                 f"vocabulary {self.chars!r}")
        if eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[int] | torch.Tensor, stop_at_eos: bool = True) -> str:
        """Text of ``ids`` (a 1-D int64 tensor or a sequence of ints): padding is dropped; with
        ``stop_at_eos`` the text ends before ``<eos>``."""
        if isinstance(ids, torch.Tensor):
            ids = V.index_tensor(ids, "ids", dim=1, n=self.vocab_size).tolist()
        else:
            ids = [V.int_in(i, f"ids[{k}]", 0, self.vocab_size - 1) for k, i in enumerate(ids)]
        return self._text(ids, stop_at_eos)

    def decode_batch(self, ids: torch.Tensor, stop_at_eos: bool = True) -> list[str]:
        """``decode`` for each row of a ``[batch, tokens]`` int64 tensor (``[]`` for an empty batch)."""
        V.index_tensor(ids, "ids", dim=2, n=self.vocab_size)
        return [self._text(row, stop_at_eos) for row in ids.tolist()]

    def _text(self, ids: list[int], stop_at_eos: bool) -> str:
        out = []
        for i in ids:
            if i == self.pad_id:
                continue
            if i == self.eos_id:
                if stop_at_eos:
                    break
                out.append("\n")
                continue
            out.append(self.itos[i])
        return "".join(out)

    def encode_batch(self, texts: Sequence[str], device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode prompts into a LEFT-padded ``[batch, max_len]`` id tensor and its bool mask.

        Left padding puts the last prompt character of every row in the same column, so that
        generation appends new tokens to all rows at once. ``mask`` is True at real tokens.
        An empty list gives two ``[0, 0]`` tensors; an empty prompt is refused (the model needs a
        token to condition on).
        """
        rows = [self.encode(t) for t in V.str_list(texts, "texts")]
        for i, r in enumerate(rows):
            if not r:
                raise ValueError(f"texts[{i}] is empty: every prompt needs at least one character")
        return left_pad(rows, self.pad_id, device)

    def to_dict(self) -> dict:
        """The JSON-ready description a checkpoint stores: ``{"type": "CharTokenizer", "chars": ...}``."""
        return {"type": "CharTokenizer", "chars": self.chars}

    @classmethod
    def from_dict(cls, d: dict) -> CharTokenizer:
        """The tokenizer that :meth:`~rlkit.llm.CharTokenizer.to_dict` wrote:
        ``{"type": "CharTokenizer", "chars": ...}``."""
        V.dict_keys(d, "d", required=["type", "chars"])
        V.choice(d["type"], 'd["type"]', ["CharTokenizer"])
        return cls(d["chars"])

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


def left_pad(rows: Sequence[Sequence[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """LEFT-pad token-id lists into ``ids [len(rows), max_len]`` (``pad_id`` filling) and a bool mask of real tokens."""
    width = max((len(r) for r in rows), default=0)
    # one tensor from padded Python lists (a per-row tensor copy costs more than the padding)
    padded = [[pad_id] * (width - len(r)) + list(r) for r in rows]
    ids = torch.tensor(padded, dtype=torch.long).reshape(len(rows), width)
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    mask = torch.arange(width).unsqueeze(0) >= (width - lengths).unsqueeze(1)
    if device is not None:
        ids, mask = ids.to(device), mask.to(device)
    return ids, mask
