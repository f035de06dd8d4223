"""Tests of the exercise checkers of chapters 2 and 3 (rlkit/exercises/solutions/ch02.py, ch03.py).

Every reference passes its own checker, every registered mistake is caught and diagnosed with its
own cause, and the references agree with independent computations: hand-worked values, closed
forms, slow loops written here, and rlkit's library functions (returns.gae, whose inverse chapter 2
asks for, returns.n_step_returns, offpolicy.importance_ratio, estimators.effective_sample_size /
importance_weight_variance).
"""
import math

import numpy as np
import pytest
import torch

from rlkit.exercises import check, exercises, get

CH02 = ["k_step_advantage", "rewards_from_advantages", "lambda_average", "optimal_constant_baseline"]
CH03 = ["importance_sampling_estimate", "chi_square_divergence", "tempering_exponent", "gspo_sequence_loss"]
ALL = CH02 + CH03


def test_chapters_register_their_exercises():
    assert sorted(e.name for e in exercises(chapter=2)) == sorted(CH02)
    assert sorted(e.name for e in exercises(chapter=3)) == sorted(CH03)


@pytest.mark.parametrize("name", ALL)
def test_each_exercise_knows_at_least_three_mistakes(name):
    assert len(get(name).mistakes) >= 3


def test_not_implemented_is_reported():
    def rewards_from_advantages(advantages, values, next_values, discounts, lam):
        raise NotImplementedError

    result = check(rewards_from_advantages, verbose=False)
    assert not result and "not implemented" in result.message


# ------------------------------------------------------------------------------ chapter 2

def _rows(seed, shape, p_term=0.2, gamma=0.95):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(*shape, generator=g, dtype=torch.float64)
    v = torch.randn(*shape, generator=g, dtype=torch.float64)
    nv = torch.cat([v[..., 1:], torch.randn(*shape[:-1], 1, generator=g, dtype=torch.float64)], -1)
    d = gamma * (torch.rand(*shape, generator=g) > p_term).double()
    return r, v, nv, d


def test_k_step_advantage_hand_case():
    ref = get("k_step_advantage").reference
    # r = 1, gamma = 0.9, V = (2, 1.5, 1, .5), V after the last step = 3, k = 2
    out = ref(torch.tensor([1.0] * 4), torch.tensor([2.0, 1.5, 1.0, 0.5]), torch.tensor([1.5, 1.0, 0.5, 3.0]),
              torch.tensor([0.9] * 4), 2)
    expected = [1 + 0.9 + 0.81 * 1.0 - 2.0, 1 + 0.9 + 0.81 * 0.5 - 1.5, 1 + 0.9 + 0.81 * 3.0 - 1.0, 1 + 0.9 * 3.0 - 0.5]
    assert torch.allclose(out, torch.tensor(expected))


def test_k_step_advantage_is_a_telescoped_sum_of_td_errors_and_matches_n_step_returns():
    from rlkit.returns import n_step_returns, td_errors

    ref = get("k_step_advantage").reference
    r, v, nv, d = _rows(1, (3, 11))
    delta = td_errors(r, v, nv, d)
    for k in (1, 2, 5, 11, 20):
        out = ref(r, v, nv, d, k)
        assert torch.allclose(out, n_step_returns(r, d, nv, k) - v, atol=1e-12)
        # sum_{l<m} (prod_{j<l} gamma_{t+j}) delta_{t+l}: equal because nv[t] = v[t+1] inside a row
        T = r.shape[-1]
        for b in range(3):
            for t in range(T):
                total, disc = 0.0, 1.0
                for l in range(min(k, T - t)):
                    total += disc * float(delta[b, t + l])
                    disc *= float(d[b, t + l])
                assert math.isclose(float(out[b, t]), total, rel_tol=1e-10, abs_tol=1e-10)


def test_rewards_from_advantages_inverts_the_library_gae():
    from rlkit.returns import gae, td_errors

    ref = get("rewards_from_advantages").reference
    r, v, nv, d = _rows(2, (4, 13))
    lam_cut = torch.full_like(r, 0.9)
    lam_cut[:, 6] = 0.0
    for lam in (0.0, 0.5, 0.95, 1.0, lam_cut):
        adv = gae(r, v, nv, d, lam)[0]
        assert torch.allclose(ref(adv, v, nv, d, lam), r, atol=1e-12)
        # and the other way round: any advantages are the GAE of the rewards recovered from them
        a = torch.randn_like(r)
        assert torch.allclose(gae(ref(a, v, nv, d, lam), v, nv, d, lam)[0], a, atol=1e-12)
    # lam = 0: the advantages are the TD errors, so r = A - gamma_t V(s_{t+1}) + V(s_t) step by step
    delta = td_errors(r, v, nv, d)
    assert torch.allclose(ref(delta, v, nv, d, 0.0), r, atol=1e-12)


def test_rewards_from_advantages_slow_loop_and_hand_case():
    ref = get("rewards_from_advantages").reference
    g = torch.Generator().manual_seed(12)
    a = torch.randn(3, 8, generator=g, dtype=torch.float64)
    v = torch.randn(3, 8, generator=g, dtype=torch.float64)
    nv = torch.randn(3, 8, generator=g, dtype=torch.float64)
    d = 0.9 * (torch.rand(3, 8, generator=g) > 0.3).double()
    lam = torch.rand(3, 8, generator=g, dtype=torch.float64)
    out = ref(a, v, nv, d, lam)
    for b in range(3):
        for t in range(8):
            a_next = float(a[b, t + 1]) if t + 1 < 8 else 0.0
            delta = float(a[b, t]) - float(d[b, t]) * float(lam[b, t]) * a_next
            expected = delta - float(d[b, t]) * float(nv[b, t]) + float(v[b, t])
            assert math.isclose(float(out[b, t]), expected, rel_tol=1e-12, abs_tol=1e-12)
    # hand case: A = (2, 1), V = (0.5, 0.5), V(s_1) = 0.5, V(s_2) = 0 (terminal), gamma_t = (0.9, 0),
    # lam = 0.5: delta_0 = 2 - 0.45 * 1 = 1.55, r_0 = 1.55 - 0.45 + 0.5 = 1.6; delta_1 = 1, r_1 = 1.5
    out = ref(torch.tensor([2.0, 1.0]), torch.tensor([0.5, 0.5]), torch.tensor([0.5, 0.0]),
              torch.tensor([0.9, 0.0]), 0.5)
    assert torch.allclose(out, torch.tensor([1.6, 1.5]))


def test_the_displayed_gae_called_as_a_student_would_fails():
    from rlkit.returns import gae

    def rewards_from_advantages(advantages, values, next_values, discounts, lam):
        return gae(advantages, values, next_values, discounts, lam)[0]

    assert not check(rewards_from_advantages, verbose=False)


def _student_inverse(gamma_in_reward, gamma_in_trace):
    # a student's inversion, written here; each gamma is "per-step" (the discounts) or "constant"
    def rewards_from_advantages(advantages, values, next_values, discounts, lam):
        lam = lam if isinstance(lam, torch.Tensor) else torch.full_like(advantages, float(lam))
        const = torch.full_like(discounts, float(discounts.max()))
        g_rew = discounts if gamma_in_reward == "per-step" else const
        g_trace = discounts if gamma_in_trace == "per-step" else const
        out = torch.empty_like(advantages)
        T = advantages.shape[-1]
        for t in range(T):
            a_next = advantages[..., t + 1] if t + 1 < T else torch.zeros_like(advantages[..., t])
            delta = advantages[..., t] - g_trace[..., t] * lam[..., t] * a_next
            out[..., t] = delta - g_rew[..., t] * next_values[..., t] + values[..., t]
        return out
    return rewards_from_advantages


@pytest.mark.parametrize("in_reward,in_trace,says", [
    ("per-step", "per-step", None),
    ("constant", "constant", "one constant gamma (the largest discount) instead of the per-step discounts"),
    ("per-step", "constant", "A_{t+1} of the next episode leaks into step t"),
])
def test_an_inversion_with_a_constant_gamma_is_rejected_with_its_cause(in_reward, in_trace, says):
    result = check(_student_inverse(in_reward, in_trace), verbose=False)
    if says is None:
        assert result, result.message
    else:
        assert not result and says in result.message, result.message
        assert "case 2 (two episodes in one row" in result.message     # caught on the hand-sized case


def test_gae_equals_lambda_average_of_k_step_advantages():
    # the derivation of the chapter: GAE = (1-lam) sum_k lam^(k-1) A^(k) with the tail on A^(K)
    from rlkit.returns import gae

    ks, la = (get(n).reference for n in ("k_step_advantage", "lambda_average"))
    r, v, nv, d = _rows(3, (2, 9), p_term=0.25)
    T = r.shape[-1]
    stack = torch.stack([ks(r, v, nv, d, k) for k in range(1, T + 1)], dim=-1)   # [2, T, K=T]
    for lam in (0.0, 0.3, 0.9, 1.0):
        assert torch.allclose(la(stack, lam), gae(r, v, nv, d, lam)[0], atol=1e-10)


def test_lambda_average_hand_case_and_weights_sum_to_one():
    la = get("lambda_average").reference
    # K = 3, lam = 1/2: weights 1/2, 1/4 and the tail 1/4
    assert math.isclose(float(la(torch.tensor([1.0, 2.0, 4.0]), 0.5)), 0.5 + 0.5 + 1.0)
    for lam in (0.0, 0.2, 0.9, 1.0):
        assert math.isclose(float(la(torch.ones(7, dtype=torch.float64), lam)), 1.0, rel_tol=1e-12)


def test_optimal_constant_baseline_minimises_the_summed_variance():
    ocb = get("optimal_constant_baseline").reference
    g = torch.Generator().manual_seed(4)
    s = torch.randn(500, 4, generator=g, dtype=torch.float64) * torch.tensor([0.3, 1.0, 2.0, 0.5], dtype=torch.float64)
    G = 2.0 + (s ** 2).sum(-1) + torch.randn(500, generator=g, dtype=torch.float64)
    b_star = float(ocb(s, G))

    def summed_var(b):   # sum over parameters of the sample variance of s_j (G - b)
        x = (s * (G - b)[:, None]).numpy()
        return float(np.var(x, axis=0).sum())

    grid = np.linspace(b_star - 3, b_star + 3, 601)
    values = [summed_var(b) for b in grid]
    # the sample variance is a quadratic in b whose minimum is b* up to the (E s)^2 term; with
    # E[s] = 0 the two agree to sampling error
    assert abs(grid[int(np.argmin(values))] - b_star) < 0.15
    # hand case: |s|^2 = (1, 4, 2), G = (1, 2, 3): (1 + 8 + 6) / 7
    out = ocb(torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]), torch.tensor([1.0, 2.0, 3.0]))
    assert math.isclose(float(out), 15 / 7, rel_tol=1e-6)


@pytest.mark.parametrize("name,args,err", [
    ("k_step_advantage", (torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.zeros(3), 0), ValueError),
    ("k_step_advantage", (torch.zeros(3), torch.zeros(4), torch.zeros(3), torch.zeros(3), 1), ValueError),
    ("rewards_from_advantages", (torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.zeros(3), 1.5), ValueError),
    ("rewards_from_advantages", (torch.zeros(3, dtype=torch.int64), torch.zeros(3), torch.zeros(3), torch.zeros(3),
                                 0.5), TypeError),
    ("rewards_from_advantages", (torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.zeros(4)),
     ValueError),
    ("lambda_average", (torch.zeros(3), -0.1), ValueError),
    ("optimal_constant_baseline", (torch.zeros(4, 2), torch.zeros(3)), ValueError),
    ("importance_sampling_estimate", (torch.zeros(3), torch.zeros(3), torch.zeros(4)), ValueError),
    ("chi_square_divergence", (torch.zeros(3), torch.zeros(3, dtype=torch.int64)), TypeError),
    ("tempering_exponent", (torch.tensor([1, 2]), 0.5), TypeError),
    ("tempering_exponent", (torch.zeros(3), 1.5), ValueError),
    ("tempering_exponent", (torch.zeros(2, 0), 0.5), ValueError),
    ("gspo_sequence_loss", (torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 2), torch.zeros(2), 0.2), ValueError),
    ("gspo_sequence_loss", (torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(3), 0.2), ValueError),
])
def test_references_validate_input(name, args, err):
    with pytest.raises(err):
        get(name).reference(*args)


# ------------------------------------------------------------------------------ chapter 3

def test_importance_sampling_estimate_hand_case_and_unbiasedness():
    est = get("importance_sampling_estimate").reference
    lp = torch.log(torch.tensor([0.5, 0.25, 0.25]))
    lq = torch.log(torch.tensor([0.25, 0.25, 0.5]))
    # weights (2, 1, 1/2), f = (1, 2, 3): (2 + 2 + 1.5) / 3
    assert math.isclose(float(est(torch.tensor([1.0, 2.0, 3.0]), lp, lq)), 5.5 / 3, rel_tol=1e-6)
    # E_p[x] for p = N(0.5, 1) from 200k draws of q = N(0, 1)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(200_000, generator=g, dtype=torch.float64)
    out = est(x, -0.5 * (x - 0.5) ** 2, -0.5 * x ** 2)
    assert abs(float(out) - 0.5) < 0.02
    # log-probabilities near -1000 stay finite
    out = est(torch.ones(2), torch.tensor([-1000.0, -1001.0]), torch.tensor([-1001.0, -1000.0]))
    assert math.isclose(float(out), (math.e + 1 / math.e) / 2, rel_tol=1e-6)


def test_chi_square_matches_library_and_monte_carlo():
    from rlkit.estimators import importance_weight_variance

    chi = get("chi_square_divergence").reference
    g = torch.Generator().manual_seed(6)
    zp, zq = torch.randn(3, 5, generator=g, dtype=torch.float64), torch.randn(3, 5, generator=g, dtype=torch.float64)
    assert torch.allclose(chi(zp, zq), importance_weight_variance(zp, zq), atol=1e-12)
    # Monte Carlo variance of w = p/q under q
    p, q = torch.softmax(zp[0], -1), torch.softmax(zq[0], -1)
    xs = torch.multinomial(q, 400_000, replacement=True, generator=g)
    w = (p / q)[xs]
    assert abs(float(w.var()) - float(chi(zp[0], zq[0]))) < 0.05 * float(chi(zp[0], zq[0])) + 0.01


@pytest.mark.parametrize("formula,says", [
    ("log space", None),
    ("p^2/q", "p^2/q is 0/0 = NaN"),
    ("(p-q)^2/q", "p^2/q is 0/0 = NaN"),          # the same failure: 0/0 where q underflows
    ("E_p[p/q]", "the ratio p/q is inf"),
])
def test_a_chi_square_from_probabilities_is_rejected_with_its_cause(formula, says):
    def chi_square_divergence(logits_p, logits_q):
        if formula == "log space":
            lp, lq = torch.log_softmax(logits_p, -1), torch.log_softmax(logits_q, -1)
            return torch.exp(torch.logsumexp(2 * lp - lq, -1)) - 1
        p, q = torch.softmax(logits_p, -1), torch.softmax(logits_q, -1)
        if formula == "p^2/q":
            return (p * p / q).sum(-1) - 1
        if formula == "(p-q)^2/q":
            return ((p - q) ** 2 / q).sum(-1)
        return (p * (p / q)).sum(-1) - 1

    result = check(chi_square_divergence, verbose=False)
    if says is None:
        assert result, result.message
    else:
        assert not result and says in result.message and "underflows" in result.message, result.message


def test_chi_square_in_log_space_is_exact_where_q_underflows():
    # the float32 case of the checker, in float64 by hand: p^2/q of the tiny symbol is e^-10 (times normalisers)
    chi = get("chi_square_divergence").reference
    zp, zq = torch.tensor([0.0, -60.0, 1.0]), torch.tensor([0.0, -110.0, 1.0])
    p, q = torch.softmax(zp.double(), -1), torch.softmax(zq.double(), -1)
    exact = float((p ** 2 / q).sum() - 1)                 # float64: q = e^-110 is representable
    assert torch.softmax(zq, -1)[1] == 0                   # ... but not in float32
    # finite and right to float32 precision: exp(x) - 1 at x = 1.2e-5 keeps about eps32 / x = 1% of its digits
    assert math.isclose(float(chi(zp, zq)), exact, rel_tol=1e-2)
    assert math.isclose(float(chi(zp.double(), zq.double())), exact, rel_tol=1e-9)


def _ess_share_by_hand(log_w_row, alpha):
    w = [math.exp(alpha * (x - max(log_w_row))) for x in log_w_row]
    return sum(w) ** 2 / sum(x * x for x in w) / len(w)


def test_tempering_exponent_hand_case_and_the_library_ess_at_the_answer():
    from rlkit.estimators import effective_sample_size

    te = get("tempering_exponent").reference
    # weights (1, 9), share 0.8: w^(1/2) = (1, 3), ESS = 16 / 10 = 1.6 = 0.8 * 2
    assert math.isclose(float(te(torch.tensor([0.0, math.log(9.0)], dtype=torch.float64), 0.8)), 0.5, rel_tol=1e-9)
    g = torch.Generator().manual_seed(8)
    lw = torch.randn(5, 60, generator=g, dtype=torch.float64) * 2.5
    for share in (0.2, 0.5, 0.9):
        alpha = te(lw, share)
        assert torch.all((alpha > 0) & (alpha < 1)), alpha
        # the library's ESS share at the answer is the target, and just above it falls below
        at = effective_sample_size(alpha[:, None] * lw, share=True)
        assert torch.allclose(at, torch.full_like(at, share), atol=1e-9)
        assert torch.all(effective_sample_size((alpha[:, None] + 1e-4) * lw, share=True) < share)
    # alpha = 1 when the full step keeps the share; equal weights keep share 1; unequal ones need alpha = 0
    assert torch.all(te(lw, 0.0) == 1.0)
    assert float(te(torch.zeros(7), 1.0)) == 1.0
    # (up to the 1e-12 slack of the comparison: the share falls only quadratically from 1 at alpha = 0)
    assert float(te(torch.tensor([0.0, 1.0]), 1.0)) < 1e-5


def test_tempering_exponent_against_a_grid_search_written_here():
    te = get("tempering_exponent").reference
    g = torch.Generator().manual_seed(9)
    lw = torch.randn(3, 25, generator=g, dtype=torch.float64) * 3.0
    grid = [i / 4000 for i in range(4001)]
    for share in (0.3, 0.6):
        out = te(lw, share)
        for b in range(3):
            row = [float(x) for x in lw[b]]
            shares = [_ess_share_by_hand(row, a) for a in grid]
            assert all(x >= y - 1e-12 for x, y in zip(shares, shares[1:]))       # the ESS falls with alpha
            best = max(a for a, s_ in zip(grid, shares) if s_ >= share)
            assert best <= float(out[b]) < best + 1 / 4000 + 1e-12, (share, b, best, float(out[b]))


def test_tempering_exponent_in_float32_at_large_log_weights():
    """The float32 precision case of the old ESS exercise (teaching review 1b) stays a case: log-weights of +400 and
    -800 (exp overflows), and near 1e4, where the uncentred log-sum-exps keep about 3 digits."""
    te = get("tempering_exponent").reference
    lw = torch.tensor([[400.0, 399.0, 390.0, 380.0], [-800.0, -801.0, -805.0, -790.0]])
    out = te(lw, 0.6)
    assert out.dtype == torch.float32
    # the answer depends only on the centred log-weights: shifting a row changes nothing
    assert torch.equal(out, te(lw - lw.amax(-1, keepdim=True), 0.6))

    def student(log_w, share):                   # a correct float32 answer, through the softmax
        lo = torch.zeros(log_w.shape[:-1], dtype=log_w.dtype)
        hi = torch.ones(log_w.shape[:-1], dtype=log_w.dtype)
        for _ in range(30):
            mid = (lo + hi) / 2
            ok = 1.0 / torch.softmax(mid[..., None] * log_w, -1).pow(2).sum(-1) / log_w.shape[-1] >= share
            lo, hi = torch.where(ok, mid, lo), torch.where(ok, hi, mid)
        full = 1.0 / torch.softmax(log_w, -1).pow(2).sum(-1) / log_w.shape[-1] >= share - 1e-6
        return torch.where(full, torch.ones_like(lo), lo)

    assert check(student, "tempering_exponent", verbose=False)

    def uncentred(log_w, share):                 # the same, with exp(2 LSE(a l) - LSE(2 a l)) uncentred
        lo = torch.zeros(log_w.shape[:-1], dtype=log_w.dtype)
        hi = torch.ones(log_w.shape[:-1], dtype=log_w.dtype)
        for _ in range(30):
            mid = (lo + hi) / 2
            al = mid[..., None] * log_w
            ok = torch.exp(2 * torch.logsumexp(al, -1) - torch.logsumexp(2 * al, -1)) / log_w.shape[-1] >= share
            lo, hi = torch.where(ok, mid, lo), torch.where(ok, hi, mid)
        return lo

    assert not check(uncentred, "tempering_exponent", verbose=False)


def test_the_displayed_effective_sample_size_called_as_a_student_would_fails():
    from rlkit.estimators import effective_sample_size

    def tempering_exponent(log_w, share):
        return effective_sample_size(log_w, share=True)

    assert not check(tempering_exponent, verbose=False)


def test_gspo_sequence_loss_against_the_library_ratio_a_slow_loop_and_the_displayed_function():
    from rlkit.exercises import check, self_check
    from rlkit.offpolicy import importance_ratio

    loss = get("gspo_sequence_loss").reference
    g = torch.Generator().manual_seed(8)
    lo = -torch.rand(3, 6, generator=g, dtype=torch.float64) * 2
    ln = lo + 0.2 * torch.randn(3, 6, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]], dtype=torch.bool)
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    for eps in (0.01, 0.2, 0.9):
        s = importance_ratio(ln, lo, mask, level="geometric")
        want = [-min(float(si) * a, min(max(float(si), 1 - eps), 1 + eps) * a) for si, a in zip(s, adv.tolist())]
        assert torch.allclose(loss(ln, lo, mask, adv, eps), torch.tensor(want, dtype=torch.float64), atol=1e-12)
    # token ratios 2 and 1/2 -> s = 1 -> loss -A whatever eps; an empty response has s = 1 too
    out = loss(torch.log(torch.tensor([[0.5, 0.2], [0.3, 0.3]])), torch.log(torch.tensor([[0.25, 0.4], [0.1, 0.9]])),
               torch.tensor([[1.0, 1.0], [0.0, 0.0]]), torch.tensor([1.5, -2.0]), 0.1)
    assert torch.allclose(out, torch.tensor([-1.5, 2.0]), atol=1e-6)
    assert self_check("gspo_sequence_loss") == []
    causes = [m.cause for m in get("gspo_sequence_loss").mistakes]
    assert len(causes) >= 3 and len(set(causes)) == len(causes)

    def gspo_sequence_loss(logp_new, logp_old, mask, advantages, eps):     # the displayed function, as is
        return importance_ratio(logp_new, logp_old, mask, level="geometric")

    assert not check(gspo_sequence_loss, verbose=False)


# The generic checks (each reference passes its checker, each registered mistake is
# caught with its cause) run for every chapter in tests/test_exercises_framework.py.
