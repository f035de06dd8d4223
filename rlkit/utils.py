"""Small helpers every chapter uses: the device, seeding, masked means, timers, run scale.

Chapter: the setup page (book/setup.md) explains the thread and device choices made here.
"""
from __future__ import annotations

import os
import random
import time
from contextlib import contextmanager

import numpy as np
import torch

__all__ = ["device", "seed_everything", "masked_mean", "full_scale", "Timer", "timer"]


def device(prefer: str | None = None) -> torch.device:
    """The device a chapter runs on: CUDA if available, then Apple's MPS, then the CPU.

    ``prefer`` ("cuda", "mps" or "cpu") forces a choice; the environment variable
    ``RLKIT_DEVICE`` does the same without editing a notebook.
    """
    choice = prefer if prefer is not None else os.environ.get("RLKIT_DEVICE")
    if choice is not None:
        if choice not in ("cuda", "mps", "cpu"):
            raise ValueError(f"device: prefer must be 'cuda', 'mps' or 'cpu', got {choice!r}")
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


def seed_everything(seed: int = 0, threads: int | None = 1) -> torch.Generator:
    """Seed Python, NumPy and torch (CPU and CUDA) and set torch's CPU thread count.

    Returns a ``torch.Generator`` seeded with ``seed`` for code that wants its own stream.

    ``threads`` defaults to 1: the book's models are tiny, and on a shared 2-core machine
    torch with 2 threads ran a small PPO up to 30x slower (the threads wait on each other
    whenever another process holds a core) and no faster when the machine was idle.
    Pass ``threads=None`` to leave torch's setting alone, or set ``RLKIT_THREADS``.
    The same seed on the same machine gives the same numbers.
    """
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise TypeError(f"seed_everything: seed must be an int, got {type(seed).__name__}")
    env_threads = os.environ.get("RLKIT_THREADS")
    if env_threads is not None:
        threads = int(env_threads)
    if threads is not None:
        if threads < 1:
            raise ValueError(f"seed_everything: threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
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
    """Mean of ``x`` over the entries where ``mask`` is true (or 1).

    .. math:: \\bar x = \\frac{\\sum_i m_i x_i}{\\max(1, \\sum_i m_i)}

    ``mask`` must have exactly the shape of ``x`` (no silent broadcasting). With ``dim``
    the mean is taken along those dimensions only. An all-zero mask gives 0, not NaN.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"masked_mean: x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"masked_mean: x must be a floating-point tensor, got dtype {x.dtype}")
    if mask is None:
        return x.mean() if dim is None else x.mean(dim=dim, keepdim=keepdim)
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"masked_mean: mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.shape != x.shape:
        raise ValueError(f"masked_mean: mask must have the shape of x {tuple(x.shape)}, got {tuple(mask.shape)}")
    m = mask.to(x.dtype)
    if dim is None:
        return (x * m).sum() / m.sum().clamp_min(1.0)
    return (x * m).sum(dim=dim, keepdim=keepdim) / m.sum(dim=dim, keepdim=keepdim).clamp_min(1.0)


def full_scale() -> bool:
    """True when the reader asked for the bigger runs (``RLKIT_SCALE=full``).

    Every notebook picks its sizes from this switch: the default ("small") runs each chapter
    in a few minutes on a laptop CPU; "full" is meant for a GPU or a long coffee break.
    """
    value = os.environ.get("RLKIT_SCALE", "small").strip().lower()
    if value not in ("small", "full"):
        raise ValueError(f"RLKIT_SCALE must be 'small' or 'full', got {value!r}")
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
    """Context manager that prints how long its block took: ``with timer("rollout"): ...``."""
    t = Timer()
    yield t
    if verbose:
        print(f"{label or 'elapsed'}: {t.elapsed:.2f} s")
