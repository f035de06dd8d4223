"""Tests of chapter 7's exercise checkers (rlkit/exercises/solutions/ch07.py).

The references are compared with independent computations (hand-worked values, slow loops,
rlkit.llm's sampler, rlkit.objectives.grpo_advantages); every registered mistake must be caught and
reported with its own cause; and the functions the chapter displays (rlkit.llm.sampling_logprobs,
rlkit.llm.sequence_advantages), called as a student would, do not pass the two exercises that were
changed into variants for that reason (issue 23).
"""
import math

import pytest
import torch

from rlkit.exercises import check, exercises, get, self_check
from rlkit.llm import sampling_logprobs, sequence_advantages
from rlkit.objectives import grpo_advantages

CH07 = ["response_logprob", "min_p_logprobs", "group_advantages_by_prompt", "sequence_ratio", "grpo_update"]


def test_chapter_registers_five_exercises():
    assert sorted(e.name for e in exercises(chapter=7)) == sorted(CH07)


def test_references_against_independent_computations():
    ref = {n: get(n).reference for n in CH07}
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]]]))
    got = ref["response_logprob"](logits, torch.tensor([[0, 2, 1]]), torch.tensor([[1.0, 1.0, 0.0]]))
    assert torch.allclose(got, torch.tensor([math.log(0.5) + math.log(0.8)]))
    z = torch.randn(5, 12, generator=torch.Generator().manual_seed(0)) * 2
    # min_p = 0 is the plain model; min_p = 1 keeps the top token only
    assert torch.allclose(ref["min_p_logprobs"](z, 0.0).exp(), sampling_logprobs(z).exp(), atol=1e-6)
    assert torch.allclose(ref["min_p_logprobs"](z, 1.0).exp(), sampling_logprobs(z, top_k=1).exp(), atol=1e-6)
    r = torch.rand(32, generator=torch.Generator().manual_seed(1))
    ga = ref["group_advantages_by_prompt"]
    consecutive = torch.arange(32) // 8
    assert torch.allclose(ga(r, consecutive), grpo_advantages(r, 8, eps=1e-6), atol=1e-5)
    perm = torch.randperm(32, generator=torch.Generator().manual_seed(2))   # shuffling the batch permutes the answer
    assert torch.allclose(ga(r[perm], consecutive[perm]), ga(r, consecutive)[perm], atol=1e-6)
    k, m = 1, 8                                          # one success in eight: (1 - k/m) / sample std
    rb = torch.tensor([1.0] + [0.0] * 7)
    one = torch.zeros(8, dtype=torch.long)
    sd = math.sqrt(m / (m - 1) * (k / m) * (1 - k / m))
    assert abs(ga(rb, one)[0].item() - (1 - k / m) / sd) < 1e-4
    # the std normalisation is symmetric in k <-> m - k (rewards r -> 1 - r): one failure among seven
    # successes gets minus the advantage of one success among seven failures, by the same hand formula
    rf = 1.0 - rb
    assert abs(ga(rf, one)[0].item() + (1 - k / m) / sd) < 1e-4
    for kk in range(m + 1):
        rk = torch.tensor([1.0] * kk + [0.0] * (m - kk), dtype=torch.float64)
        assert torch.allclose(ga(rk, one), -ga(1 - rk, one), rtol=0, atol=1e-12)
    old = torch.tensor([[-1.0, -2.0, 0.0]])
    new = torch.tensor([[-0.8, -1.6, 9.0]])
    got = ref["sequence_ratio"](new, old, torch.tensor([[1.0, 1.0, 0.0]]))
    assert torch.allclose(got, torch.tensor([math.exp(0.3)]))


# The generic checks (each reference passes its checker, each registered mistake is
# caught with its cause) run for every chapter in tests/test_exercises_framework.py.


def _slow_min_p(logits, min_p):
    """Min-p by a loop over tokens, in float64 probabilities (the cases' logits are moderate here)."""
    p = torch.softmax(logits.double(), -1).tolist()
    top = max(p)
    kept = [x if x >= min_p * top else 0.0 for x in p]
    total = sum(kept)
    return torch.tensor([math.log(x / total) if x > 0 else -math.inf for x in kept], dtype=torch.float64)


def _slow_group_advantages(rewards, prompt_ids):
    """Grouped advantages with a dict of lists, one response at a time."""
    groups = {}
    for r, i in zip(rewards.tolist(), prompt_ids.tolist()):
        groups.setdefault(i, []).append(r)
    out = []
    for r, i in zip(rewards.tolist(), prompt_ids.tolist()):
        g = groups[i]
        mean = sum(g) / len(g)
        sd = (sum((x - mean) ** 2 for x in g) / (len(g) - 1)) ** 0.5 if len(g) > 1 else 0.0
        out.append((r - mean) / (sd + 1e-6))
    return torch.tensor(out, dtype=torch.float64)


def test_min_p_and_grouped_advantages_against_slow_loops():
    g = torch.Generator().manual_seed(9)
    for min_p in (0.0, 0.05, 0.3, 0.9, 1.0):
        z = torch.randn(12, generator=g, dtype=torch.float64) * 3
        got = get("min_p_logprobs").reference(z, min_p)
        want = _slow_min_p(z, min_p)
        assert torch.equal(torch.isinf(got), torch.isinf(want)), min_p
        assert torch.allclose(got[~torch.isinf(got)], want[~torch.isinf(want)], atol=1e-12), min_p
    for sizes in ([3, 1, 5], [2, 2, 2, 2], [1, 1, 7]):
        ids = torch.cat([torch.full((n,), 10 * j + 3) for j, n in enumerate(sizes)])
        perm = torch.randperm(len(ids), generator=g)
        ids, r = ids[perm], torch.rand(len(ids), generator=g, dtype=torch.float64)
        got = get("group_advantages_by_prompt").reference(r, ids)
        assert torch.allclose(got, _slow_group_advantages(r, ids), atol=1e-12), sizes


@pytest.mark.parametrize("name", ["min_p_logprobs", "group_advantages_by_prompt"])
def test_each_mistake_is_diagnosed_with_its_own_cause(name):
    assert self_check(name) == []
    causes = [m.cause for m in get(name).mistakes]
    assert len(causes) >= 3 and len(set(causes)) == len(causes)


def test_the_displayed_functions_do_not_pass_the_changed_exercises():
    """What a student would try after reading the chapter: its displayed sampler with top_p = min_p, and its
    displayed sequence_advantages (or the library's grpo_advantages) with the group size read off the ids."""
    def min_p_logprobs(logits, min_p):
        return sampling_logprobs(logits, top_p=max(min_p, 1e-6))

    def group_advantages_by_prompt(rewards, prompt_ids):
        size = len(prompt_ids) // len(prompt_ids.unique())
        return sequence_advantages(rewards, "grpo", size)

    def group_advantages_by_prompt_lib(rewards, prompt_ids):
        return grpo_advantages(rewards, len(prompt_ids) // len(prompt_ids.unique()))

    assert not check(min_p_logprobs, verbose=False)
    assert not check(group_advantages_by_prompt, verbose=False)
    assert not check(group_advantages_by_prompt_lib, "group_advantages_by_prompt", verbose=False)


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
