"""Problem set 3 (a stale-sampler study): skeleton, visible and hidden tests, reference.

* the skeleton notebook is valid: its metadata names ps3, every task has exactly one answer cell (in the
  order of the tasks), every answer cell names a task, raises NotImplementedError and is followed by its
  visible-test cell, and the written questions are tagged and have a place for the answer;
* the skeleton's answer cells (as the grader loads them) fail every visible test cleanly;
* the instructor's reference passes every visible and hidden test with full points, and so does the
  reference pasted into the skeleton's answer cells (the grader's path, on the cheap visible tests);
* a known slip (U_k from the incremental ratio pi_{k+1}/pi_k) loses the points of its hand-worked test.
"""
from __future__ import annotations

import copy
import inspect
import json
from pathlib import Path

import pytest
import torch

from rlkit.exercises.problem_sets import answer_cells, get_problem_set, load_answers, run_tests
from rlkit.exercises.solutions import ps3 as SOL

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parent.parent
PS = get_problem_set("ps3")
NB_PATH = ROOT / PS.notebook
SLOW = {"driver_learns"}         # the visible learning test; the reference runs it in test_reference_passes_all


@pytest.fixture(scope="module")
def skeleton() -> dict:
    with open(NB_PATH, encoding="utf-8") as f:
        return json.load(f)


def _filled(nb: dict) -> dict:
    """The skeleton with each answer cell replaced by the reference's source (SOL.ANSWER_CELLS)."""
    nb = copy.deepcopy(nb)
    for cell in nb["cells"]:
        name = cell.get("metadata", {}).get("rlkit", {}).get("answer")
        if name:
            src = "\n\n".join(inspect.getsource(getattr(SOL, f)) for f in SOL.ANSWER_CELLS[name])
            cell["source"] = src + f'\n\ncheck_task(globals(), "ps3", "{name}")\n'
    return nb


def test_skeleton_is_valid(skeleton):
    assert skeleton["metadata"]["rlkit"] == {"problem_set": "ps3"}
    cells = answer_cells(skeleton)
    assert [name for name, _ in cells] == list(PS.tasks), "one answer cell per task, in the order of the tasks"
    for name, src in cells:
        assert f"def {name}(" in src and "raise NotImplementedError" in src and "TODO" in src, name
    code = skeleton["cells"]
    for i, c in enumerate(code):
        if "answer" in c.get("metadata", {}).get("tags", []):
            name = c["metadata"]["rlkit"]["answer"]
            nxt = "".join(code[i + 1]["source"])
            assert code[i + 1]["cell_type"] == "code" and f'check_task(globals(), "ps3", "{name}")' in nxt, name
        assert not c.get("outputs"), f"cell {i} has outputs: the skeleton is stored without them"
    written = [c for c in code if "written" in c.get("metadata", {}).get("tags", [])]
    assert len(written) == 4 and all(c["cell_type"] == "markdown" and "Your answer:" in "".join(c["source"])
                                     for c in written)
    intro = "".join(code[0]["source"])
    assert "| **total: 90** | **30** | **20** | **40** |" in intro
    assert sum(t.points for t in PS.visible) == 30 and sum(t.points for t in SOL.HIDDEN) == 20
    assert PS.written_points == 40
    for task in PS.tasks:
        assert any(t.task == task for t in PS.visible), task


def test_skeleton_fails_every_visible_test_cleanly(skeleton):
    ns = load_answers(skeleton)
    results = run_tests(ns, PS.visible)
    assert len(results) == len(PS.visible)
    for r in results:
        assert not r.passed and r.points == 0 and "not implemented" in r.message, r.message


def test_reference_passes_all():
    ns = SOL.reference_namespace()
    results = run_tests(ns, PS.visible + SOL.HIDDEN)
    bad = [r.message for r in results if not r.passed or r.points != r.max_points]
    assert not bad, bad


def test_reference_in_the_skeleton_passes_visible_tests(skeleton):
    ns = load_answers(_filled(skeleton))
    results = run_tests(ns, [t for t in PS.visible if t.name not in SLOW])
    bad = [r.message for r in results if not r.passed]
    assert not bad, bad


def test_the_incremental_ratio_loses_the_update_shift_points():
    def incremental(logp_new, logp_prox, logp_behav, mask=None):
        return SOL.staleness_estimate(logp_new, logp_prox, mask)       # 1/2 mean |pi_{k+1}/pi_k - 1|

    ns = dict(SOL.reference_namespace(), update_shift_estimate=incremental)
    got = {r.name: r for r in run_tests(ns, [t for t in PS.visible if t.name == "update_shift_hand_cases"])}
    r = got["update_shift_hand_cases"]
    assert not r.passed and "incremental ratio" in r.message, r.message
