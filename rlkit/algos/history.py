"""What a trainer returns besides the policy: a record of the run, for plots and checks.

:class:`History` holds two time series:

* **per update** (one entry per gradient update of the trainer): ``steps`` (env steps so far),
  ``wall_time`` (seconds since training began) and a dict ``stats`` of named lists, e.g.
  ``loss``, ``policy_loss``, ``value_loss``, ``entropy``, ``kl`` (KL(pi_old || pi_new) on the batch),
  ``clip_frac``, ``grad_norm``, ``lr``.  ``history["kl"]`` is a shortcut for ``history.stats["kl"]``.
* **per completed episode**: ``episode_steps`` (env step count when it finished),
  ``episode_returns`` (undiscounted), ``episode_lengths``, ``episode_wall_time``.

Helpers: :meth:`~rlkit.algos.History.rolling_return` (the curve chapters plot),
:meth:`~rlkit.algos.History.steps_to` and :meth:`~rlkit.algos.History.time_to` (first point where
the mean of the last ``window`` episodes reaches a threshold), :meth:`~rlkit.algos.History.to_dict`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["History"]


@dataclass
class History:
    algo: str = ""
    config: dict = field(default_factory=dict)
    steps: list = field(default_factory=list)
    wall_time: list = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    episode_steps: list = field(default_factory=list)
    episode_returns: list = field(default_factory=list)
    episode_lengths: list = field(default_factory=list)
    episode_wall_time: list = field(default_factory=list)

    # ---- recording -------------------------------------------------------------------------
    def log_update(self, step: int, wall: float, **stats: float) -> None:
        """Append one update's stats. A stat missing from this update is stored as NaN, so every
        list in ``stats`` has ``len(self.steps)`` entries."""
        n = len(self.steps)
        self.steps.append(int(step))
        self.wall_time.append(float(wall))
        for k, v in stats.items():
            lst = self.stats.setdefault(k, [math.nan] * n)
            lst.append(float(v))
        for lst in self.stats.values():
            if len(lst) < n + 1:
                lst.append(math.nan)

    def sync_episodes(self, episodes, wall: float) -> None:
        """Copy the episodes an :class:`rlkit.rollout.EpisodeLog` finished since the last call,
        stamping them with the wall time ``wall``."""
        start = len(self.episode_returns)
        new = len(episodes.returns) - start
        self.episode_steps += episodes.steps[start:]
        self.episode_returns += episodes.returns[start:]
        self.episode_lengths += episodes.lengths[start:]
        self.episode_wall_time += [float(wall)] * new

    # ---- reading ---------------------------------------------------------------------------
    def __getitem__(self, key: str) -> list:
        if key in self.stats:
            return self.stats[key]
        if key in ("steps", "wall_time", "episode_steps", "episode_returns", "episode_lengths",
                   "episode_wall_time"):
            return getattr(self, key)
        raise KeyError(f"no stat named {key!r}; available: {sorted(self.stats)}")

    def mean_return(self, window: int = 20) -> float:
        """Mean undiscounted return of the last ``window`` completed episodes (NaN if none)."""
        if not self.episode_returns:
            return math.nan
        return float(np.mean(self.episode_returns[-window:]))

    def rolling_return(self, window: int = 20) -> tuple[np.ndarray, np.ndarray]:
        """``(episode_steps, mean of the last `window` returns at each completed episode)``.
        Until ``window`` episodes exist the mean is over those available."""
        r = np.asarray(self.episode_returns, dtype=float)
        if r.size == 0:
            return np.zeros(0), np.zeros(0)
        c = np.concatenate([[0.0], np.cumsum(r)])
        idx = np.arange(1, r.size + 1)
        lo = np.maximum(0, idx - window)
        return np.asarray(self.episode_steps), (c[idx] - c[lo]) / (idx - lo)

    def _first_reach(self, threshold: float, window: int):
        r = np.asarray(self.episode_returns, dtype=float)
        if r.size < window:
            return None
        c = np.concatenate([[0.0], np.cumsum(r)])
        means = (c[window:] - c[:-window]) / window          # mean of episodes [i, i+window)
        hit = np.flatnonzero(means >= threshold)
        return None if hit.size == 0 else int(hit[0] + window - 1)

    def steps_to(self, threshold: float, window: int = 20) -> int | None:
        """Env steps at which the mean of the last ``window`` completed episodes first reached
        ``threshold`` (None if never)."""
        i = self._first_reach(threshold, window)
        return None if i is None else int(self.episode_steps[i])

    def time_to(self, threshold: float, window: int = 20) -> float | None:
        """Wall-clock seconds (since training began, at update granularity) at which the mean of the
        last ``window`` episodes first reached ``threshold`` (None if never)."""
        i = self._first_reach(threshold, window)
        return None if i is None else float(self.episode_wall_time[i])

    def to_dict(self) -> dict[str, Any]:
        """A plain dict of lists (``stats`` flattened in), e.g. for ``pandas.DataFrame`` or json."""
        d = {"algo": self.algo, "config": dict(self.config), "steps": list(self.steps),
             "wall_time": list(self.wall_time)}
        d.update({k: list(v) for k, v in self.stats.items()})
        d.update(episode_steps=list(self.episode_steps), episode_returns=list(self.episode_returns),
                 episode_lengths=list(self.episode_lengths), episode_wall_time=list(self.episode_wall_time))
        return d

    def __repr__(self) -> str:
        return (f"History(algo={self.algo!r}, updates={len(self.steps)}, episodes={len(self.episode_returns)}, "
                f"env_steps={self.steps[-1] if self.steps else 0}, stats={sorted(self.stats)})")
