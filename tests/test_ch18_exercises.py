"""Tests of chapter 18's exercise checkers (rlkit/exercises/solutions/ch18.py).

The references are compared with the library's independent implementations (rlkit.safety's
LagrangeMultiplier, PIDLagrangian and tilted_policy; rlkit.llm.safety's shield through
rlkit.llm.sampling_logprobs) and with hand-worked values; every registered mistake must be caught
and reported with its own cause.
"""
import torch

from rlkit.exercises import check, exercises, get
from rlkit.safety import LagrangeMultiplier, PIDLagrangian, tilted_policy

CH18 = ["dual_step", "pid_lambdas", "lagrangian_policy", "shielded_logprobs"]


def test_chapter_registers_four_exercises():
    assert sorted(e.name for e in exercises(chapter=18)) == sorted(CH18)


def test_references_against_the_library_and_hand_values():
    ref = {n: get(n).reference for n in CH18}
    d = torch.float64
    lam, cost = torch.tensor([0.5, 0.0, 1.0], dtype=d), torch.tensor([0.3, 0.0, 0.05], dtype=d)
    want = []
    for l0, c in zip(lam.tolist(), cost.tolist()):
        m = LagrangeMultiplier(budget=0.1, lr=2.0, init=l0)
        want.append(m.update(c))
    assert torch.allclose(ref["dual_step"](lam, cost, 0.1, 2.0), torch.tensor(want, dtype=d))
    assert torch.allclose(ref["dual_step"](torch.tensor([0.5], dtype=d), torch.tensor([0.3], dtype=d), 0.1, 2.0),
                          torch.tensor([0.9], dtype=d))
    costs = torch.tensor([0.3, 0.25, 0.15, 0.05, 0.0, 0.0, 0.02, 0.2], dtype=d)
    pid = PIDLagrangian(budget=0.1, kp=1.0, ki=0.5, kd=3.0)
    assert torch.allclose(ref["pid_lambdas"](costs, 0.1, 1.0, 0.5, 3.0),
                          torch.tensor([pid.update(c) for c in costs.tolist()], dtype=d))
    assert torch.allclose(ref["pid_lambdas"](torch.tensor([0.3, 0.1], dtype=d), 0.1, 1.0, 2.0, 0.0),
                          torch.tensor([0.6, 0.4], dtype=d))
    rp = torch.tensor([[0.6, 0.3, 0.1]], dtype=d)
    r, c = torch.tensor([[1.0, 0.0, 0.0]], dtype=d), torch.tensor([[1.0, 0.0, 1.0]], dtype=d)
    assert torch.allclose(ref["lagrangian_policy"](rp, r, c, 2.0, 0.5), tilted_policy(rp, r, c, 2.0, 0.5))
    hand = ref["shielded_logprobs"](torch.log(torch.tensor([[0.5, 0.25, 0.25]], dtype=d)),
                                    torch.tensor([[False, True, False]]))
    assert torch.allclose(hand.exp(), torch.tensor([[2 / 3, 0.0, 1 / 3]], dtype=d))


def test_each_mistake_is_diagnosed_with_its_cause():
    for name in CH18:
        ex = get(name)
        assert len(ex.mistakes) >= 3, name
        for m in ex.mistakes:
            m.fn.__name__ = name
            res = check(m.fn, name=name, verbose=False)
            assert not res and m.cause in res.message, (name, m.cause, res.message)
        assert check(ex.reference, name=name, verbose=False)
