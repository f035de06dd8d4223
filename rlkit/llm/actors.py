r"""The tiny LLM as an actor of an :class:`rlkit.distributed.ActorPool`: a model factory, a group sampler, a merge.

Chapter: 16_offpolicy_multistep (real asynchronous actors).

:mod:`rlkit.distributed` moves weights and samples between a learner and its actors and knows
nothing about language models. This module is what an actor of the tiny LLM needs:

* :func:`tiny_llm`, the ``make_model`` of the pool (the shipped model, on the CPU);
* :class:`GroupSampler`, its ``sample_fn``: one :class:`rlkit.llm.rl.Batch` of ``prompts`` groups of
  ``group_size`` responses, with the behaviour log-probs :math:`\log\mu(y_t)` recorded at sampling time;
* :func:`merge_batches`, which stacks the batches of several :class:`rlkit.distributed.Sampled` into
  one, with the version that sampled every row.

The learner side, :class:`rlkit.llm.samplers.Pool`, is the sampler of :func:`rlkit.llm.train` that
consumes a pool's samples. Both ``tiny_llm`` and ``GroupSampler`` are importable, picklable objects,
as the process and Ray backends require.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .. import _validate as V
from ..distributed import Sampled
from .checkpoint import load_pretrained
from .rl import Batch, RLConfig, collect
from .sampling import cat_rollouts
from .tasks import Task, get_task
from .tokenizer import CharTokenizer

__all__ = ["tiny_llm", "GroupSampler", "merge_batches"]


def tiny_llm() -> torch.nn.Module:
    """The shipped tiny GPT in eval mode, on the CPU (``make_model`` for an :class:`rlkit.distributed.ActorPool`).

    Chapter: 16_offpolicy_multistep.
    """
    model, _ = load_pretrained()
    return model.eval()


_TOKENIZER = None


def _shipped_tokenizer() -> CharTokenizer:
    global _TOKENIZER
    if _TOKENIZER is None:
        _TOKENIZER = load_pretrained()[1]
    return _TOKENIZER


@dataclass(frozen=True)
class GroupSampler:
    r"""``sample_fn`` of an :class:`~rlkit.distributed.ActorPool` on the tiny LLM: ``prompts`` x ``group_size`` answers.

    ``GroupSampler(task)(model, rng_seed, request) -> rlkit.llm.rl.Batch``: draws the prompts with
    ``random.Random(rng_seed)``, samples with a ``torch.Generator`` seeded ``rng_seed`` at
    ``temperature`` (:func:`rlkit.llm.collect`), and scores them with the task's ``"exact"`` checker,
    using the shipped tokenizer (:func:`rlkit.llm.load_pretrained`). The batch's
    ``rollout.model_logprobs`` ``[prompts * group_size, tokens]`` are the behaviour log-probs
    :math:`\log\mu(y_t)` (temperature 1: the policy itself); ``rollout.logprobs`` those of the
    distribution sampled from. ``task`` is a task name (``rlkit.llm.TASKS``) or a
    :class:`rlkit.llm.Task` whose functions are importable.

    Chapter: 16_offpolicy_multistep.
    """

    task: Any = "addition"
    group_size: int = 8
    prompts: int = 1
    temperature: float = 1.0

    def __post_init__(self):
        V.instance_of(self.task, "GroupSampler.task", (str, Task), "task name or rlkit.llm.Task")
        V.int_in(self.group_size, "GroupSampler.group_size")
        V.int_in(self.prompts, "GroupSampler.prompts")
        V.real_in(self.temperature, "GroupSampler.temperature", 0.0, lo_open=True)

    def __call__(self, model, rng_seed: int, request: int) -> Batch:
        task = get_task(self.task) if isinstance(self.task, str) else self.task
        cfg = RLConfig(algo="grpo" if self.group_size >= 2 else "reinforce", prompts_per_step=self.prompts,
                       group_size=self.group_size, minibatches=1, temperature=self.temperature)
        rng = random.Random(rng_seed)
        gen = torch.Generator().manual_seed(rng_seed)
        return collect(model, _shipped_tokenizer(), task, cfg, rng, gen, next(model.parameters()).device)


def merge_batches(samples: Sequence[Sampled], tok: CharTokenizer) -> tuple[Batch, torch.Tensor]:
    r"""Stack the :class:`rlkit.llm.rl.Batch` payloads of ``samples`` into one batch, with the version of every row.

    Returns ``(batch, versions)``: ``batch`` concatenates problems, rollouts (prompts left-padded to
    the longest with ``tok.pad_id``, responses right-padded to the widest), rewards, correct and
    responses in the order of ``samples``; ``versions`` is ``long[rows]``, the version that sampled
    each row (the lag of row :math:`b` is ``pool.version - versions[b]``). A group stays in
    consecutive rows, so :func:`rlkit.llm.sequence_advantages` applies to the merged rewards.
    ``tok`` is the tokenizer the samples were encoded with (its ``pad_id`` pads).

    Chapter: 16_offpolicy_multistep.
    """
    V.instance_of(samples, "samples", Sequence, "sequence of Sampled")
    pad = V.int_in(getattr(tok, "pad_id", None), "tok.pad_id", 0)
    if not samples:
        raise ValueError("samples is empty: nothing to merge")
    for i, s in enumerate(samples):
        V.instance_of(s, f"samples[{i}]", Sampled)
        V.instance_of(s.payload, f"samples[{i}].payload", Batch, "rlkit.llm.rl.Batch (from GroupSampler)")
    bs = [s.payload for s in samples]
    width = max(b.rollout.response_ids.shape[1] for b in bs)
    ro = cat_rollouts([b.rollout for b in bs], pad, width)
    versions = torch.cat([torch.full((len(b.rollout),), s.version, dtype=torch.long) for s, b in zip(samples, bs)])
    merged = Batch([p for b in bs for p in b.problems], ro, torch.cat([b.rewards for b in bs]),
                   torch.cat([b.correct for b in bs]), [r for b in bs for r in b.responses],
                   float(np.mean([b.zero_var_share for b in bs])))
    return merged, versions
