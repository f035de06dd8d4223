"""Scoring a model on a task: encode prompts, sample or decode greedily, check the answers.

Chapter: 07_tiny_llm.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .sampling import sample
from .tasks import Problem, Task
from .tokenizer import CharTokenizer

__all__ = ["encode_prompts", "evaluate"]


def encode_prompts(problems: Sequence[Problem], tok: CharTokenizer, device=None):
    """``(prompt_ids [B, P], prompt_mask [B, P])`` of the problems' prompts, left-padded."""
    return tok.encode_batch([p.prompt for p in problems], device=device)


def _device_of(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")


@torch.no_grad()
def evaluate(model, tok: CharTokenizer, task: Task, problems: Sequence[Problem], *, greedy: bool = True,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             checker="exact", batch_size: int = 1024, generator: torch.Generator | None = None) -> dict:
    """Answer every problem once and score it.

    Returns ``{"accuracy": mean reward (float), "rewards": [n] tensor, "responses": list[str]}``.
    With ``greedy=False`` responses are sampled (pass a seeded ``generator`` for reproducibility).
    """
    if len(problems) == 0:
        raise ValueError("evaluate: problems is empty")
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    dev = _device_of(model)
    responses = []
    for i in range(0, len(problems), batch_size):
        chunk = problems[i:i + batch_size]
        ids, mask = encode_prompts(chunk, tok, dev)
        ro = sample(model, ids, mask, max_new_tokens=task.max_new_tokens, eos_id=tok.eos_id, pad_id=tok.pad_id,
                    greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
        responses += tok.decode_batch(ro.response_ids.cpu())
    if was_training:
        model.train()
    rewards = task.score(responses, problems, checker)
    return {"accuracy": rewards.mean().item(), "rewards": rewards, "responses": responses}
