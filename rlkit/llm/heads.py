r"""Critic heads for any language model: one linear map of the LM's logits, of any output shape.

Chapters: 07_tiny_llm (the value of PPO), 16_offpolicy_multistep (a Q-value per token),
18_safety_constraints (a reward and a cost value), 24_pitfalls_recipe (a reward and a cost Q).

Every critic of the book is the same construction: a copy of the language model reads the prompt
and the response, and a linear layer maps its logits at each position to the outputs,

.. math:: f(h_t) = W\,\mathrm{logits}(h_t) + b \in \mathbb R^{\text{shape}},

with :math:`W` zero and :math:`b` constant (0 unless asked) at first. Chapter 14 also reads the
model's final hidden states :math:`z_t` instead of its logits (``features="hidden"``,
:class:`HiddenValueHead`); the logits are a projection of them. Only the shape differs:

===============  ======================  ==========================================================
``shape``        output per position     used as
===============  ======================  ==========================================================
``()``           :math:`V(h_t)`          PPO's critic (:class:`ValueHead`)
``(2,)``         :math:`(V, C)(h_t)`     reward and cost values (chapter 18)
``(V,)``         :math:`Q(h_t, \cdot)`   a Q-value for every next token (chapter 16)
``(2, V)``       :math:`(Q_r, Q_c)`      reward and cost Q-values (chapter 24)
===============  ======================  ==========================================================

Position :math:`t` is the state after reading ``ids[:, :t + 1]``; :meth:`~rlkit.llm.LogitHead.at_responses`
returns the outputs at the positions that score response tokens.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .. import _validate as V
from .sampling import Rollout, call_model

__all__ = ["LogitHead", "ValueHead", "HiddenValueHead", "response_positions"]


def response_positions(net, ro: Rollout, rows=None) -> torch.Tensor:
    """``net``'s outputs at the positions that score the response tokens of ``ro``: ``[B, T, ...]``.

    ``net`` is a :class:`LogitHead` or any model following the protocol of :mod:`rlkit.llm.model`;
    ``rows`` (optional) selects responses: a slice, a list of ints or a 1-D int64 tensor of row indices
    in ``[0, N)``, or a bool mask ``[N]``. Output ``[:, t]`` is read after the prompt and
    ``response[:t]``, so it scores (or values the state before) response token ``t``.
    """
    V.is_callable(net, "net")
    V.instance_of(ro, "ro", Rollout)
    pid, pm, rid = ro.prompt_ids, ro.prompt_mask, ro.response_ids
    rows = _rows(rows, len(ro), pid.device)
    if rows is not None:
        pid, pm, rid = pid[rows], pm[rows], rid[rows]
    P, T = pid.shape[1], rid.shape[1]
    ids = torch.cat([pid, rid], 1)
    att = torch.cat([pm, torch.ones_like(rid, dtype=torch.bool)], 1)
    out = net(ids, attention_mask=att) if isinstance(net, LogitHead) else call_model(net, ids, att)
    return out[:, P - 1:P - 1 + T]


def _rows(rows, n: int, device):
    """``rows`` of :func:`response_positions` checked: None, a slice, an int64 index tensor or a bool mask."""
    if rows is None or isinstance(rows, slice):
        return rows
    if isinstance(rows, (list, tuple, range)):
        rows = torch.tensor([V.int_in(r, f"rows[{i}]", -n, n - 1) for i, r in enumerate(rows)], dtype=torch.long,
                            device=device)
    V.instance_of(rows, "rows", torch.Tensor, "slice, a list of ints, an int64 tensor or a bool mask")
    if rows.dtype == torch.bool:
        return V.exact_shape(rows, "rows", (n,), "(a bool mask, one per response)")
    return V.index_tensor(rows % n if rows.dtype == torch.int64 and n else rows, "rows", dim=1, n=n)


class LogitHead(nn.Module):
    r"""A critic on a copy of an LM: ``forward(ids [B, L], attention_mask=None) -> [B, L, *shape]``.

    The linear map of the module docstring, on the LM's logits (``features="logits"``) or on its
    final hidden states (``features="hidden"``: the model's ``forward`` must accept
    ``return_hidden=True``, as :meth:`rlkit.llm.GPT.forward` does). ``shape=()`` gives ``[B, L]``.

    Args:
        lm: a model following the protocol of :mod:`rlkit.llm.model` (usually a deep copy of the
            policy; it is trained with the head unless ``freeze_body``).
        width: the width of the features: ``lm``'s vocabulary for logits, its hidden size for
            hidden states (default for hidden states: ``lm.config.n_embd``).
        shape: the output shape per position: ``()``, ``(k,)`` or ``(k, m)`` with positive ints.
        features: ``"logits"`` or ``"hidden"``.
        freeze_body: train only the head (a linear probe on frozen features; the body runs without gradients).
        init: the initial value of every output (the head's bias).
    """

    accepts_attention_mask = True

    def __init__(self, lm: nn.Module, width: int | None = None, shape: tuple = (), *, features: str = "logits",
                 freeze_body: bool = False, init: float = 0.0):
        super().__init__()
        self.lm = V.instance_of(lm, "lm", nn.Module)
        self.features = V.choice(features, "features", ("logits", "hidden"))
        if width is None and self.features == "hidden":
            width = getattr(getattr(lm, "config", None), "n_embd", None)
            V.given(width, "width", "lm has no config.n_embd")
        width = V.int_in(V.given(width, "width", "the LM's logits are read"), "width")
        if not isinstance(shape, tuple) or len(shape) > 2:
            raise ValueError(f"shape must be a tuple of at most two positive ints, got {shape!r}")
        self.shape = tuple(V.int_in(s, f"shape[{i}]") for i, s in enumerate(shape))
        self.freeze_body = V.boolean(freeze_body, "freeze_body")
        if self.freeze_body:
            for p in lm.parameters():
                p.requires_grad_(False)
        out = 1
        for s in self.shape:
            out *= s
        self.vocab_size = width
        self.head = nn.Linear(width, out)
        nn.init.zeros_(self.head.weight)
        nn.init.constant_(self.head.bias, V.real_in(init, "init"))

    def _features(self, ids, attention_mask):
        if self.features == "logits":
            return call_model(self.lm, ids, attention_mask)
        return self.lm(ids, attention_mask=attention_mask, return_hidden=True)[1]

    def forward(self, ids, attention_mask=None):
        if self.freeze_body:
            with torch.no_grad():
                z = self._features(ids, attention_mask)
        else:
            z = self._features(ids, attention_mask)
        if z.shape[-1] != self.head.in_features:
            what = "logits" if self.features == "logits" else "hidden states"
            raise ValueError(f"width={self.head.in_features} does not match lm, whose {what} have "
                             f"{z.shape[-1]} features")
        out = self.head(z)
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
        super().__init__(lm, V.int_in(vocab_size, "vocab_size"), ())


class HiddenValueHead(LogitHead):
    r"""A critic on the LM's hidden states: :math:`V_\phi(h_t) = w^\top z_t + b` (a scalar LogitHead on ``"hidden"``).

    :math:`z_t` is the final hidden state of ``lm`` (``lm(ids, attention_mask, return_hidden=True)``,
    :meth:`rlkit.llm.GPT.forward`), ``n_embd`` numbers per position, against the ``vocab_size``
    logits that :class:`ValueHead` reads (the logits are :math:`W_e z_t`, a projection
    of them). ``forward(ids [B, T], attention_mask=None) -> values [B, T]``; ``values[:, t]`` is the
    value of the state after ``ids[:, :t + 1]``. The head starts at :math:`V \equiv` ``init``.
    With ``freeze_body=True`` only :math:`w, b` are trained (a linear probe on frozen features).

    Args:
        lm: a model whose ``forward`` accepts ``return_hidden=True`` (e.g. a copy of the policy, or a
            freshly initialised :class:`~rlkit.llm.GPT` to train a critic from scratch).
        hidden_size: the width of the hidden states (default ``lm.config.n_embd``).
        freeze_body: train only the head.
        init: the initial value (the head's bias).

    Chapter: 14_credit_over_tokens.
    """

    def __init__(self, lm: nn.Module, hidden_size: int | None = None, freeze_body: bool = False, init: float = 0.0):
        V.instance_of(lm, "lm", nn.Module)
        if hidden_size is None:
            hidden_size = V.given(getattr(getattr(lm, "config", None), "n_embd", None), "hidden_size",
                                  "lm has no config.n_embd")
        V.int_in(hidden_size, "hidden_size")
        super().__init__(lm, hidden_size, (), features="hidden", freeze_body=freeze_body, init=init)
