"""Problem set 4 (Lagrangian PPO against a cost budget): the reference passes every visible and hidden test with
full points; the skeleton's answer cells fail every visible test cleanly; the skeleton is well formed."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlkit.exercises.problem_sets import answer_cells, get_problem_set, load_answers, run_tests
from rlkit.exercises.problem_sets.ps4 import HazardGrid, exact_values, rollout
from rlkit.exercises.solutions import ps4 as solution

ROOT = Path(__file__).resolve().parents[1]
PS = get_problem_set("ps4")
SKELETON = ROOT / PS.notebook


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_skeleton_is_well_formed():
    nb = json.loads(SKELETON.read_text(encoding="utf-8"))
    assert nb["metadata"]["rlkit"] == {"problem_set": "ps4"}
    names = [name for name, _ in answer_cells(nb)]
    assert sorted(names) == sorted(PS.tasks) and len(names) == len(set(names)), names
    for cell in nb["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        if "answer" in tags:
            assert cell["cell_type"] == "code" and cell["metadata"]["rlkit"]["answer"] in PS.tasks
            assert "raise NotImplementedError" in "".join(cell["source"])
        if "written" in tags:
            assert cell["cell_type"] == "markdown" and "Your answer:" in "".join(cell["source"])
    written = [c for c in nb["cells"] if "written" in c.get("metadata", {}).get("tags", [])]
    assert len(written) == 5
    checks = {t: f'check_task(globals(), "ps4", "{t}")' for t in PS.tasks}
    sources = ["".join(c["source"]) for c in nb["cells"]]
    for i, c in enumerate(nb["cells"]):                              # each answer cell is followed by its visible tests
        name = c.get("metadata", {}).get("rlkit", {}).get("answer")
        if name:
            assert checks[name] in sources[i + 1], f"no visible-test cell after the answer cell of {name}"
    assert all(not c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code"), "skeleton stored with outputs"


def test_skeleton_fails_every_visible_test_cleanly():
    ns = load_answers(SKELETON)
    results = run_tests(ns, PS.visible)
    assert len(results) == len(PS.visible)
    for r in results:
        assert not r.passed and r.points == 0.0 and r.message, r
        assert "not implemented" in r.message, r.message


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
