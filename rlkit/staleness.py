r"""Training on stale data: version tags, lag, filters, windows, clip radii, monitors, config.

Part II of the book (chapters 11-13) splits the penalty of an off-policy update into the
**update shift** :math:`U_k` (how far the update moves :math:`\pi_{k+1}` from :math:`\pi_k`) and the
**sampling staleness** :math:`S_k` (how far the versions that produced the batch are from
:math:`\pi_k`). This module is the sampler-side and monitoring half of that story:

Samples and versions

* :class:`LagDistribution` - how many versions old a batch is when the learner uses it
  (fixed, uniform, geometric or any table of probabilities).
* :class:`PolicyArchive` - the last few published policy versions, so that a simulation can
  sample with version :math:`k - \ell` (simulated asynchronous sampling, chapter 12).
* :class:`VersionedBuffer` - every sample carries the version that produced it and its
  log-probabilities under that version (the behaviour log-probs).

Sampler-side control of :math:`S_k` (chapter 12)

* :func:`staleness_filter` - drop samples with :math:`|\rho_k - 1| > \epsilon_{\text{stale}}`.
* :func:`version_window` - keep only data from the :math:`W` most recent versions.
* :func:`geppo_clip_radius`, :func:`age_clip_radius` - shrink the clip radius for older data.

Measuring (Lemma 5.1, chapters 11-13)

* :func:`update_shift` :math:`\hat U_k = \tfrac12\,\overline{|\rho_{k+1}-\rho_k|}`,
  :func:`staleness` :math:`\hat S_k = \tfrac12\,\overline{|\rho_k-1|}`,
  :func:`effective_sample_size`, :func:`mean_by_age`.
* :class:`Threshold`, :class:`Alert`, :class:`Monitor` - alert rules on those numbers.
* :class:`Checkpoint` - the last good weights and optimiser state, for a rollback.

Configuration (chapter 13)

* :class:`StaleTrainingConfig` - the knobs of a stale-data trainer, checked on construction with
  errors that name the field.

Ratios: :math:`\rho_{k+1} = \pi_\theta(a\mid s)/\mu(a\mid s)`, :math:`\rho_k = \pi_k(a\mid s)/\mu(a\mid s)`,
with :math:`\mu = \pi^{(i)}` the version that sampled :math:`a`. They are formed from
log-probabilities, in log space until the last moment. Tensors may have any shape (LLM tensors are
``[batch, tokens]`` with a ``mask`` of real tokens); nothing is broadcast silently.

Chapters: 12_clipping_staleness, 13_engineering_checklist.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, fields
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from . import _validate as V

Tensor = torch.Tensor

__all__ = [
    "LagDistribution", "PolicyArchive", "VersionedBuffer",
    "staleness_filter", "version_window", "geppo_clip_radius", "age_clip_radius",
    "update_shift", "staleness", "effective_sample_size", "mean_by_age",
    "Threshold", "Alert", "Monitor", "METRICS", "Checkpoint",
    "METHODS", "CLIP_SCHEDULES", "FILTER_LEVELS", "StaleTrainingConfig",
]


# ============================================================================================
# Small argument checks
# ============================================================================================

def _int(x, name: str, lo: int = 0) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    if x < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {x}")
    return x


def _logp_pair(a, a_name: str, b, b_name: str) -> None:
    V.float_tensor(a, a_name, min_dim=0)
    V.float_tensor(b, b_name, min_dim=0)
    V.same_layout(a, a_name, b, b_name)


def _mask(mask, ref: Tensor, ref_name: str) -> Optional[Tensor]:
    """``None`` or a bool/0-1 mask shaped like ``ref``, returned as a bool tensor."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor or None, got {type(mask).__name__}")
    if tuple(mask.shape) != tuple(ref.shape):
        raise ValueError(f"mask has shape {tuple(mask.shape)} but {ref_name} has shape {tuple(ref.shape)} "
                         f"(rlkit never broadcasts silently)")
    if mask.device != ref.device:
        raise ValueError(f"mask is on {mask.device} but {ref_name} is on {ref.device}")
    if mask.dtype != torch.bool:
        if mask.numel() and not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError("mask must be bool or hold only 0 and 1")
        mask = mask != 0
    return mask


def _masked_mean(x: Tensor, m: Optional[Tensor]) -> Tensor:
    """Mean of ``x`` over the entries where ``m`` is True (0-dim; NaN if none are)."""
    if m is None:
        return x.mean() if x.numel() else torch.full((), math.nan, dtype=x.dtype, device=x.device)
    n = m.sum()
    s = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum()
    return s / n if int(n) > 0 else torch.full((), math.nan, dtype=x.dtype, device=x.device)


def _abs_exp_diff(log_a: Tensor, log_b: Tensor) -> Tensor:
    r""":math:`|e^{a} - e^{b}| = e^{b}\,|\mathrm{expm1}(a - b)|`, accurate when ``a`` is close to ``b``."""
    return torch.exp(log_b) * torch.expm1(log_a - log_b).abs()


# ============================================================================================
# Lag, archive of versions, version-tagged buffer
# ============================================================================================

@dataclass(frozen=True)
class LagDistribution:
    r"""The distribution of the lag :math:`\ell` (in policy versions) of the data a learner uses.

    In an asynchronous pipeline the learner at version :math:`k` trains on samples generated by
    version :math:`k - \ell`. ``probs[l]`` is :math:`P(\ell = l)` for :math:`l = 0, \dots, L`.
    Construct it with :meth:`fixed`, :meth:`uniform`, :meth:`geometric` or from any table.

    What "staleness" counts differs between systems (chapter 13): here it is versions, i.e.
    optimiser steps of the learner, the unit of AReaL's ``max_head_offpolicyness`` and of
    PipelineRL's ``max_lag`` (which counts samples, not versions; see the chapter).

    Chapter: 12_clipping_staleness.
    """

    probs: Tuple[float, ...]

    def __post_init__(self):
        p = tuple(self.probs) if not isinstance(self.probs, torch.Tensor) else tuple(self.probs.tolist())
        if len(p) == 0:
            raise ValueError("LagDistribution.probs must hold at least one probability (for lag 0)")
        for i, x in enumerate(p):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
                raise ValueError(f"LagDistribution.probs[{i}] must be a finite number >= 0, got {x!r}")
        s = sum(p)
        if abs(s - 1.0) > 1e-6:
            raise ValueError(f"LagDistribution.probs must sum to 1, got {s:.6g}")
        while len(p) > 1 and p[-1] == 0:       # trailing zeros do not change the distribution
            p = p[:-1]
        object.__setattr__(self, "probs", tuple(float(x) / s for x in p))

    @classmethod
    def fixed(cls, lag: int) -> "LagDistribution":
        """Every batch is exactly ``lag`` versions old."""
        lag = _int(lag, "lag")
        return cls(tuple([0.0] * lag + [1.0]))

    @classmethod
    def uniform(cls, max_lag: int, min_lag: int = 0) -> "LagDistribution":
        """Lags ``min_lag, ..., max_lag`` with equal probability."""
        max_lag, min_lag = _int(max_lag, "max_lag"), _int(min_lag, "min_lag")
        if min_lag > max_lag:
            raise ValueError(f"min_lag ({min_lag}) must be <= max_lag ({max_lag})")
        n = max_lag - min_lag + 1
        return cls(tuple([0.0] * min_lag + [1.0 / n] * n))

    @classmethod
    def geometric(cls, mean: float, max_lag: int) -> "LagDistribution":
        r"""A geometric lag :math:`P(\ell) \propto q^\ell` truncated at ``max_lag``, with
        :math:`q = m/(1+m)` chosen so that the *untruncated* mean is ``mean`` = :math:`m`
        (a queue whose consumer is usually, not always, keeping up)."""
        mean = V.finite_float(mean, "mean", 0.0)
        max_lag = _int(max_lag, "max_lag")
        q = mean / (1.0 + mean)
        w = [q ** l for l in range(max_lag + 1)]
        s = sum(w)
        return cls(tuple(x / s for x in w))

    @property
    def min(self) -> int:
        """The smallest lag with positive probability."""
        return next(i for i, p in enumerate(self.probs) if p > 0)

    @property
    def max(self) -> int:
        """The largest lag with positive probability."""
        return len(self.probs) - 1

    @property
    def mean(self) -> float:
        """:math:`\\mathbb E[\\ell]`."""
        return float(sum(i * p for i, p in enumerate(self.probs)))

    def share_at_least(self, lag: int) -> float:
        """:math:`P(\\ell \\ge` ``lag`` :math:`)`: the share of data a window of ``lag`` versions drops."""
        lag = _int(lag, "lag")
        return float(sum(self.probs[lag:]))

    def sample(self, n: int, generator: Optional[torch.Generator] = None) -> Tensor:
        """``n`` i.i.d. lags, ``long[n]`` (on the CPU)."""
        n = _int(n, "n", 1)
        p = torch.tensor(self.probs, dtype=torch.float64)
        if len(self.probs) == 1:
            return torch.zeros(n, dtype=torch.long)
        return torch.multinomial(p, n, replacement=True, generator=generator)

    def __repr__(self) -> str:
        if len(self.probs) - 1 == self.min:
            return f"LagDistribution.fixed({self.min})"
        return f"LagDistribution(min={self.min}, max={self.max}, mean={self.mean:.2f})"


class PolicyArchive:
    r"""The most recent published policy versions, for simulating lagged samplers.

    ``push(version, policy)`` stores a frozen deep copy of ``policy`` (an ``nn.Module``) under an
    increasing integer ``version``; ``get(version)`` returns it. Only the newest ``capacity``
    versions are kept (a sampler never needs a version older than the largest lag).
    ``behaviour_versions(current, lags)`` turns lags into the versions that sample, clamped to
    the oldest version still held (early in training fewer versions exist, so realised lags can
    be smaller than the requested ones: use the returned versions, not the requested lags).

    Chapter: 12_clipping_staleness.
    """

    def __init__(self, capacity: int):
        self.capacity = _int(capacity, "capacity", 1)
        self._store: Dict[int, torch.nn.Module] = {}

    def push(self, version: int, policy: torch.nn.Module) -> None:
        version = _int(version, "version")
        if not isinstance(policy, torch.nn.Module):
            raise TypeError(f"policy must be a torch.nn.Module, got {type(policy).__name__}")
        if self._store and version <= max(self._store):
            raise ValueError(f"version must increase: got {version} after {max(self._store)}")
        snap = copy.deepcopy(policy)
        snap.eval()
        for p in snap.parameters():
            p.requires_grad_(False)
        self._store[version] = snap
        while len(self._store) > self.capacity:
            del self._store[min(self._store)]

    def get(self, version: int) -> torch.nn.Module:
        version = _int(version, "version")
        if version not in self._store:
            raise KeyError(f"version {version} is not in the archive (held: {self.versions})")
        return self._store[version]

    @property
    def versions(self) -> List[int]:
        return sorted(self._store)

    @property
    def latest(self) -> int:
        if not self._store:
            raise ValueError("the archive is empty: push a version first")
        return max(self._store)

    def behaviour_versions(self, current: int, lags: Tensor) -> Tensor:
        """``clamp(current - lags, oldest held version)``; ``lags`` long tensor of any shape."""
        current = _int(current, "current")
        if not isinstance(lags, torch.Tensor) or lags.dtype != torch.long:
            raise TypeError("lags must be a LongTensor")
        if lags.numel() and int(lags.min()) < 0:
            raise ValueError("lags must be >= 0")
        if current not in self._store:
            raise ValueError(f"current version {current} is not in the archive (held: {self.versions})")
        return (current - lags).clamp(min=min(self._store))

    def __len__(self) -> int:
        return len(self._store)

    def __repr__(self) -> str:
        return f"PolicyArchive(capacity={self.capacity}, versions={self.versions})"


class VersionedBuffer:
    r"""A buffer in which every sample carries the version that produced it and its log-probs.

    ``put(version, logp, **fields)`` appends ``n`` samples: ``version`` is an int (all samples
    from one version) or a ``long[n]`` tensor, ``logp`` the behaviour log-probabilities
    :math:`\log\pi^{(i)}(a\mid s)` (``[n]`` or ``[n, tokens]``) and every field a tensor with leading
    dimension ``n`` (observations, actions, advantages, masks...). ``take(current, window)``
    returns every stored sample as one dict (``"version"``, ``"age"`` = ``current - version``,
    ``"logp_behav"`` and the fields), keeping only the ``window`` most recent versions if a
    window is given; ``consume=True`` (default) empties the buffer (on-policy style: every sample
    is used once), ``consume=False`` keeps the samples for reuse and only evicts those that left
    the window. ``capacity`` (samples) evicts the oldest samples first.

    Chapter: 12_clipping_staleness.
    """

    def __init__(self, capacity: Optional[int] = None):
        self.capacity = None if capacity is None else _int(capacity, "capacity", 1)
        self._chunks: List[Dict[str, Tensor]] = []
        self._keys: Optional[Tuple[str, ...]] = None

    def __len__(self) -> int:
        return sum(int(c["version"].shape[0]) for c in self._chunks)

    def put(self, version: Union[int, Tensor], logp: Tensor, **fields: Tensor) -> None:
        V.float_tensor(logp, "logp", min_dim=1)
        n = int(logp.shape[0])
        if isinstance(version, torch.Tensor):
            if version.dtype != torch.long or tuple(version.shape) != (n,):
                raise ValueError(f"version must be an int or a LongTensor of shape [{n}], got "
                                 f"{version.dtype} {tuple(version.shape)}")
            if n and int(version.min()) < 0:
                raise ValueError("versions must be >= 0")
            ver = version.to(logp.device)
        else:
            ver = torch.full((n,), _int(version, "version"), dtype=torch.long, device=logp.device)
        for k, x in fields.items():
            if k in ("version", "age", "logp_behav"):
                raise ValueError(f"field name {k!r} is reserved")
            if not isinstance(x, torch.Tensor) or x.dim() < 1 or int(x.shape[0]) != n:
                raise ValueError(f"field {k!r} must be a tensor with leading dimension {n} (like logp), got "
                                 f"{getattr(x, 'shape', type(x).__name__)}")
        keys = tuple(sorted(fields))
        if self._keys is not None and keys != self._keys:
            raise ValueError(f"every put must have the same fields: had {self._keys}, got {keys}")
        self._keys = keys
        chunk = {"version": ver, "logp_behav": logp.detach(), **{k: v.detach() for k, v in fields.items()}}
        self._chunks.append(chunk)
        if self.capacity is not None:
            self._evict_to(self.capacity)

    def _evict_to(self, cap: int) -> None:
        while len(self) > cap:
            first = self._chunks[0]
            extra = len(self) - cap
            n0 = int(first["version"].shape[0])
            if extra >= n0:
                self._chunks.pop(0)
            else:
                self._chunks[0] = {k: v[extra:] for k, v in first.items()}

    def versions(self) -> Tensor:
        """The version of every stored sample, ``long[len(self)]``."""
        if not self._chunks:
            return torch.zeros(0, dtype=torch.long)
        return torch.cat([c["version"] for c in self._chunks])

    def take(self, current: int, window: Optional[int] = None, consume: bool = True) -> Dict[str, Tensor]:
        current = _int(current, "current")
        if window is not None:
            window = _int(window, "window", 1)
        if not self._chunks:
            raise ValueError("the buffer is empty")
        out = {k: torch.cat([c[k] for c in self._chunks]) for k in self._chunks[0]}
        if int(out["version"].max()) > current:
            raise ValueError(f"the buffer holds samples of version {int(out['version'].max())}, newer than "
                             f"current={current}")
        out["age"] = current - out["version"]
        if window is not None:
            keep = version_window(out["version"], current, window)
            out = {k: v[keep] for k, v in out.items()}
            self._chunks = [{k: v[version_window(c["version"], current, window)] for k, v in c.items()}
                            for c in self._chunks]
            self._chunks = [c for c in self._chunks if c["version"].numel()]
        if consume:
            self._chunks = []
        return out

    def clear(self) -> None:
        self._chunks = []


# ============================================================================================
# Sampler-side control of S_k
# ============================================================================================

FILTER_LEVELS = ("token", "sequence", "sequence-mean")


def staleness_filter(logp_prox: Tensor, logp_behav: Tensor, eps_stale: float, mask: Optional[Tensor] = None,
                     level: str = "token") -> Tensor:
    r"""Keep-mask of the staleness filter: drop samples with :math:`|\rho_k - 1| > \epsilon_{\text{stale}}`.

    .. math:: \text{keep} = \mathbf 1\big\{|\rho_k - 1| \le \epsilon_{\text{stale}}\big\},
              \qquad \rho_k = \exp(\log\pi_k - \log\mu).

    After the filter every kept sample has :math:`|\rho_k-1|\le\epsilon_{\text{stale}}`, so the
    staleness measured on the kept samples is at most :math:`\epsilon_{\text{stale}}/2`
    (:func:`staleness`). The price: the dropped samples were generated for nothing, and the
    kept ones are no longer distributed as :math:`\mu` (the filter is a selection on the
    ratio, chapter 12).

    ``level`` says what a *sample* is for LLM tensors ``[batch, tokens]``:

    * ``"token"``: each token is judged by its own ratio.
    * ``"sequence"``: each response by its sequence ratio :math:`\prod_t\rho_{k,t}` (the ratio of
      the response as one action; heavy-tailed for long responses).
    * ``"sequence-mean"``: by the length-normalised ratio :math:`\exp(\overline{\log\rho_{k,t}})`
      (GSPO's choice of sequence ratio).

    The sequence levels need a last dimension (tokens) and broadcast each response's decision
    to its tokens. Positions where ``mask`` is False are returned False.

    Args:
        logp_prox: log-probs under the current policy :math:`\pi_k`, any shape (``[B, T]`` for LLMs).
        logp_behav: log-probs under the version that sampled, same shape, dtype, device.
        eps_stale: threshold ``> 0``.
        mask: optional bool / 0-1 mask of real samples.
        level: one of :data:`FILTER_LEVELS`.

    Returns: bool tensor of the input's shape (True = keep). Finite for log-ratios of +-80.

    Chapter: 12_clipping_staleness.
    """
    _logp_pair(logp_prox, "logp_prox", logp_behav, "logp_behav")
    eps_stale = V.finite_float(eps_stale, "eps_stale", 0.0, lo_open=True)
    V.choice(level, "level", FILTER_LEVELS)
    m = _mask(mask, logp_prox, "logp_prox")
    log_rho = logp_prox.detach() - logp_behav.detach()
    if m is not None:
        log_rho = torch.where(m, log_rho, torch.zeros((), dtype=log_rho.dtype, device=log_rho.device))
    if level == "token":
        keep = torch.expm1(log_rho).abs() <= eps_stale
    else:
        if log_rho.dim() < 1:
            raise ValueError(f"level={level!r} needs a tokens dimension (last), got a 0-dim tensor")
        s = log_rho.sum(-1)
        if level == "sequence-mean":
            n = (m.sum(-1) if m is not None else torch.full_like(s, log_rho.shape[-1])).clamp(min=1)
            s = s / n
        keep = (torch.expm1(s).abs() <= eps_stale)[..., None].expand_as(log_rho)
    return keep if m is None else keep & m


def version_window(versions: Tensor, current: int, window: int) -> Tensor:
    r"""Keep-mask of a version window: data from the ``window`` most recent versions only.

    .. math:: \text{keep} = \mathbf 1\{k - v < W\},

    with :math:`k` = ``current`` and :math:`v` the version of each sample: :math:`W = 1` is
    strictly on-policy, :math:`W = L + 1` keeps every lag up to :math:`L`. A window bounds the
    *age*, which bounds :math:`S_k` only indirectly (by how far :math:`W` updates can move the
    policy); the staleness filter bounds the ratio itself.

    Args: ``versions`` long tensor of any shape (each entry ``<= current``), ``current`` int,
    ``window`` int ``>= 1``. Returns a bool tensor shaped like ``versions``.

    Chapter: 12_clipping_staleness.
    """
    if not isinstance(versions, torch.Tensor) or versions.dtype != torch.long:
        raise TypeError(f"versions must be a LongTensor, got {getattr(versions, 'dtype', type(versions).__name__)}")
    current = _int(current, "current")
    window = _int(window, "window", 1)
    if versions.numel() and int(versions.max()) > current:
        raise ValueError(f"versions holds {int(versions.max())} > current={current}: data from the future")
    return (current - versions) < window


def geppo_clip_radius(eps: float, version_weights: Union[Sequence[float], Tensor]) -> float:
    r"""GePPO's clip radius for a batch mixing the last :math:`M` versions (Queeney et al., 2021).

    With weight :math:`\nu_i` on the data of age :math:`i` (:math:`i = 0, \dots, M-1`,
    :math:`\sum_i\nu_i=1`),

    .. math:: \epsilon_{\text{GePPO}} = \frac{\epsilon_{\text{PPO}}}{\sum_i \nu_i\,(i+1)} .

    Why: if every update moves the policy by at most :math:`\epsilon/2` in expected TV (the
    clip's budget), data of age :math:`i` can be up to :math:`(i+1)\epsilon/2` from the policy
    after this update, :math:`\mathbb E_\nu[i+1]\,\epsilon/2` on average; dividing by
    :math:`\mathbb E_\nu[i+1]` gives back PPO's worst case. Uniform weights over :math:`M`
    versions give :math:`2\epsilon/(M+1)`. One radius for the whole batch: GePPO shrinks it by
    the *mean* age, not per sample (compare :func:`age_clip_radius`).

    Args: ``eps`` > 0; ``version_weights`` non-negative, summing to 1 (index = age).
    Returns: a float. Chapter: 12_clipping_staleness.
    """
    eps = V.finite_float(eps, "eps", 0.0, lo_open=True)
    w = torch.as_tensor(version_weights, dtype=torch.float64).flatten()
    if w.numel() == 0 or not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise ValueError("version_weights must be a non-empty sequence of finite numbers >= 0")
    if abs(float(w.sum()) - 1.0) > 1e-6:
        raise ValueError(f"version_weights must sum to 1, got {float(w.sum()):.6g}")
    ages = torch.arange(w.numel(), dtype=torch.float64)
    return eps / float((w * (ages + 1)).sum())


def age_clip_radius(eps: float, ages: Tensor) -> Tensor:
    r"""A per-sample clip radius that shrinks with the age of the sample: :math:`\epsilon/(1+a)`.

    .. math:: \epsilon(a) = \frac{\epsilon}{1 + a},\qquad a = k - v .

    The per-sample form of :func:`geppo_clip_radius` (which divides by the *mean* of
    :math:`1 + a` over the batch): a sample of age :math:`a` is charged for the :math:`a`
    updates it has already lived through, so the optimiser "swallows" part of the staleness
    budget. The source article attributes this age-dependent radius to GePPO; the GePPO paper
    and code use one radius for all ages (chapter 12 compares the two).

    Args: ``eps`` > 0; ``ages`` integer or float tensor of ages ``>= 0``, any shape.
    Returns: float tensor shaped like ``ages`` (float32 unless ``ages`` is floating).
    Chapter: 12_clipping_staleness.
    """
    eps = V.finite_float(eps, "eps", 0.0, lo_open=True)
    if not isinstance(ages, torch.Tensor):
        raise TypeError(f"ages must be a torch.Tensor, got {type(ages).__name__}")
    a = ages if ages.is_floating_point() else ages.to(torch.float32)
    if a.numel() and (not bool(torch.isfinite(a).all()) or float(a.min()) < 0):
        raise ValueError("ages must be finite and >= 0")
    return eps / (1.0 + a)


# ============================================================================================
# Estimators (Lemma 5.1)
# ============================================================================================

def update_shift(logp_new: Tensor, logp_prox: Tensor, logp_behav: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    r"""Sample estimate of the update shift :math:`U_k` (Lemma 5.1; chapter 11, eq-ch11-estimators).

    .. math:: \hat U_k = \tfrac12\,\overline{\big|\rho_{k+1} - \rho_k\big|},\qquad
              \rho_{k+1} = \frac{\pi_{k+1}}{\mu},\ \rho_k = \frac{\pi_k}{\mu},

    the mean over the (masked) samples, each drawn from its behaviour version :math:`\mu`.
    It estimates :math:`\mathbb E_{s}[D_{TV}(\pi_{k+1}, \pi_k; s)]` without bias when the samples'
    states and actions come from the behaviour versions and :math:`\mu` covers both policies'
    support. Note :math:`|\rho_{k+1} - \rho_k| = \rho_k\,|r - 1|` with :math:`r = \pi_{k+1}/\pi_k`:
    the incremental ratio alone, :math:`\tfrac12\overline{|r-1|}`, is *not* an estimate of
    :math:`U_k` on stale data.

    Args:
        logp_new: log-probs under :math:`\pi_{k+1}` (after the update), any shape.
        logp_prox: log-probs under :math:`\pi_k` (before it), same shape.
        logp_behav: log-probs under the version that sampled, same shape.
        mask: optional bool / 0-1 mask of the samples to average over.

    Returns: a 0-dim tensor (NaN if the mask keeps nothing). Finite for log-ratios of +-80.
    Chapter: 12_clipping_staleness (defined in 11_dynamic_mixing).
    """
    _logp_pair(logp_new, "logp_new", logp_prox, "logp_prox")
    _logp_pair(logp_new, "logp_new", logp_behav, "logp_behav")
    m = _mask(mask, logp_new, "logp_new")
    lb = logp_behav.detach()
    d = 0.5 * _abs_exp_diff(logp_new.detach() - lb, logp_prox.detach() - lb)
    return _masked_mean(d, m)


def staleness(logp_prox: Tensor, logp_behav: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    r"""Sample estimate of the sampling staleness :math:`S_k` (Lemma 5.1 with :math:`\pi_2 = \mu`).

    .. math:: \hat S_k = \tfrac12\,\overline{\big|\rho_k - 1\big|},\qquad \rho_k = \frac{\pi_k}{\mu},

    an unbiased estimate of :math:`\mathbb E_s[D_{TV}(\pi_k, \mu; s)]` under the behaviour
    distribution (when :math:`\mu` covers :math:`\pi_k`'s support; a truncating sampler makes it an
    underestimate, chapter 11). Zero on on-policy data. The staleness filter thresholds the
    same quantity sample by sample.

    Args: ``logp_prox`` (:math:`\log\pi_k`), ``logp_behav`` (:math:`\log\mu`), same shape;
    optional ``mask``. Returns: 0-dim tensor. Chapter: 12_clipping_staleness.
    """
    _logp_pair(logp_prox, "logp_prox", logp_behav, "logp_behav")
    m = _mask(mask, logp_prox, "logp_prox")
    d = 0.5 * torch.expm1(logp_prox.detach() - logp_behav.detach()).abs()
    return _masked_mean(d, m)


def effective_sample_size(log_weights: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    r"""Kish's effective sample size of importance weights, as a share of the sample count.

    .. math:: \mathrm{ESS} = \frac{\big(\sum_j w_j\big)^2}{n\sum_j w_j^2} \in \big(\tfrac1n, 1\big],
              \qquad w_j = \exp(\text{log\_weights}_j),

    1 when all weights are equal (on-policy data), :math:`1/n` when one weight dominates. With
    :math:`w = \rho_k` it says how many of the batch's samples effectively count after the
    importance correction for staleness. Computed with the log-sum-exp trick, so weights of
    :math:`e^{\pm 80}` are fine.

    Args: ``log_weights`` any shape (all entries form one sample), optional ``mask``.
    Returns: 0-dim tensor in (0, 1] (NaN if the mask keeps nothing). Chapter: 13_engineering_checklist.
    """
    V.float_tensor(log_weights, "log_weights", min_dim=0)
    m = _mask(mask, log_weights, "log_weights")
    lw = log_weights.detach().flatten()
    if m is not None:
        lw = lw[m.flatten()]
    n = lw.numel()
    if n == 0:
        return torch.full((), math.nan, dtype=log_weights.dtype, device=log_weights.device)
    return torch.exp(2 * torch.logsumexp(lw, 0) - torch.logsumexp(2 * lw, 0)) / n


def mean_by_age(values: Tensor, ages: Tensor, mask: Optional[Tensor] = None,
                max_age: Optional[int] = None) -> Tensor:
    r"""Mean of ``values`` over the samples of each age: ``out[a]`` = mean over samples of age ``a``.

    ``values`` ``[n, ...]`` (per-sample quantities such as :math:`\tfrac12|\rho_k-1|`; any trailing
    token dims are averaged with ``mask``), ``ages`` ``long[n]``. Returns ``[max_age + 1]``
    (default: the largest age present), NaN for ages with no sample. Chapter: 12_clipping_staleness.
    """
    V.float_tensor(values, "values", min_dim=1)
    if not isinstance(ages, torch.Tensor) or ages.dtype != torch.long or ages.dim() != 1 \
            or ages.shape[0] != values.shape[0]:
        raise ValueError(f"ages must be a LongTensor of shape [{values.shape[0]}] (one age per sample)")
    if ages.numel() and int(ages.min()) < 0:
        raise ValueError("ages must be >= 0")
    m = _mask(mask, values, "values")
    top = (int(ages.max()) if ages.numel() else 0) if max_age is None else _int(max_age, "max_age")
    w = torch.ones_like(values, dtype=values.dtype) if m is None else m.to(values.dtype)
    x = torch.where(w > 0, values, torch.zeros((), dtype=values.dtype, device=values.device))
    s = x.reshape(x.shape[0], -1).sum(-1)
    c = w.reshape(w.shape[0], -1).sum(-1)
    keep = ages <= top
    tot = torch.zeros(top + 1, dtype=values.dtype, device=values.device).index_add_(0, ages[keep], s[keep])
    cnt = torch.zeros(top + 1, dtype=values.dtype, device=values.device).index_add_(0, ages[keep], c[keep])
    return torch.where(cnt > 0, tot / cnt.clamp(min=1), torch.full_like(tot, math.nan))


# ============================================================================================
# Monitors and alerts
# ============================================================================================

METRICS = {
    "update_shift": "U_k = 1/2 mean|rho_{k+1} - rho_k|, the size of the update (expected TV)",
    "staleness": "S_k = 1/2 mean|rho_k - 1| over the sampled batch, before any filter",
    "clip_fraction": "share of samples whose gradient the clip zeroed",
    "kl": "KL(pi_k || pi_{k+1}) over the batch",
    "entropy": "mean entropy of pi_k on the batch (nats)",
    "ess": "effective sample size of the rho_k weights, share of the batch",
    "drop_share": "share of samples dropped by the staleness filter and the version window",
    "grad_norm": "gradient norm before clipping",
    "return": "mean episode return (or reward) of the samplers",
    "loss": "training loss",
}


@dataclass(frozen=True)
class Threshold:
    r"""An alert rule: ``metric`` must stay within ``[min, max]`` (either may be None).

    The alert fires once the rule has been violated on ``patience`` consecutive updates (one
    noisy batch should not stop a run). A non-finite value (NaN, inf) always counts as a
    violation. ``metric`` must be one of :data:`METRICS`. Chapter: 13_engineering_checklist.
    """

    metric: str
    max: Optional[float] = None
    min: Optional[float] = None
    patience: int = 1

    def __post_init__(self):
        if self.metric not in METRICS:
            raise ValueError(f"Threshold.metric must be one of {sorted(METRICS)}, got {self.metric!r}")
        if self.max is None and self.min is None:
            raise ValueError(f"Threshold({self.metric!r}): give max, min or both")
        for name in ("max", "min"):
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, V.finite_float(v, f"Threshold.{name}"))
        if self.max is not None and self.min is not None and self.min >= self.max:
            raise ValueError(f"Threshold({self.metric!r}): min ({self.min}) must be < max ({self.max})")
        _int(self.patience, "Threshold.patience", 1)

    def violated(self, value: float) -> bool:
        if not math.isfinite(value):
            return True
        return (self.max is not None and value > self.max) or (self.min is not None and value < self.min)


@dataclass(frozen=True)
class Alert:
    """A fired alert: at update ``step``, ``metric`` was ``value``, outside ``[min, max]`` for
    ``streak`` consecutive updates."""

    step: int
    metric: str
    value: float
    min: Optional[float]
    max: Optional[float]
    streak: int

    @property
    def message(self) -> str:
        if not math.isfinite(self.value):
            bound = "is not finite"
        elif self.max is not None and self.value > self.max:
            bound = f"> max {self.max:g}"
        else:
            bound = f"< min {self.min:g}"
        return (f"update {self.step}: {self.metric} = {self.value:.4g} {bound} "
                f"({self.streak} update{'s' if self.streak > 1 else ''} in a row)")

    def __str__(self) -> str:
        return self.message


class Monitor:
    r"""Watches per-update metrics and fires :class:`Alert` s when a :class:`Threshold` is broken.

    ``update(step, **metrics)`` records the metrics, returns the alerts that fire at this
    update (a rule fires when its violation streak reaches its ``patience``, and again every
    ``patience`` updates while it lasts) and keeps every alert in ``alerts``. Metrics without a
    rule are only recorded (``history``). ``ok`` is True when no rule is violated at the last
    update (a trainer saves its "last good" checkpoint only then). :meth:`replay` runs a
    recorded trace through a new set of rules: the chapter's threshold slider uses it.

    Chapter: 13_engineering_checklist.
    """

    def __init__(self, thresholds: Iterable[Threshold] = ()):
        self.thresholds = tuple(thresholds)
        for t in self.thresholds:
            if not isinstance(t, Threshold):
                raise TypeError(f"thresholds must be Threshold objects, got {type(t).__name__}")
        self.history: Dict[str, List[float]] = {}
        self.steps: List[int] = []
        self.alerts: List[Alert] = []
        self._streak = [0] * len(self.thresholds)
        self.ok = True

    def update(self, step: int, **metrics: float) -> List[Alert]:
        step = _int(step, "step")
        n = len(self.steps)
        self.steps.append(step)
        for k, v in metrics.items():
            v = float(v)
            self.history.setdefault(k, [math.nan] * n).append(v)
        for lst in self.history.values():
            if len(lst) < n + 1:
                lst.append(math.nan)
        fired = []
        self.ok = True
        for j, t in enumerate(self.thresholds):
            if t.metric not in metrics:
                continue
            v = float(metrics[t.metric])
            if t.violated(v):
                self.ok = False
                self._streak[j] += 1
                if self._streak[j] % t.patience == 0:
                    fired.append(Alert(step, t.metric, v, t.min, t.max, self._streak[j]))
            else:
                self._streak[j] = 0
        self.alerts += fired
        return fired

    def reset_streaks(self) -> None:
        """Forget violation streaks (after a rollback the run starts again from good weights)."""
        self._streak = [0] * len(self.thresholds)
        self.ok = True

    @staticmethod
    def replay(trace: Mapping[str, Sequence[float]], thresholds: Iterable[Threshold],
               steps: Optional[Sequence[int]] = None) -> List[Alert]:
        """The alerts ``thresholds`` would have fired on a recorded ``trace`` (metric -> values)."""
        lengths = {len(v) for v in trace.values()}
        if len(lengths) != 1:
            raise ValueError(f"every metric of trace must have the same length, got lengths {sorted(lengths)}")
        n = lengths.pop()
        steps = list(range(n)) if steps is None else list(steps)
        if len(steps) != n:
            raise ValueError(f"steps has {len(steps)} entries for a trace of length {n}")
        mon = Monitor(thresholds)
        for i in range(n):
            mon.update(int(steps[i]), **{k: v[i] for k, v in trace.items()})
        return mon.alerts


class Checkpoint:
    r"""The last good state of a run: deep copies of modules' and optimisers' ``state_dict``.

    ``save(step, model, opt, ...)`` stores copies; ``restore(model, opt, ...)`` loads them back
    (same objects, same order) and returns the step they were saved at. Chapter 13 uses it for a
    monitor-triggered rollback.
    """

    def __init__(self):
        self.step: Optional[int] = None
        self._states: Optional[list] = None

    def save(self, step: int, *objects) -> None:
        step = _int(step, "step")
        if not objects:
            raise ValueError("save needs at least one module or optimiser")
        for o in objects:
            if not hasattr(o, "state_dict"):
                raise TypeError(f"cannot checkpoint a {type(o).__name__}: it has no state_dict()")
        self._states = [copy.deepcopy(o.state_dict()) for o in objects]
        self.step = step

    def restore(self, *objects) -> int:
        if self._states is None:
            raise RuntimeError("no checkpoint saved yet")
        if len(objects) != len(self._states):
            raise ValueError(f"restore needs the same {len(self._states)} objects that were saved, got {len(objects)}")
        for o, s in zip(objects, self._states):
            o.load_state_dict(copy.deepcopy(s))
        return self.step

    @property
    def saved(self) -> bool:
        return self._states is not None


# ============================================================================================
# The validated configuration
# ============================================================================================

METHODS = ("standard", "adaptive", "decoupled")
CLIP_SCHEDULES = ("constant", "geppo", "age")
ON_ALERT = ("log", "rollback", "stop")


@dataclass
class StaleTrainingConfig:
    r"""The staleness knobs of a trainer, checked when the object is built.

    The source article sketches such a config with four asserts; this one checks every field's
    type and range and the consistency *between* fields, and each error names the field, the
    value and what would be accepted.

    Fields:

    * ``method``: the clipped objective: ``"standard"`` (PPO-clip of :math:`\pi_\theta/\mu` around 1),
      ``"adaptive"`` (method 1, clip around :math:`\rho_k`, :func:`rlkit.objectives.geppo_loss`) or
      ``"decoupled"`` (method 2, clip :math:`\pi_\theta/\pi_k`, weight :math:`\rho_k`,
      :func:`rlkit.objectives.decoupled_ppo_loss`). The article calls them standard / adaptive /
      incremental.
    * ``clip_eps``: the clip radius, in (0, 1).
    * ``clip_schedule``: ``"constant"``; ``"geppo"`` (one radius :func:`geppo_clip_radius` for the
      lag distribution); ``"age"`` (:func:`age_clip_radius` per sample).
    * ``lag``: a :class:`LagDistribution` or an int (a fixed lag): how old the data are.
    * ``version_window``: ``None`` or an int ``W >= 1``: keep data of age ``< W`` only.
    * ``eps_stale``: ``None`` or a float ``> 0``: drop samples with :math:`|\rho_k-1|` above it.
    * ``filter_level``: ``"token"``, ``"sequence"`` or ``"sequence-mean"`` (LLM trainers).
    * ``behav_clip``: ``None`` or a float ``> 0`` truncating :math:`\rho_k` (``"decoupled"`` only).
    * ``thresholds``: :class:`Threshold` rules for the :class:`Monitor`.
    * ``on_alert``: ``"log"``, ``"rollback"`` (restore the last good checkpoint and multiply the
      learning rate by ``rollback_lr_factor``) or ``"stop"``.
    * ``checkpoint_every``: updates between "last good" checkpoints (rollback only).
    * ``max_rollbacks``: after this many rollbacks the run stops instead.
    * ``rollback_lr_factor``: in (0, 1].

    Cross-field rules: the version window must keep some data (``version_window > lag.min``);
    ``behav_clip`` needs ``method="decoupled"``; ``"rollback"``/``"stop"`` need at least one
    threshold; a ``"geppo"`` schedule on a fixed lag of 0 is pointless but allowed (radius =
    ``clip_eps``).

    Chapter: 13_engineering_checklist.
    """

    method: str = "adaptive"
    clip_eps: float = 0.2
    clip_schedule: str = "constant"
    lag: Union[LagDistribution, int] = 0
    version_window: Optional[int] = None
    eps_stale: Optional[float] = None
    filter_level: str = "token"
    behav_clip: Optional[float] = None
    thresholds: Tuple[Threshold, ...] = ()
    on_alert: str = "log"
    checkpoint_every: int = 5
    max_rollbacks: int = 3
    rollback_lr_factor: float = 0.5

    def __post_init__(self):
        def bad(name, msg):
            return ValueError(f"StaleTrainingConfig.{name}: {msg}")

        def choice(name, options):
            v = getattr(self, name)
            if v not in options:
                raise bad(name, f"must be one of {options}, got {v!r}")

        def num(name, lo, hi, lo_open=True, hi_open=False, allow_none=False):
            v = getattr(self, name)
            if v is None and allow_none:
                return
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise bad(name, f"must be a finite number{' or None' if allow_none else ''}, got {v!r}")
            ok = (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
            if not ok:
                raise bad(name, f"must lie in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}, got {v!r}")
            setattr(self, name, float(v))

        def pos_int(name, allow_none=False):
            v = getattr(self, name)
            if v is None and allow_none:
                return
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise bad(name, f"must be an int >= 1{' or None' if allow_none else ''}, got {v!r}")

        choice("method", METHODS)
        num("clip_eps", 0.0, 1.0, hi_open=True)
        choice("clip_schedule", CLIP_SCHEDULES)
        if isinstance(self.lag, bool):
            raise bad("lag", f"must be a LagDistribution or an int >= 0, got {self.lag!r}")
        if isinstance(self.lag, int):
            if self.lag < 0:
                raise bad("lag", f"a fixed lag must be >= 0 versions, got {self.lag}")
            self.lag = LagDistribution.fixed(self.lag)
        if not isinstance(self.lag, LagDistribution):
            raise bad("lag", f"must be a LagDistribution or an int >= 0, got {type(self.lag).__name__}")
        pos_int("version_window", allow_none=True)
        num("eps_stale", 0.0, math.inf, allow_none=True)
        choice("filter_level", FILTER_LEVELS)
        num("behav_clip", 0.0, math.inf, allow_none=True)
        if not isinstance(self.thresholds, (tuple, list)):
            raise bad("thresholds", f"must be a tuple of Threshold, got {type(self.thresholds).__name__}")
        for i, t in enumerate(self.thresholds):
            if not isinstance(t, Threshold):
                raise bad("thresholds", f"entry {i} must be a Threshold, got {type(t).__name__}")
        self.thresholds = tuple(self.thresholds)
        choice("on_alert", ON_ALERT)
        pos_int("checkpoint_every")
        pos_int("max_rollbacks")
        num("rollback_lr_factor", 0.0, 1.0)

        # ---- consistency between fields --------------------------------------------------
        if self.version_window is not None and self.version_window <= self.lag.min:
            raise bad("version_window", f"= {self.version_window} keeps only data younger than "
                      f"{self.version_window} versions, but {self.lag!r} is never below {self.lag.min}: every "
                      f"sample would be dropped. Use version_window > {self.lag.min} (>= {self.lag.max + 1} "
                      f"keeps all data) or reduce the lag")
        if self.behav_clip is not None and self.method != "decoupled":
            raise bad("behav_clip", f"truncates the behaviour weight of method='decoupled'; with "
                      f"method={self.method!r} it would be ignored. Remove it or use method='decoupled'")
        if self.on_alert != "log" and not self.thresholds:
            raise bad("on_alert", f"= {self.on_alert!r} acts on alerts, but thresholds is empty, so no "
                      f"alert can fire. Add Threshold rules or use on_alert='log'")
        seen = set()
        for t in self.thresholds:
            if t.metric in seen:
                raise bad("thresholds", f"two rules for {t.metric!r}; merge them into one Threshold(min=..., max=...)")
            seen.add(t.metric)

    # ---- derived quantities ----------------------------------------------------------------
    def alert_action(self, alerts, rollbacks_done: int) -> str:
        """What a trainer does after a monitor update that raised ``alerts``.

        ``"continue"`` when nothing fired or ``on_alert="log"``; ``"stop"`` for ``on_alert="stop"``,
        or for ``"rollback"`` once ``max_rollbacks`` rollbacks have been done; ``"rollback"``
        otherwise. Both stale trainers (CartPole and the tiny LLM) follow this one rule.
        """
        if not alerts or self.on_alert == "log":
            return "continue"
        if self.on_alert == "stop" or rollbacks_done >= self.max_rollbacks:
            return "stop"
        return "rollback"

    @property
    def expected_drop_share(self) -> float:
        """Share of the data the version window drops, under the lag distribution (0 without a window)."""
        return 0.0 if self.version_window is None else self.lag.share_at_least(self.version_window)

    def clip_radius(self, ages: Optional[Tensor] = None) -> Union[float, Tensor]:
        """The clip radius: a float (``"constant"``, ``"geppo"``) or, for ``"age"``, one per sample of ``ages``."""
        if self.clip_schedule == "constant":
            return self.clip_eps
        if self.clip_schedule == "geppo":
            w = self.lag.probs
            if self.version_window is not None:      # the window changes the mixture of ages
                w = w[:self.version_window]
                s = sum(w)
                w = tuple(x / s for x in w)
            return geppo_clip_radius(self.clip_eps, w)
        if ages is None:
            raise ValueError("clip_schedule='age' gives one radius per sample: pass ages")
        return age_clip_radius(self.clip_eps, ages)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["lag"] = repr(self.lag)
        d["thresholds"] = [repr(t) for t in self.thresholds]
        return d
