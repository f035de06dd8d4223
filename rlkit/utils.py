"""Small helpers every chapter uses: the device, seeding, masked means, timers, run scale.

Chapter: the setup page (book/setup.md) explains the thread and device choices made here.
"""
from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Iterable
from contextlib import contextmanager

import numpy as np
import torch

from . import _validate as V

__all__ = ["device", "seeds", "seed_base", "seed_everything", "masked_mean", "clip_grad", "full_scale",
           "Timer", "timer"]


def device(prefer: str | None = None) -> torch.device:
    """The device a chapter runs on: CUDA if available, then Apple's MPS, then the CPU.

    ``prefer`` ("cuda", "mps" or "cpu") forces a choice; the environment variable
    ``RLKIT_DEVICE`` does the same without editing a notebook.
    """
    choice = prefer if prefer is not None else os.environ.get("RLKIT_DEVICE")
    if choice is not None:
        V.choice(choice, "prefer" if prefer is not None else "RLKIT_DEVICE", ("cuda", "mps", "cpu"))
        if choice == "cuda" and not torch.cuda.is_available():
            raise ValueError("device: prefer='cuda' but torch.cuda.is_available() is False")
        if choice == "mps" and not _mps_available():
            raise ValueError("device: prefer='mps' but the MPS backend is not available")
        return torch.device(choice)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if _mps_available():
        return torch.device("mps")
    return torch.device("cpu")


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def seed_base() -> int:
    """The number every chapter's seeds start from: ``RLKIT_SEED_BASE`` (an int), 0 when unset.

    Changing it reruns every experiment in the book on seeds it was not written on, which is how
    the robustness runner (``python -m rlkit.robustness``) checks that a claim is not one seed's luck.
    """
    raw = os.environ.get("RLKIT_SEED_BASE", "0").strip()
    try:
        base = int(raw)
    except ValueError:
        raise ValueError(f"RLKIT_SEED_BASE must be an integer, got {raw!r}") from None
    if not 0 <= base <= 2**31:
        raise ValueError(f"RLKIT_SEED_BASE must be in [0, 2**31], got {base}")
    return base


def seeds(n: int, start: int = 0) -> list[int]:
    """The seeds of an experiment with ``n`` runs: ``[base + start, ..., base + start + n - 1]``.

    ``base`` is :func:`seed_base` (the ``RLKIT_SEED_BASE`` switch). Every seed list in the book
    comes from here, so one variable moves all of them; ``start`` keeps two experiments in one
    chapter on different seeds (``seeds(5)`` and ``seeds(5, start=100)``). Index results by
    ``SEEDS[0]``, never by a literal seed.
    """
    n = V.int_in(n, "n")
    start = V.int_in(start, "start", 0, 2**31)
    base = seed_base()
    return [base + start + i for i in range(n)]


def seed_everything(seed: int = 0, threads: int | None = 1) -> torch.Generator:
    """Seed Python, NumPy and torch (CPU and CUDA) and set torch's CPU thread count.

    Returns a ``torch.Generator`` seeded with ``seed`` for code that wants its own stream.

    ``threads`` defaults to 1: the book's models are tiny, and on a shared 2-core machine
    torch with 2 threads ran a small PPO up to 30x slower (the threads wait on each other
    whenever another process holds a core) and no faster when the machine was idle.
    Pass ``threads=None`` to leave torch's setting alone, or set ``RLKIT_THREADS``.
    The same seed on the same machine gives the same numbers.
    """
    V.int_in(seed, "seed", -2**63, 2**64 - 1)
    env_threads = os.environ.get("RLKIT_THREADS")
    if env_threads is not None:
        if not env_threads.strip().isdigit():
            raise ValueError(f"RLKIT_THREADS must be a positive int, got {env_threads!r}")
        threads = int(env_threads)
    if threads is not None:
        torch.set_num_threads(V.int_in(threads, "threads"))
    seed = int(seed)
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    gen = torch.Generator()
    gen.manual_seed(seed)
    return gen


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None = None, dim=None, keepdim: bool = False) -> torch.Tensor:
    r"""Mean of ``x`` over the entries where ``mask`` is true (or 1): rlkit's one masked mean.

    .. math:: \bar x = \frac{\sum_i m_i x_i}{\max\big(1, \sum_i m_i\big)}

    Masked-out entries are never read: they may hold NaN or inf (padding) and reach neither the
    value nor the gradient. **An all-false mask, or an empty** ``x``, **gives 0** (with a zero
    gradient), never NaN: "no sample" contributes nothing to a loss or a running statistic.

    Args:
        x: floating tensor of any shape.
        mask: ``None`` or a bool / 0-1 tensor of exactly ``x``'s shape (no silent broadcasting).
        dim: ``None`` (all entries) or the dimension(s) to average over: an int or a tuple of
            distinct ints, each in ``[-x.dim(), x.dim() - 1]``.
        keepdim: ``True`` or ``False``; keep the reduced dimensions (only read with ``dim``).

    Returns: a 0-dim tensor (``dim=None``) or ``x`` with ``dim`` reduced.

    Chapters: every loss of chapters 1-13 averages over real tokens or steps with it.
    """
    V.float_tensor(x, "x", min_dim=0)
    m = V.check_mask(mask, x, "x")
    dims = _dims(dim, x)
    V.boolean(keepdim, "keepdim")
    if m is None:
        n = x.numel() if dim is None else math.prod(x.shape[d] for d in dims)
        if dim is None:
            return x.mean() if n else x.sum()
        return x.mean(dim=dim, keepdim=keepdim) if n else x.sum(dim=dim, keepdim=keepdim)
    kept = torch.where(m > 0, x, torch.zeros((), dtype=x.dtype, device=x.device))
    if dim is None:
        return kept.sum() / m.sum().clamp(min=1.0)
    return kept.sum(dim=dim, keepdim=keepdim) / m.sum(dim=dim, keepdim=keepdim).clamp(min=1.0)


def _dims(dim, x: torch.Tensor) -> tuple | None:
    """``dim`` of :func:`masked_mean` checked, as a tuple of non-negative ints (None stays None)."""
    if dim is None:
        return None
    n = max(x.dim(), 1)
    dims = (dim,) if isinstance(dim, int) and not isinstance(dim, bool) else dim
    V.instance_of(dims, "dim", (tuple, list), "int, a tuple of ints, or None")
    out = tuple(V.int_in(d, "dim", -n, n - 1) % n for d in dims)
    V.distinct(out, "dim")
    return out


def clip_grad(params, max_norm: float | None) -> float:
    """Clip the global gradient norm of ``params`` to ``max_norm`` (``None``: no clipping).

    ``params``: an iterable of tensors (parameters), or one tensor. ``max_norm``: a number ``> 0``
    (``inf`` never clips, like ``None``). Returns the norm BEFORE clipping, as a float. Every rlkit
    trainer (CartPole and LLM) clips with it.
    """
    if isinstance(params, torch.Tensor):
        params = [params]
    V.instance_of(params, "params", Iterable, "iterable of tensors (e.g. model.parameters())")
    params = V.tuple_of(list(params), "params", torch.Tensor, "torch.Tensor")
    max_norm = math.inf if max_norm is None else V.real_in(max_norm, "max_norm", 0.0, lo_open=True, allow_inf=True)
    return float(torch.nn.utils.clip_grad_norm_(params, max_norm))


def full_scale() -> bool:
    """True when the reader asked for the bigger runs (``RLKIT_SCALE=full``).

    Every notebook picks its sizes from this switch: the default ("small") runs each chapter
    in a few minutes on a laptop CPU; "full" is meant for a GPU or a long coffee break.
    """
    value = V.choice(os.environ.get("RLKIT_SCALE", "small").strip().lower(), "RLKIT_SCALE", ("small", "full"))
    return value == "full"


class Timer:
    """Wall-clock stopwatch: ``t = Timer(); ...; t.elapsed`` (seconds, float)."""

    def __init__(self):
        self.start = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def reset(self) -> None:
        self.start = time.perf_counter()


@contextmanager
def timer(label: str = "", verbose: bool = True):
    """Context manager that prints how long its block took: ``with timer("rollout"): ...``.

    ``label``: a str (``""`` prints ``elapsed``); ``verbose``: True or False (False prints nothing).
    """
    V.instance_of(label, "label", str)
    V.boolean(verbose, "verbose")
    t = Timer()
    yield t
    if verbose:
        print(f"{label or 'elapsed'}: {t.elapsed:.2f} s")
