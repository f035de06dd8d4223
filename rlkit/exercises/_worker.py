"""The process in which ``python -m rlkit.exercises grade`` and ``grade-folder`` run a submission
(not a public interface).

    python -m rlkit.exercises._worker FILE [--chapter N] [--after ITEM] [--hidden-seed S]
    python -m rlkit.exercises._worker FILE --problem-set psN [--after ITEM]

imports FILE, then grades one item after another (after the item ITEM, when the grader restarts it
past one that timed out or crashed) and reports to the grader, one JSON object a line on the file
descriptor that was standard output: ``{"event": "ready"}`` once the checkers are loaded,
``{"event": "imported"}`` or ``{"event": "import_error", "error": ...}``, then
``{"event": "start", "name": ...}`` and ``{"event": "result", ...}`` for each item. The items are
:func:`items`: the registered exercises (of chapter N), each checked on its visible cases and,
with ``--hidden-seed`` (the instructor's install), on its hidden cases too; or a problem set's
visible tests (``visible:NAME``) and hidden tests (``hidden:NAME``, from
``rlkit.exercises.solutions.psN.HIDDEN``). The submission's own standard output goes to standard
error, so that nothing it prints can be taken for a report.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys


def problem_set_tests(key: str) -> dict:
    """A problem set's tests by item name: ``visible:NAME`` then ``hidden:NAME`` (the hidden ones
    only where the instructor's ``rlkit.exercises.solutions.psN`` is installed)."""
    from rlkit.exercises import has_solutions
    from rlkit.exercises.problem_sets import get_problem_set

    ps = get_problem_set(key)
    tests = {f"visible:{t.name}": t for t in ps.visible}
    if has_solutions():
        hidden = importlib.import_module(f"rlkit.exercises.solutions.{key}").HIDDEN
        tests.update({f"hidden:{t.name}": t for t in hidden})
    return tests


def items(chapter: int | None = None, problem_set: str | None = None) -> list[str]:
    """The names of the items a worker grades, in order (the grader computes the same list)."""
    if problem_set is not None:
        return list(problem_set_tests(problem_set))
    from rlkit.exercises import exercises
    return [ex.name for ex in exercises(chapter)]


def _exercise_result(name: str, fn, hidden_seed: int | None) -> dict:
    from rlkit.exercises import check, check_on, get

    if fn is None or not callable(fn):
        return dict(name=name, passed=False, missing=True, message=f"✗ {name}: missing", cases_passed=0,
                    cases_total=0)
    r = check(fn, name=name, verbose=False)
    out = dict(name=name, passed=r.passed, message=r.message, cases_passed=r.cases_passed, cases_total=r.cases_total)
    if hidden_seed is not None:
        from rlkit.exercises.solutions import hidden_expectations

        cases, expected, mistakes = hidden_expectations(name, hidden_seed)
        if cases:
            h = check_on(fn, get(name), cases, expected, mistakes, what="hidden case")
            out.update(hidden_passed=h.cases_passed, hidden_total=h.cases_total, hidden_message=h.message)
        else:
            out.update(hidden_passed=0, hidden_total=0, hidden_message="no hidden cases (its cases are not seeded)")
    return out


def _test_result(name: str, test, namespace: dict) -> dict:
    from rlkit.exercises.problem_sets import run_tests

    (r,) = run_tests(namespace, [test])
    return dict(name=name, task=r.task, passed=r.passed, points=r.points, max_points=r.max_points,
                message=r.message)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlkit.exercises._worker")
    parser.add_argument("file")
    parser.add_argument("--chapter", type=int, default=None)
    parser.add_argument("--after", default=None)
    parser.add_argument("--hidden-seed", type=int, default=None)
    parser.add_argument("--problem-set", default=None)
    args = parser.parse_args(argv)

    sys.stdout.flush()
    report = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)                                   # the submission's prints go to stderr

    def send(**event):
        report.write(json.dumps(event) + "\n")
        report.flush()

    names = items(args.chapter, args.problem_set)
    tests = problem_set_tests(args.problem_set) if args.problem_set is not None else {}
    send(event="ready")
    try:
        spec = importlib.util.spec_from_file_location("student_submission", args.file)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except BaseException as err:                    # SystemExit from the submission too
        send(event="import_error", error=f"{type(err).__name__}: {err}")
        return 0
    send(event="imported")
    todo = names[names.index(args.after) + 1:] if args.after in names else names
    namespace = vars(module)
    for name in todo:
        send(event="start", name=name)
        if args.problem_set is not None:
            send(event="result", **_test_result(name, tests[name], namespace))
        else:
            send(event="result", **_exercise_result(name, namespace.get(name), args.hidden_seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
