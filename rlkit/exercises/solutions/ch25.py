r"""Checkers for the exercises of chapter 25, ``lessons/25_hugging_face_models.ipynb``.

* ``mask_position_ids(mask)``: position ids of a left-padded batch, :math:`\max(0, \sum_{j\le t} m_{b,j} - 1)`.
* ``merge_stop_logits(logits, eos_id, stop_ids)``: stop tokens merged into ``eos_id``,
  :math:`z'_{eos} = \log\sum_{s\in\{eos\}\cup S} e^{z_s}` and :math:`z'_s = -\infty` for :math:`s \in S`.
* ``trl_aggregate(per_token_loss, mask, loss_type, max_len)``: TRL's loss aggregations ``grpo``,
  ``bnpo`` and ``dr_grpo``.
"""
from __future__ import annotations

import torch

from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []
F64 = torch.float64


# --------------------------------------------------------------------- 1. mask_position_ids

def _pos_cases():
    g = torch.Generator().manual_seed(2501)

    def left_padded(b, t):
        lengths = torch.randint(1, t + 1, (b,), generator=g)
        return torch.arange(t)[None, :] >= (t - lengths)[:, None]

    return [
        Case(args=(torch.tensor([[False, False, True, True], [True, True, True, True]]),),
             label="two rows, the first with 2 padding tokens"),
        Case(args=(left_padded(6, 9),), label="6 left-padded rows of width 9"),
        Case(args=(torch.ones(3, 5, dtype=torch.bool),), label="no padding at all: 0, 1, 2, ..."),
    ]


@exercise(chapter=25, cases=_pos_cases, atol=0, rtol=0,
          description="Position ids of a left-padded batch from its attention mask.")
def mask_position_ids(mask):
    r""":math:`\mathrm{pos}_{b,t} = \max(0, \sum_{j \le t} m_{b,j} - 1)`, ``[B, T]`` int64."""
    return (mask.long().cumsum(1) - 1).clamp_min(0)


@mistake(mask_position_ids, "positions 0..T-1 for every row ignore the padding: a left-padded prompt then starts "
         "at position (its padding) instead of 0, as in a forward pass without position ids")
def _pos_arange(mask):
    return torch.arange(mask.shape[1]).expand(mask.shape).clone()


@mistake(mask_position_ids, "the first real token gets position 0: subtract 1 from the running count of real tokens")
def _pos_from_one(mask):
    return mask.long().cumsum(1)


@mistake(mask_position_ids, "padding before the first real token gets -1, which an embedding table cannot look up: "
         "clamp at 0 (the value is hidden by the mask anyway)")
def _pos_negative(mask):
    return mask.long().cumsum(1) - 1


# --------------------------------------------------------------------- 2. merge_stop_logits

def _stop_cases():
    g = torch.Generator().manual_seed(2502)
    hand = torch.log(torch.tensor([[0.5, 0.2, 0.2, 0.1]], dtype=F64))
    return [
        Case(args=(hand, 1, [2]), label="probabilities (0.5, 0.2, 0.2, 0.1), eos 1, stop token 2"),
        Case(args=(torch.randn(3, 4, 10, generator=g, dtype=F64), 0, [3, 7]), label="[3, 4, 10] logits, two stops"),
        Case(args=(torch.randn(5, 12, generator=g, dtype=F64) * 3, 11, [0, 1, 2]), label="three stops, big logits"),
    ]


@exercise(chapter=25, cases=_stop_cases, atol=1e-10,
          description="Merge the probability of stop tokens into the end-of-sequence token.")
def merge_stop_logits(logits, eos_id, stop_ids):
    r""":math:`z'_{eos} = \log\sum_{s} e^{z_s}` over eos and the stops; the stops get :math:`-\infty`."""
    idx = torch.tensor([eos_id, *stop_ids])
    out = logits.clone()
    out[..., eos_id] = torch.logsumexp(logits[..., idx], -1)
    out[..., list(stop_ids)] = float("-inf")
    return out


@mistake(merge_stop_logits, "the largest logit is not the merged one: the probability of stopping is the SUM of "
         "the probabilities, so take logsumexp, not max")
def _stop_max(logits, eos_id, stop_ids):
    out = logits.clone()
    out[..., eos_id] = logits[..., [eos_id, *stop_ids]].max(-1).values
    out[..., list(stop_ids)] = float("-inf")
    return out


@mistake(merge_stop_logits, "the stop tokens still have their own probability: set their logits to -inf, or the "
         "stopping mass is counted twice")
def _stop_not_banned(logits, eos_id, stop_ids):
    out = logits.clone()
    out[..., eos_id] = torch.logsumexp(logits[..., [eos_id, *stop_ids]], -1)
    return out


@mistake(merge_stop_logits, "adding logits multiplies probabilities: add the probabilities (logsumexp of the logits)")
def _stop_sum_logits(logits, eos_id, stop_ids):
    out = logits.clone()
    out[..., eos_id] = logits[..., [eos_id, *stop_ids]].sum(-1)
    out[..., list(stop_ids)] = float("-inf")
    return out


# --------------------------------------------------------------------- 3. trl_aggregate

def _agg_cases():
    g = torch.Generator().manual_seed(2503)
    loss = torch.randn(4, 5, generator=g, dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]], dtype=F64)
    loss2 = torch.randn(4, 5, generator=g, dtype=F64)
    mask2 = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]], dtype=F64)
    return ([Case(args=(loss, mask, kind, 8), label=f"loss_type={kind!r}: 4 completions of 5, 1, 3, 2 tokens, "
                  f"max_completion_length 8") for kind in ("grpo", "bnpo", "dr_grpo")]
            + [Case(args=(loss2, mask2, kind, 6), label=f"loss_type={kind!r}: another batch, 2, 5, 4, 1 tokens, "
                    f"max_completion_length 6") for kind in ("grpo", "bnpo", "dr_grpo")])


@exercise(chapter=25, cases=_agg_cases, atol=1e-12,
          description="TRL's loss aggregations grpo, bnpo and dr_grpo.")
def trl_aggregate(per_token_loss, mask, loss_type, max_len):
    r"""grpo: mean over completions of the per-completion token mean; bnpo: sum over the batch's tokens;
    dr_grpo: sum over :math:`N L`."""
    x = per_token_loss * mask
    if loss_type == "grpo":
        return (x.sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    if loss_type == "bnpo":
        return x.sum() / mask.sum().clamp(min=1)
    return x.sum() / (x.shape[0] * max_len)


@mistake(trl_aggregate, "dr_grpo divides by the generation budget max_completion_length, a constant, not by the "
         "padded width of this batch (which changes with the longest completion)")
def _agg_padded_width(per_token_loss, mask, loss_type, max_len):
    x = per_token_loss * mask
    if loss_type == "grpo":
        return (x.sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    if loss_type == "bnpo":
        return x.sum() / mask.sum().clamp(min=1)
    return x.sum() / x.numel()


@mistake(trl_aggregate, "grpo averages each completion over its own tokens first, then over completions; dividing "
         "the batch's sum by all its tokens is bnpo")
def _agg_grpo_as_bnpo(per_token_loss, mask, loss_type, max_len):
    x = per_token_loss * mask
    if loss_type in ("grpo", "bnpo"):
        return x.sum() / mask.sum().clamp(min=1)
    return x.sum() / (x.shape[0] * max_len)


@mistake(trl_aggregate, "the padding is in the sum: multiply the per-token loss by the mask before summing")
def _agg_unmasked(per_token_loss, mask, loss_type, max_len):
    x = per_token_loss
    if loss_type == "grpo":
        return (x.sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    if loss_type == "bnpo":
        return x.sum() / mask.sum().clamp(min=1)
    return x.sum() / (x.shape[0] * max_len)
