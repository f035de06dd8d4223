"""Tests for rlkit.staleness (and the stale trainers built on it) against independent computations:
hand-worked cases, closed forms, exact TV distances of categorical distributions and slow loops."""
import math

import pytest
import torch

from rlkit.estimators import effective_sample_size
from rlkit.staleness import (
    METRICS,
    Alert,
    Checkpoint,
    GuardDecision,
    LagDistribution,
    Monitor,
    PolicyArchive,
    StaleTrainingConfig,
    Threshold,
    TrainingGuard,
    VersionedBuffer,
    age_clip_radius,
    geppo_clip_radius,
    half_abs_ratio_diff,
    mean_by_age,
    staleness,
    staleness_filter,
    update_shift,
    version_window,
)

torch.set_num_threads(1)
D64 = torch.float64


def log(x):
    return torch.log(torch.tensor(x, dtype=D64))


# ----------------------------------------------------------------------------------------------
# estimators vs exact TV between categorical distributions (the ratio lemma (lem-ch11-ratio))
# ----------------------------------------------------------------------------------------------

def tv_loop(p, q):
    return 0.5 * sum(abs(a - b) for a, b in zip(p, q))


def test_estimators_exact_on_a_stratified_sample():
    # mu = (1/2, 1/4, 1/4): the "sample" [0, 0, 1, 2] has exactly the behaviour frequencies, so the
    # sample mean IS the expectation and the ratio lemma (lem-ch11-ratio) must give the TV exactly
    mu, pk, pnew = [0.5, 0.25, 0.25], [0.2, 0.5, 0.3], [0.1, 0.6, 0.3]
    a = torch.tensor([0, 0, 1, 2])
    lb, lk, ln = log(mu)[a], log(pk)[a], log(pnew)[a]
    assert update_shift(ln, lk, lb).item() == pytest.approx(tv_loop(pnew, pk), abs=1e-12)
    assert staleness(lk, lb).item() == pytest.approx(tv_loop(pk, mu), abs=1e-12)
    assert tv_loop(pnew, pk) == pytest.approx(0.1)
    assert tv_loop(pk, mu) == pytest.approx(0.3)


def test_estimators_converge_to_exact_tv_with_random_samples():
    g = torch.Generator().manual_seed(0)
    mu = torch.softmax(torch.randn(6, generator=g, dtype=D64), 0)
    pk = torch.softmax(torch.randn(6, generator=g, dtype=D64), 0)
    pn = torch.softmax(torch.log(pk) + 0.3 * torch.randn(6, generator=g, dtype=D64), 0)
    n = 200_000
    a = torch.multinomial(mu, n, replacement=True, generator=g)
    lb, lk, ln = mu.log()[a], pk.log()[a], pn.log()[a]
    u, s = update_shift(ln, lk, lb).item(), staleness(lk, lb).item()
    # standard errors from the per-sample terms (independent of the estimator's code)
    du = 0.5 * (pn[a] / mu[a] - pk[a] / mu[a]).abs()
    ds = 0.5 * (pk[a] / mu[a] - 1).abs()
    assert abs(u - tv_loop(pn.tolist(), pk.tolist())) < 5 * du.std().item() / math.sqrt(n)
    assert abs(s - tv_loop(pk.tolist(), mu.tolist())) < 5 * ds.std().item() / math.sqrt(n)


def test_token_mean_staleness_is_the_length_weighted_token_tv():
    # What the LLM trainer's per-token S-hat estimates (rlkit.llm.stale): on a two-token "language"
    # (token 0 ends the response), the masked token mean of 1/2|rho_k - 1| over responses sampled from
    # mu converges to E_mu[sum_t TV_t] / E_mu[T], the next-token TV averaged over the length-weighted
    # prefix occupancy. Closed forms by enumeration; the response-level TV is at most E_mu[sum_t TV_t].
    mu1, pk1 = torch.tensor([0.5, 0.3, 0.2], dtype=D64), torch.tensor([0.3, 0.4, 0.3], dtype=D64)
    mu2 = torch.tensor([[0.6, 0.2, 0.2], [0.1, 0.1, 0.8]], dtype=D64)      # after token 1, after token 2
    pk2 = torch.tensor([[0.1, 0.7, 0.2], [0.1, 0.1, 0.8]], dtype=D64)    # TV 0.5 after token 1, 0 after 2
    tv1 = tv_loop(mu1.tolist(), pk1.tolist())
    tv2 = [tv_loop(mu2[j].tolist(), pk2[j].tolist()) for j in range(2)]
    e_sum_tv = tv1 + mu1[1].item() * tv2[0] + mu1[2].item() * tv2[1]
    e_len = 1 + mu1[1].item() + mu1[2].item()
    target = e_sum_tv / e_len
    plain_mean_of_positions = 0.5 * (tv1 + (mu1[1] * tv2[0] + mu1[2] * tv2[1]).item() / (1 - mu1[0].item()))
    assert abs(target - plain_mean_of_positions) > 0.01          # the weighting matters on this example
    # response-level TV by enumerating the 1 + 2 * 3 responses
    seq = [(mu1[0].item(), pk1[0].item())]
    seq += [(mu1[a].item() * mu2[a - 1, b].item(), pk1[a].item() * pk2[a - 1, b].item())
            for a in (1, 2) for b in range(3)]
    tv_seq = 0.5 * sum(abs(m - p) for m, p in seq)
    assert tv_seq <= e_sum_tv + 1e-12 and tv_seq > target
    # Monte Carlo through rlkit.staleness.staleness with a [B, 2] mask
    g = torch.Generator().manual_seed(3)
    n = 200_000
    y1 = torch.multinomial(mu1, n, replacement=True, generator=g)
    y2 = torch.multinomial(mu2[(y1 - 1).clamp(min=0)], 1, generator=g).squeeze(-1)
    two = y1 > 0
    prev, zero = (y1 - 1).clamp(min=0), torch.zeros(n, dtype=D64)
    lb = torch.stack([mu1.log()[y1], torch.where(two, mu2[prev, y2].log(), zero)], -1)
    lk = torch.stack([pk1.log()[y1], torch.where(two, pk2[prev, y2].log(), zero)], -1)
    mask = torch.stack([torch.ones(n, dtype=torch.bool), two], -1)
    s_hat = staleness(lk, lb, mask).item()
    terms = 0.5 * (torch.exp(lk - lb) - 1).abs()[mask]
    assert abs(s_hat - target) < 5 * terms.std().item() / math.sqrt(mask.sum().item())
    assert abs(s_hat - tv_seq) > 0.05                             # not the response-level staleness


def test_estimators_masked_mean_and_zero_on_policy():
    lb = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.1, 0.0]])
    lk = torch.tensor([[-0.5, -2.0, 5.0], [-0.5, -0.1, 9.0]])
    m = torch.tensor([[1, 1, 0], [1, 1, 0]])
    # by hand: rows' kept terms 0.5*|e^{0.5}-1|, 0, 0, 0 -> mean over 4 kept entries
    want = 0.5 * (math.exp(0.5) - 1) / 4
    assert staleness(lk, lb, m).item() == pytest.approx(want, rel=1e-6)
    assert staleness(lb, lb).item() == 0.0
    assert update_shift(lk, lk, lb, m).item() == 0.0
    # nothing kept: 0, the one convention of rlkit.utils.masked_mean (and NaN padding stays out)
    assert staleness(lk, lb, torch.zeros_like(m)).item() == 0.0
    lk_pad = lk.clone()
    lk_pad[:, 2] = float("nan")
    assert staleness(lk_pad, lb, m).item() == pytest.approx(want, rel=1e-6)
    # per-row means with dim=-1 (what rlkit.tabular uses for a batch of MDPs)
    rows = staleness(lk, lb, m, dim=-1)
    assert rows.tolist() == pytest.approx([0.5 * (math.exp(0.5) - 1) / 2, 0.0], rel=1e-6)


def test_half_abs_ratio_diff_is_the_one_lemma51_estimator():
    lb = torch.tensor([-1.0, -2.0, -0.5, -3.0], dtype=D64)
    la = torch.tensor([-0.5, -2.5, -0.5, float("-inf")], dtype=D64)
    lc = torch.tensor([-1.5, -2.0, -0.4, -3.0], dtype=D64)
    loop = [0.5 * abs(math.exp(a - b) - math.exp(c - b)) for a, c, b in zip(la.tolist(), lc.tolist(), lb.tolist())]
    assert half_abs_ratio_diff(la, lc, lb).item() == pytest.approx(sum(loop) / 4, rel=1e-12)
    assert update_shift(la, lc, lb).item() == half_abs_ratio_diff(la, lc, lb).item()
    assert staleness(la, lb).item() == half_abs_ratio_diff(la, lb, lb).item()
    # equal log-ratios give 0 even where the ratio itself overflows (not inf - inf = NaN)
    big = torch.tensor([200.0])
    assert half_abs_ratio_diff(big, big, torch.zeros(1)).item() == 0.0


def test_incremental_ratio_is_not_the_update_shift():
    # |rho_{k+1} - rho_k| = rho_k |r - 1|: with rho_k = 4 the incremental ratio alone is 4x too small
    lb, lk = log([0.1]), log([0.4])
    ln = lk + math.log(1.1)
    assert update_shift(ln, lk, lb).item() == pytest.approx(0.5 * 4 * 0.1, rel=1e-9)


@pytest.mark.parametrize("big", [50.0, -50.0, 80.0])
def test_extreme_log_ratios_are_finite(big):
    lb = torch.tensor([0.0, -1.0])
    lk = torch.tensor([big, -1.0])
    ln = torch.tensor([big + 0.1, -1.0])
    for x in (update_shift(ln, lk, lb), staleness(lk, lb), effective_sample_size(lk - lb, share=True)):
        assert torch.isfinite(x)
    keep = staleness_filter(lk, lb, 0.2)
    assert keep.tolist() == [False, True]


def test_estimator_input_checks():
    a = torch.zeros(3)
    with pytest.raises(ValueError, match="shape"):
        staleness(a, torch.zeros(4))
    with pytest.raises(TypeError, match="floating"):
        staleness(torch.zeros(3, dtype=torch.long), a)
    with pytest.raises(ValueError, match="mask"):
        update_shift(a, a, a, torch.ones(2))
    with pytest.raises(ValueError, match="0 and 1"):
        staleness(a, a, torch.tensor([0.0, 0.5, 1.0]))


# ----------------------------------------------------------------------------------------------
# ESS, mean by age
# ----------------------------------------------------------------------------------------------

def test_effective_sample_size_share_closed_forms():
    ess = lambda lw, m=None: effective_sample_size(lw, mask=m, dim=None, share=True)
    assert ess(torch.zeros(10)).item() == pytest.approx(1.0)
    # w = (1, 3): (1 + 3)^2 / (2 * (1 + 9)) = 0.8
    assert ess(torch.log(torch.tensor([1.0, 3.0]))).item() == pytest.approx(0.8, rel=1e-6)
    one_big = torch.tensor([80.0, 0.0, 0.0, 0.0])
    assert ess(one_big).item() == pytest.approx(0.25, rel=1e-6)
    m = torch.tensor([True, False, True])
    assert ess(torch.tensor([0.0, 50.0, 0.0]), m).item() == pytest.approx(1.0)
    # [B, T] tokens with a mask, all kept tokens one sample (the LLM trainer's use); NaN padding is skipped
    lw = torch.tensor([[0.0, math.log(3.0)], [float("nan"), 0.0]])
    mm = torch.tensor([[True, True], [False, True]])
    assert ess(lw, mm).item() == pytest.approx(25 / (3 * 11), rel=1e-6)       # w = 1, 3, 1


def test_mean_by_age_matches_loop():
    g = torch.Generator().manual_seed(1)
    vals = torch.rand(20, 4, generator=g, dtype=D64)
    mask = torch.rand(20, 4, generator=g) < 0.7
    ages = torch.randint(0, 5, (20,), generator=g)
    ages[ages == 3] = 4                          # age 3 absent -> NaN
    got = mean_by_age(vals, ages, mask, max_age=5)
    for a in range(6):
        xs = [vals[i, t].item() for i in range(20) for t in range(4) if ages[i] == a and mask[i, t]]
        if xs:
            assert got[a].item() == pytest.approx(sum(xs) / len(xs), rel=1e-12)
        else:
            assert math.isnan(got[a].item())


# ----------------------------------------------------------------------------------------------
# filter, window, clip radii
# ----------------------------------------------------------------------------------------------

def test_staleness_filter_token_level_by_hand():
    lb = torch.zeros(5, dtype=D64)
    rho = torch.tensor([1.0, 1.25, 0.75, 1.35, 0.6], dtype=D64)
    keep = staleness_filter(rho.log(), lb, 0.3)
    assert keep.tolist() == [True, True, True, False, False]


def test_staleness_filter_sequence_levels_match_loops():
    g = torch.Generator().manual_seed(2)
    lk = 0.2 * torch.randn(6, 5, generator=g, dtype=D64)
    lb = torch.zeros_like(lk)
    mask = torch.ones(6, 5, dtype=torch.bool)
    mask[0, 3:] = False
    mask[4, 1:] = False
    for level in ("sequence", "sequence-mean"):
        keep = staleness_filter(lk, lb, 0.25, mask, level=level)
        for i in range(6):
            terms = [lk[i, t].item() for t in range(5) if mask[i, t]]
            s = sum(terms) / (len(terms) if level == "sequence-mean" else 1)
            ok = abs(math.exp(s) - 1) <= 0.25
            assert keep[i].tolist() == [ok and bool(mask[i, t]) for t in range(5)], (level, i)


def test_staleness_filter_bounds_kept_staleness():
    g = torch.Generator().manual_seed(3)
    lk, lb = torch.randn(1000, generator=g), torch.randn(1000, generator=g)
    keep = staleness_filter(lk, lb, 0.4)
    assert 0 < keep.sum() < 1000
    assert staleness(lk, lb, keep).item() <= 0.2 + 1e-7


def test_staleness_filter_checks():
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="eps_stale"):
        staleness_filter(x, x, 0.0)
    with pytest.raises(ValueError, match="level"):
        staleness_filter(x, x, 0.1, level="batch")


def test_version_window():
    v = torch.tensor([10, 9, 8, 7, 3])
    assert version_window(v, 10, 1).tolist() == [True, False, False, False, False]
    assert version_window(v, 10, 3).tolist() == [True, True, True, False, False]
    with pytest.raises(ValueError, match="future"):
        version_window(v, 9, 3)
    with pytest.raises(ValueError, match="window"):
        version_window(v, 10, 0)
    with pytest.raises(TypeError):
        version_window(v.float(), 10, 2)


def test_clip_radii_closed_forms():
    for M in (1, 2, 5, 9):
        assert geppo_clip_radius(0.2, [1.0 / M] * M) == pytest.approx(2 * 0.2 / (M + 1))
    assert geppo_clip_radius(0.2, [0, 0, 0, 1.0]) == pytest.approx(0.05)     # all data 3 versions old
    r = age_clip_radius(0.3, torch.tensor([0, 1, 2, 5]))
    assert r.tolist() == pytest.approx([0.3, 0.15, 0.1, 0.05])
    with pytest.raises(ValueError, match="sum to 1"):
        geppo_clip_radius(0.2, [0.5, 0.4])
    with pytest.raises(ValueError, match="ages"):
        age_clip_radius(0.2, torch.tensor([-1]))


# ----------------------------------------------------------------------------------------------
# lag distribution, archive, buffer
# ----------------------------------------------------------------------------------------------

def test_lag_distribution():
    f = LagDistribution.fixed(4)
    assert (f.min, f.max, f.mean) == (4, 4, 4.0)
    assert f.sample(5).tolist() == [4] * 5
    u = LagDistribution.uniform(8)
    assert u.probs == pytest.approx([1 / 9] * 9) and u.mean == pytest.approx(4.0)
    assert u.share_at_least(3) == pytest.approx(6 / 9)
    geo = LagDistribution.geometric(1.0, 3)               # q = 1/2: (8, 4, 2, 1) / 15
    assert geo.probs == pytest.approx([8 / 15, 4 / 15, 2 / 15, 1 / 15])
    counts = torch.bincount(u.sample(90_000, torch.Generator().manual_seed(0)), minlength=9).double() / 90_000
    assert (counts - 1 / 9).abs().max() < 0.01
    assert LagDistribution((0.0, 0.5, 0.5, 0.0)).max == 2
    with pytest.raises(ValueError, match="sum to 1"):
        LagDistribution((0.5, 0.2))
    with pytest.raises(ValueError, match=r"probs\[1\]"):
        LagDistribution((1.5, -0.5))
    with pytest.raises(ValueError, match="min_lag"):
        LagDistribution.uniform(2, 3)


def test_policy_archive():
    net = torch.nn.Linear(2, 2)
    arc = PolicyArchive(capacity=3)
    for v in range(5):
        with torch.no_grad():
            net.weight.fill_(float(v))
        arc.push(v, net)
    assert arc.versions == [2, 3, 4] and arc.latest == 4
    assert arc.get(3).weight[0, 0].item() == 3.0          # a copy, not the live module
    assert arc.behaviour_versions(4, torch.tensor([0, 1, 5])).tolist() == [4, 3, 2]
    with pytest.raises(KeyError):
        arc.get(1)
    with pytest.raises(ValueError, match=r"version must be >= 5, got 4"):     # versions increase
        arc.push(4, net)


def test_versioned_buffer_window_and_capacity():
    buf = VersionedBuffer()
    for v in range(4):
        buf.put(v, torch.full((2,), -float(v)), x=torch.full((2, 3), float(v)))
    out = buf.take(current=3, window=2, consume=False)
    assert out["version"].tolist() == [2, 2, 3, 3] and out["age"].tolist() == [1, 1, 0, 0]
    assert out["logp_behav"].tolist() == [-2, -2, -3, -3] and out["x"][:, 0].tolist() == [2, 2, 3, 3]
    assert len(buf) == 4                                   # versions 0, 1 left the window for good
    buf.take(current=3)
    assert len(buf) == 0
    cap = VersionedBuffer(capacity=3)
    cap.put(torch.tensor([0, 0]), torch.zeros(2), x=torch.zeros(2))
    cap.put(torch.tensor([1, 1]), torch.zeros(2), x=torch.ones(2))
    assert cap.versions().tolist() == [0, 1, 1]
    with pytest.raises(ValueError, match="same fields"):
        cap.put(2, torch.zeros(1), y=torch.zeros(1))
    with pytest.raises(ValueError, match=r"x must have shape \[n, \.\.\.\] like logp = \(2,\), got \(3,\)"):
        cap.put(2, torch.zeros(2), x=torch.zeros(3))
    with pytest.raises(ValueError, match="newer"):
        cap.take(current=0)


# ----------------------------------------------------------------------------------------------
# monitor, checkpoint
# ----------------------------------------------------------------------------------------------

def test_monitor_patience_nan_and_replay():
    mon = Monitor([Threshold("staleness", max=0.1, patience=2), Threshold("ess", min=0.5)])
    trace = {"staleness": [0.05, 0.2, 0.05, 0.2, 0.3, 0.4, 0.05], "ess": [0.9, 0.9, 0.4, 0.9, 0.9, float("nan"), 0.9]}
    fired = [mon.update(i, staleness=trace["staleness"][i], ess=trace["ess"][i]) for i in range(7)]
    got = [(a.step, a.metric) for f in fired for a in f]
    assert got == [(2, "ess"), (4, "staleness"), (5, "ess")]
    assert mon.ok
    assert [(a.step, a.metric) for a in Monitor.replay(trace, mon.thresholds)] == got
    assert "not finite" in str(mon.alerts[-1]) and "> max 0.1" in mon.alerts[1].message
    assert mon.history["ess"][2] == 0.4
    # patience 2: fires again every 2 violating updates while the streak lasts
    again = Monitor.replay({"kl": [1.0] * 5}, [Threshold("kl", max=0.5, patience=2)])
    assert [a.step for a in again] == [1, 3]


def test_threshold_checks():
    with pytest.raises(ValueError, match="metric"):
        Threshold("udpate_shift", max=0.1)
    with pytest.raises(ValueError, match="min"):
        Threshold("kl", max=0.1, min=0.2)
    with pytest.raises(ValueError, match="give max, min"):
        Threshold("kl")
    assert set(METRICS) >= {"update_shift", "staleness", "clip_fraction", "kl", "entropy", "ess"}


def test_checkpoint_restores_weights_and_optimizer():
    net = torch.nn.Linear(3, 1)
    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    net(torch.ones(1, 3)).sum().backward()
    opt.step()
    ck = Checkpoint()
    ck.save(7, net, opt)
    w = net.weight.detach().clone()
    state = opt.state_dict()["state"][0]["exp_avg"].clone()
    for _ in range(3):
        opt.zero_grad()
        net(torch.ones(1, 3)).sum().backward()
        opt.step()
    assert not torch.equal(net.weight, w)
    assert ck.restore(net, opt) == 7
    assert torch.equal(net.weight, w) and torch.equal(opt.state_dict()["state"][0]["exp_avg"], state)
    with pytest.raises(RuntimeError):
        Checkpoint().restore(net)


# ----------------------------------------------------------------------------------------------
# the validated config
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, field", [
    (dict(method="incremental"), "method"),
    (dict(clip_eps=1.2), "clip_eps"),
    (dict(clip_eps=0), "clip_eps"),
    (dict(lag=-1), "lag"),
    (dict(lag="4"), "lag"),
    (dict(eps_stale=0.0), "eps_stale"),
    (dict(eps_stale=-0.1), "eps_stale"),
    (dict(version_window=0), "version_window"),
    (dict(lag=4, version_window=4), "version_window"),
    (dict(lag=LagDistribution.uniform(8, min_lag=2), version_window=2), "version_window"),
    (dict(method="adaptive", behav_clip=2.0), "behav_clip"),
    (dict(on_alert="rollback"), "on_alert"),
    (dict(on_alert="page-someone", thresholds=(Threshold("kl", max=0.1),)), "on_alert"),
    (dict(thresholds=(Threshold("kl", max=0.1), Threshold("kl", min=0.0))), "thresholds"),
    (dict(thresholds=({"kl": 0.1},)), "thresholds"),
    (dict(rollback_lr_factor=0.0), "rollback_lr_factor"),
    (dict(checkpoint_every=0), "checkpoint_every"),
    (dict(filter_level="word"), "filter_level"),
    (dict(clip_schedule="linear"), "clip_schedule"),
])
def test_config_errors_name_the_field(kwargs, field):
    with pytest.raises((ValueError, TypeError), match=rf"StaleTrainingConfig\.{field}"):
        StaleTrainingConfig(**kwargs)


def test_config_accepts_and_derives():
    c = StaleTrainingConfig(method="decoupled", lag=LagDistribution.uniform(8), version_window=3, eps_stale=0.3,
                            behav_clip=2.0, thresholds=(Threshold("kl", max=0.05),), on_alert="rollback")
    assert c.expected_drop_share == pytest.approx(6 / 9)
    # GePPO radius over the ages the window keeps (0, 1, 2 uniformly): 0.2 / 2
    c2 = StaleTrainingConfig(lag=LagDistribution.uniform(8), version_window=3, clip_schedule="geppo")
    assert c2.clip_radius() == pytest.approx(0.1)
    c3 = StaleTrainingConfig(lag=4)
    assert isinstance(c3.lag, LagDistribution) and c3.lag.max == 4 and c3.clip_radius() == 0.2
    assert StaleTrainingConfig(clip_schedule="age").clip_radius(torch.tensor([1])).tolist() == pytest.approx([0.1])
    assert c.to_dict()["lag"].startswith("LagDistribution")


# ----------------------------------------------------------------------------------------------
# per-sample clip radii in the trainers' losses: reference loops
# ----------------------------------------------------------------------------------------------

def _ref_token_loss(method, logp, lprox, lb, adv, eps, m):
    tot, cnt = 0.0, 0
    for i in range(len(logp)):
        if not m[i]:
            continue
        e = eps[i]
        rho, rk = math.exp(logp[i] - lb[i]), math.exp(lprox[i] - lb[i])
        if method == "standard":
            v = -min(rho * adv[i], min(max(rho, 1 - e), 1 + e) * adv[i])
        elif method == "adaptive":
            v = -min(rho * adv[i], min(max(rho, rk - e), rk + e) * adv[i])
        else:
            r = math.exp(logp[i] - lprox[i])
            v = -rk * min(r * adv[i], min(max(r, 1 - e), 1 + e) * adv[i])
        tot += v
        cnt += 1
    return tot / cnt


@pytest.mark.parametrize("method", ["standard", "adaptive", "decoupled"])
def test_per_sample_radius_losses_match_loops(method):
    from rlkit.objectives import clipped_policy_loss
    g = torch.Generator().manual_seed(4)
    n = 40
    lb = torch.randn(n, generator=g, dtype=D64)
    lprox = lb + 0.4 * torch.randn(n, generator=g, dtype=D64)
    logp = lprox + 0.3 * torch.randn(n, generator=g, dtype=D64)
    adv = torch.randn(n, generator=g, dtype=D64)
    ages = torch.randint(0, 4, (n,), generator=g)
    eps = age_clip_radius(0.3, ages).to(D64)
    loss, _ = clipped_policy_loss(method, logp, lprox, lb, adv, eps)
    want = _ref_token_loss(method, logp.tolist(), lprox.tolist(), lb.tolist(), adv.tolist(), eps.tolist(), [1] * n)
    assert loss.item() == pytest.approx(want, rel=1e-10)
    # LLM layout: 8 responses x 5 tokens, one radius per response, token-mean aggregation
    B, T = 8, 5
    mask = (torch.rand(B, T, generator=g) < 0.8).to(D64)
    mask[:, 0] = 1
    eps_r = age_clip_radius(0.3, torch.randint(0, 4, (B,), generator=g)).to(D64)
    loss2, _ = clipped_policy_loss(method, logp[:B * T].view(B, T), lprox[:B * T].view(B, T), lb[:B * T].view(B, T),
                                   adv[:B * T].view(B, T), eps_r, mask=mask, aggregation="token-mean")
    want2 = _ref_token_loss(method, logp[:B * T].tolist(), lprox[:B * T].tolist(), lb[:B * T].tolist(),
                            adv[:B * T].tolist(), eps_r.repeat_interleave(T).tolist(), mask.flatten().tolist())
    assert loss2.item() == pytest.approx(want2, rel=1e-10)


# ----------------------------------------------------------------------------------------------
# the one alert / rollback mechanism of both stale trainers
# ----------------------------------------------------------------------------------------------

def test_training_guard_rollback_save_and_stop():
    net = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    cfg = StaleTrainingConfig(thresholds=(Threshold("kl", max=0.1),), on_alert="rollback", max_rollbacks=1,
                              checkpoint_every=2, rollback_lr_factor=0.25)
    guard = TrainingGuard(cfg, net, opt)
    w0 = net.weight.detach().clone()
    with torch.no_grad():
        net.weight += 1.0
    d = guard.update(0, kl=0.05)                       # fine: update 0 is not a checkpoint update (1 % 2)
    assert d == GuardDecision("continue") and not d.rolled_back and not d.stop
    d = guard.update(1, kl=0.05)                       # fine and (1 + 1) % 2 == 0: save as update 2
    assert d.action == "continue" and guard.checkpoint.step == 2
    w2 = net.weight.detach().clone()
    with torch.no_grad():
        net.weight += 5.0
    d = guard.update(2, kl=0.5)                        # alert: restore the weights saved at update 2
    assert d.rolled_back and d.restored_to == 2 and len(d.alerts) == 1
    assert torch.equal(net.weight, w2) and not torch.equal(net.weight, w0)
    assert guard.lr_scale == 0.25 and guard.rollbacks == [(2, 2)]
    d = guard.update(3, kl=0.5)                        # max_rollbacks reached: stop
    assert d.stop and guard.rollbacks == [(2, 2)] and len(guard.alerts) == 2
    # on_alert="log": alerts are only recorded
    log = TrainingGuard(StaleTrainingConfig(thresholds=(Threshold("kl", max=0.1),)), net, opt)
    assert log.update(0, kl=1.0).action == "continue" and len(log.alerts) == 1
    with pytest.raises(TypeError, match="config"):
        TrainingGuard("not a config", net, opt)


# ----------------------------------------------------------------------------------------------
# the trainers: short runs
# ----------------------------------------------------------------------------------------------

def _short_ppo(**cfg):
    from rlkit.algos import StalePPOConfig
    from rlkit.algos.stale_ppo import train_stale_ppo
    return train_stale_ppo(cfg=StalePPOConfig(total_steps=4 * 64, num_envs=4, num_steps=16, epochs=2),
                           stale=StaleTrainingConfig(**cfg), progress=False)


def test_stale_ppo_lag0_methods_identical_and_lemma51():
    runs = [_short_ppo(method=m, lag=0)[1] for m in ("standard", "adaptive", "decoupled")]
    for h in runs[1:]:
        assert h["loss"] == runs[0]["loss"] and h.episode_returns == runs[0].episode_returns
    _, h = _short_ppo(method="adaptive", lag=2)
    assert h["mean_age"][0] == 0.0 and h["mean_age"][-1] == 2.0        # lags clamp early in training
    assert h["staleness"][0] == 0.0 and h["staleness"][-1] > 0
    for a, b in zip(h["update_shift"], h["update_shift_tv"]):        # same order of magnitude
        assert 0.2 < a / b < 5
    assert set(h.stats) >= {"update_shift", "staleness", "staleness_tv", "drop_share", "ess", "clip_fraction", "kl"}


def test_stale_ppo_rollback_fires_and_restores():
    _, h = _short_ppo(method="adaptive", lag=1, thresholds=(Threshold("kl", max=1e-9),), on_alert="rollback",
                      max_rollbacks=2, rollback_lr_factor=0.5)
    assert len(h.rollbacks) == 2 and h.rollbacks[0] == (0, 0)
    assert h["lr"][1] < h["lr"][0]
    assert len(h.alerts) == 3 and isinstance(h.alerts[0], Alert)          # the third alert stops the run
    assert len(h.steps) == 3


def test_stale_grpo_short_run():
    from rlkit.llm import ADDITION, RLConfig, RLResult, load_pretrained
    from rlkit.llm.stale import train_stale_grpo
    out = []
    for method in ("standard", "decoupled"):
        model, tok = load_pretrained()
        r = train_stale_grpo(model, tok, ADDITION, RLConfig(steps=2, prompts_per_step=4, group_size=4,
                                                            eval_every=2, eval_problems=16),
                             StaleTrainingConfig(method=method, lag=0))
        out.append(r)
    assert out[0].history["loss"] == out[1].history["loss"]
    model, tok = load_pretrained()
    r = train_stale_grpo(model, tok, ADDITION, RLConfig(steps=3, prompts_per_step=4, group_size=4, eval_every=3,
                                                        eval_problems=16),
                         StaleTrainingConfig(method="adaptive", lag=1, eps_stale=0.5))
    assert isinstance(r, RLResult) and r.stale.eps_stale == 0.5 and r.alerts == [] and r.rollbacks == []
    assert r.history["mean_age"] == [0.0, 1.0, 1.0] and r.history["staleness"][0] == 0.0
    # the KL between the policy before and after an update is kl_update; kl is the reference KL (none here)
    assert "kl" not in r.history and all(x >= 0 for x in r.history["kl_update"])
    assert r.evals["step"] == [0, 3] and "sampled_accuracy" not in r.evals
    with pytest.raises(ValueError, match="algo"):
        train_stale_grpo(model, tok, ADDITION, RLConfig(algo="ppo"))


def _tiny_stale_cfg(**kw):
    from rlkit.llm import RLConfig
    return RLConfig(**{**dict(steps=3, prompts_per_step=4, group_size=4, eval_every=3, eval_problems=16), **kw})


def test_stale_grpo_is_train_with_the_lagged_sampler_the_stale_loss_and_the_control_hook():
    # the wrapper is the chapter's one call, number for number
    from rlkit.llm import ADDITION, load_pretrained, train
    from rlkit.llm.samplers import Lagged
    from rlkit.llm.stale import StaleControl, StaleLoss, train_stale_grpo
    from rlkit.llm.trainer import HeldOut
    stale = StaleTrainingConfig(method="decoupled", lag=LagDistribution.uniform(2), version_window=2,
                                clip_schedule="age")
    model, tok = load_pretrained()
    a = train_stale_grpo(model, tok, ADDITION, _tiny_stale_cfg(), stale, eval_sampled=True)
    model, tok = load_pretrained()
    b = train(model, tok, ADDITION, _tiny_stale_cfg(), sampler=Lagged(stale.lag), loss=StaleLoss(stale),
              hooks=[StaleControl(stale)], evaluation=HeldOut(sampled=True, seed_offset=2))
    strip = lambda d: {k: [float(x).hex() for x in v] for k, v in d.items() if k != "train_seconds"}  # noqa: E731
    assert strip(a.history) == strip(b.history) and strip(a.evals) == strip(b.evals)
    assert set(a.evals) >= {"greedy_accuracy", "sampled_accuracy"}


# every RLConfig field train_stale_grpo does not read, with a value that would otherwise be silently ignored
IGNORED_BY_STALE_GRPO = dict(clip_eps=0.1, clip_eps_high=0.3, temperature=0.7, top_k=5, top_p=0.9,
                             dynamic_sampling=True, max_sample_rounds=2)


@pytest.mark.parametrize("field", sorted(IGNORED_BY_STALE_GRPO))
def test_stale_grpo_refuses_the_rlconfig_fields_it_does_not_read(field):
    from rlkit.llm import ADDITION, load_pretrained
    from rlkit.llm.stale import train_stale_grpo
    model, tok = load_pretrained()
    cfg = _tiny_stale_cfg(**{field: IGNORED_BY_STALE_GRPO[field]})
    with pytest.raises(ValueError, match=rf"RLConfig\.{field} "):
        train_stale_grpo(model, tok, ADDITION, cfg, StaleTrainingConfig(lag=1))


def test_stale_grpo_accepts_the_explicit_off_of_the_switches_it_does_not_use():
    from rlkit.llm import ADDITION, load_pretrained
    from rlkit.llm.stale import train_stale_grpo
    model, tok = load_pretrained()
    r = train_stale_grpo(model, tok, ADDITION, _tiny_stale_cfg(steps=1, dynamic_sampling=False),
                         StaleTrainingConfig(lag=1))
    assert len(r.history["loss"]) == 1


def test_the_kl_and_critic_fields_it_refused_are_no_longer_settings():
    # rlkit 0.2's KL, critic and dense-reward fields (refused by train_stale_grpo before) left RLConfig
    with pytest.raises(ValueError, match=r"RLConfig.value_lr .*TokenGAE\(lr=...\)"):
        _tiny_stale_cfg(value_lr=1e-3)


def test_stale_control_rollback_halves_the_lr_and_empties_the_sampler_archive():
    # a KL ceiling no update can meet: the first update is rolled back to update 0 (the weights before
    # training), the learning rate is halved, and the next batch comes from the restored weights only
    # (age 0) although the lag is 1; the second rollback is one too many and stops the run
    from rlkit.llm import ADDITION, load_pretrained
    from rlkit.llm.stale import train_stale_grpo
    model, tok = load_pretrained()
    stale = StaleTrainingConfig(method="adaptive", lag=1, thresholds=(Threshold("kl", max=1e-12),),
                                on_alert="rollback", max_rollbacks=1, rollback_lr_factor=0.5)
    r = train_stale_grpo(model, tok, ADDITION, _tiny_stale_cfg(), stale)
    h = r.history
    assert r.rollbacks == [(0, 0)] and [a.step for a in r.alerts] == [0, 1]
    assert h["rolled_back"] == [1.0, 0.0] and h["alerts"] == [1.0, 1.0]
    assert h["lr"] == [1e-4, 0.5e-4] and h["mean_age"] == [0.0, 0.0]
    assert r.evals["step"] == [0, 2]                          # a stopped run is evaluated where it stopped
    fresh, _ = load_pretrained()                            # the stop keeps the update after the rollback
    assert not all(torch.equal(p, q) for p, q in zip(fresh.state_dict().values(), model.state_dict().values()))


def test_stale_control_narrows_the_mask_after_the_advantages():
    # the window and the filter narrow step.mask (what the update trains on) and leave the advantages, which
    # were computed over every sampled response, alone; drop_share is the share of tokens removed
    from rlkit.llm.stale import StaleControl
    from rlkit.llm.trainer import Step

    class _Run:
        def __init__(self):
            self.logged = {}

        def log(self, **kw):
            self.logged.update(kw)

    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    lb = torch.zeros(4, 3)
    lk = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.9, 0.0], [0.1, 0.0, 0.0], [0.0, 0.0, 0.0]])
    adv = torch.ones(4, 3) * mask
    ro = type("Ro", (), {"mask": mask})()
    step = Step(batch=type("B", (), {"rollout": ro})(), logp_old=lk, logp_behav=lb, age=torch.tensor([0, 1, 2, 3]),
                mask=mask, rewards=torch.zeros(4), adv=adv.clone())
    run = _Run()
    stale = StaleTrainingConfig(lag=LagDistribution.uniform(3), version_window=3, eps_stale=0.5)
    StaleControl(stale).on_advantages(run, step)
    keep = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert torch.equal(step.mask, keep) and torch.equal(step.adv, adv) and torch.equal(step.rollout.mask, mask)
    assert run.logged["drop_share"] == pytest.approx(1 - 5 / 8) and run.logged["mean_age"] == 1.5
    assert run.logged["staleness"] == pytest.approx(float(staleness(lk, lb, mask)))


def test_alert_action_follows_on_alert_and_max_rollbacks():
    from rlkit.staleness import StaleTrainingConfig, Threshold
    rule = (Threshold("kl", max=0.1),)
    log = StaleTrainingConfig(thresholds=rule, on_alert="log")
    stop = StaleTrainingConfig(thresholds=rule, on_alert="stop")
    back = StaleTrainingConfig(thresholds=rule, on_alert="rollback", max_rollbacks=2)
    fired = ["kl above 0.1"]
    assert [c.alert_action([], 0) for c in (log, stop, back)] == ["continue"] * 3
    assert log.alert_action(fired, 0) == "continue"
    assert stop.alert_action(fired, 0) == "stop"
    assert [back.alert_action(fired, n) for n in (0, 1, 2, 3)] == ["rollback", "rollback", "stop", "stop"]


def _short_ppo_hooks(stale, **hooks):
    from rlkit.algos import StalePPOConfig
    from rlkit.algos.stale_ppo import train_stale_ppo
    return train_stale_ppo(cfg=StalePPOConfig(total_steps=8 * 64, num_envs=4, num_steps=16, epochs=2),
                           stale=stale, progress=False, **hooks)[1]


def test_stale_ppo_lag_schedule_grows_the_queue_as_versions_are_published():
    # lag 0 for updates 0-1, then 3: the archive held only the current version, so the age grows by one
    # version per update (a hand count: 0, 0, 0, 1, 2, 3, 3, 3) until the new lag is reached
    h = _short_ppo_hooks(StaleTrainingConfig(method="standard", lag=0),
                         lag_schedule=lambda k: LagDistribution.fixed(3 if k >= 2 else 0))
    assert list(h["mean_age"]) == [0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 3.0, 3.0]
    # a schedule that always returns the config's lag changes nothing
    stale = StaleTrainingConfig(method="standard", lag=2)
    a = _short_ppo_hooks(stale)
    b = _short_ppo_hooks(stale, lag_schedule=lambda k: stale.lag)
    assert a["loss"] == b["loss"] and a["staleness"] == b["staleness"]


def test_stale_ppo_tempered_sampler_is_stale_at_lag_zero():
    stale = StaleTrainingConfig(method="standard", lag=0)
    plain = _short_ppo_hooks(stale)
    assert all(s == 0.0 for s in plain["staleness"])                   # pi_k sampled every sample itself
    assert plain["loss"] == _short_ppo_hooks(stale, sampler_temperature=1.0)["loss"]
    hot = _short_ppo_hooks(stale, sampler_temperature=1.5)
    assert all(s > 0 for s in hot["staleness"][1:])
    # the exact mean TV between softmax(z) and softmax(z / 1.5) is what the sample estimate estimates
    for s, tv in zip(hot["staleness"][1:], hot["staleness_tv"][1:]):
        assert tv > 0 and 0.2 < s / tv < 5


def test_tempered_sampler_draws_from_and_reports_the_tempered_distribution():
    from rlkit.algos.stale_ppo import _tempered
    from rlkit.nets import CategoricalPolicy
    torch.manual_seed(0)
    actor = CategoricalPolicy(3, 4)
    obs = torch.randn(1, 3).expand(40_000, 3)
    a, logp = _tempered(actor, 2.0)(obs)
    expected = torch.log_softmax(actor(obs[:1]) / 2.0, -1)[0]
    assert torch.allclose(logp, expected[a], atol=1e-6)
    freq = torch.bincount(a, minlength=4).double() / a.numel()
    p = expected.exp().double()
    assert torch.all((freq - p).abs() < 4 * torch.sqrt(p * (1 - p) / a.numel()))


@pytest.mark.parametrize("hooks, match", [
    (dict(sampler_temperature=0.0), "sampler_temperature"),
    (dict(sampler_temperature=float("nan")), "sampler_temperature"),
    (dict(lag_schedule=3), "lag_schedule must be callable"),
    (dict(lag_schedule=lambda k: 3), r"lag_schedule\(0\) must return"),
])
def test_stale_ppo_hooks_refuse_bad_values(hooks, match):
    with pytest.raises((TypeError, ValueError), match=match):
        _short_ppo_hooks(StaleTrainingConfig(method="standard", lag=0), **hooks)
