"""Problem sets: homework-sized assignments that span chapters, with visible tests.

A problem set is a skeleton notebook, ``lessons/problem_sets/psN_<topic>.ipynb``, with one code cell
per *task* (tagged ``answer``, with ``{"rlkit": {"answer": "<task>"}}`` in its metadata) that the
student fills in, markdown cells for the written part, and cells that run the visible tests::

    check_task(globals(), "ps1", "gae")

This package holds the student's side: the :class:`ProblemSet` declarations and their visible
tests (``rlkit/exercises/problem_sets/psN.py``). The instructor's side,
``rlkit/exercises/solutions/psN.py``, holds the reference solution and the hidden tests, and
``book/instructor/psN_rubric.md`` the rubric for the written part; neither ships to students.

A :class:`Test` is a function of the namespace of the student's answers (a dict from names to the
functions and classes the answer cells define). It fails by raising ``AssertionError`` with a
message that says what is wrong; it passes by returning ``None`` (full marks) or a fraction in
``[0, 1]`` (partial credit, e.g. 3 of 4 seeds reached the target). Any other exception, and a
missing answer (``NotImplementedError``), scores 0 with the exception in the message.
"""
from __future__ import annotations

import ast
import importlib
import json
import math
import pkgutil
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from rlkit import _validate as V

__all__ = ["Test", "ProblemSet", "TestResult", "register_problem_set", "problem_sets", "get_problem_set",
           "run_tests", "check_task", "ANSWER_PREAMBLE", "answer_cells", "answer_source", "load_answers"]

#: What an answer cell may use without importing it (the grader runs the answer cells after this).
ANSWER_PREAMBLE = ("import math\n\nimport numpy as np\nimport torch\nimport torch.nn.functional as F\n"
                   "from torch import nn\n")
#: Top-level calls that the grader drops from answer cells (they print; they grade nothing).
_DROPPED_CALLS = ("check", "check_task")


@dataclass(frozen=True)
class Test:
    """One test of a problem set: ``fn(namespace)`` on the student's answers.

    Attributes:
        name: a short identifier, unique within the problem set (``"gae_matches_recursion"``).
        task: the answer (function or class name) the test needs.
        points: what the test is worth.
        fn: raises ``AssertionError`` to fail; returns None (full marks) or a fraction in [0, 1].
        timeout: seconds the grader allows it (each test runs with this limit in the grading process).
    """
    name: str
    task: str
    points: float
    fn: Callable[[dict], float | None]
    timeout: float = 60.0

    def __post_init__(self):
        V.nonempty_str(self.name, "name")
        V.nonempty_str(self.task, "task")
        V.real_in(self.points, "points", 0.0, lo_open=True)
        V.is_callable(self.fn, "fn")
        V.real_in(self.timeout, "timeout", 0.0, lo_open=True)


@dataclass(frozen=True)
class ProblemSet:
    """A problem set: its tasks, the chapters it spans, its visible tests and its written part.

    Attributes:
        key: ``"ps1"`` ... (the notebook's ``metadata["rlkit"]["problem_set"]``).
        title: one line.
        chapters: the chapters it draws on.
        notebook: the skeleton's path relative to the repository root.
        tasks: the names the answer cells must define, in order.
        visible: the tests the student runs with :func:`check_task`.
        written_points: points for the written part, graded by hand with the rubric.
    """
    key: str
    title: str
    chapters: tuple[int, ...]
    notebook: str
    tasks: tuple[str, ...]
    visible: tuple[Test, ...]
    written_points: float = 0.0

    def __post_init__(self):
        V.nonempty_str(self.key, "key")
        V.nonempty_str(self.title, "title")
        V.str_list(list(self.tasks), "tasks")
        for t in self.visible:
            V.instance_of(t, "visible[...]", Test)
            if t.task not in self.tasks:
                raise ValueError(f"visible: test {t.name!r} needs task {t.task!r}, which is not in tasks {self.tasks}")
        names = [t.name for t in self.visible]
        if len(set(names)) != len(names):
            raise ValueError(f"visible: test names must be unique, got {names}")
        V.real_in(self.written_points, "written_points", 0.0)


@dataclass
class TestResult:
    """What one test gave: the points earned out of ``max_points`` and a message."""
    name: str
    task: str
    points: float
    max_points: float
    passed: bool
    message: str

    def __bool__(self) -> bool:
        return self.passed


_REGISTRY: dict[str, ProblemSet] = {}
_LOADED = False


def register_problem_set(ps: ProblemSet) -> ProblemSet:
    """Add a problem set (a later registration under the same key replaces it)."""
    V.instance_of(ps, "ps", ProblemSet)
    _REGISTRY[ps.key] = ps
    return ps


def _load_all() -> None:
    global _LOADED
    if not _LOADED:
        for info in pkgutil.iter_modules(__path__):
            if info.name.startswith("ps"):
                importlib.import_module(f"{__name__}.{info.name}")
        _LOADED = True


def problem_sets() -> list[ProblemSet]:
    """Every registered problem set, by key."""
    _load_all()
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def get_problem_set(key: str) -> ProblemSet:
    """The problem set registered under ``key`` (``ValueError`` naming the known keys otherwise)."""
    V.instance_of(key, "key", str, "str (e.g. 'ps1')")
    _load_all()
    if key not in _REGISTRY:
        raise ValueError(f"key: no problem set {key!r}; known: {', '.join(sorted(_REGISTRY)) or '(none)'}")
    return _REGISTRY[key]


def _one(test: Test, namespace: dict) -> TestResult:
    if test.task not in namespace:
        return TestResult(test.name, test.task, 0.0, test.points, False, f"✗ {test.name}: {test.task} is not defined")
    try:
        got = test.fn(namespace)
    except NotImplementedError:
        return TestResult(test.name, test.task, 0.0, test.points, False,
                          f"✗ {test.name}: {test.task} is not implemented yet (it raised NotImplementedError)")
    except AssertionError as err:
        return TestResult(test.name, test.task, 0.0, test.points, False, f"✗ {test.name}: {err}")
    except Exception as err:  # the student's code raised: report it, never crash the notebook or the grader
        where = traceback.extract_tb(err.__traceback__)[-1]
        return TestResult(test.name, test.task, 0.0, test.points, False,
                          f"✗ {test.name}: {type(err).__name__}: {err} (at {where.name}, line {where.lineno})")
    if got is None:
        return TestResult(test.name, test.task, test.points, test.points, True, f"✓ {test.name}")
    frac = float(got)
    if not (math.isfinite(frac) and 0.0 <= frac <= 1.0):
        raise ValueError(f"test {test.name!r} returned {got!r}; a test returns None or a fraction in [0, 1]")
    return TestResult(test.name, test.task, frac * test.points, test.points, frac == 1.0,
                      f"{'✓' if frac == 1.0 else '~'} {test.name}: {frac:.0%} of the credit")


def run_tests(namespace: dict, tests, task: str | None = None) -> list[TestResult]:
    """Run ``tests`` (of one ``task``, or all) on the answers in ``namespace``; one result per test, in order."""
    V.instance_of(namespace, "namespace", dict, "dict (e.g. globals())")
    return [_one(t, namespace) for t in tests if task is None or t.task == task]


def check_task(namespace: dict, key: str, task: str, verbose: bool = True) -> list[TestResult]:
    """Run a problem set's visible tests of one task on the answers in ``namespace`` and print them."""
    ps = get_problem_set(key)
    V.choice(task, "task", ps.tasks)
    results = run_tests(namespace, ps.visible, task)
    if verbose:
        for r in results:
            print(r.message)
        got, most = sum(r.points for r in results), sum(r.max_points for r in results)
        print(f"{task}: {got:g} of {most:g} visible points")
    return results


def answer_cells(notebook) -> list[tuple[str, str]]:
    """The answer cells of a notebook (a path or an nbformat-4 dict): ``(name, source)`` in order.

    An answer cell is a code cell tagged ``answer`` whose metadata names its answer
    (``{"rlkit": {"answer": NAME}}``); a tagged cell without a name is an error.
    """
    if not isinstance(notebook, dict):
        with open(notebook, encoding="utf-8") as f:
            notebook = json.load(f)
    V.instance_of(notebook.get("cells"), "notebook['cells']", list, "list (an nbformat-4 notebook)")
    out = []
    for i, cell in enumerate(notebook["cells"]):
        meta = cell.get("metadata", {})
        if cell.get("cell_type") != "code" or "answer" not in meta.get("tags", []):
            continue
        name = meta.get("rlkit", {}).get("answer")
        if not isinstance(name, str) or not name:
            raise ValueError(f"notebook cell {i}: tagged 'answer' but its metadata has no rlkit.answer name")
        src = cell.get("source", "")
        out.append((name, "".join(src) if isinstance(src, list) else src))
    return out


def _without_checks(source: str, where: str) -> str:
    """``source`` without its top-level ``check(...)`` / ``check_task(...)`` statements."""
    try:
        tree = ast.parse(source, filename=where)
    except SyntaxError as err:
        raise SyntaxError(f"{where}: {err.msg} (line {err.lineno})") from None
    lines = source.splitlines(keepends=True)
    for node in reversed(tree.body):
        call = node.value if isinstance(node, ast.Expr) else None
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in _DROPPED_CALLS:
            del lines[node.lineno - 1:node.end_lineno]
    return "".join(lines)


def answer_source(notebook) -> str:
    """One module's source from a notebook's answer cells: the preamble, then each cell without its
    top-level ``check``/``check_task`` calls. A cell that is not valid Python raises ``SyntaxError``
    naming it."""
    parts = [ANSWER_PREAMBLE]
    for name, src in answer_cells(notebook):
        parts.append(f"\n# ---- answer: {name}\n" + _without_checks(src, f"answer cell {name!r}"))
    return "".join(parts)


def load_answers(notebook) -> dict:
    """Run a notebook's answer cells (:func:`answer_source`) in a fresh namespace and return it.

    This executes the student's code in the calling process: the grader does it in a separate
    process with a timeout (``python -m rlkit.exercises grade-folder``)."""
    namespace: dict = {"__name__": "student_answers"}
    exec(compile(answer_source(notebook), "<answers>", "exec"), namespace)
    return namespace
