"""Problem set 4 (Lagrangian PPO against a cost budget): the reference passes every visible and hidden test with
full points, the visible tests catch the slips they name, and the task's helpers agree with independent
computations. The checks every problem set shares (the skeleton, its points, clean failures) are in
tests/test_problem_sets.py."""
from __future__ import annotations

import pytest
import torch

from rlkit.exercises.problem_sets import get_problem_set, run_tests
from rlkit.exercises.problem_sets.ps4 import HazardGrid, exact_values, rollout
from rlkit.exercises.solutions import ps4 as solution

PS = get_problem_set("ps4")
pytestmark = pytest.mark.usefixtures("one_torch_thread")     # the learning tests run on one thread


def test_reference_passes_visible_and_hidden_with_full_points():
    ns = solution.reference_namespace()
    results = run_tests(ns, PS.visible) + run_tests(ns, solution.HIDDEN)
    failed = [r.message for r in results if not r.passed or r.points != r.max_points]
    assert not failed, failed
    assert {t.task for t in solution.HIDDEN} == set(PS.tasks)


def test_visible_tests_catch_the_slips_they_name():
    ns = dict(solution.reference_namespace())
    ns["lagrangian_advantage"] = lambda a_r, a_c, nu: a_r - nu * a_c
    ns["dual_ascent_step"] = lambda nu, cost, budget, lr, nu_max=None: nu + lr * (cost - budget)
    ns["ppo_clip_loss"] = lambda ln, lo, adv, clip, mask=None: tuple(
        (-x if i == 0 else x) for i, x in enumerate(solution.ppo_clip_loss(ln, lo, adv, clip, mask)))
    by_name = {r.name: r for r in run_tests(ns, [t for t in PS.visible if t.task != "train_constrained"])}
    assert "normalisation" in by_name["adv_formula"].message
    assert "projection onto nu >= 0 is missing" in by_name["dual_projection"].message
    assert "sign is flipped" in by_name["ppo_loss_values_and_gradient"].message


def test_task_helpers_against_independent_computations():
    env = HazardGrid()
    short = torch.nn.Linear(env.n_states, 4)                 # always "right": the short route
    torch.nn.init.zeros_(short.weight)
    with torch.no_grad():
        short.bias.copy_(torch.tensor([-1e4, 0.0, -1e4, -1e4]))
    assert exact_values(env, short) == pytest.approx((5.0, 4.0))
    batch = rollout(env, short, 8, torch.Generator().manual_seed(0))
    assert batch["ep_return"].tolist() == [5.0] * 8 and batch["ep_cost"].tolist() == [4.0] * 8
    assert batch["valid"].sum(-1).tolist() == [5] * 8 and batch["done"].sum().item() == 8
    uniform = torch.nn.Linear(env.n_states, 4)
    torch.nn.init.zeros_(uniform.weight)
    torch.nn.init.zeros_(uniform.bias)
    r, c = exact_values(env, uniform)
    big = rollout(env, uniform, 20000, torch.Generator().manual_seed(1))
    assert abs(float(big["ep_return"].mean()) - r) < 0.2 and abs(float(big["ep_cost"].mean()) - c) < 0.05
