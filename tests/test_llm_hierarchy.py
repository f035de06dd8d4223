"""Tests of rlkit.llm.hierarchy (chapter 23): the task, options, planners, verifiers, plan execution,
exact probabilities, the retry formula and the executor trainer.

Independent computations: hand-worked cases, a slow token-by-token product of softmax probabilities
for teacher forcing, a direct sum over attempts and a Monte Carlo simulation of the retry loop, and
brute force over pair orders for the planner.
"""
import random

import numpy as np
import pytest
import torch
import torch.nn as nn

from rlkit.llm import load_pretrained, sample
from rlkit.llm.hierarchy import (
    ADD,
    SKILLS,
    THREE_TERM_ADDITION,
    VERIFIERS,
    HierarchyConfig,
    Option,
    SkillLibrary,
    SubGoal,
    exact_verifier,
    executor_update,
    left_to_right_planner,
    mod9_verifier,
    parse_int,
    parse_terms,
    plan_success_probability,
    response_probabilities,
    retry_success,
    run_plan,
    smallest_first_planner,
    three_term_problem,
    train_executor,
    units_verifier,
    verifier_rates,
)
from rlkit.llm.tasks import Problem
from rlkit.llm.trainer import Run


@pytest.fixture(scope="module")
def lm():
    torch.set_num_threads(1)
    model, tok = load_pretrained()
    return model.eval(), tok


def test_task_generator_and_parsing():
    rng = random.Random(0)
    for _ in range(300):
        p = three_term_problem(rng)
        a, b, c = parse_terms(p.prompt)
        assert all(10 <= x <= 99 for x in (a, b, c)) and p.answer == str(a + b + c)
        assert min(a + b, a + c, b + c) <= 99
        assert p.info["left_fits"] == (a + b <= 99)
        assert p.info["carries"] == (a % 10 + b % 10 + c % 10) // 10
    assert THREE_TERM_ADDITION.max_new_tokens == 4
    assert parse_terms("12+34+56=") == (12, 34, 56)
    for bad in ("12+34", "12=", "12+-3=", "1 2+3=", "+3="):
        with pytest.raises(ValueError, match="prompt"):
            parse_terms(bad)
    assert parse_int("82") == 82 and parse_int("0") == 0
    assert parse_int("082") is None and parse_int("") is None and parse_int("8x") is None


def test_options_library_and_subgoals():
    assert ADD.can_start((10, 99)) and not ADD.can_start((9, 50)) and not ADD.can_start((100, 5))
    assert not ADD.can_start((None, 5)) and not ADD.can_start((True, 50)) and not ADD.can_start((10,))
    assert ADD.prompt((37, 45)) == "37+45=" and ADD.target((37, 45)) == 82
    assert "add" in SKILLS and len(SKILLS) == 1 and list(SKILLS) == ["add"]
    with pytest.raises(KeyError, match="no option named 'mul'"):
        SKILLS["mul"]
    with pytest.raises(ValueError, match="distinct names"):
        SkillLibrary([ADD, ADD])
    with pytest.raises(ValueError, match="hi"):
        Option("bad", "{0}=", 1, 10, 5, sum)
    sg = SubGoal("add", ("s0", 7))
    assert sg.bind([30]) == (30, 7) and sg.bind([None]) == (None, 7)
    with pytest.raises(ValueError, match="not computed yet"):
        SubGoal("add", ("s1", 7)).bind([30])


def test_planners_hand_cases_and_brute_force():
    p = Problem("66+24+10=", "100")
    assert left_to_right_planner(p) == [SubGoal("add", (66, 24)), SubGoal("add", ("s0", 10))]
    assert smallest_first_planner(p) == [SubGoal("add", (10, 24)), SubGoal("add", ("s0", 66))]
    four = Problem("40+10+30+20=", "100")
    assert smallest_first_planner(four) == [SubGoal("add", (10, 20)), SubGoal("add", ("s0", 30)),
                                            SubGoal("add", ("s1", 40))]
    # smallest-first keeps the first sum inside the initiation set whenever some order does (brute force)
    rng = random.Random(1)
    for _ in range(2000):
        a, b, c = (rng.randint(10, 99) for _ in range(3))
        q = Problem(f"{a}+{b}+{c}=", str(a + b + c))
        x, y = smallest_first_planner(q)[0].args
        assert (x + y <= 99) == (min(a + b, a + c, b + c) <= 99)


def test_verifiers_hand_cases():
    args = (37, 45)                                                   # target 82
    assert [exact_verifier(ADD, args, v) for v in (82, 72, 91, None)] == [True, False, False, False]
    assert [mod9_verifier(ADD, args, v) for v in (82, 72, 91, 73, None)] == [True, False, True, True, False]
    assert [units_verifier(ADD, args, v) for v in (82, 72, 92, 81, None)] == [True, True, True, False, False]
    assert set(VERIFIERS) == {"exact", "mod9", "units"}


def _slow_retry(p, f, n):
    return sum((1 - p - f) ** (i - 1) * p for i in range(1, n + 1))


def test_retry_success_against_sum_simulation_and_limits():
    g = torch.Generator().manual_seed(0)
    p = torch.rand(20, generator=g, dtype=torch.float64) * 0.8
    f = torch.rand(20, generator=g, dtype=torch.float64) * (1 - p)
    for n in (1, 2, 5, 9):
        got = retry_success(p, n, f)
        ref = torch.tensor([_slow_retry(a, b, n) for a, b in zip(p.tolist(), f.tolist())], dtype=torch.float64)
        assert torch.allclose(got, ref, atol=1e-12)
        assert torch.allclose(retry_success(p, n), 1 - (1 - p) ** n, atol=1e-12)
        assert torch.allclose(retry_success(p, n, torch.zeros_like(p)), retry_success(p, n), atol=1e-12)
    assert torch.allclose(retry_success(p, 10_000, f), p / (p + f), atol=1e-9)         # the ceiling p / (p + f)
    zero = torch.tensor([0.0], dtype=torch.float64)
    assert retry_success(zero, 3, zero).item() == 0.0
    assert retry_success(0.5, 3).item() == pytest.approx(0.875)
    # Monte Carlo simulation of the loop: attempt outcomes right / accepted wrong / rejected
    rng = np.random.default_rng(0)
    pp, ff, n, trials = 0.3, 0.2, 4, 200_000
    u = rng.random((trials, n))
    outcome = np.where(u < pp, 1, np.where(u < pp + ff, 2, 0))      # 1 right, 2 fooled, 0 rejected
    first = np.argmax(outcome > 0, axis=1)
    stopped = outcome[np.arange(trials), first]
    mc = np.mean(stopped == 1)
    assert abs(mc - retry_success(pp, n, ff).item()) < 4 * np.sqrt(mc * (1 - mc) / trials)
    with pytest.raises(ValueError, match="p \\+ f"):
        retry_success(torch.tensor([0.7]), 2, torch.tensor([0.5]))
    with pytest.raises(ValueError, match="shape"):
        retry_success(torch.tensor([0.2, 0.3]), 2, torch.tensor([0.1]))
    with pytest.raises(ValueError, match="p"):
        retry_success(torch.tensor([1.2]), 2)


def _slow_prob(model, tok, prompt, response, temperature=1.0):
    ids = tok.encode(prompt)
    prob = 1.0
    for t in tok.encode(response) + [tok.eos_id]:
        logits = model(torch.tensor([ids]))[0, -1].double() / temperature
        prob *= torch.softmax(logits, -1)[t].item()
        ids = ids + [t]
    return prob


def test_response_probabilities_against_slow_product(lm):
    model, tok = lm
    pairs = [("37+45=", "82"), ("37+45=", "72"), ("12+34+56=", "102"), ("99+99=", "198"), ("10+10=", "")]
    with torch.no_grad():
        got = response_probabilities(model, tok, [a for a, _ in pairs], [b for _, b in pairs], batch_size=2)
        hot = response_probabilities(model, tok, ["37+45="], ["82"], temperature=0.7)
        for (pr, rs), g in zip(pairs, got.tolist()):
            assert g == pytest.approx(_slow_prob(model, tok, pr, rs), rel=1e-4, abs=1e-12)
        assert hot.item() == pytest.approx(_slow_prob(model, tok, "37+45=", "82", 0.7), rel=1e-4)
    assert response_probabilities(model, tok, [], []).shape == (0,)
    with pytest.raises(ValueError):
        response_probabilities(model, tok, ["1+1="], [])


def test_verifier_rates_and_plan_success_probability(lm):
    model, tok = lm
    args = [(37, 45), (12, 34), (58, 67)]
    p_ex, f_ex = verifier_rates(model, tok, ADD, args, exact_verifier)
    assert (f_ex == 0).all()
    direct = response_probabilities(model, tok, [ADD.prompt(a) for a in args], [str(sum(a)) for a in args])
    assert torch.allclose(p_ex, direct, atol=1e-12)
    p_u, f_u = verifier_rates(model, tok, ADD, args, units_verifier, window=30)
    for i, a in enumerate(args):
        t = sum(a)
        cands = [v for v in range(max(0, t - 30), t + 31) if v != t and v % 10 == t % 10]
        ref = response_probabilities(model, tok, [ADD.prompt(a)] * len(cands), [str(v) for v in cands]).sum()
        assert f_u[i].item() == pytest.approx(ref.item(), rel=1e-9)
    assert torch.allclose(p_u, p_ex)
    # plan success probability: the product of the step probabilities at the TRUE intermediate prompts
    probs = [Problem("10+24+66=", "100"), Problem("66+44+20=", "130")]       # left to right: 110 > 99 for the 2nd
    P = plan_success_probability(model, tok, probs, left_to_right_planner)
    r1 = response_probabilities(model, tok, ["10+24=", "66+44="], ["34", "110"])
    r2 = response_probabilities(model, tok, ["34+66="], ["100"])
    assert torch.allclose(P[:, 0], r1) and P[0, 1].item() == pytest.approx(r2.item()) and P[1, 1].item() == 0.0


class _AlwaysEos(nn.Module):
    """A fake model whose next token is always <eos>: every answer is empty."""

    def __init__(self, vocab, eos):
        super().__init__()
        self.vocab, self.eos = vocab, eos
        self.w = nn.Parameter(torch.zeros(()))

    def forward(self, ids, attention_mask=None):
        out = torch.zeros(*ids.shape, self.vocab) + self.w
        out[..., self.eos] = 10.0
        return out


def test_run_plan_matches_direct_calls_and_handles_failures(lm):
    model, tok = lm
    problems = THREE_TERM_ADDITION.problems(24, seed=3, split="test")
    res = run_plan(model, tok, problems, smallest_first_planner, greedy=True)
    assert res.started.all() and (res.attempts == 1).all() and res.accepted.all()
    # step 1 equals a direct greedy call; step 2 reads the model's own step-1 value
    firsts = [smallest_first_planner(p)[0].args for p in problems]
    ids, att = tok.encode_batch([ADD.prompt(a) for a in firsts])
    direct = tok.decode_batch(sample(model, ids, att, max_new_tokens=4, eos_id=tok.eos_id, pad_id=tok.pad_id,
                                     greedy=True).response_ids)
    assert [v[0] for v in res.values] == [parse_int(d) for d in direct]
    for p, vals, ok in zip(problems, res.values, res.correct.tolist()):
        assert ok == float(str(vals[-1]) == p.answer)
    assert res.step_correct[:, 0].tolist() == [float(v[0] == sum(a)) for v, a in zip(res.values, firsts)]
    # greedy retries with the exact verifier: a wrong first value is retried (identically) n times
    rr = run_plan(model, tok, problems, smallest_first_planner, verifier=exact_verifier, attempts=3, greedy=True)
    assert torch.equal(rr.step_correct, res.step_correct)
    assert torch.equal(rr.attempts[:, 0], torch.where(res.step_correct[:, 0] > 0, 1, 3))
    # sampled retries: every accepted value passes the verifier
    rs = run_plan(model, tok, problems, smallest_first_planner, verifier=mod9_verifier, attempts=4,
                  generator=torch.Generator().manual_seed(0))
    for i, p in enumerate(problems):
        a = smallest_first_planner(p)[0].args
        assert bool(rs.accepted[i, 0]) == mod9_verifier(ADD, a, rs.values[i][0])
        assert 1 <= rs.attempts[i, 0] <= 4
    # a model that answers nothing: sub-goal 2 cannot start, nothing is correct
    dead = _AlwaysEos(tok.vocab_size, tok.eos_id)
    rd = run_plan(dead, tok, problems[:5], smallest_first_planner, greedy=True, record=True)
    assert rd.started[:, 0].all() and not rd.started[:, 1].any() and rd.accuracy == 0.0
    assert rd.answers == [""] * 5 and rd.steps[1]["rows"].numel() == 0
    empty = run_plan(model, tok, [], smallest_first_planner)
    assert len(empty) == 0 and np.isnan(empty.accuracy)
    with pytest.raises(ValueError, match="needs a verifier"):
        run_plan(model, tok, problems, smallest_first_planner, attempts=2)
    with pytest.raises(ValueError, match="record"):
        run_plan(model, tok, problems, smallest_first_planner, verifier=exact_verifier, attempts=2, record=True)
    with pytest.raises(ValueError, match="same number of sub-goals"):
        run_plan(model, tok, [problems[0], Problem("10+20+30+15=", "75")], smallest_first_planner)
    with pytest.raises(ValueError, match=r"option .mul., which is not in the library; it has \[.add.\]"):
        run_plan(model, tok, problems[:1], lambda p: [SubGoal("mul", (2, 3))])


def test_train_executor_smoke_and_determinism(lm):
    model, tok = lm
    import copy
    ev = THREE_TERM_ADDITION.problems(16, seed=5, split="test")
    cfg = HierarchyConfig(steps=2, prompts_per_step=2, group_size=4, eval_every=1, seed=3)
    runs = []
    for reward in ("subgoal", "final", "subgoal"):
        m = copy.deepcopy(model)
        runs.append(train_executor(m, tok, THREE_TERM_ADDITION, smallest_first_planner, cfg.replace(reward=reward),
                                   eval_problems=ev))
    h = runs[0].history
    assert len(h["reward"]) == 2 and len(h["step1"]) == 2 and len(h["step2"]) == 2
    assert all(np.isfinite(h[k]).all() for k in ("reward", "final", "step1", "train_seconds"))
    assert runs[0].evals["step"] == [0, 1, 2] and len(runs[0].evals["success_probability"]) == 3
    assert runs[0].history["reward"] == runs[2].history["reward"]                      # same seed, same run
    assert all(0.0 <= r <= 1.0 for run in runs for r in run.history["reward"])
    with pytest.raises(ValueError, match="group_size"):
        HierarchyConfig(group_size=1)
    with pytest.raises(ValueError, match="reward"):
        HierarchyConfig(reward="dense")


def test_train_executor_is_the_run_shell_and_executor_update(lm):
    """train_executor = trainer.Run (optimiser, generators, log, clock, evaluations) + executor_update per step:
    one update by hand on a Run gives the trainer's first update to the bit (its evaluations draw no noise)."""
    import copy
    model, tok = lm
    ev = THREE_TERM_ADDITION.problems(8, seed=5, split="test")
    cfg = HierarchyConfig(steps=1, prompts_per_step=4, group_size=4, eval_every=1, seed=1, reward="final",
                          grad_clip=0.01)
    m1, m2 = copy.deepcopy(model), copy.deepcopy(model)
    res = train_executor(m1, tok, THREE_TERM_ADDITION, smallest_first_planner, cfg, eval_problems=ev)
    plans, G, started, loss, norm = executor_update(Run(m2, tok, THREE_TERM_ADDITION, cfg), smallest_first_planner)
    assert res.history["loss"] == [loss] and res.history["grad_norm"] == [norm] and norm > cfg.grad_clip
    assert res.history["final"] == [plans.accuracy] and torch.equal(G, plans.correct[:, None] * started)
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))
    assert res.evals["step"] == [0, 1] and set(res.evals) == {"step", "train_seconds", "greedy_accuracy",
                                                             "success_probability"}


def test_train_executor_without_a_started_sub_goal_takes_no_step(lm):
    """A plan no option can start has no executor tokens: no Adam step, loss and grad_norm NaN, weights unchanged."""
    import copy
    model, tok = lm
    m = copy.deepcopy(model)

    def outside(problem):
        return [SubGoal("add", (5, 200)), SubGoal("add", ("s0", 10))]

    cfg = HierarchyConfig(steps=2, prompts_per_step=2, group_size=2, eval_every=2)
    res = train_executor(m, tok, THREE_TERM_ADDITION, outside, cfg, eval_problems=THREE_TERM_ADDITION.problems(4))
    assert all(np.isnan(res.history[k]).all() for k in ("loss", "grad_norm", "step1", "step2"))
    assert res.history["reward"] == [0.0, 0.0] and res.evals["greedy_accuracy"] == [0.0, 0.0]
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), model.parameters()))
