"""Tests of chapter 8's exercise checkers (rlkit/exercises/solutions/ch08.py).

Every reference is compared with an independent computation: slow loops over versions and tokens,
scalar math with the standard library, Monte Carlo simulations of Gaussian and non-Gaussian token
log-ratios and of Bernoulli rewards, and hand-worked cases. Every registered mistake must be caught
and diagnosed with its own cause.
"""
import math
import statistics

import pytest
import torch

from rlkit.exercises import check, exercises, get

torch.set_num_threads(1)
CH08 = ["behaviour_logprobs", "masked_is_weights", "lognormal_tail_share", "stale_advantage_error"]
F64 = torch.float64


def test_chapter_registers_four_exercises():
    assert sorted(e.name for e in exercises(chapter=8)) == sorted(CH08)


def test_a_not_implemented_stub_is_reported():
    def masked_is_weights(logp_learner, logp_sampler, mask, cap, level="token"):
        raise NotImplementedError
    r = check(masked_is_weights, verbose=False)
    assert not r and "not implemented" in r.message


# --------------------------------------------------------------- behaviour_logprobs

def test_behaviour_logprobs_matches_a_slow_loop_per_row_and_per_token():
    ref = get("behaviour_logprobs").reference
    g = torch.Generator().manual_seed(0)
    M, B, T = 4, 6, 5
    lp = -5 * torch.rand(M, B, T, generator=g)
    lengths = [5, 3, 1, 4, 5, 2]
    mask = torch.zeros(B, T)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    per_row = torch.randint(M, (B,), generator=g)
    per_tok = torch.randint(M, (B, T), generator=g)
    got_row, got_tok = ref(lp, per_row, mask), ref(lp, per_tok, mask)
    for b in range(B):
        for t in range(T):
            want_row = lp[per_row[b], b, t].item() if t < lengths[b] else 0.0
            want_tok = lp[per_tok[b, t], b, t].item() if t < lengths[b] else 0.0
            assert got_row[b, t].item() == want_row
            assert got_tok[b, t].item() == want_tok


def test_behaviour_logprobs_gives_the_sequence_ratio_of_a_mixed_batch():
    # with a single version the behaviour log-probs are that version's own, so the ratio to it is 1
    ref = get("behaviour_logprobs").reference
    lp = -torch.rand(3, 2, 4, dtype=F64)
    mask = torch.ones(2, 4, dtype=F64)
    out = ref(lp, torch.tensor([1, 1]), mask)
    assert torch.equal(out, lp[1])


def test_behaviour_logprobs_rejects_bad_input():
    ref = get("behaviour_logprobs").reference
    lp, mask = -torch.rand(2, 3, 4), torch.ones(3, 4)
    with pytest.raises(ValueError, match="versions must lie in"):
        ref(lp, torch.tensor([0, 2, 1]), mask)
    with pytest.raises(TypeError, match="versions must be .*int64"):
        ref(lp, torch.tensor([0.0, 1.0, 1.0]), mask)
    with pytest.raises(ValueError, match="shape"):
        ref(lp, torch.tensor([0, 1]), mask)
    with pytest.raises(ValueError, match="mask"):
        ref(lp, torch.tensor([0, 1, 1]), torch.ones(3, 5))
    with pytest.raises(ValueError, match=r"logp_versions .*\[M, B, T\]"):
        ref(lp[0], torch.tensor([0, 1, 1]), mask)


# --------------------------------------------------------------- masked_is_weights

def test_masked_is_weights_match_scalar_math_at_both_levels():
    ref = get("masked_is_weights").reference
    g = torch.Generator().manual_seed(1)
    samp = -6 * torch.rand(5, 9, generator=g, dtype=F64)
    learn = samp + torch.randn(5, 9, generator=g, dtype=F64)
    mask = (torch.rand(5, 9, generator=g) < 0.8).to(F64)
    learn = torch.where(mask.bool(), learn, torch.full_like(learn, 40.0))        # garbage in the padding
    for cap in (1.0, 2.0, 10.0):
        w_tok, w_seq = ref(learn, samp, mask, cap), ref(learn, samp, mask, cap, level="sequence")
        for b in range(5):
            seq = sum(learn[b, t].item() - samp[b, t].item() for t in range(9) if mask[b, t])
            for t in range(9):
                rho = math.exp(learn[b, t].item() - samp[b, t].item())
                want_tok = rho if mask[b, t] and rho <= cap else 0.0
                want_seq = rho if mask[b, t] and math.exp(seq) <= cap else 0.0
                assert w_tok[b, t].item() == pytest.approx(want_tok, rel=1e-12, abs=1e-300)
                assert w_seq[b, t].item() == pytest.approx(want_seq, rel=1e-12, abs=1e-300)


def test_masked_is_weights_stay_finite_for_extreme_log_ratios_in_float32():
    ref = get("masked_is_weights").reference
    learn = torch.tensor([[0.0, -100.0, -1.0], [0.0, -100.0, -1.0]])
    samp = torch.tensor([[-100.0, 0.0, -1.0], [-100.0, 0.0, -1.0]])
    w = ref(learn, samp, torch.ones(2, 3), 2.0)
    assert torch.isfinite(w).all()
    assert w[0, 0].item() == 0.0 and w[0, 1].item() < 1e-40 and w[0, 2].item() == 1.0
    # the sequence log-ratio is 0: the response is kept, and its +100 token ratio e^100 overflows float32 to inf;
    # the float64 weights are finite
    ws = ref(learn.double(), samp.double(), torch.ones(2, 3, dtype=F64), 2.0, level="sequence")
    assert torch.isfinite(ws).all() and ws[0, 0].item() == pytest.approx(math.exp(100.0))


def test_masked_is_weights_have_mean_at_most_one_and_below_truncation():
    # E_sampler[w] = 1 without a cap (support covered); masking lowers it more than truncation (here f = 1)
    ref = get("masked_is_weights").reference
    logits_s = torch.tensor([2.0, 1.0, 0.0, -1.0], dtype=F64)
    logits_l = torch.tensor([0.0, 1.0, 2.0, 1.5], dtype=F64)
    ls, ll = torch.log_softmax(logits_s, 0), torch.log_softmax(logits_l, 0)
    mask = torch.ones(1, 4, dtype=F64)
    w_big = ref(ll[None], ls[None], mask, 1e6)[0]
    assert (ls.exp() * w_big).sum().item() == pytest.approx(1.0, abs=1e-12)
    w_mask = ref(ll[None], ls[None], mask, 2.0)[0]
    w_trunc = torch.exp(ll - ls).clamp(max=2.0)
    assert (ls.exp() * w_mask).sum().item() < (ls.exp() * w_trunc).sum().item() - 1e-3
    assert (ls.exp() * w_trunc).sum().item() < 1.0 - 1e-3


def test_the_displayed_importance_ratio_called_as_a_student_would_fails():
    from rlkit.offpolicy import importance_ratio

    def masked_is_weights(logp_learner, logp_sampler, mask, cap, level="token"):
        return importance_ratio(logp_learner, logp_sampler, mask).clamp(max=cap) * mask

    r = check(masked_is_weights, verbose=False)
    assert not r and "you truncated" in r.message, r.message


def test_masked_is_weights_reject_bad_input():
    ref = get("masked_is_weights").reference
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="cap"):
        ref(x, x, torch.ones(2, 3), 0.0)
    with pytest.raises(TypeError, match="cap"):
        ref(x, x, torch.ones(2, 3), "2")
    with pytest.raises(ValueError, match="logp_sampler has shape"):
        ref(x, torch.zeros(2, 4), torch.ones(2, 3), 2.0)
    with pytest.raises(TypeError, match="floating"):
        ref(x.long(), x, torch.ones(2, 3), 2.0)
    with pytest.raises(ValueError, match="level"):
        ref(x, x, torch.ones(2, 3), 2.0, level="response")


# --------------------------------------------------------------- lognormal_tail_share

def _phi(z):
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def test_lognormal_tail_share_matches_the_standard_library_normal():
    ref = get("lognormal_tail_share").reference
    lengths = torch.tensor([1, 3, 10, 100, 1000])
    m, v, lo, hi = -0.01, 0.02, 0.5, 2.0
    got = ref(lengths, m, v, lo, hi)
    nd = statistics.NormalDist()
    for T, g in zip(lengths.tolist(), got.tolist()):
        mu, sd = T * m, math.sqrt(T * v)
        want = nd.cdf((math.log(lo) - mu) / sd) + 1 - nd.cdf((math.log(hi) - mu) / sd)
        assert g == pytest.approx(want, abs=1e-12)
        assert g == pytest.approx(_phi((math.log(lo) - mu) / sd) + 1 - _phi((math.log(hi) - mu) / sd), abs=1e-12)


def test_lognormal_tail_share_matches_a_simulation_of_gaussian_tokens():
    ref = get("lognormal_tail_share").reference
    g = torch.Generator().manual_seed(2)
    m, v = -0.02, 0.04
    for T in (4, 64):
        sums = (m + math.sqrt(v) * torch.randn(100_000, T, generator=g, dtype=F64)).sum(-1)
        share = ((sums < math.log(0.5)) | (sums > math.log(2.0))).double().mean().item()
        assert ref(torch.tensor([T]), m, v).item() == pytest.approx(share, abs=0.006)


def test_lognormal_tail_share_predicts_non_gaussian_tokens_for_long_responses():
    # token log-ratios of a real policy pair (categorical, skewed): the CLT takes over for long T
    ref = get("lognormal_tail_share").reference
    g = torch.Generator().manual_seed(3)
    logits_mu = 2 * torch.randn(16, generator=g, dtype=F64)
    lmu = torch.log_softmax(logits_mu, 0)
    lpi = torch.log_softmax(logits_mu + 0.3 * torch.randn(16, generator=g, dtype=F64), 0)
    tok_lr = lpi - lmu
    mean = (lmu.exp() * tok_lr).sum().item()                       # = -KL(mu || pi)
    var = (lmu.exp() * (tok_lr - mean) ** 2).sum().item()
    T, N = 400, 20_000
    idx = torch.multinomial(lmu.exp(), N * T, replacement=True, generator=g).view(N, T)
    sums = tok_lr[idx].sum(-1)
    share = ((sums < math.log(0.5)) | (sums > math.log(2.0))).double().mean().item()
    assert ref(torch.tensor([T]), mean, var).item() == pytest.approx(share, abs=0.02)


def test_lognormal_tail_share_tends_to_one_and_rejects_bad_input():
    ref = get("lognormal_tail_share").reference
    out = ref(torch.tensor([1, 10, 100, 1000, 10_000]), -0.005, 0.01)
    assert (out[1:] > out[:-1]).all() and out[-1].item() > 0.99
    with pytest.raises(ValueError, match="token_var"):
        ref(torch.tensor([1]), 0.0, 0.0)
    with pytest.raises(ValueError, match="high"):
        ref(torch.tensor([1]), 0.0, 1.0, 2.0, 0.5)
    with pytest.raises(ValueError, match="lengths"):
        ref(torch.tensor([0]), 0.0, 1.0)
    with pytest.raises(TypeError, match="lengths"):
        ref([1, 2], 0.0, 1.0)


# --------------------------------------------------------------- stale_advantage_error

def test_stale_advantage_error_hand_worked_case():
    ref = get("stale_advantage_error").reference
    # v_b = 0.2 (std 0.4), v_c = 0.9 (std 0.3): R = 1 -> 2 vs 1/3, R = 0 -> -1/2 vs -3
    got = ref(torch.tensor([0.2], dtype=F64), torch.tensor([0.9], dtype=F64), 0.0).item()
    assert got == pytest.approx(0.2 * (2 - 1 / 3) + 0.8 * (3 - 0.5), abs=1e-12)
    assert got == pytest.approx(7 / 3, abs=1e-12)


def test_stale_advantage_error_matches_a_bernoulli_simulation():
    ref = get("stale_advantage_error").reference
    g = torch.Generator().manual_seed(4)
    vb = torch.tensor([0.1, 0.5, 0.7, 0.95], dtype=F64)
    vc = torch.tensor([0.3, 0.4, 0.9, 0.6], dtype=F64)
    eps = 1e-6
    R = (torch.rand(200_000, 4, generator=g, dtype=F64) < vb).to(F64)
    a_b = (R - vb) / (torch.sqrt(vb * (1 - vb)) + eps)
    a_c = (R - vc) / (torch.sqrt(vc * (1 - vc)) + eps)
    mc = (a_b - a_c).abs().mean(0)
    assert torch.allclose(ref(vb, vc, eps), mc, rtol=0.02, atol=0.0)


def test_stale_advantage_error_is_zero_when_fresh_and_has_a_closed_form():
    # E|A_b - A_c| = |v_c - v_b| / sqrt(v_c (1 - v_c)) at eps = 0, because A_b(R) - A_c(R) has the same
    # sign for R = 0 and R = 1 and E_b[A_b] = 0
    ref = get("stale_advantage_error").reference
    v = torch.linspace(0.05, 0.95, 19, dtype=F64)
    assert ref(v, v, 1e-6).abs().max().item() == 0.0
    vb, vc = v, v.flip(0)
    closed = (vc - vb).abs() / torch.sqrt(vc * (1 - vc))
    assert torch.allclose(ref(vb, vc, 0.0), closed, atol=1e-12)


def test_stale_advantage_error_rejects_bad_input():
    ref = get("stale_advantage_error").reference
    with pytest.raises(ValueError, match="success probabilities"):
        ref(torch.tensor([1.2]), torch.tensor([0.5]))
    with pytest.raises(ValueError, match="v_current has shape"):
        ref(torch.tensor([0.2, 0.3]), torch.tensor([0.5]))
    with pytest.raises(ValueError, match="eps"):
        ref(torch.tensor([0.2]), torch.tensor([0.5]), -1.0)
    with pytest.raises(TypeError, match="floating"):
        ref(torch.tensor([0]), torch.tensor([1]))


# The generic checks (each reference passes its checker, each registered mistake is
# caught with its cause) run for every chapter in tests/test_exercises_framework.py.
