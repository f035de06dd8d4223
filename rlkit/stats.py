r"""The book's statistics: summaries over seeds, two-arm comparisons, Holm's correction, and claims.

Every empirical statement in the book ("A beats B", "X helps", "Y does nothing") rests on this
module. The standard (stated for readers in ``book/setup.md``, section "How the book tests its
claims"):

* **A difference** is claimed only when the 95% interval of the difference excludes 0, with at
  least 5 seeds per arm, or a paired design (the same seeds in both arms).
* **"No effect"** is claimed only when the whole interval lies inside a stated tolerance;
  otherwise the arms are "not separated at this scale" and the interval is given.
* **One run** is an illustration, never asserted as a general fact.

Four tools:

* :func:`summary`: mean, standard error and a t-interval of one arm.
* :func:`compare`: the difference of two arms, its t-interval and a two-sided p-value: paired by
  seed when both arms are mappings over the same seeds (or ``paired=True``), Welch otherwise.
* :func:`holm`: Holm's step-down adjustment of several p-values (a chapter that ranks more than
  two arms).
* :func:`claim` (and :func:`claim_all` for a family of comparisons): the helper check cells use.
  It words the claim, runs the test, asserts it with a message that prints the numbers, shows a
  one-line verdict, and records the result for the book's claims ledger (``book/claims.md``).

The t distribution is computed here (a regularised incomplete beta function and a bisection
for its quantile), so the module needs no scipy; ``tests/test_stats.py``
compares it with scipy where scipy is installed.

Chapter: the setup page states the standard; every chapter's check cells use it.
"""
from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from . import _validate as V

__all__ = ["Summary", "Comparison", "Claim", "ClaimFailed", "summary", "compare", "holm", "claim",
           "claim_all", "report", "t_cdf", "t_quantile", "CLAIM_MIME", "recorded_claims"]

#: The output type a claim is displayed with, beside plain text; the claims ledger reads it.
CLAIM_MIME = "application/vnd.rlkit.claim+json"

_KINDS = ("greater", "less", "differ", "equivalent", "not_separated")

_RECORDED: list[dict] = []


class ClaimFailed(AssertionError):
    """A check cell's claim does not hold on the numbers it was given (the message has them)."""


# --------------------------------------------------------------------------- the t distribution

def _betacf(a: float, b: float, x: float) -> float:
    # Lentz's continued fraction for the regularised incomplete beta function
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularised incomplete beta function."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    r"""P(T <= t) for Student's t with ``df`` degrees of freedom (``df`` may be fractional, as Welch's is).

    .. math:: P(T \le t) = 1 - \tfrac12 I_{df/(df+t^2)}\big(\tfrac{df}{2}, \tfrac12\big) \quad (t \ge 0)
    """
    df = _positive(df, "df")
    t = _finite(t, "t")
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom (bisection on :func:`t_cdf`)."""
    df = _positive(df, "df")
    q = _finite(q, "q")
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q}")
    if q == 0.5:
        return 0.0
    if q < 0.5:
        return -t_quantile(1.0 - q, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < q:
        hi *= 2.0
        if hi > 1e12:
            return math.inf
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


# --------------------------------------------------------------------------- input checking

def _finite(x, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) and not hasattr(x, "__float__"):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    v = float(x)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    return v


def _positive(x, name: str) -> float:
    v = _finite(x, name)
    if v <= 0:
        raise ValueError(f"{name} must be > 0, got {v}")
    return v


def _level(level) -> float:
    v = _finite(level, "level")
    if not 0.0 < v < 1.0:
        raise ValueError(f"level must be in (0, 1), e.g. 0.95, got {v}")
    return v


def _values(x, name: str, min_n: int = 2) -> tuple[list[float], list | None]:
    """The numbers of one arm, and its seeds when it is a mapping ``{seed: value}``."""
    if isinstance(x, (str, bytes)):
        raise TypeError(f"{name} must be a sequence of numbers or a mapping seed -> number, got a string")
    keys = None
    if isinstance(x, Mapping):
        keys = list(x.keys())
        items = list(x.values())
    else:
        if not hasattr(x, "__iter__"):
            raise TypeError(f"{name} must be a sequence of numbers or a mapping seed -> number, "
                            f"got {type(x).__name__}")
        items = _flat(x, name)
    vals = []
    for i, v in enumerate(items):
        label = f"{name}[{keys[i]!r}]" if keys is not None else f"{name}[{i}]"
        vals.append(_finite(v, label))
    if len(vals) < min_n:
        raise ValueError(f"{name} needs at least {min_n} values (seeds) for an interval, got {len(vals)}")
    return vals, keys


def _flat(x, name):
    if hasattr(x, "tolist") and not isinstance(x, (list, tuple)):
        x = x.tolist()
        if not isinstance(x, list):
            raise TypeError(f"{name} must be one-dimensional, got a scalar")
    out = []
    for v in x:
        if isinstance(v, (list, tuple)):
            raise TypeError(f"{name} must be one-dimensional (one number per seed), got a nested sequence")
        out.append(v)
    return out


def _mean_var(v: Sequence[float]) -> tuple[float, float]:
    n = len(v)
    m = math.fsum(v) / n
    var = math.fsum((x - m) ** 2 for x in v) / (n - 1)
    return m, var


# --------------------------------------------------------------------------- summary

@dataclass(frozen=True)
class Summary:
    """One arm over seeds: ``n``, ``mean``, standard error ``se``, and the t-interval [``lo``, ``hi``]."""

    n: int
    mean: float
    se: float
    lo: float
    hi: float
    level: float = 0.95

    def __str__(self) -> str:
        return self.format()

    def format(self, spec: str = ".3g") -> str:
        """``"mean ± se (95% CI lo to hi, n=5)"`` with the numbers in format ``spec``."""
        return (f"{self.mean:{spec}} ± {self.se:{spec}} ({100 * self.level:g}% CI {self.lo:{spec}} to "
                f"{self.hi:{spec}}, n={self.n})")


def summary(values, level: float = 0.95) -> Summary:
    r"""Mean, standard error and ``level`` t-interval of one arm's values (one per seed).

    .. math:: \bar x \pm t_{n-1,\,(1+\text{level})/2}\; s/\sqrt n

    Args:
        values: at least 2 finite numbers (a list, a 1-D array or tensor, or a mapping seed -> number).
        level: the interval's coverage, in (0, 1).

    Example: ``summary([1, 2, 3])`` has mean 2, se 0.577 and 95% interval 2 ± 4.303·0.577.
    """
    level = _level(level)
    v, _ = _values(values, "values")
    n = len(v)
    m, var = _mean_var(v)
    se = math.sqrt(var / n)
    half = t_quantile(0.5 + level / 2, n - 1) * se
    return Summary(n=n, mean=m, se=se, lo=m - half, hi=m + half, level=level)


# --------------------------------------------------------------------------- two arms

@dataclass(frozen=True)
class Comparison:
    """The difference ``diff`` = mean(a) − mean(b), its t-interval [``lo``, ``hi``] and two-sided ``p``.

    ``paired`` says which test made it: the paired t-test on per-seed differences, or Welch's.
    ``separated`` is true when the interval excludes 0.
    """

    diff: float
    se: float
    df: float
    lo: float
    hi: float
    p: float
    paired: bool
    n_a: int
    n_b: int
    mean_a: float
    mean_b: float
    level: float = 0.95

    @property
    def separated(self) -> bool:
        """The interval of the difference excludes 0."""
        return self.lo > 0 or self.hi < 0

    def __str__(self) -> str:
        return self.format()

    def format(self, spec: str = ".3g") -> str:
        """``"diff 0.31 (95% CI 0.12 to 0.5), p = 0.004, paired, n = 5"``."""
        test = f"paired, n = {self.n_a}" if self.paired else f"Welch, n = {self.n_a} and {self.n_b}"
        return (f"diff {self.diff:{spec}} ({100 * self.level:g}% CI {self.lo:{spec}} to {self.hi:{spec}}), "
                f"p = {_fmt_p(self.p)}, {test}")


def _fmt_p(p: float) -> str:
    return f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"


def compare(a, b, *, paired: bool | None = None, level: float = 0.95) -> Comparison:
    r"""Compare two arms: the difference of means (a − b), its ``level`` t-interval and a two-sided p.

    Paired (per-seed differences :math:`d_i = a_i - b_i`, a one-sample t-test on them, df = n − 1)
    when the two arms share seeds: both are mappings with the same keys, or ``paired=True`` with
    two sequences of equal length whose i-th entries come from the same seed. Otherwise Welch's
    unequal-variance test:

    .. math:: \hat\Delta = \bar a - \bar b,\quad s = \sqrt{s_a^2/n_a + s_b^2/n_b},\quad
       \nu = \frac{s^4}{(s_a^2/n_a)^2/(n_a-1) + (s_b^2/n_b)^2/(n_b-1)}

    ``b`` may also be a number: a one-sample test of mean(a) against it. ``paired`` is None (decide
    from the arms), True or False.

    A zero standard error (identical values, or identical per-seed differences) gives a
    zero-width interval and p = 0 when the difference is not 0, p = 1 when it is.

    Raises:
        ValueError: fewer than 2 values in an arm, mappings over different seeds with
            ``paired=True``, sequences of different lengths with ``paired=True``.
    """
    level = _level(level)
    if paired is not None:
        V.boolean(paired, "paired")
    va, ka = _values(a, "a")
    if isinstance(b, numbers.Real) or getattr(b, "ndim", None) == 0:  # a number, or a 0-d array/tensor
        ref = _finite(b, "b")
        if paired:
            raise ValueError("paired=True needs two arms; b is a number (a one-sample test)")
        s = summary(va, level)
        return _from_t(s.mean - ref, s.se, s.n - 1, level, True, s.n, s.n, s.mean, ref)
    vb, kb = _values(b, "b")
    if paired is None:
        paired = ka is not None and kb is not None and set(ka) == set(kb)
    if paired:
        if ka is not None and kb is not None:
            if set(ka) != set(kb):
                raise ValueError(f"paired=True needs the same seeds in a and b, got {sorted(ka)} and {sorted(kb)}")
            bmap = dict(zip(kb, vb))
            vb = [bmap[k] for k in ka]
        elif len(va) != len(vb):
            raise ValueError(f"paired=True needs a and b of the same length (one value per seed), "
                             f"got {len(va)} and {len(vb)}")
        d = [x - y for x, y in zip(va, vb)]
        m, var = _mean_var(d)
        n = len(d)
        return _from_t(m, math.sqrt(var / n), n - 1, level, True, n, n,
                       math.fsum(va) / n, math.fsum(vb) / n)
    ma, var_a = _mean_var(va)
    mb, var_b = _mean_var(vb)
    na, nb = len(va), len(vb)
    qa, qb = var_a / na, var_b / nb
    se = math.sqrt(qa + qb)
    denom = (qa * qa / (na - 1) if qa else 0.0) + (qb * qb / (nb - 1) if qb else 0.0)
    df = (qa + qb) ** 2 / denom if denom > 0 else float(na + nb - 2)
    return _from_t(ma - mb, se, df, level, False, na, nb, ma, mb)


def _from_t(diff, se, df, level, paired, na, nb, ma, mb) -> Comparison:
    if se == 0.0:
        p = 1.0 if diff == 0.0 else 0.0
        return Comparison(diff, 0.0, df, diff, diff, p, paired, na, nb, ma, mb, level)
    t = diff / se
    p = min(1.0, 2.0 * t_cdf(-abs(t), df))
    half = t_quantile(0.5 + level / 2, df) * se
    return Comparison(diff, se, df, diff - half, diff + half, p, paired, na, nb, ma, mb, level)


# --------------------------------------------------------------------------- several arms

def holm(pvalues) -> list[float]:
    r"""Holm's step-down adjusted p-values, in the order given.

    Sort the m p-values, :math:`p_{(1)} \le \dots \le p_{(m)}`; the adjusted value of the i-th
    smallest is :math:`\max_{j \le i} \min(1, (m - j + 1)\, p_{(j)})`. Rejecting every hypothesis
    whose adjusted p is below α controls the family-wise error at α.

    Example: ``holm([0.01, 0.04, 0.03])`` is ``[0.03, 0.06, 0.06]``.
    """
    _iterable(pvalues, "pvalues", "a sequence of p-values")
    ps = [_finite(p, f"pvalues[{i}]") for i, p in enumerate(pvalues)]
    for i, p in enumerate(ps):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"pvalues[{i}] must be in [0, 1], got {p}")
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        out[i] = running
    return out


# --------------------------------------------------------------------------- claims

@dataclass
class Claim:
    """One tested statement, as the ledger records it."""

    statement: str
    kind: str
    arms: tuple[str, str]
    holds: bool
    comparison: Comparison
    tol: float | None = None
    margin: float = 0.0
    p_adjusted: float | None = None
    family: str | None = None
    chapter: str | None = None
    asserted: bool = True
    extra: dict = field(default_factory=dict)

    def line(self) -> str:
        """The one-line verdict a check cell shows."""
        if self.asserted:
            mark = "holds" if self.holds else "FAILS"
        else:  # a report asserts nothing: say whether the interval separates the arms
            mark = "separated" if self.comparison.separated else "not separated"
        verb = {"greater": ">", "less": "<", "differ": "≠", "equivalent": "≈", "not_separated": "~"}[self.kind]
        what = f"{self.arms[0]} {verb} {self.arms[1]}"
        p = "" if self.p_adjusted is None else f", Holm-adjusted p = {_fmt_p(self.p_adjusted)}"
        tol = "" if self.tol is None else f", tolerance ±{self.tol:.3g}"
        margin = f", margin {self.margin:.3g}" if self.margin else ""
        tag = "claim" if self.asserted else "reported"
        return f"[{tag} {mark}] {self.statement} ({what}: {self.comparison}{p}{tol}{margin})"

    def record(self) -> dict:
        """A JSON-serialisable dict (what the ledger stores)."""
        d = asdict(self)
        d["comparison"] = asdict(self.comparison)
        d["arms"] = list(self.arms)
        return d


def _verdict(kind: str, c: Comparison, alpha_ok: bool, tol: float | None, margin: float) -> bool:
    if kind == "greater":
        return c.lo > margin and alpha_ok
    if kind == "less":
        return c.hi < -margin and alpha_ok
    if kind == "differ":
        return (c.lo > margin or c.hi < -margin) and alpha_ok
    if kind == "equivalent":
        return -tol <= c.lo and c.hi <= tol
    return not c.separated  # not_separated


def _check_kind(kind, tol, margin):
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
    if kind == "equivalent":
        if tol is None:
            raise ValueError("kind='equivalent' needs tol: the largest difference that counts as no effect")
        tol = _positive(tol, "tol")
    elif tol is not None:
        raise ValueError(f"tol is only read by kind='equivalent', not kind={kind!r}")
    margin = _finite(margin, "margin")
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    return tol, margin


def _emit(c: Claim) -> None:
    rec = c.record()
    _RECORDED.append(rec)
    path = os.environ.get("RLKIT_CLAIMS_FILE")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec) + "\n")
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # pragma: no cover - IPython ships with the book's requirements
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display({"text/plain": c.line(), CLAIM_MIME: rec}, raw=True)
    else:
        print(c.line())


def claim(statement: str, a, b, *, kind: str = "greater", arms: tuple[str, str] = ("A", "B"),
          paired: bool | None = None, tol: float | None = None, margin: float = 0.0,
          level: float = 0.95, chapter: str | None = None, check: bool = True) -> Claim:
    """Test a statement about two arms, show and record the verdict, and assert it.

    Args:
        statement: the claim in words, as the chapter's text makes it ("the baseline cuts the
            variance"). It heads the assertion message and the ledger's row.
        a, b: the two arms (see :func:`compare`: mappings seed -> value are paired by seed);
            ``b`` may be a number (a one-sample claim against it).
        kind: ``"greater"`` (the interval of a − b lies above ``margin``), ``"less"`` (below
            −``margin``), ``"differ"`` (either), ``"equivalent"`` (inside ±``tol``: "no effect"),
            or ``"not_separated"`` (the interval contains 0; recorded, and best used with
            ``check=False``, since a real but small effect may separate on other seeds).
        arms: the names of a and b, for the message and the ledger.
        margin: how far the interval must clear 0 (in a − b's units) for "greater"/"less"/"differ".
        tol: the equivalence tolerance (``kind="equivalent"`` only).
        check: ``False`` reports the comparison without asserting it (a marginal effect the text
            gives with its interval); True or False.
        chapter: the chapter's name for the ledger (a str), or None (``RLKIT_CHAPTER``).

    Returns: the :class:`Claim`.

    Raises:
        ClaimFailed: ``check`` is true and the claim does not hold; the message has the numbers.
    """
    if not isinstance(statement, str) or not statement.strip():
        raise ValueError("statement must be a non-empty string: the claim in words")
    _chapter_arg(chapter)
    V.boolean(check, "check")
    tol, margin = _check_kind(kind, tol, margin)
    arms = _arms(arms)
    comp = compare(a, b, paired=paired, level=level)
    holds = _verdict(kind, comp, comp.p < 1 - comp.level, tol, margin)
    c = Claim(statement.strip(), kind, arms, holds, comp, tol=tol, margin=margin,
              chapter=chapter or _chapter(), asserted=bool(check))
    _emit(c)
    if check and not holds:
        raise ClaimFailed(c.line())
    return c


def report(statement: str, a, b, **kwargs) -> Claim:
    """:func:`claim` with ``check=False``: show and record the comparison, assert nothing."""
    return claim(statement, a, b, check=False, **kwargs)


def claim_all(statement: str, comparisons, *, level: float = 0.95, chapter: str | None = None,
              check: bool = True) -> list[Claim]:
    """A family of directional claims ranked together, with Holm's correction over the family.

    Args:
        statement: what the family says as a whole ("the three corrections rank as ...").
        comparisons: a sequence of ``(statement, a, b, kind, arms)`` tuples (``kind`` is
            ``"greater"``, ``"less"`` or ``"differ"``); ``arms`` may be omitted.
        level: the family-wise coverage: each claim holds when its Holm-adjusted p is below
            1 − ``level`` and its difference points the way stated.

    Returns: the claims, in the order given.
    """
    level = _level(level)
    if not isinstance(statement, str) or not statement.strip():
        raise ValueError("statement must be a non-empty string: the family's claim in words")
    _chapter_arg(chapter)
    V.boolean(check, "check")
    items = list(_iterable(comparisons, "comparisons", "a sequence of (statement, a, b, kind) tuples"))
    if not items:
        raise ValueError("comparisons must hold at least one (statement, a, b, kind) tuple")
    comps, specs = [], []
    for i, it in enumerate(items):
        if not isinstance(it, (tuple, list)) or len(it) not in (4, 5):
            raise TypeError(f"comparisons[{i}] must be (statement, a, b, kind) or (statement, a, b, kind, arms)")
        st, a, b, kind = it[:4]
        arms = _arms(it[4] if len(it) == 5 else ("A", "B"))
        if kind not in ("greater", "less", "differ"):
            raise ValueError(f"comparisons[{i}]: kind must be 'greater', 'less' or 'differ', got {kind!r}")
        _values(a, f"comparisons[{i}] (its a)")            # named here: compare would say "a" and "b"
        if not (isinstance(b, numbers.Real) or getattr(b, "ndim", None) == 0):
            _values(b, f"comparisons[{i}] (its b)")
        else:
            _finite(b, f"comparisons[{i}] (its b)")
        comps.append(compare(a, b, level=level))
        specs.append((st, kind, arms))
    adjusted = holm([c.p for c in comps])
    out, failed = [], []
    for (st, kind, arms), comp, p_adj in zip(specs, comps, adjusted):
        direction = {"greater": comp.diff > 0, "less": comp.diff < 0, "differ": True}[kind]
        holds = direction and p_adj < 1 - level
        c = Claim(str(st), kind, arms, holds, comp, p_adjusted=p_adj, family=statement.strip(),
                  chapter=chapter or _chapter(), asserted=bool(check))
        _emit(c)
        out.append(c)
        if not holds:
            failed.append(c.line())
    if check and failed:
        raise ClaimFailed(statement.strip() + ": " + "; ".join(failed))
    return out


def _arms(arms) -> tuple[str, str]:
    if not isinstance(arms, (tuple, list)) or len(arms) != 2 or not all(isinstance(x, str) for x in arms):
        raise TypeError(f"arms must be two names, e.g. ('with baseline', 'without'), got {arms!r}")
    return (arms[0], arms[1])


def _iterable(x, name: str, what: str):
    """``x`` if it can be iterated over (and is not a str), else a TypeError naming it."""
    if isinstance(x, (str, bytes)) or not hasattr(x, "__iter__"):
        raise TypeError(f"{name} must be {what}, got {type(x).__name__}")
    return x


def _chapter_arg(chapter) -> None:
    if chapter is not None and not isinstance(chapter, str):
        raise TypeError(f"chapter must be a str (e.g. '07_tiny_llm') or None, got {type(chapter).__name__}")


def _chapter() -> str | None:
    return os.environ.get("RLKIT_CHAPTER")


def recorded_claims() -> list[dict]:
    """Every claim recorded in this process so far (a copy), oldest first."""
    return [dict(r) for r in _RECORDED]
