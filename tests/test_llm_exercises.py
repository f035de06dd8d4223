"""Tests of chapter 7's exercise checkers (rlkit/exercises/solutions/ch07.py).

The references are compared with independent computations (hand-worked values, rlkit.llm's
sampler, rlkit.objectives.grpo_advantages); every registered mistake must be caught and reported
with its own cause.
"""
import math

import torch

from rlkit.exercises import exercises, get
from rlkit.llm import sampling_logprobs
from rlkit.objectives import grpo_advantages

CH07 = ["response_logprob", "top_p_logprobs", "group_advantages", "sequence_ratio", "grpo_update"]


def test_chapter_registers_five_exercises():
    assert sorted(e.name for e in exercises(chapter=7)) == sorted(CH07)


def test_references_against_independent_computations():
    ref = {n: get(n).reference for n in CH07}
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]]]))
    got = ref["response_logprob"](logits, torch.tensor([[0, 2, 1]]), torch.tensor([[1.0, 1.0, 0.0]]))
    assert torch.allclose(got, torch.tensor([math.log(0.5) + math.log(0.8)]))
    z = torch.randn(5, 12, generator=torch.Generator().manual_seed(0)) * 2
    for p in (0.3, 0.8, 0.95):
        assert torch.allclose(ref["top_p_logprobs"](z, p).exp(), sampling_logprobs(z, top_p=p).exp(), atol=1e-6)
    r = torch.rand(32, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(ref["group_advantages"](r, 8), grpo_advantages(r, 8, eps=1e-6), atol=1e-5)
    k, m = 1, 8                                          # one success in eight: (1 - k/m) / sample std
    rb = torch.tensor([1.0] + [0.0] * 7)
    sd = math.sqrt(m / (m - 1) * (k / m) * (1 - k / m))
    assert abs(ref["group_advantages"](rb, 8)[0].item() - (1 - k / m) / sd) < 1e-4
    # the std normalisation is symmetric in k <-> m - k (rewards r -> 1 - r): one failure among seven
    # successes gets minus the advantage of one success among seven failures, by the same hand formula
    rf = 1.0 - rb
    assert abs(ref["group_advantages"](rf, 8)[0].item() + (1 - k / m) / sd) < 1e-4
    for kk in range(m + 1):
        rk = torch.tensor([1.0] * kk + [0.0] * (m - kk), dtype=torch.float64)
        assert torch.allclose(ref["group_advantages"](rk, m), -ref["group_advantages"](1 - rk, m), rtol=0, atol=1e-12)
    old = torch.tensor([[-1.0, -2.0, 0.0]])
    new = torch.tensor([[-0.8, -1.6, 9.0]])
    got = ref["sequence_ratio"](new, old, torch.tensor([[1.0, 1.0, 0.0]]))
    assert torch.allclose(got, torch.tensor([math.exp(0.3)]))


# The generic checks (each reference passes its checker, each registered mistake is
# caught with its cause) run for every chapter in tests/test_exercises_framework.py.


def _slow_grpo_update(logits, ref_logits, actions, rewards, order, per_mb, lr, clip, beta):
    """GRPO's outer loop in plain numpy with the gradient written out by hand, one sample at a time:
    d/dlogp of min(rho A, clip(rho) A) is rho A where the unclipped term is the smaller one and 0 where
    the clip binds; d k3 / dlogp = 1 - pi_ref/pi; d logp(a) / dtheta = onehot(a) - softmax(theta)."""
    import numpy as np

    def softmax(z):
        e = np.exp(z - z.max())
        return e / e.sum()

    theta = logits.double().numpy().copy()
    ref = ref_logits.double().numpy()
    acts, r = actions.numpy(), rewards.double().numpy()
    P, G = acts.shape
    old = np.array([[np.log(softmax(theta[p])[a]) for a in acts[p]] for p in range(P)])
    adv = np.empty_like(r)
    for p in range(P):
        mean = sum(r[p]) / G
        sd = (sum((x - mean) ** 2 for x in r[p]) / (G - 1)) ** 0.5
        adv[p] = (r[p] - mean) / (sd + 1e-6)
    for perm in order.tolist():
        for start in range(0, P, per_mb):
            idx = perm[start:start + per_mb]
            grad = np.zeros_like(theta)
            n = len(idx) * G
            for p in idx:
                pi, pref = softmax(theta[p]), softmax(ref[p])
                for i, a in enumerate(acts[p]):
                    rho = pi[a] / np.exp(old[p, i])
                    A = adv[p, i]
                    clipped = (A >= 0 and rho > 1 + clip) or (A < 0 and rho < 1 - clip)
                    d_obj = (0.0 if clipped else rho * A) - beta * (1 - pref[a] / pi[a])
                    dlogp = -pi.copy()
                    dlogp[a] += 1
                    grad[p] -= d_obj * dlogp / n
            theta = theta - lr * grad
    return torch.tensor(theta)


def test_grpo_update_hand_case_and_slow_loop():
    ref = get("grpo_update").reference
    # hand-worked: one prompt, uniform logits over 3 responses, rewards (0, 0, 1, 1) on responses
    # (0, 1, 2, 2): A = (-a, -a, a, a), a = 0.5 / sd with sd = sqrt(4/3 * 1/4); ratio 1, no clip, no KL;
    # step = lr * mean_i A_i (onehot(a_i) - 1/3) = 0.5 / 4 * (-a, -a, 2a)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    got = ref(torch.zeros(1, 3, dtype=torch.float64), torch.zeros(1, 3, dtype=torch.float64),
              torch.tensor([[0, 1, 2, 2]]), torch.tensor([[0.0, 0, 1, 1]], dtype=torch.float64),
              torch.tensor([[0]]), 1, 0.5, 0.2, 0.0)
    assert torch.allclose(got, torch.tensor([[-a, -a, 2 * a]], dtype=torch.float64) * 0.5 / 4, atol=1e-12)
    # against the slow loop on every case of the checker (clip binding, KL, ragged last minibatch)
    for case in get("grpo_update").get_cases():
        fast = ref(*case.args).double()
        slow = _slow_grpo_update(*case.args)
        tol = 1e-10 if case.args[0].dtype == torch.float64 else 1e-4
        assert torch.allclose(fast, slow, atol=tol, rtol=0), case.label


def test_grpo_update_clip_binds_in_later_epochs():
    """The cases exercise the clip: in the lr-2 case some sample's ratio leaves [1 - clip, 1 + clip]
    before its last minibatch step, so freezing the old log-probabilities matters."""
    case = get("grpo_update").get_cases()[1]
    logits, ref_logits, actions, rewards, order, per_mb, lr, clip, beta = case.args
    ex = get("grpo_update")
    one_epoch = ex.reference(logits, ref_logits, actions, rewards, order[:1], per_mb, lr, clip, beta)
    old = torch.log_softmax(logits, -1).gather(-1, actions)
    rho = torch.exp(torch.log_softmax(one_epoch, -1).gather(-1, actions) - old)
    assert bool(((rho - 1).abs() > clip).any())
