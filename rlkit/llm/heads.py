r"""Critic heads for any language model: one linear map of the LM's logits, of any output shape.

Chapters: 07_tiny_llm (the value of PPO), 16_offpolicy_multistep (a Q-value per token),
18_safety_constraints (a reward and a cost value), 24_pitfalls_recipe (a reward and a cost Q).

Every critic of the book is the same construction: a copy of the language model reads the prompt
and the response, and a linear layer maps its logits at each position to the outputs,

.. math:: f(h_t) = W\,\mathrm{logits}(h_t) + b \in \mathbb R^{\text{shape}},

with :math:`W` and :math:`b` zero at first, so every output starts at 0. Only the shape differs:

===============  ======================  ==========================================================
``shape``        output per position     used as
===============  ======================  ==========================================================
``()``           :math:`V(h_t)`          PPO's critic (:class:`ValueHead`)
``(2,)``         :math:`(V, C)(h_t)`     reward and cost values (chapter 18)
``(V,)``         :math:`Q(h_t, \cdot)`   a Q-value for every next token (chapter 16)
``(2, V)``       :math:`(Q_r, Q_c)`      reward and cost Q-values (chapter 24)
===============  ======================  ==========================================================

Position :math:`t` is the state after reading ``ids[:, :t + 1]``; :meth:`LogitHead.at_responses`
returns the outputs at the positions that score response tokens.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .. import _validate as V
from .sampling import Rollout, call_model

__all__ = ["LogitHead", "ValueHead", "response_positions"]


def response_positions(net, ro: Rollout, rows=None) -> torch.Tensor:
    """``net``'s outputs at the positions that score the response tokens of ``ro``: ``[B, T, ...]``.

    ``net`` is a :class:`LogitHead` or any model following the protocol of :mod:`rlkit.llm.model`;
    ``rows`` (optional) selects responses. Output ``[:, t]`` is read after the prompt and
    ``response[:t]``, so it scores (or values the state before) response token ``t``.
    """
    pid, pm, rid = ro.prompt_ids, ro.prompt_mask, ro.response_ids
    if rows is not None:
        pid, pm, rid = pid[rows], pm[rows], rid[rows]
    P, T = pid.shape[1], rid.shape[1]
    ids = torch.cat([pid, rid], 1)
    att = torch.cat([pm, torch.ones_like(rid, dtype=torch.bool)], 1)
    out = net(ids, attention_mask=att) if isinstance(net, LogitHead) else call_model(net, ids, att)
    return out[:, P - 1:P - 1 + T]


class LogitHead(nn.Module):
    r"""A critic on a copy of an LM: ``forward(ids [B, L], attention_mask=None) -> [B, L, *shape]``.

    The zero-initialised linear map of the module docstring. ``shape=()`` gives ``[B, L]``.

    Args:
        lm: a model following the protocol of :mod:`rlkit.llm.model` (usually a deep copy of the
            policy; it is trained with the head).
        vocab_size: the width of ``lm``'s logits.
        shape: the output shape per position: ``()``, ``(k,)`` or ``(k, m)`` with positive ints.
    """

    accepts_attention_mask = True

    def __init__(self, lm: nn.Module, vocab_size: int, shape: tuple = ()):
        super().__init__()
        self.lm = V.instance_of(lm, "lm", nn.Module)
        vocab_size = V.int_in(vocab_size, "vocab_size")
        if not isinstance(shape, tuple) or len(shape) > 2:
            raise ValueError(f"shape must be a tuple of at most two positive ints, got {shape!r}")
        self.shape = tuple(V.int_in(s, f"shape[{i}]") for i, s in enumerate(shape))
        width = 1
        for s in self.shape:
            width *= s
        self.vocab_size = vocab_size
        self.head = nn.Linear(vocab_size, width)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, ids, attention_mask=None):
        out = self.head(call_model(self.lm, ids, attention_mask))
        if not self.shape:
            return out.squeeze(-1)
        return out.view(*out.shape[:-1], *self.shape)

    def at_responses(self, ro: Rollout, rows=None) -> torch.Tensor:
        """The outputs at the response positions of ``ro`` (optionally only ``rows``): ``[B, T, *shape]``."""
        return response_positions(self, ro, rows)


class ValueHead(LogitHead):
    r"""PPO's critic: :math:`V(s_t) = w^\top \mathrm{logits}_t + b` on a copy of the model (a scalar LogitHead).

    ``forward(ids [B, T], attention_mask=None) -> values [B, T]``; ``values[:, t]`` is the value of
    the state after reading ``ids[:, :t + 1]``. The head starts at zero, so :math:`V \equiv 0`
    at first. Chapter: 07_tiny_llm.
    """

    def __init__(self, lm: nn.Module, vocab_size: int):
        super().__init__(lm, vocab_size, ())
