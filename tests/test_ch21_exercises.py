"""Tests of chapter 21's exercise checkers (rlkit/exercises/solutions/ch21.py).

The references are compared with the library's independent implementations (rlkit.offline) and
hand-worked values; every registered mistake must be caught and reported with its own cause.
"""
import math

import torch

from rlkit.exercises import check, exercises, get, self_check
from rlkit.offline import cql_penalty, expectile_loss, ope_dr

CH21 = ["masked_expectile", "sampled_cql_term", "doubly_robust"]


def test_chapter_registers_three_exercises():
    assert sorted(e.name for e in exercises(chapter=21)) == sorted(CH21)


def test_references_against_the_library_and_hand_values():
    ref = {n: get(n).reference for n in CH21}
    g = torch.Generator().manual_seed(0)
    lr, r = torch.randn(9, generator=g, dtype=torch.float64), torch.rand(9, generator=g, dtype=torch.float64)
    rh, v = torch.rand(9, generator=g, dtype=torch.float64), torch.rand(9, generator=g, dtype=torch.float64)
    assert torch.allclose(ref["doubly_robust"](lr, r, rh, v), ope_dr(lr, r, rh, v))
    hand = ref["doubly_robust"](torch.log(torch.tensor([2.0, 0.5])), torch.tensor([1.0, 0.0]),
                                torch.tensor([0.5, 0.5]), torch.tensor([0.6, 0.4]))
    assert math.isclose(float(hand), 0.875, rel_tol=1e-6)


def test_each_mistake_is_diagnosed_with_its_cause():
    for name in CH21:
        ex = get(name)
        assert len(ex.mistakes) >= 3, name
        for m in ex.mistakes:
            m.fn.__name__ = name
            res = check(m.fn, name=name, verbose=False)
            assert not res and m.cause in res.message, (name, m.cause, res.message)
        assert check(ex.reference, name=name, verbose=False)


def _expectile_by_bisection(x, kappa, iters=200):
    """The root of kappa * sum (x - v)_+ - (1 - kappa) * sum (v - x)_+, decreasing in v, by bisection."""
    lo, hi = float(x.min()), float(x.max())
    for _ in range(iters):
        v = 0.5 * (lo + hi)
        g = kappa * float((x - v).clamp_min(0).sum()) - (1 - kappa) * float((v - x).clamp_min(0).sum())
        lo, hi = (v, hi) if g > 0 else (lo, v)
    return 0.5 * (lo + hi)


def test_masked_expectile_against_bisection_the_loss_and_hand_values():
    ref = get("masked_expectile").reference
    g = torch.Generator().manual_seed(21)
    for kappa in (0.1, 0.5, 0.7, 0.95):
        x = torch.randint(0, 5, (5, 8), generator=g).double() / 4
        x = x + 0.1 * torch.randn(5, 8, generator=g, dtype=torch.float64)
        m = torch.rand(5, 8, generator=g) < 0.7
        m[:, 0] = True
        out = ref(x, kappa, m)
        for b in range(5):
            assert math.isclose(float(out[b]), _expectile_by_bisection(x[b][m[b]], kappa), abs_tol=1e-10)
            # it minimises the chapter's (displayed) expectile loss: nudging it either way raises the loss
            u = x[b][m[b]]
            loss = lambda v, u=u, kappa=kappa: float(expectile_loss(u - v, kappa))        # noqa: E731
            assert loss(out[b]) <= min(loss(out[b] + 1e-4), loss(out[b] - 1e-4))
    assert torch.allclose(ref(x, 0.5, m), torch.stack([x[b][m[b]].mean() for b in range(5)]), atol=1e-12)
    hand = ref(torch.tensor([[0.0, 1.0], [3.0, 3.0]], dtype=torch.float64), 0.75,
               torch.tensor([[True, True], [False, False]]))
    assert torch.allclose(hand, torch.tensor([0.75, 0.0], dtype=torch.float64))


def test_the_displayed_expectile_loss_no_longer_solves_the_exercise():
    """The chapter shows rlkit.offline.expectile_loss; the exercise used to be exactly that function."""
    def masked_expectile(values, kappa, mask):
        return expectile_loss(values, kappa, mask)
    assert not check(masked_expectile, verbose=False)


def test_masked_expectile_is_sound():
    assert self_check("masked_expectile") == []


def _sampled_cql_loop(q, actions, mask, samples, logp):
    total, count = 0.0, 0
    for i in range(q.shape[0]):
        for t in range(q.shape[1]):
            if not mask[i, t]:
                continue
            ws = [float(q[i, t, samples[i, t, j]] - logp[i, t, j]) for j in range(samples.shape[-1])]
            top = max(ws)
            est = top + math.log(sum(math.exp(w - top) for w in ws) / len(ws))
            total += est - float(q[i, t, actions[i, t]])
            count += 1
    return total / max(count, 1)


def test_sampled_cql_against_a_loop_the_exact_penalty_and_many_samples():
    ref = get("sampled_cql_term").reference
    g = torch.Generator().manual_seed(211)
    N, T, V = 3, 5, 7
    q = torch.randn(N, T, V, generator=g, dtype=torch.float64)
    a = torch.randint(0, V, (N, T), generator=g)
    m = torch.rand(N, T, generator=g) < 0.6
    mu = torch.log_softmax(torch.randn(N, T, V, generator=g, dtype=torch.float64), -1)
    smp = torch.multinomial(mu.exp().reshape(-1, V), 5, replacement=True, generator=g).reshape(N, T, 5)
    lp = mu.gather(-1, smp)
    assert math.isclose(float(ref(q, a, m, smp, lp)), _sampled_cql_loop(q, a, m, smp, lp), abs_tol=1e-12)
    every = torch.arange(V).expand(N, T, V)                       # each token once, uniform proposal
    uni = torch.full((N, T, V), -math.log(V), dtype=torch.float64)
    assert torch.allclose(ref(q, a, m, every, uni), cql_penalty(q, a, m), atol=1e-12)
    many = torch.multinomial(mu.exp().reshape(-1, V), 20000, replacement=True, generator=g).reshape(N, T, 20000)
    est = float(ref(q, a, m, many, mu.gather(-1, many)))        # consistent: close to the exact penalty
    assert abs(est - float(cql_penalty(q, a, m))) < 0.03
    hand = ref(torch.log(torch.tensor([[[1.0, 2.0, 1.0]]], dtype=torch.float64)), torch.tensor([[1]]),
               torch.tensor([[True]]), torch.tensor([[[0, 1]]]),
               torch.full((1, 1, 2), -math.log(3), dtype=torch.float64))
    assert math.isclose(float(hand), math.log(4.5) - math.log(2), rel_tol=1e-12)


def test_the_displayed_cql_penalty_no_longer_solves_the_exercise():
    """The chapter shows rlkit.offline.cql_penalty; the exercise used to be exactly that function."""
    def sampled_cql_term(q, actions, mask, samples, sample_logprobs):
        return cql_penalty(q, actions, mask)
    result = check(sampled_cql_term, verbose=False)
    assert not result and "exact log-sum-exp over the whole vocabulary" in result.message


def test_sampled_cql_term_is_sound():
    assert self_check("sampled_cql_term") == []
