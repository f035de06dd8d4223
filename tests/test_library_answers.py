"""rlkit.exercises.library_answers: the check refuses an answer that calls the library's own answer.

Each row of LIBRARY_ANSWERS is tested both ways: the library function really answers the exercise
(with the guard lifted, a one-line call passes every case), and with the guard in place the same
one-liner fails with a message naming the function. The guard is then tested on the ways a student
reaches a function (an imported name, a module attribute, a full dotted path, a helper, a closure, a
default argument, a nested lambda, functools.partial), and on what it must let through.
"""
from __future__ import annotations

import functools
import inspect
import itertools

import pytest
import torch

import rlkit
import rlkit.exercises.library_answers as LA
from rlkit import risk
from rlkit.exercises import check, exercises, get
from rlkit.exercises.library_answers import LIBRARY_ANSWERS, library_calls, resolve
from rlkit.risk import cvar


def _one_liner(name: str, dotted: str, order: tuple[int, ...]):
    """What a student writes: a function with the exercise's signature returning the library's call."""
    ex, lib = get(name), resolve(dotted)
    ns: dict = {}
    exec(f"def _sig{ex.signature}: pass", {"inf": float("inf")}, ns)
    sig = inspect.signature(ns["_sig"])

    def answer(*args, **kwargs):
        b = sig.bind(*args, **kwargs)
        b.apply_defaults()
        vals = list(b.arguments.values())
        vals = [vals[i] for i in order]
        while vals:                      # trailing arguments the library function does not take
            try:
                inspect.signature(lib).bind(*vals)
                break
            except TypeError:
                vals = vals[:-1]
        return lib(*vals)

    answer.__signature__ = sig
    answer.__name__ = name
    return answer


ROWS = [(name, dotted) for name, ds in LIBRARY_ANSWERS.items() for dotted in ds]


def test_every_row_names_a_book_exercise_and_a_public_library_function():
    book = {e.name for e in exercises() if e.chapter >= 0}
    for name, dotted in ROWS:
        assert name in book, name
        obj = resolve(dotted)
        assert callable(obj) and dotted.startswith("rlkit.") and not dotted.startswith("rlkit.exercises")
        module, _, attr = dotted.rpartition(".")
        assert attr in getattr(__import__(module, fromlist=[attr]), "__all__", ()), dotted


@pytest.mark.parametrize("name,dotted", ROWS)
def test_the_library_function_answers_its_exercise_and_the_check_refuses_it(name, dotted, monkeypatch):
    # the guard lifted: a one-liner passes every case (with the arguments in some order), so the row
    # is a real answer, not a guess
    monkeypatch.setitem(LIBRARY_ANSWERS, name, ())
    answer = None
    for order in itertools.permutations(range(len(get(name).parameters))):
        lifted = check(_one_liner(name, dotted, order), verbose=False)
        if lifted and lifted.cases_passed == lifted.cases_total > 0:
            answer = _one_liner(name, dotted, order)
            break
    assert answer is not None, f"{dotted} does not answer {name} in any order of its arguments"
    monkeypatch.undo()
    guarded = check(answer, verbose=False)
    assert not guarded and guarded.cases_passed == 0
    assert dotted in guarded.message and "write that computation yourself" in guarded.message


def test_no_reference_solution_calls_its_own_library_answer():
    pytest.importorskip("rlkit.exercises.solutions")
    for name, ds in LIBRARY_ANSWERS.items():
        assert library_calls(get(name).reference, ds) == [], name


def _ways_to_call_cvar():
    """The same one-liner reached six ways: each must be caught."""
    def direct(rewards, alpha):
        return cvar(rewards, alpha)

    def attribute(rewards, alpha):
        return risk.cvar(rewards, alpha)

    def dotted(rewards, alpha):
        return rlkit.risk.cvar(rewards, alpha)

    def helper(a, b):
        return cvar(a, b)

    def through_helper(rewards, alpha):
        return helper(rewards, alpha)

    f = cvar

    def closure(rewards, alpha):
        return f(rewards, alpha)

    def default(rewards, alpha, _f=cvar):
        return _f(rewards, alpha)

    def nested_lambda(rewards, alpha):
        return (lambda: cvar(rewards, alpha))()

    partial = functools.partial(cvar)
    return [direct, attribute, dotted, through_helper, closure, default, nested_lambda, partial]


@pytest.mark.parametrize("fn", _ways_to_call_cvar(), ids=lambda f: getattr(f, "__name__", "partial"))
def test_the_guard_follows_names_attributes_helpers_closures_and_defaults(fn):
    assert library_calls(fn, ["rlkit.risk.cvar"]) == ["rlkit.risk.cvar"]
    result = check(fn, name="cvar_of_samples", verbose=False)
    assert not result and "rlkit.risk.cvar" in result.message


def test_the_guard_lets_other_library_functions_and_own_code_through():
    def own(rewards, alpha):                     # a correct answer of the student's own, using torch only
        x = rewards.sort(-1).values
        k = max(1, int(torch.tensor(alpha * x.shape[-1]).ceil().item()))
        return x[..., :k].mean(-1)

    def uses_other(rewards, alpha):              # a library helper that is not the answer
        return rlkit.utils.masked_mean(own(rewards, alpha), torch.ones(()))

    assert library_calls(own, LIBRARY_ANSWERS["cvar_of_samples"]) == []
    assert library_calls(uses_other, LIBRARY_ANSWERS["cvar_of_samples"]) == []
    assert "library's own answer" not in check(own, name="cvar_of_samples", verbose=False).message
    # an exercise with no row is never refused on these grounds
    assert library_calls(own, []) == []


def test_library_calls_and_resolve_validate_their_arguments():
    with pytest.raises(TypeError, match="fn: expected a callable"):
        library_calls(3, ["rlkit.risk.cvar"])
    with pytest.raises(ValueError, match="dotted"):
        resolve("cvar")
    with pytest.raises(ValueError, match="names nothing importable"):
        resolve("rlkit.risk.no_such_function")


def test_the_table_agrees_with_a_search_of_the_whole_book():
    """search() over every exercise and every public function finds exactly the table's rows (so a new
    exercise with a library answer, or a new library function that answers one, fails here)."""
    found = LA.search()
    assert {n: set(ds) for n, ds in found.items()} == {n: set(ds) for n, ds in LIBRARY_ANSWERS.items()}


def test_grade_folder_gives_no_credit_for_a_library_one_liner(tmp_path):
    """The grader checks through the same guard: visible and hidden cases both score 0, with the reason."""
    pytest.importorskip("rlkit.exercises.solutions")
    import json
    import subprocess
    import sys

    source = ("import rlkit\ndef cvar_of_samples(rewards, alpha):\n    return rlkit.risk.cvar(rewards, alpha)\n"
              "check(cvar_of_samples)\n")
    cells = [{"cell_type": "markdown", "metadata": {}, "source": "# Chapter 17 (student edition)"},
             {"cell_type": "code", "metadata": {"tags": ["answer"], "rlkit": {"answer": "cvar_of_samples"}},
              "source": source, "outputs": [], "execution_count": None}]
    nb = {"cells": cells, "metadata": {"rlkit": {"edition": "student", "chapter": 17}},
          "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "one_liner.ipynb").write_text(json.dumps(nb))
    report = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "rlkit.exercises", "grade-folder", str(tmp_path / "sub"),
                           "--report", str(report)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (item,) = [i for i in json.loads(report.read_text())[0]["items"] if i["name"] == "cvar_of_samples"]
    assert item["points"] == 0 and item["passed"] == 0 and item["hidden_total"] >= 1
    assert "rlkit.risk.cvar" in item["message"] and "library's own answer" in item["message"]
