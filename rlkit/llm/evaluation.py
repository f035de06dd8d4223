"""Scoring a model on a task: encode prompts, sample or decode greedily, check the answers.

Chapter: 07_tiny_llm.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import _validate as V
from .sampling import sample
from .tasks import Problem, Task
from .tokenizer import CharTokenizer

__all__ = ["encode_prompts", "device_of", "evaluate"]


def encode_prompts(problems: Sequence[Problem], tok: CharTokenizer, device=None):
    """``(prompt_ids [B, P], prompt_mask [B, P])`` of the problems' prompts, left-padded.

    ``problems``: a list of problems; ``device``: None (the CPU), a ``torch.device`` or a device string.
    """
    V.instance_of(tok, "tok", CharTokenizer)
    problems = V.tuple_of(problems, "problems", Problem)
    if device is not None and not isinstance(device, torch.device):
        # imported here: rlkit.rollout brings gymnasium, which rlkit.llm does not otherwise import
        from ..rollout import check_device
        device = check_device(device, "device")
    return tok.encode_batch([p.prompt for p in problems], device=device)


def device_of(model) -> torch.device:
    """The device of ``model``'s first parameter (the CPU for a model without parameters)."""
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")


@torch.no_grad()
def evaluate(model, tok: CharTokenizer, task: Task, problems: Sequence[Problem], *, greedy: bool = True,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             checker="exact", batch_size: int = 1024, generator: torch.Generator | None = None,
             logits_processor=None) -> dict:
    r"""Answer every problem once and score it: accuracy :math:`= \frac{1}{n}\sum_i r_i`.

    Args:
        model: follows the protocol of :mod:`rlkit.llm.model`; tok: its :class:`CharTokenizer`.
        task: the :class:`Task` (its ``max_new_tokens`` and checkers); problems: a non-empty list.
        greedy, temperature, top_k, top_p, generator, logits_processor: as in
            :func:`rlkit.llm.sample`; with
            ``greedy=False`` responses are sampled (pass a seeded ``generator`` for reproducibility).
        checker: a checker name of ``task`` or a callable. batch_size: prompts per call, >= 1.

    Returns:
        ``{"accuracy": mean reward (float), "rewards": [n] tensor, "responses": list[str]}``.
        An empty ``problems`` is refused (an accuracy of nothing is not a number). Chapter: 07_tiny_llm.
    """
    V.is_callable(model, "model")
    V.instance_of(tok, "tok", CharTokenizer)
    V.instance_of(task, "task", Task)
    V.instance_of(problems, "problems", (list, tuple), "list of Problem")
    V.int_in(len(problems), "len(problems)")
    V.int_in(batch_size, "batch_size")
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    dev = device_of(model)
    responses = []
    try:
        for i in range(0, len(problems), batch_size):
            ids, mask = encode_prompts(problems[i:i + batch_size], tok, dev)
            ro = sample(model, ids, mask, max_new_tokens=task.max_new_tokens, eos_id=tok.eos_id, pad_id=tok.pad_id,
                        greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator,
                        logits_processor=logits_processor)
            responses += tok.decode_batch(ro.response_ids.cpu())
    finally:
        if was_training:
            model.train()
    rewards = task.score(responses, problems, checker)
    return {"accuracy": rewards.mean().item(), "rewards": rewards, "responses": responses}
