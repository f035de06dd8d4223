"""Tests of chapter 1's exercise checkers (rlkit/exercises/solutions/ch01.py).

The references are compared with independent computations (autograd, hand-worked values, slow
loops written here, rlkit.returns.discounted_returns); every registered mistake must be caught
and diagnosed with its own cause.
"""
import math

import pytest
import torch

from rlkit.exercises import check, exercises, get

CH01 = ["softmax_score", "bandit_gradient", "reward_to_go", "reinforce_loss"]


def test_chapter_registers_four_exercises():
    names = [e.name for e in exercises(chapter=1)]
    assert sorted(names) == sorted(CH01)


def _outputs(ex, fn, case):
    # what the checker compares: the return value, or what the exercise's probe returns
    out = ex.probe(fn, *case.args) if ex.probe is not None else fn(*case.args)
    return out if isinstance(out, tuple) else (out,)


def test_mistakes_are_distinguishable():
    # each mistake differs from the reference on some case (else it could never be reported)
    for name in CH01:
        ex = get(name)
        for m in ex.mistakes:
            differs = False
            for case in ex.get_cases():
                for a, b in zip(_outputs(ex, m.fn, case), _outputs(ex, ex.reference, case)):
                    if a.shape != b.shape or not torch.allclose(a.double(), b.double(), atol=ex.atol, rtol=ex.rtol,
                                                                equal_nan=True):
                        differs = True
            assert differs, (name, m.cause)


# ------------------------------------------------------------------ independent checks of references

def test_softmax_score_equals_autograd():
    ref = get("softmax_score").reference
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    actions = torch.randint(0, 4, (5,), generator=g)
    for i in range(5):
        (grad,) = torch.autograd.grad(torch.log_softmax(logits[i], -1)[actions[i]], logits)
        assert torch.allclose(ref(logits.detach(), actions)[i], grad[i], atol=1e-12)


def test_softmax_score_hand_case_and_zero_mean():
    ref = get("softmax_score").reference
    # uniform over 2 actions, action 0: e_0 - (1/2, 1/2)
    assert torch.allclose(ref(torch.zeros(2), torch.tensor(0)), torch.tensor([0.5, -0.5]))
    # E_{a ~ pi}[score] = 0 (the lemma of chapter 1)
    z = torch.tensor([0.3, -1.2, 2.0], dtype=torch.float64)
    pi = torch.softmax(z, -1)
    mean = sum(pi[a] * ref(z, torch.tensor(a)) for a in range(3))
    assert torch.allclose(mean, torch.zeros(3, dtype=torch.float64), atol=1e-12)
    # large logits stay finite
    out = ref(torch.tensor([1000.0, -1000.0]), torch.tensor(1))
    assert torch.isfinite(out).all() and torch.allclose(out, torch.tensor([-1.0, 1.0]))


def test_bandit_gradient_equals_autograd():
    ref = get("bandit_gradient").reference
    g = torch.Generator().manual_seed(1)
    z = torch.randn(3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    r = torch.randn(3, 5, generator=g, dtype=torch.float64)
    (grad,) = torch.autograd.grad((torch.softmax(z, -1) * r).sum(), z)
    assert torch.allclose(ref(z.detach(), r), grad, atol=1e-12)
    # hand case: two arms, uniform, rewards (0, 1): J = pi_1, dJ/dz = (-1/4, 1/4)
    assert torch.allclose(ref(torch.zeros(2), torch.tensor([0.0, 1.0])), torch.tensor([-0.25, 0.25]))


def test_reward_to_go_hand_cases():
    ref = get("reward_to_go").reference
    out = ref(torch.tensor([1.0, 1.0, 1.0]), torch.tensor([0.9, 0.9, 0.0]))
    assert torch.allclose(out, torch.tensor([1 + 0.9 + 0.81, 1.9, 1.0]))
    out = ref(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]), torch.tensor([0.5, 0.0, 0.5, 0.5, 0.5]))
    assert torch.allclose(out, torch.tensor([2.0, 2.0, 3 + 2 + 1.25, 4 + 2.5, 5.0]))


def test_reward_to_go_matches_slow_sum_and_library():
    from rlkit.returns import discounted_returns

    ref = get("reward_to_go").reference
    g = torch.Generator().manual_seed(2)
    r = torch.randn(4, 9, generator=g, dtype=torch.float64)
    d = 0.95 * (torch.rand(4, 9, generator=g) > 0.3).double()
    out = ref(r, d)
    for b in range(4):
        for t in range(9):
            total, disc = 0.0, 1.0
            for k in range(t, 9):  # G_t = sum_k (prod_{j<k} d_j) r_k
                total += disc * float(r[b, k])
                disc *= float(d[b, k])
            assert math.isclose(float(out[b, t]), total, rel_tol=1e-12, abs_tol=1e-12)
    assert torch.allclose(out, discounted_returns(r, d, 0.0), atol=1e-12)


def test_reinforce_loss_gradient_is_minus_the_estimator():
    ref = get("reinforce_loss").reference
    g = torch.Generator().manual_seed(3)
    n, t, a = 3, 4, 2
    logits = torch.randn(n, t, a, generator=g, dtype=torch.float64, requires_grad=True)
    actions = torch.randint(0, a, (n, t), generator=g)
    w = torch.randn(n, t, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    (grad,) = torch.autograd.grad(ref(logits, actions, w, mask), logits)
    # the estimator, one term at a time: (1/N) sum_{i,t real} w_it * (e_a - softmax)
    est = torch.zeros(n, t, a, dtype=torch.float64)
    for i in range(n):
        for k in range(t):
            if mask[i, k]:
                pi = torch.softmax(logits.detach()[i, k], -1)
                est[i, k] = w[i, k] * (torch.nn.functional.one_hot(actions[i, k], a).double() - pi) / n
    assert torch.allclose(grad, -est, atol=1e-12)


def test_reinforce_loss_does_not_backprop_into_weights():
    ref = get("reinforce_loss").reference
    w = torch.ones(1, 2, requires_grad=True)
    loss = ref(torch.zeros(1, 2, 2, requires_grad=True), torch.tensor([[0, 1]]), w, torch.ones(1, 2))
    loss.backward()
    assert w.grad is None
    assert math.isclose(float(loss.detach()), 2 * math.log(2), rel_tol=1e-6)


def _student_loss(detach):
    # a student's REINFORCE loss, written here independently of the reference
    def reinforce_loss(logits, actions, weights, mask):
        logp = torch.log_softmax(logits, dim=-1).gather(-1, actions[..., None]).squeeze(-1)
        w = weights.detach() if detach else weights
        return -(mask.to(logp.dtype) * w * logp).sum() / logits.shape[0]
    return reinforce_loss


def test_a_loss_whose_weights_are_not_detached_is_rejected_with_its_cause():
    good = check(_student_loss(detach=True), verbose=False)
    assert good, good.message
    bad = check(_student_loss(detach=False), verbose=False)
    assert not bad
    assert "output 1" in bad.message and "the weights are not detached" in bad.message, bad.message


def test_a_loss_with_no_gradient_is_rejected_with_its_cause():
    def reinforce_loss(logits, actions, weights, mask):
        with torch.no_grad():
            return _student_loss(detach=True)(logits, actions, weights, mask)

    bad = check(reinforce_loss, verbose=False)
    assert not bad and "carries no gradient" in bad.message, bad.message


def test_not_detaching_changes_the_gradient_when_the_weights_depend_on_the_parameters():
    # independent of the probe: weights computed from the same logits (a shared critic) by hand
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    actions = torch.randint(0, 4, (2, 3), generator=g)
    mask = torch.ones(2, 3, dtype=torch.bool)
    weights = torch.tanh(logits).sum(-1)                 # depends on theta
    grads = {d: torch.autograd.grad(_student_loss(d)(logits, actions, weights, mask), logits)[0] for d in (True, False)}
    # detached: exactly the REINFORCE estimate -(1/N) sum w (e_a - pi); not detached: something else
    pi = torch.softmax(logits.detach(), -1)
    est = weights.detach()[..., None] * (torch.nn.functional.one_hot(actions, 4).double() - pi) / 2
    assert torch.allclose(grads[True], -est, atol=1e-12)
    assert (grads[False] - grads[True]).abs().max() > 1e-2
    # the probe's reference gradient is this estimate too, whatever the weights depend on
    ex = get("reinforce_loss")
    loss, grad = ex.probe(ex.reference, logits.detach(), actions, weights.detach(), mask)
    assert torch.allclose(grad, -est, atol=1e-12)
    assert math.isclose(float(loss), float(_student_loss(True)(logits, actions, weights, mask)), rel_tol=1e-12)


@pytest.mark.parametrize("name,args,err", [
    ("softmax_score", (torch.zeros(3), torch.tensor(1.0)), TypeError),
    ("softmax_score", (torch.zeros(2, 3), torch.tensor([0, 1, 2])), ValueError),
    ("softmax_score", (torch.zeros(3), torch.tensor(3)), ValueError),
    ("bandit_gradient", (torch.zeros(3), torch.zeros(4)), ValueError),
    ("reward_to_go", (torch.zeros(3), torch.zeros(4)), ValueError),
    ("reward_to_go", (torch.zeros(3, dtype=torch.int64), torch.zeros(3)), TypeError),
    ("reinforce_loss", (torch.zeros(2, 3), torch.zeros(2, dtype=torch.int64), torch.zeros(2), torch.ones(2)),
     ValueError),
])
def test_references_validate_input(name, args, err):
    with pytest.raises(err):
        get(name).reference(*args)


# The generic checks (each reference passes its checker, each registered mistake is
# caught with its cause) run for every chapter in tests/test_exercises_framework.py.
