"""A character tokenizer: one token per character, plus a padding and an end-of-text token.

Chapter: 07_tiny_llm. A character vocabulary keeps the model tiny and makes every token a
human-readable action: the answer "82" to the prompt "37+45=" is the three actions
``'8'``, ``'2'``, ``<eos>``.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch

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
        if not isinstance(chars, str) or not chars:
            raise TypeError("CharTokenizer: chars must be a non-empty str")
        if len(set(chars)) != len(chars):
            dup = sorted({c for c in chars if chars.count(c) > 1})
            raise ValueError(f"CharTokenizer: chars must not repeat characters, repeated: {dup}")
        if "\n" in chars:
            raise ValueError("CharTokenizer: '\\n' is reserved for <eos>; remove it from chars")
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
        if not isinstance(text, str):
            raise TypeError(f"encode: text must be a str, got {type(text).__name__}")
        ids = []
        for i, c in enumerate(text):
            if c == "\n":
                ids.append(self.eos_id)
            elif c in self.stoi:
                ids.append(self.stoi[c])
            else:
                raise ValueError(f"encode: character {c!r} at position {i} of {text!r} is not in the "
                                 f"vocabulary {self.chars!r}")
        if eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[int] | torch.Tensor, stop_at_eos: bool = True) -> str:
        """Text of ``ids``: padding is dropped; with ``stop_at_eos`` the text ends before ``<eos>``."""
        if isinstance(ids, torch.Tensor):
            if ids.dim() != 1:
                raise ValueError(f"decode: ids must be one sequence (1-D), got shape {tuple(ids.shape)}; "
                                 "use decode_batch for [batch, tokens]")
            ids = ids.tolist()
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"decode: id {i} is outside the vocabulary [0, {self.vocab_size})")
            if i == self.pad_id:
                continue
            if i == self.eos_id:
                if stop_at_eos:
                    break
                out.append("\n")
                continue
            out.append(self.itos[i])
        return "".join(out)

    def decode_batch(self, ids: torch.Tensor, stop_at_eos: bool = True) -> list[str]:
        """``decode`` for each row of a ``[batch, tokens]`` tensor."""
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
            raise ValueError("decode_batch: ids must be a [batch, tokens] tensor")
        return [self.decode(row, stop_at_eos) for row in ids]

    def encode_batch(self, texts: Sequence[str], device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode prompts into a LEFT-padded ``[batch, max_len]`` id tensor and its bool mask.

        Left padding puts the last prompt character of every row in the same column, so that
        generation appends new tokens to all rows at once. ``mask`` is True at real tokens.
        """
        if isinstance(texts, str) or not isinstance(texts, Sequence) or len(texts) == 0:
            raise TypeError("encode_batch: texts must be a non-empty list of str")
        rows = [self.encode(t) for t in texts]
        if any(len(r) == 0 for r in rows):
            raise ValueError("encode_batch: every prompt needs at least one character")
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.bool)
        for i, r in enumerate(rows):
            ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r):] = True
        if device is not None:
            ids, mask = ids.to(device), mask.to(device)
        return ids, mask

    def to_dict(self) -> dict:
        return {"type": "CharTokenizer", "chars": self.chars}

    @classmethod
    def from_dict(cls, d: dict) -> "CharTokenizer":
        if not isinstance(d, dict) or d.get("type") != "CharTokenizer" or "chars" not in d:
            raise ValueError(f"CharTokenizer.from_dict: expected {{'type': 'CharTokenizer', 'chars': ...}}, got {d!r}")
        return cls(d["chars"])

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"
