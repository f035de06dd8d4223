"""What every problem set must satisfy (issue 23, item 4), checked on all five at once.

* The skeleton is well formed:
  * its metadata names the set;
  * it has one answer cell per task, in the order of the tasks;
  * each answer cell the student fills (it raises NotImplementedError) is followed by its visible-test
    cell;
  * the written questions are tagged markdown cells with a place for the answer;
  * it is stored without outputs.
* The points the student reads in the skeleton are the points the tests and the rubric give:
  visible, hidden and written, or the written questions' points added up.
* Every task has a test, and the hidden tests name only tasks of the set.
* The skeleton, as the grader loads it, fails every visible test cleanly: 0 points, "not implemented",
  and nothing raises.
* Where the instructor module says which of its functions make each answer cell (``ANSWER_CELLS``),
  the reference pasted into the skeleton passes the visible tests through the grader's path. The slow
  learning tests are left to each set's own file.

Each set's own file (``tests/test_problem_sets_psN.py``) tests its reference on the hidden tests, and
tests the slips its tests are there to catch.
"""
from __future__ import annotations

import copy
import importlib
import inspect
import json
import re
from pathlib import Path

import pytest

from rlkit.exercises.problem_sets import answer_cells, get_problem_set, load_answers, run_tests

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("ps1", "ps2", "ps3", "ps4", "ps5")
#: (visible, hidden, written) points of each set, and its number of written questions
POINTS = {"ps1": (18, 29, 45), "ps2": (28, 20, 32), "ps3": (30, 20, 40), "ps4": (60, 15, 25), "ps5": (12, 27, 36)}
WRITTEN = {"ps1": 5, "ps2": 4, "ps3": 4, "ps4": 5, "ps5": 4}
#: the visible learning tests, which the pasted-reference test leaves to the set's own file
SLOW = {"ps2": {"train_learns"}, "ps3": {"driver_learns"}}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _set(key: str):
    ps = get_problem_set(key)
    nb = json.loads((ROOT / ps.notebook).read_text(encoding="utf-8"))
    return ps, nb, importlib.import_module(f"rlkit.exercises.solutions.{key}")


@pytest.mark.parametrize("key", KEYS)
def test_the_skeleton_is_well_formed(key):
    ps, nb, _ = _set(key)
    assert nb["metadata"]["rlkit"] == {"problem_set": key}
    assert [name for name, _ in answer_cells(nb)] == list(ps.tasks), "one answer cell per task, in order"
    cells, to_fill = nb["cells"], 0
    sources = ["".join(c["source"]) for c in cells]
    for i, cell in enumerate(cells):
        name = cell.get("metadata", {}).get("rlkit", {}).get("answer")
        if name is None:
            continue
        assert cell["cell_type"] == "code" and name in ps.tasks, name
        if "raise NotImplementedError" in sources[i]:
            to_fill += 1
            assert f'check_task(globals(), "{key}", "{name}")' in sources[i + 1], \
                f"no visible-test cell after the answer cell of {name}"
    assert to_fill >= 3, f"only {to_fill} answer cells to fill"
    written = [c for c in cells if "written" in c.get("metadata", {}).get("tags", [])]
    assert len(written) == WRITTEN[key]
    assert all(c["cell_type"] == "markdown" and "Your answer" in "".join(c["source"]) for c in written)
    assert not any(c.get("outputs") for c in cells if c["cell_type"] == "code"), "stored with outputs"


@pytest.mark.parametrize("key", KEYS)
def test_the_points_the_skeleton_states_are_the_points_given(key):
    ps, nb, sol = _set(key)
    visible, hidden, written = POINTS[key]
    assert sum(t.points for t in ps.visible) == visible and sum(t.points for t in sol.HIDDEN) == hidden
    assert ps.written_points == written
    md = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    row = re.search(r"\| \| \*\*total[^|]*\*\* \| \*\*(\d+)\*\* \| \*\*(\d+)\*\* \| \*\*(\d+)\*\* \|", md)
    if row:                                   # a points table: visible, hidden, written
        assert tuple(map(int, row.groups())) == POINTS[key], row.group(0)
    else:                                     # else each written question states its points
        stated = re.findall(r"\*\*Written question \d+\*\* \((\d+) points?\)", md)
        assert len(stated) == WRITTEN[key] and sum(map(int, stated)) == written, stated


@pytest.mark.parametrize("key", KEYS)
def test_every_task_has_a_test_and_hidden_tests_name_tasks_of_the_set(key):
    ps, _, sol = _set(key)
    hidden = {t.task for t in sol.HIDDEN}
    assert hidden <= set(ps.tasks), hidden - set(ps.tasks)
    assert {t.task for t in ps.visible} | hidden == set(ps.tasks)
    names = [t.name for t in ps.visible + tuple(sol.HIDDEN)]
    assert len(names) == len(set(names)), "test names repeat between the visible and the hidden tests"


@pytest.mark.parametrize("key", KEYS)
def test_the_skeleton_fails_every_visible_test_cleanly(key):
    ps, _, _ = _set(key)
    results = run_tests(load_answers(ROOT / ps.notebook), ps.visible)
    assert len(results) == len(ps.visible)
    for r in results:
        assert not r.passed and r.points == 0 and "not implemented" in r.message, r.message


def _filled(nb: dict, key: str, sol) -> dict:
    """The skeleton with each answer cell replaced by the reference's source (``sol.ANSWER_CELLS``)."""
    nb = copy.deepcopy(nb)
    for cell in nb["cells"]:
        name = cell.get("metadata", {}).get("rlkit", {}).get("answer")
        if name:
            src = "\n\n".join(inspect.getsource(getattr(sol, f)) for f in sol.ANSWER_CELLS[name])
            cell["source"] = src + f'\n\ncheck_task(globals(), "{key}", "{name}")\n'
    return nb


@pytest.mark.parametrize("key", [k for k in KEYS
                                 if hasattr(importlib.import_module(f"rlkit.exercises.solutions.{k}"), "ANSWER_CELLS")])
def test_the_reference_pasted_into_the_skeleton_passes_the_visible_tests(key):
    ps, nb, sol = _set(key)
    ns = load_answers(_filled(nb, key, sol))
    results = run_tests(ns, [t for t in ps.visible if t.name not in SLOW.get(key, ())])
    bad = [r.message for r in results if not r.passed]
    assert not bad, bad
