"""Tests of the exercise checkers of chapters 4 and 6 (rlkit/exercises/solutions/ch04.py, ch06.py).

Every reference passes its own check; every registered mistake fails with its own cause; and
each reference is compared with an independent computation (hand-worked values, slow loops,
finite differences, exact expectations, torch.distributions, other rlkit modules). Chapter 4's first
exercise asks for the KL between two bigram models' sequence distributions, because the chapter
displays rlkit.divergences.kl_categorical, which passed the old one-step exercise (issue 23); a test
calls the displayed function as a student would and sees it fail.
"""
import math

import pytest
import torch

from rlkit.exercises import check, exercises, get

CH04 = ["markov_sequence_kl", "reverse_kl_estimators", "penalty_beta_trajectory", "clip_loss_grad",
        "natural_step"]
CH06 = ["entropy_change", "kl_second_order", "kl_lr_trajectory"]
ALL = CH04 + CH06
F64 = torch.float64


def test_chapters_register_their_exercises():
    assert sorted(e.name for e in exercises(chapter=4)) == sorted(CH04)
    assert sorted(e.name for e in exercises(chapter=6)) == sorted(CH06)


@pytest.mark.parametrize("name", ALL)
def test_student_exception_is_reported_not_raised(name):
    def broken(*args, **kwargs):
        raise RuntimeError("oops")
    r = check(broken, name=name, verbose=False)
    assert not r and "RuntimeError" in r.message


# ------------------------------------------------------------------------------ chapter 4

def _brute_force_sequence_kl(logits_p, logits_q, start, T):
    """Sum over all V^T sequences of p(y) (log p(y) - log q(y)), in plain floats."""
    import itertools
    lp, lq = torch.log_softmax(logits_p, -1).tolist(), torch.log_softmax(logits_q, -1).tolist()
    total = 0.0
    for seq in itertools.product(range(len(lp)), repeat=T):
        prev, a, b = start, 0.0, 0.0
        for y in seq:
            a, b, prev = a + lp[prev][y], b + lq[prev][y], y
        if a > -math.inf:
            total += math.exp(a) * (a - b)
    return total


def test_markov_sequence_kl_hand_case_and_brute_force():
    ref = get("markov_sequence_kl").reference
    p = torch.log(torch.tensor([[0.9, 0.1], [0.2, 0.8]], dtype=F64))
    q = torch.zeros(2, 2, dtype=F64)
    k0 = 0.9 * math.log(1.8) + 0.1 * math.log(0.2)      # the KL of each row against the uniform q
    k1 = 0.2 * math.log(0.4) + 0.8 * math.log(1.6)
    assert ref(p, q, 0, 2).item() == pytest.approx(k0 + 0.9 * k0 + 0.1 * k1, abs=1e-12)
    g = torch.Generator().manual_seed(0)
    for V, T, start in [(3, 4, 0), (2, 6, 1), (4, 3, 2)]:
        lp, lq = 2 * torch.randn(V, V, generator=g, dtype=F64), torch.randn(V, V, generator=g, dtype=F64)
        lp[0, -1] = -math.inf                            # a token p never writes after token 0
        assert ref(lp, lq, start, T).item() == pytest.approx(_brute_force_sequence_kl(lp, lq, start, T), rel=1e-10)
    # T = 1 is the one-step KL of the start row, the exercise the chapter's kl_categorical used to answer
    from rlkit.divergences import kl_categorical
    lp, lq = torch.randn(5, 5, generator=g, dtype=F64), torch.randn(5, 5, generator=g, dtype=F64)
    assert ref(lp, lq, 3, 1).item() == pytest.approx(kl_categorical(lp[3], lq[3]).item(), abs=1e-12)


def test_markov_sequence_kl_mistakes_and_the_displayed_function():
    from rlkit.divergences import kl_categorical
    from rlkit.exercises import self_check
    assert self_check("markov_sequence_kl") == []
    causes = [m.cause for m in get("markov_sequence_kl").mistakes]
    assert len(causes) >= 3 and len(set(causes)) == len(causes)

    def markov_sequence_kl(logits_p, logits_q, start, T):      # what the displayed function gives in one line
        return T * kl_categorical(logits_p[..., start, :], logits_q[..., start, :])

    assert not check(markov_sequence_kl, verbose=False)
    assert not check(lambda logits_p, logits_q, start, T: kl_categorical(logits_p, logits_q).sum(-1),
                     "markov_sequence_kl", verbose=False)


def test_reverse_kl_estimators_hand_values_and_exact_expectations():
    ref = get("reverse_kl_estimators").reference
    # sample with p = 1/2, q = 1/4: l = log(1/2), r = 1/2
    r1, r3 = ref(torch.tensor([math.log(0.5)], dtype=F64), torch.tensor([math.log(0.25)], dtype=F64))
    assert r1.item() == pytest.approx(-0.5 * math.log(2), abs=1e-12)
    assert r3.item() == pytest.approx(-0.5 * math.log(2) + 0.5, abs=1e-12)
    # exact expectations under p (enumerate the support): both are unbiased for KL(q || p), r3 is never negative
    g = torch.Generator().manual_seed(2)
    lp = torch.log_softmax(torch.randn(6, generator=g, dtype=F64), -1)
    lq = torch.log_softmax(lp + 0.7 * torch.randn(6, generator=g, dtype=F64), -1)
    p, q = lp.exp(), lq.exp()
    reverse = float((q * (lq - lp)).sum())
    r1, r3 = ref(lp, lq)
    assert float((p * r1).sum()) == pytest.approx(reverse, abs=1e-12)
    assert float((p * r3).sum()) == pytest.approx(reverse, abs=1e-12)
    assert torch.all(r3 >= 0)
    assert abs(reverse - float((p * (lp - lq)).sum())) > 1e-3          # and it is not the forward KL


def test_reverse_kl_r3_is_accurate_at_tiny_log_ratios_and_the_displayed_estimators_fail():
    from rlkit.divergences import kl_k1, kl_k2, kl_k3
    from rlkit.exercises import self_check
    ref = get("reverse_kl_estimators").reference
    # independent: the Taylor series of (l - 1) e^l + 1, in float64, for |l| <= 3e-4
    lp = torch.tensor([-0.7, -1.3, -2.1, -0.2, -3.0, -1.0])
    for dtype, tol in ((torch.float32, 2e-3), (F64, 1e-9)):
        lpd = lp.to(dtype)
        lq = lpd + torch.tensor([1e-4, -1e-4, 2e-4, -3e-4, 1.5e-4, -2e-4], dtype=dtype)
        ell = (lq - lpd).double()
        series = ell ** 2 / 2 + ell ** 3 / 3 + ell ** 4 / 8
        r3 = ref(lpd, lq)[1].double()
        assert torch.allclose(r3, series, rtol=tol, atol=0.0), (dtype, r3, series)

    def naive(logp, logq):                      # the cancellation the checker must catch
        ell = logq - logp
        return torch.exp(ell) * ell, (ell - 1) * torch.exp(ell) + 1
    r = check(naive, name="reverse_kl_estimators", verbose=False)
    assert not r and "expm1" in r.message

    def float64_inside(logp, logq):             # more accurate than the reference: accepted
        ell = (logq - logp).double()
        em1 = torch.expm1(ell)
        return tuple(x.to(logp.dtype) for x in (torch.exp(ell) * ell, ell * em1 - (em1 - ell)))
    assert check(float64_inside, name="reverse_kl_estimators", verbose=False)
    assert self_check("reverse_kl_estimators") == []
    causes = [m.cause for m in get("reverse_kl_estimators").mistakes]
    assert len(causes) >= 3 and len(set(causes)) == len(causes)
    # what the chapter shows (kl_k3) and imports (kl_k1, kl_k2), called as a student would: forward, or swapped
    assert not check(lambda logp, logq: (kl_k1(logp, logq), kl_k3(logp, logq)), "reverse_kl_estimators", verbose=False)
    assert not check(lambda logp, logq: (kl_k1(logq, logp), kl_k3(logq, logp)), "reverse_kl_estimators", verbose=False)
    assert not check(lambda logp, logq: (kl_k2(logq, logp), kl_k3(logq, logp)), "reverse_kl_estimators", verbose=False)


def test_penalty_beta_trajectory_follows_the_controller_class_in_closed_loop():
    from rlkit.controllers import AdaptiveKLController
    ex = get("penalty_beta_trajectory")
    article = next(m.fn for m in ex.mistakes if "article's rule" in m.cause)
    for beta0, c, target, power in [(1.0, 0.02, 0.01, 2.0), (0.3, 0.05, 0.01, 1.0), (7.0, 0.4, 0.02, 1.5),
                                    (1.0, 0.375, 0.25, 2.0)]:
        for rule, fn in (("ppo", ex.reference), ("article", article)):
            ctl = AdaptiveKLController(init_beta=beta0, target=target, rule=rule, beta_min=1e-12, beta_max=1e12)
            want = [beta0] + [ctl.update(c / ctl.beta ** power) for _ in range(12)]
            assert fn(beta0, c, target, 12, power=power).tolist() == pytest.approx(want, rel=1e-12)
    ref = ex.reference
    assert ref(1.0, 0.02, 0.01, 4).tolist() == [1.0, 2.0, 1.0, 2.0, 1.0]      # the chapter's hand case
    assert ref(1.0, 0.02, 0.01, 4).dtype == F64
    with pytest.raises(ValueError, match="beta0"):
        ref(0.0, 0.01, 0.01, 3)
    with pytest.raises(ValueError, match="steps"):
        ref(1.0, 0.01, 0.01, -1)


def test_penalty_beta_trajectory_settles_or_cycles_as_the_band_argument_says():
    # p = 1: the KL grid has ratio 2 < 2.25, every start settles; p = 2: ratio 4, the start cycles exactly when no
    # KL c beta0^-2 4^k lies in [target / 1.5, 1.5 target] (decided here by scanning k)
    ref = get("penalty_beta_trajectory").reference
    c, target = 0.02, 0.01
    for beta0 in torch.logspace(-2, 2, 301, dtype=F64).tolist():
        tail1 = ref(beta0, c, target, 60, power=1.0)[-4:]
        assert torch.all(tail1 == tail1[0])
        tail2 = ref(beta0, c, target, 60, power=2.0)[-4:]
        grid = [c / beta0 ** 2 * 4.0 ** k for k in range(-40, 41)]
        in_band = any(target / 1.5 <= d <= 1.5 * target for d in grid)
        settled = bool(torch.all(tail2 == tail2[0]))
        assert settled == in_band, beta0
        if not settled:
            assert tail2[0] == tail2[2] and tail2[1] in (2 * tail2[0], tail2[0] / 2)


def test_the_displayed_factor_called_as_a_student_would_fails():
    from rlkit.controllers import AdaptiveKLController

    def penalty_beta_trajectory(beta0, c, target, steps, power=2.0):
        return beta0 * AdaptiveKLController(init_beta=beta0, target=target).factor(c / beta0 ** power)

    assert not check(penalty_beta_trajectory, verbose=False)


def test_clip_loss_grad_matches_autograd_of_the_library_loss_and_a_slow_loop():
    from rlkit.objectives import ppo_clip_loss
    ref = get("clip_loss_grad").reference
    g = torch.Generator().manual_seed(3)
    lo = torch.log(torch.rand(200, generator=g, dtype=F64) * 0.9 + 0.05)
    ln = lo + 0.8 * torch.randn(200, generator=g, dtype=F64)
    adv = torch.randn(200, generator=g, dtype=F64)
    for eps, eps_high, c in [(0.2, None, None), (0.2, 0.28, None), (0.1, 0.3, 2.0), (0.2, None, 3.0)]:
        out = ref(ln, lo, adv, eps, eps_high, c)
        x = ln.clone().requires_grad_()
        loss, _ = ppo_clip_loss(x[None], lo[None], adv[None], eps=eps, eps_high=eps_high, dual_clip=c)
        (loss * 200).backward()                      # token-mean over 200 samples: times 200 is the sum
        assert torch.allclose(out, x.grad, atol=1e-12)
        top = 1 + (eps if eps_high is None else eps_high)
        for i in range(200):                         # the regions, one sample at a time
            r, a = math.exp(ln[i].item() - lo[i].item()), adv[i].item()
            active = (a > 0 and r < top) or (a < 0 and r > 1 - eps and not (c is not None and r > c))
            assert out[i].item() == pytest.approx(-r * a if active else 0.0, abs=1e-12)


def test_clip_loss_grad_hand_cases():
    ref = get("clip_loss_grad").reference
    lo = torch.log(torch.tensor([0.2] * 6, dtype=F64))
    ln = lo + torch.log(torch.tensor([1.5, 1.5, 0.5, 0.5, 1.25, 4.0], dtype=F64))
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0], dtype=F64)
    # r = 1.5, A > 0: clipped; r = 1.5, A < 0: pushed down; r = 0.5, A > 0: pushed up; r = 0.5, A < 0: clipped;
    # r = 1.25, A > 0: clipped at eps = 0.2, not with eps_high = 0.28; r = 4, A < 0: only the dual clip stops it
    assert ref(ln, lo, adv, 0.2).tolist() == pytest.approx([0.0, 1.5, -0.5, 0.0, 0.0, 4.0])
    assert ref(ln, lo, adv, 0.2, 0.28).tolist() == pytest.approx([0.0, 1.5, -0.5, 0.0, -1.25, 4.0])
    assert ref(ln, lo, adv, 0.2, 0.28, 3.0).tolist() == pytest.approx([0.0, 1.5, -0.5, 0.0, -1.25, 0.0])
    with pytest.raises(ValueError, match="dual_clip"):
        ref(ln, lo, adv, 0.2, None, 0.5)


def test_the_displayed_ppo_clip_loss_called_as_a_student_would_fails():
    from rlkit.objectives import ppo_clip_loss

    def clip_loss_grad(logp_new, logp_old, advantages, eps, eps_high=None, dual_clip=None):
        return ppo_clip_loss(logp_new, logp_old, advantages, eps=eps, eps_high=eps_high, dual_clip=dual_clip)[0]

    assert not check(clip_loss_grad, verbose=False)


def test_natural_step_sits_on_the_kl_boundary():
    ref = get("natural_step").reference
    g = torch.Generator().manual_seed(4)
    M = torch.randn(5, 5, generator=g, dtype=F64)
    F = M @ M.T + 0.05 * torch.eye(5, dtype=F64)
    s = torch.randn(5, generator=g, dtype=F64)
    d = ref(s, F @ s, 0.03)
    assert float(0.5 * d @ F @ d) == pytest.approx(0.03, rel=1e-10)
    cos = float(d @ s / (d.norm() * s.norm()))
    assert cos == pytest.approx(1.0, abs=1e-12)
    assert ref(torch.tensor([1.0, 0.0]), torch.tensor([4.0, 0.0]), 0.02).tolist() == pytest.approx([0.1, 0.0])


# ------------------------------------------------------------------------------ chapter 6

def _entropy(z):
    lp = torch.log_softmax(z, -1)
    return -(lp.exp() * lp).sum(-1)


def test_entropy_change_is_the_directional_derivative():
    ref = get("entropy_change").reference
    g = torch.Generator().manual_seed(5)
    z = 2 * torch.randn(6, 5, generator=g, dtype=F64)
    dz = torch.randn(6, 5, generator=g, dtype=F64)
    h = 1e-6
    fd = (_entropy(z + h * dz) - _entropy(z - h * dz)) / (2 * h)
    assert torch.allclose(ref(z, dz), fd, atol=1e-8)
    # a uniform policy is a maximum of H: no first-order change in any direction
    assert torch.allclose(ref(torch.zeros(4, dtype=F64), torch.randn(4, generator=g, dtype=F64)),
                          torch.zeros((), dtype=F64), atol=1e-14)


def test_kl_second_order_matches_the_exact_kl_for_small_steps():
    ref = get("kl_second_order").reference
    g = torch.Generator().manual_seed(6)
    z = torch.randn(3, 7, generator=g, dtype=F64)
    dz = torch.randn(3, 7, generator=g, dtype=F64)
    for eps in (1e-2, 1e-3):
        lp, lq = torch.log_softmax(z, -1), torch.log_softmax(z + eps * dz, -1)
        exact = (lp.exp() * (lp - lq)).sum(-1)
        assert torch.allclose(exact / eps ** 2, ref(z, dz), rtol=10 * eps)
    # a constant shift of every logit is no change at all
    assert torch.allclose(ref(z, torch.ones_like(z)), torch.zeros(3, dtype=F64), atol=1e-14)


def test_kl_lr_trajectory_follows_the_controller_class_in_closed_loop():
    from rlkit.controllers import KLTriggeredLR
    ref = get("kl_lr_trajectory").reference
    g = torch.Generator().manual_seed(61)
    for lr0, c, thr, aim, power, sigma in [(0.2, 40.0, 0.02, 0.005, 2.0, 0.0), (0.01, 3.0, 0.02, 0.005, 1.0, 0.7),
                                           (1e-4, 40.0, 0.04, 0.01, 1.5, 0.3), (0.3, 50.0, 0.02, 0.005, 2.0, 1.0)]:
        noise = sigma * torch.randn(25, generator=g, dtype=F64)
        ctl = KLTriggeredLR(threshold=thr, aim=aim, gain=0.5, max_step=1.25, max_cut=10.0, lr_min=1e-12, lr_max=1e3)
        lrs, kls = [lr0], []
        for k in range(25):
            kls.append(c * lrs[-1] ** power * math.exp(noise[k].item()))
            lrs.append(ctl(kls[-1], lrs[-1]))
        got_lrs, got_kls = ref(lr0, c, thr, aim, 25, power=power, noise=noise)
        assert got_lrs.tolist() == pytest.approx(lrs, rel=1e-12)
        assert got_kls.tolist() == pytest.approx(kls, rel=1e-12)
    # hand: KL = 40 * 0.05^2 = 0.1 > 0.02, cut sqrt(0.005 / 0.1): the next KL is the set point exactly
    lrs, kls = ref(0.05, 40.0, 0.02, 0.005, 2)
    assert kls.tolist() == pytest.approx([0.1, 0.005], rel=1e-12)
    assert lrs[1].item() == pytest.approx(0.05 * math.sqrt(0.05), rel=1e-12)
    # p = 1: the same cut lands on the geometric mean sqrt(d d*) of the KL and the set point
    lrs, kls = ref(0.1, 0.5, 0.02, 0.005, 2, power=1.0)
    assert kls[1].item() == pytest.approx(math.sqrt(0.05 * 0.005), rel=1e-12)
    with pytest.raises(ValueError, match="aim"):
        ref(0.01, 1.0, 0.02, 0.03, 3)
    with pytest.raises(ValueError, match="noise"):
        ref(0.01, 1.0, 0.02, 0.005, 3, noise=[0.0, 0.1])


def test_kl_lr_tracking_halves_the_log_distance_for_power_two():
    # below the threshold, with no clip binding, log lr moves by p/4 of its distance to the set point's lr
    ref = get("kl_lr_trajectory").reference
    c, aim = 40.0, 0.005
    lr_star = math.sqrt(aim / c)
    lrs, _ = ref(lr_star * 1.2, c, 0.02, aim, 6)
    gaps = [math.log(x / lr_star) for x in lrs.tolist()]
    for a, b in zip(gaps, gaps[1:]):
        assert b == pytest.approx(a / 2, rel=1e-9, abs=1e-15)


def test_the_displayed_factor_called_as_a_student_would_fails_in_chapter_6():
    from rlkit.controllers import KLTriggeredLR

    def kl_lr_trajectory(lr0, c, threshold, aim, steps, power=2.0, noise=None):
        return lr0 * KLTriggeredLR(threshold=threshold, aim=aim).factor(c * lr0 ** power)

    assert not check(kl_lr_trajectory, verbose=False)


# The generic checks (each reference passes its checker, each registered mistake is
# caught with its cause) run for every chapter in tests/test_exercises_framework.py.
