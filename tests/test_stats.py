"""rlkit.stats against hand-worked cases, slow reference computations and scipy.stats (if installed)."""
import math

import numpy as np
import pytest

from rlkit import stats
from rlkit.utils import seed_base, seeds

try:
    import scipy.stats as sps
except ImportError:  # scipy is not a requirement: the hand-worked cases still run
    sps = None

needs_scipy = pytest.mark.skipif(sps is None, reason="scipy not installed: the hand-worked cases still run")


# ---------------------------------------------------------------- the t distribution

def test_t_cdf_closed_forms():
    # df = 1 is Cauchy: F(t) = 1/2 + atan(t)/pi; df = 2: F(t) = 1/2 + t / (2 sqrt(2 + t^2))
    for t in (-30.0, -2.5, -0.3, 0.0, 0.7, 4.0, 50.0):
        assert stats.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-13)
        assert stats.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-13)


def test_t_quantile_table_values():
    # the printed table every statistics text has: t_{0.975, df}
    table = {1: 12.7062, 2: 4.3027, 4: 2.7764, 9: 2.2622, 30: 2.0423}
    for df, q in table.items():
        assert stats.t_quantile(0.975, df) == pytest.approx(q, abs=1e-4)
    assert stats.t_quantile(0.975, 1e6) == pytest.approx(1.959964, abs=1e-5)   # the normal limit
    assert stats.t_quantile(0.025, 4) == pytest.approx(-stats.t_quantile(0.975, 4), abs=1e-12)


@needs_scipy
@pytest.mark.parametrize("df", [1, 1.5, 2, 3.7, 4, 9, 25.3, 200])
def test_t_against_scipy(df):
    for t in (-8, -2, -0.5, 0.1, 1.3, 3, 12):
        assert stats.t_cdf(t, df) == pytest.approx(sps.t.cdf(t, df), rel=1e-10, abs=1e-14)
    for q in (0.6, 0.9, 0.975, 0.995):
        assert stats.t_quantile(q, df) == pytest.approx(sps.t.ppf(q, df), rel=1e-9)


def test_t_bad_input():
    with pytest.raises(ValueError, match="df"):
        stats.t_cdf(1.0, 0)
    with pytest.raises(ValueError, match="q"):
        stats.t_quantile(1.0, 3)
    with pytest.raises(ValueError, match="t must be finite"):
        stats.t_cdf(float("nan"), 3)


# ---------------------------------------------------------------- summary

def test_summary_hand_worked():
    s = stats.summary([1, 2, 3])
    # mean 2, sample sd 1, se 1/sqrt(3), t_{0.975,2} = 4.302653
    assert s.mean == 2 and s.n == 3
    assert s.se == pytest.approx(1 / math.sqrt(3), abs=1e-15)
    assert s.hi - s.mean == pytest.approx(4.302652729911275 / math.sqrt(3), abs=1e-9)
    assert s.lo == pytest.approx(2 * s.mean - s.hi, abs=1e-12)
    assert "n=3" in str(s)


@needs_scipy
def test_summary_against_scipy():
    x = np.random.default_rng(0).normal(3, 2, size=7)
    s = stats.summary(x, level=0.9)
    lo, hi = sps.t.interval(0.9, len(x) - 1, loc=x.mean(), scale=sps.sem(x))
    assert (s.lo, s.hi) == pytest.approx((lo, hi), rel=1e-10)


def test_summary_accepts_mapping_tensor_and_rejects_bad_input():
    import torch
    assert stats.summary({0: 1.0, 1: 3.0}).mean == 2.0
    assert stats.summary(torch.tensor([1.0, 3.0])).mean == 2.0
    with pytest.raises(ValueError, match="at least 2"):
        stats.summary([1.0])
    with pytest.raises(ValueError, match=r"values\[1\] must be finite"):
        stats.summary([1.0, float("nan")])
    with pytest.raises(TypeError, match="one-dimensional"):
        stats.summary([[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(TypeError, match="string"):
        stats.summary("12")
    with pytest.raises(ValueError, match="level"):
        stats.summary([1, 2], level=95)


# ---------------------------------------------------------------- two arms

def _welch_by_hand(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    qa, qb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    df = (qa + qb) ** 2 / (qa ** 2 / (len(a) - 1) + qb ** 2 / (len(b) - 1))
    return a.mean() - b.mean(), math.sqrt(qa + qb), df


def test_welch_hand_worked():
    a, b = [1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 4.0, 6.0]
    c = stats.compare(a, b)
    # diff -1, qa = 2.5/5 = 0.5, qb = 4/3, se = sqrt(11/6), df = (11/6)^2 / (0.25/4 + (16/9)/2)
    assert not c.paired
    assert c.diff == pytest.approx(-1.0)
    assert c.se == pytest.approx(math.sqrt(11 / 6))
    assert c.df == pytest.approx((11 / 6) ** 2 / (0.25 / 4 + (16 / 9) / 2))
    d, se, df = _welch_by_hand(a, b)
    half = stats.t_quantile(0.975, df) * se
    assert (c.lo, c.hi) == pytest.approx((d - half, d + half))
    assert not c.separated


def test_paired_hand_worked_and_by_seed():
    a = {0: 10.0, 1: 12.0, 2: 11.0, 3: 13.0}
    b = {3: 12.0, 0: 9.0, 2: 10.5, 1: 11.0}      # same seeds, other order: paired by key
    c = stats.compare(a, b)
    d = [1.0, 1.0, 0.5, 1.0]                       # per-seed differences
    assert c.paired and c.n_a == 4
    assert c.diff == pytest.approx(np.mean(d))
    assert c.se == pytest.approx(np.std(d, ddof=1) / 2)
    t = c.diff / c.se
    assert c.p == pytest.approx(2 * stats.t_cdf(-t, 3))
    assert c.separated
    # paired gives far more power here than Welch on the same numbers
    w = stats.compare(list(a.values()), list(b.values()))
    assert not w.paired and w.p > 0.2 and c.p < 0.01


@needs_scipy
def test_compare_against_scipy():
    rng = np.random.default_rng(1)
    a, b = rng.normal(1, 1, 6), rng.normal(0, 2, 9)
    c = stats.compare(a, b)
    ref = sps.ttest_ind(a, b, equal_var=False)
    assert c.p == pytest.approx(ref.pvalue, rel=1e-9)
    lo, hi = ref.confidence_interval(0.95)
    assert (c.lo, c.hi) == pytest.approx((lo, hi), rel=1e-9)
    b2 = a - rng.normal(0.3, 0.2, 6)
    cp = stats.compare(a, b2, paired=True)
    refp = sps.ttest_rel(a, b2)
    assert cp.p == pytest.approx(refp.pvalue, rel=1e-9)
    assert (cp.lo, cp.hi) == pytest.approx(tuple(refp.confidence_interval(0.95)), rel=1e-9)
    one = stats.compare(a, 0.25)
    assert one.p == pytest.approx(sps.ttest_1samp(a, 0.25).pvalue, rel=1e-9)
    assert stats.compare(a, np.float64(0.25)).p == one.p      # numpy and torch scalars are numbers too
    import torch
    assert stats.compare(a, torch.tensor(0.25, dtype=torch.float64)).p == one.p


def test_compare_coverage_by_simulation():
    # an independent check of the interval itself: under the null, about 95% of intervals hold 0
    rng = np.random.default_rng(2)
    cover = []
    for _ in range(2000):
        c = stats.compare(rng.normal(0, 1, 5), rng.normal(0, 3, 8))
        cover.append(c.lo <= 0 <= c.hi)
    assert 0.935 < np.mean(cover) < 0.965


def test_compare_degenerate_and_bad_input():
    c = stats.compare([1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
    assert c.se == 0 and c.p == 0 and c.lo == c.hi == 1.0 and c.separated
    same = stats.compare([2.0, 3.0], [2.0, 3.0], paired=True)
    assert same.p == 1 and not same.separated
    with pytest.raises(ValueError, match="same length"):
        stats.compare([1, 2, 3], [1, 2], paired=True)
    with pytest.raises(ValueError, match="same seeds"):
        stats.compare({0: 1.0, 1: 2.0}, {0: 1.0, 2: 2.0}, paired=True)
    with pytest.raises(ValueError, match="b needs at least 2"):
        stats.compare([1, 2], [3])


# ---------------------------------------------------------------- Holm

def test_holm_hand_worked():
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.5, 0.001]) == pytest.approx([0.5, 0.002])
    assert stats.holm([0.9, 0.8, 0.7]) == pytest.approx([1.0, 1.0, 1.0])
    assert stats.holm([]) == []


def test_holm_against_slow_reference():
    # the definition, written as the closed test over all subsets it shortcuts (Bonferroni in each)
    import itertools
    rng = np.random.default_rng(3)
    for _ in range(50):
        p = list(rng.uniform(0, 0.2, size=4))
        m = len(p)
        ref = []
        for i in range(m):
            worst = 0.0
            for k in range(1, m + 1):
                for sub in itertools.combinations(range(m), k):
                    if i in sub:
                        worst = max(worst, min(1.0, k * min(p[j] for j in sub)))
            ref.append(worst)
        assert stats.holm(p) == pytest.approx(ref)


def test_holm_bad_input():
    with pytest.raises(ValueError, match=r"pvalues\[1\]"):
        stats.holm([0.1, 1.5])


# ---------------------------------------------------------------- claims

def test_claim_holds_records_and_fails_with_numbers(tmp_path, monkeypatch, capsys):
    path = tmp_path / "claims.jsonl"
    monkeypatch.setenv("RLKIT_CLAIMS_FILE", str(path))
    a, b = {s: 1.0 + 0.1 * s for s in range(5)}, {s: 0.1 * s for s in range(5)}
    c = stats.claim("a beats b", a, b, arms=("a", "b"))
    assert c.holds and c.comparison.paired
    assert "[claim holds] a beats b" in capsys.readouterr().out
    with pytest.raises(stats.ClaimFailed, match=r"b beats a \(b > a: diff -1"):
        stats.claim("b beats a", b, a, arms=("b", "a"))
    # a margin the interval does not clear
    with pytest.raises(stats.ClaimFailed):
        stats.claim("a beats b by more than 2", a, b, margin=2.0)
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    import json
    rec = json.loads(lines[0])
    assert rec["statement"] == "a beats b" and rec["holds"] and rec["comparison"]["n_a"] == 5


def test_claim_equivalent_and_not_separated():
    rng = np.random.default_rng(4)
    x = rng.normal(0, 0.01, 8)
    y = rng.normal(0, 0.01, 8)
    assert stats.claim("no effect", x, y, kind="equivalent", tol=0.05).holds
    with pytest.raises(stats.ClaimFailed):
        stats.claim("no effect", x + 1, y, kind="equivalent", tol=0.05)
    r = stats.report("a and b", [1, 2, 3], [2, 1, 3], kind="not_separated")
    assert r.holds and not r.asserted
    with pytest.raises(ValueError, match="needs tol"):
        stats.claim("x", x, y, kind="equivalent")
    with pytest.raises(ValueError, match="kind must be"):
        stats.claim("x", x, y, kind="bigger")
    with pytest.raises(ValueError, match="statement"):
        stats.claim("  ", x, y)


def test_claim_all_applies_holm():
    rng = np.random.default_rng(5)
    base = rng.normal(0, 1, 6)
    strong = {s: v for s, v in enumerate(base + 3 + rng.normal(0, 0.1, 6))}
    weak = {s: v for s, v in enumerate(base + 0.05 + rng.normal(0, 0.05, 6))}
    b = dict(enumerate(base))
    c = stats.compare(weak, b)
    out = stats.claim_all("two arms over b", [("strong > b", strong, b, "greater"),
                                              ("weak > b", weak, b, "greater")], check=False)
    assert out[0].holds
    # the family-wise adjusted p of the weaker claim is never below its own p
    assert out[1].p_adjusted >= c.p
    assert out[1].p_adjusted == pytest.approx(stats.holm([out[0].comparison.p, c.p])[1])


# ---------------------------------------------------------------- the seed switch

def test_seeds_follow_the_switch(monkeypatch):
    monkeypatch.delenv("RLKIT_SEED_BASE", raising=False)
    assert seeds(3) == [0, 1, 2] and seeds(2, start=10) == [10, 11] and seed_base() == 0
    monkeypatch.setenv("RLKIT_SEED_BASE", "1000")
    assert seeds(3) == [1000, 1001, 1002]
    monkeypatch.setenv("RLKIT_SEED_BASE", "ten")
    with pytest.raises(ValueError, match="RLKIT_SEED_BASE"):
        seeds(3)
    monkeypatch.setenv("RLKIT_SEED_BASE", "0")
    with pytest.raises(ValueError, match="n must be"):
        seeds(0)
