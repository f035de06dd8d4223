"""A tiny GRU language model: a second model class that follows the LM protocol.

It exists to show (and test) that :mod:`rlkit.llm.sampling` and :mod:`rlkit.llm.rl` need nothing
from a model but ``ids [B, T] -> logits [B, T, V]``: no attention mask, no KV cache, no hidden
states. A reader with a GPU plugs a larger model in the same way. Chapter: 07_tiny_llm.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .. import _validate as V

__all__ = ["TinyGRULM"]


class TinyGRULM(nn.Module):
    """Embedding -> one-layer GRU -> linear read-out. ``forward(ids [B, T]) -> logits [B, T, V]``."""

    def __init__(self, vocab_size: int, hidden: int = 64):
        super().__init__()
        self.vocab_size = V.int_in(vocab_size, "vocab_size", 2)
        V.int_in(hidden, "hidden")
        self.embed = nn.Embedding(vocab_size, hidden)
        self.gru = nn.GRU(hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        V.index_tensor(ids, "ids", dim=2, n=self.vocab_size)
        x = self.embed(ids)
        h = self.gru(x)[0] if ids.shape[1] else x          # the GRU refuses empty sequences: T = 0 -> [B, 0, V]
        return self.out(h)
