"""Problem set 5 (bug hunt): the reference (fixed trainer + diagnostics) passes every test with full points,
the skeleton ships exactly the buggy code of ``rlkit.exercises.problem_sets.ps5``, the shipped trainer fails
the hidden tests, and fixing one bug moves exactly the hidden test of that bug. The checks every problem set
shares (the skeleton, its points, clean failures) are in tests/test_problem_sets.py.

The two learning tests (the reference and the shipped trainer, 3 seeds x 10,000 steps each) take most of
the time.
"""
from __future__ import annotations

import json
import pathlib

import pytest

from rlkit.exercises.problem_sets import answer_cells, get_problem_set, load_answers, run_tests
from rlkit.exercises.problem_sets import ps5 as vis
from rlkit.exercises.solutions import ps5 as ref

ROOT = pathlib.Path(__file__).resolve().parents[1]
PS = get_problem_set("ps5")
pytestmark = pytest.mark.usefixtures("one_torch_thread")     # the learning tests run on one thread
NOTEBOOK = ROOT / PS.notebook
FUNCTIONS = ("collect_rollout", "gae_advantages", "ppo_update")
FAST = tuple(t for t in ref.HIDDEN if t.name != "trainer_learns_fresh_seeds")
LEARN = tuple(t for t in ref.HIDDEN if t.name == "trainer_learns_fresh_seeds")


def _full_marks(results):
    bad = [r.message for r in results if not (r.passed and r.points == r.max_points)]
    assert not bad, bad


def _shipped_ns():
    """The skeleton's three functions (as shipped) with the reference diagnostics."""
    ns = load_answers(NOTEBOOK)
    ns.update({k: v for k, v in ref.reference_namespace().items() if k.startswith("diagnose_")})
    return ns


def test_reference_passes_visible_tests():
    _full_marks(run_tests(ref.reference_namespace(), PS.visible))


def test_reference_passes_hidden_tests():
    _full_marks(run_tests(ref.reference_namespace(), ref.HIDDEN))


def test_skeleton_is_well_formed_and_ships_the_buggy_code():
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    assert nb["metadata"]["rlkit"] == {"problem_set": "ps5"}
    cells = dict(answer_cells(nb))
    assert [n for n, _ in answer_cells(nb)] == list(PS.tasks)       # one answer cell per task, in order
    for fn in FUNCTIONS:
        assert cells[fn].strip() == vis.SHIPPED_SOURCE[fn].strip(), f"the skeleton's {fn} is not the shipped code"
    for name in PS.tasks[3:]:
        assert "raise NotImplementedError" in cells[name]
    sources = ["".join(c["source"]) for c in nb["cells"]]
    assert vis.TRAIN_SOURCE.strip() in sources, "the notebook's train cell is not TRAIN_SOURCE"
    assert sum(f'check_task(globals(), "ps5", "{d}")' in "".join(sources) for d in PS.tasks[3:]) == 3
    written = [c for c in nb["cells"] if "written" in c["metadata"].get("tags", [])]
    assert len(written) == 4 and all("Your answer" in "".join(c["source"]) for c in written)
    assert not any(c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code")


def test_shipped_trainer_fails_the_hidden_tests():
    results = {r.name: r for r in run_tests(_shipped_ns(), FAST)}
    for name in ref.BUGS.values():
        assert not results[name].passed and results[name].message, name
    # the reference diagnostics accept the reference whatever the namespace holds
    assert all(results[n].passed for n in results if n.startswith("diagnose_"))


def test_shipped_trainer_does_not_learn():
    (r,) = run_tests(_shipped_ns(), LEARN)
    assert not r.passed and r.points == 0, r.message


@pytest.mark.parametrize("fix", FUNCTIONS)
def test_each_single_fix_moves_its_own_test(fix):
    ns = _shipped_ns()
    ns[fix] = ref.reference_namespace()[fix]
    passed = {r.name for r in run_tests(ns, FAST) if r.passed and r.task in FUNCTIONS}
    assert passed == {ref.BUGS[fix]}, passed


def test_shipped_functions_are_the_reference_with_one_bug_each():
    """Each shipped function differs from its fix on the reference diagnostic, and only there."""
    bugs = vis.shipped()
    for fn, diag in zip(FUNCTIONS, ("diagnose_rollout", "diagnose_gae", "diagnose_update")):
        with pytest.raises(AssertionError):
            getattr(ref, diag)(bugs[fn])
        getattr(ref, diag)(getattr(ref, fn))


def test_visible_test_rejects_diagnostics_that_cannot_tell():
    ns = ref.reference_namespace()
    always = dict(ns, diagnose_gae=lambda fn: (_ for _ in ()).throw(AssertionError("always fails")))
    never = dict(ns, diagnose_gae=lambda fn: None)
    for bad in (always, never):
        (r,) = run_tests(bad, PS.visible, "diagnose_gae")
        assert not r.passed and r.points == 0, r.message
    # and the hidden test rejects a diagnostic that flags a correct implementation written differently
    (r,) = run_tests(always, [t for t in ref.HIDDEN if t.name == "diagnose_gae_accepts_correct"])
    assert not r.passed
