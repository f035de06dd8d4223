"""Checkers for the book's exercises.

Each chapter declares its exercises in ``rlkit/exercises/solutions/chNN.py``: the reference solution, named
after the exercise and decorated with :func:`exercise`, and the known wrong variants, each
decorated with :func:`mistake` and the cause to report::

    @exercise(chapter=1, cases=_rtg_cases, atol=1e-5, description="Reward-to-go ...")
    def reward_to_go(rewards, discounts):
        ...

    @mistake(reward_to_go, "the discount is not zeroed at termination")
    def _rtg_ignores_termination(rewards, discounts):
        ...

A student writes a function with the same name and calls ``check(reward_to_go)``. ``check`` runs
the student's function on every case, compares it with the reference's stored outputs (below) and
explains the first thing that differs: a signature that does not fit, an exception, the wrong
number of outputs, the wrong shape or dtype (a floating-point output must have the reference's
dtype: the dtype of the floating-point inputs, by torch's type promotion, or the one the exercise
states, e.g. "a float64 tensor"), NaNs, an input modified in place, or the first differing
element, followed by a likely cause. Likely causes come from two places: the exercise's registered
mistakes (a buggy variant whose outputs the student's match exactly), and generic patterns (a sign
flip, a constant factor, a shift by one step in time, time reversed).

``check`` returns a :class:`CheckResult`, truthy when every case matched, so a notebook can
``assert check(my_fn)``. Instructors can grade with :func:`grade`, which runs the checks for
a whole namespace of student functions and returns a table of results.

**Stored expectations: no reference code at checking time.** ``check`` never runs a book
exercise's reference or its mistakes. It compares against their outputs recorded on the fixed
cases, ``rlkit/exercises/expected/chNN.pt`` (written by ``python -m rlkit.exercises.solutions
record [--chapter N]``; loadable with ``torch.load(path, weights_only=True)``): the cases
themselves, the reference's outputs (through the exercise's probe, :mod:`rlkit.exercises.probes`)
and each registered mistake's outputs with its cause. A student's function is run on every case
(``cases_passed`` counts them all, for partial credit); the message reports the first failing
case and its likely cause. The diagnoses are those of the live checker: a registered mistake is
recognised by its stored outputs, then the generic patterns, the gradient probe, the in-place,
NaN, dtype and signature checks.

There are two installs. The instructor's has ``rlkit/exercises/solutions/`` (the references,
cases and mistakes as code): there :func:`get` returns the live :class:`Exercise`, with
``reference`` and ``mistakes[i].fn``, and :func:`self_check` works. The student bundle
(``python -m rlkit.exercises student-bundle OUT/``) has no ``solutions`` package: the registry is
rebuilt from the stored data as :class:`StoredExercise` objects, whose ``reference`` raises
``AttributeError`` (with a message saying why) and whose mistakes carry their causes only
(``fn`` is None). :func:`has_solutions` says which install this is. An exercise registered at run
time (with :func:`register` or :func:`exercise`, e.g. in a test) has no stored data and is checked
against its reference, run live.
"""
from __future__ import annotations

import difflib
import importlib
import inspect
import pkgutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from rlkit import _validate as V

__all__ = ["Case", "Mistake", "Exercise", "StoredExercise", "Stored", "CheckResult", "UnknownExerciseError",
           "register", "exercise", "mistake", "check", "grade", "exercises", "get", "self_check", "has_solutions",
           "EXPECTED_DIR", "expected_path"]

#: The folder of the stored expectations, one ``chNN.pt`` per chapter.
EXPECTED_DIR = Path(__file__).resolve().parent / "expected"
#: the version of the stored data's layout (``record`` writes it; a reader refuses another)
STORED_FORMAT = 1
#: the command that rewrites a chapter's stored expectations (quoted in messages about stale data)
RECORD_COMMAND = "python -m rlkit.exercises.solutions record --chapter {chapter}"


class UnknownExerciseError(ValueError):
    """No exercise is registered under the name given to :func:`get`, :func:`check` or :func:`self_check`."""


@dataclass
class Case:
    """One input to an exercise: positional ``args``, keyword ``kwargs`` and a readable ``label``."""

    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    label: str = ""


@dataclass
class Mistake:
    """A known wrong variant of the reference and the cause to report when a student matches it
    (``fn`` is None in the student bundle, where only the variant's stored outputs remain)."""

    fn: Callable | None
    cause: str


@dataclass
class Stored:
    """An exercise's stored expectations (what ``expected/chNN.pt`` holds for it).

    Attributes:
        cases: the visible cases (inputs and labels), as the reference was run on them.
        expected: the reference's outputs, one per case (through the exercise's probe, if any).
        mistakes: ``(cause, outputs)`` per registered mistake, in order; ``outputs[i]`` is None
            where the mistake raised on case ``i``.
        signature: the reference's signature, e.g. ``"(rewards, discounts)"`` (for answer cells).
        parameters: its parameter names.
        doc: the reference's docstring ("" if none).
    """

    cases: list
    expected: list
    mistakes: list
    signature: str
    parameters: tuple
    doc: str = ""


@dataclass
class Exercise:
    """An exercise: its reference solution, the cases it is checked on and the mistakes it knows."""

    name: str
    chapter: int
    reference: Callable
    cases: Sequence[Case] | Callable[[], Sequence[Case]]
    mistakes: Sequence[Mistake] = ()
    atol: float = 1e-6
    rtol: float = 1e-5
    description: str = ""
    #: how a function's outputs are obtained on a case, ``probe(fn, *args, **kwargs)``; None calls
    #: ``fn(*args, **kwargs)``. A probe can compare more than the return value, e.g. a gradient.
    probe: Callable | None = None
    #: whether a floating-point tensor output must have the reference's dtype (the dtype of the
    #: floating-point inputs, or the one the exercise states); if not, any floating dtype is accepted.
    match_dtype: bool = True
    #: the stored expectations (None until :func:`check` first reads them; None for an exercise
    #: registered at run time, which is checked against its live reference)
    stored: Stored | None = field(default=None, repr=False, compare=False)

    def get_cases(self) -> list[Case]:
        cases = list(self.cases() if callable(self.cases) else self.cases)
        V.int_in(len(cases), f"the number of cases of exercise {self.name!r}")
        for i, c in enumerate(cases):
            V.instance_of(c, f"exercise {self.name!r}: case {i}", Case, "Case")
        return cases

    @property
    def signature(self) -> str:
        """The function's signature as the answer cell writes it, e.g. ``"(rewards, discounts)"``."""
        st = _stored(self)
        return st.signature if st is not None else str(inspect.signature(self.reference))

    @property
    def parameters(self) -> tuple[str, ...]:
        """The names of the function's parameters."""
        st = _stored(self)
        return st.parameters if st is not None else tuple(inspect.signature(self.reference).parameters)

    @property
    def doc(self) -> str:
        """The reference's docstring ("" if it has none)."""
        st = _stored(self)
        return st.doc if st is not None else (inspect.getdoc(self.reference) or "")


class StoredExercise(Exercise):
    """An exercise rebuilt from its stored expectations, where the instructor's
    ``rlkit.exercises.solutions`` is not installed (the student bundle).

    It checks exactly as the live exercise does, against the stored outputs, but it holds no code
    of the reference or of the mistakes: ``reference`` raises ``AttributeError`` saying so, and
    each of ``mistakes`` has ``fn=None`` and its cause.
    """

    @property
    def reference(self):
        raise AttributeError(
            f"exercise {self.name!r} has no reference solution in this installation: the student edition "
            f"of rlkit holds only the expected outputs on the visible cases (rlkit/exercises/expected/"
            f"ch{self.chapter:02d}.pt), which check() compares against; the reference solutions stay with "
            f"the instructor (rlkit/exercises/solutions/)")

    @reference.setter
    def reference(self, value):
        if value is not None:
            raise ValueError("a StoredExercise has no reference (pass reference=None)")

    def __repr__(self) -> str:
        return f"StoredExercise({self.name!r}, chapter={self.chapter}, {len(self.stored.cases)} cases)"

    def __eq__(self, other) -> bool:
        return self is other

    __hash__ = object.__hash__


@dataclass
class CheckResult:
    """What :func:`check` found. ``bool(result)`` is True iff every case matched."""

    name: str
    passed: bool
    message: str
    cases_passed: int = 0
    cases_total: int = 0

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        status = "passed" if self.passed else "failed"
        return f"CheckResult({self.name!r}, {status}, {self.cases_passed}/{self.cases_total} cases)"


_REGISTRY: dict[str, Exercise] = {}
_LOADED = False


def register(exercise: Exercise) -> Exercise:
    """Add an exercise to the registry (a later registration with the same name replaces it)."""
    V.instance_of(exercise, "exercise", Exercise)
    _REGISTRY[exercise.name] = exercise
    return exercise


def exercise(chapter: int, cases: Sequence[Case] | Callable[[], Sequence[Case]], *, atol: float = 1e-6,
             rtol: float = 1e-5, description: str = "", probe: Callable | None = None,
             match_dtype: bool = True) -> Callable[[Callable], Callable]:
    """Decorator: register the decorated function as the reference solution of the exercise named
    after it, checked on ``cases`` (a list of :class:`Case`, or a function returning one) to
    ``atol``/``rtol``. With ``probe``, every function (the student's, the reference, each mistake)
    is run on a case as ``probe(fn, *args, **kwargs)`` and what the probe returns is compared, for
    example a loss together with its gradient. With ``match_dtype`` (the default), a floating-point
    tensor output must have the reference's dtype; pass False for an exercise that leaves the
    floating dtype open. Returns the function unchanged."""
    def decorate(reference: Callable) -> Callable:
        register(Exercise(reference.__name__, chapter, reference, cases, [], atol, rtol, description, probe,
                          match_dtype))
        return reference
    return decorate


def mistake(reference: Callable, cause: str) -> Callable[[Callable], Callable]:
    """Decorator: register the decorated function as a known wrong variant of the exercise whose
    reference is ``reference``; ``check`` reports ``cause`` when a student's outputs match it on
    every case. Mistakes are tried in the order they are declared."""
    ex = next((e for e in _REGISTRY.values() if getattr(e, "reference", None) is reference), None)
    if ex is None:
        raise ValueError(f"mistake: {getattr(reference, '__name__', reference)!r} is not the reference of a "
                         "registered exercise (decorate it with @exercise first)")

    def decorate(fn: Callable) -> Callable:
        ex.mistakes = [*ex.mistakes, Mistake(fn, cause)]
        return fn
    return decorate


_SOLUTIONS: bool | None = None          # whether rlkit.exercises.solutions is importable (None: not tried)
_EXPECTED: dict[int, dict[str, StoredExercise]] = {}


def has_solutions() -> bool:
    """True in the instructor's install (``rlkit.exercises.solutions`` importable), False in the
    student bundle, where the exercises are rebuilt from the stored expectations."""
    global _SOLUTIONS
    if _SOLUTIONS is None:
        try:
            importlib.import_module("rlkit.exercises.solutions")
            _SOLUTIONS = True
        except ModuleNotFoundError as err:
            if err.name != "rlkit.exercises.solutions":      # a missing dependency inside it is a real error
                raise
            _SOLUTIONS = False
    return _SOLUTIONS


def expected_path(chapter: int) -> Path:
    """The file of chapter ``chapter``'s stored expectations."""
    return EXPECTED_DIR / f"ch{int(chapter):02d}.pt"


def _case_from(record: dict) -> Case:
    return Case(tuple(record["args"]), dict(record["kwargs"]), record["label"])


def _stored_exercise(rec: dict, path: Path) -> StoredExercise:
    from rlkit.exercises.probes import PROBES

    probe = None
    if rec["probe"] is not None:
        if rec["probe"] not in PROBES:
            raise ValueError(f"{path}: exercise {rec['name']!r} was recorded with the probe {rec['probe']!r}, which "
                             f"rlkit.exercises.probes does not define (known: {', '.join(PROBES)})")
        probe = PROBES[rec["probe"]]
    cases = [_case_from(c) for c in rec["cases"]]
    stored = Stored(cases, list(rec["expected"]), [(m["cause"], list(m["outputs"])) for m in rec["mistakes"]],
                    rec["signature"], tuple(rec["parameters"]), rec["doc"])
    mistakes = [Mistake(None, m["cause"]) for m in rec["mistakes"]]
    return StoredExercise(rec["name"], rec["chapter"], None, cases, mistakes, rec["atol"], rec["rtol"],
                          rec["description"], probe, rec["match_dtype"], stored)


def read_expected(chapter: int) -> dict[str, StoredExercise]:
    """Chapter ``chapter``'s stored expectations, by exercise name (empty if the chapter has no file)."""
    chapter = int(chapter)
    if chapter not in _EXPECTED:
        path = expected_path(chapter)
        out: dict[str, StoredExercise] = {}
        if path.is_file():
            data = torch.load(path, weights_only=True)
            if not isinstance(data, dict) or data.get("format") != STORED_FORMAT:
                raise ValueError(f"{path}: not stored expectations of format {STORED_FORMAT}; rewrite it with "
                                 + RECORD_COMMAND.format(chapter=chapter))
            for rec in data["exercises"]:
                out[rec["name"]] = _stored_exercise(rec, path)
        _EXPECTED[chapter] = out
    return _EXPECTED[chapter]


def _stored(ex: Exercise) -> Stored | None:
    """The stored expectations of ``ex``: its own, or (a book exercise of the instructor's install,
    declared in rlkit/exercises/solutions/) those recorded under its name; None if there are none."""
    if ex.stored is None:
        module = getattr(ex.__dict__.get("reference"), "__module__", "") or ""
        if module.startswith("rlkit.exercises.solutions."):
            rec = read_expected(ex.chapter).get(ex.name)
            if rec is not None:
                ex.stored = rec.stored
    return ex.stored


def _load_all() -> None:
    global _LOADED
    if _LOADED:
        return
    if has_solutions():
        from rlkit.exercises import solutions
        for info in pkgutil.iter_modules(solutions.__path__):
            if info.name.startswith("ch"):
                importlib.import_module(f"{solutions.__name__}.{info.name}")
    else:
        for path in sorted(EXPECTED_DIR.glob("ch[0-9][0-9].pt")):
            for name, ex in read_expected(int(path.stem[2:])).items():
                _REGISTRY.setdefault(name, ex)
    _LOADED = True


def exercises(chapter: int | None = None) -> list[Exercise]:
    """All registered exercises (optionally of one chapter), sorted by chapter and name."""
    _load_all()
    out = [e for e in _REGISTRY.values() if chapter is None or e.chapter == chapter]
    return sorted(out, key=lambda e: (e.chapter, e.name))


def get(name: str) -> Exercise:
    """The exercise registered under ``name``.

    Raises :class:`UnknownExerciseError` (a ``ValueError``) for a name that is not registered; its
    message names the closest registered names and lists them all.
    """
    V.instance_of(name, "name", str, "str (the exercise's name)")
    _load_all()
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=3)
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        known = ", ".join(sorted(_REGISTRY)) or "(none)"
        raise UnknownExerciseError(f"no exercise named {name!r}{hint}; known exercises: {known}")
    return _REGISTRY[name]


# ----------------------------------------------------------------------------- comparison helpers

def _clone(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, (list, tuple)):
        return type(x)(_clone(v) for v in x)
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    return x


def _flatten(out) -> list:
    if isinstance(out, (tuple, list)):
        items = []
        for o in out:
            items.extend(_flatten(o))
        return items
    return [out]


def _as_tensor(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x)
    if isinstance(x, (bool, int, float, np.floating, np.integer)):
        return torch.tensor(float(x), dtype=torch.float64)
    return None


def _close(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> bool:
    if a.shape != b.shape:
        return False
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    return bool(torch.allclose(a64, b64, atol=atol, rtol=rtol, equal_nan=True))


def _fmt(v: float) -> str:
    return f"{v:.6g}"


def _generic_cause(got: torch.Tensor, exp: torch.Tensor, atol: float, rtol: float) -> str | None:
    """Recognise a few patterns that explain most wrong answers."""
    g, e = got.to(torch.float64), exp.to(torch.float64)
    if not torch.isfinite(g).all() or not torch.isfinite(e).all():
        return None
    if e.abs().max() > atol and _close(g, -e, atol, rtol):
        return ("your result is the reference with the sign flipped (a minus sign dropped or added, or a "
                "difference taken the other way round; for a loss, remember that it is minimised)")
    nz = e.abs() > 1e-9
    if nz.sum() >= 2:  # with one number, every wrong answer is "a constant times" the right one
        ratio = g[nz] / e[nz]
        c = ratio.median()
        if torch.isfinite(c) and abs(float(c) - 1.0) > 1e-3 and _close(g, c * e, atol, rtol):
            return (f"your result is the reference times a constant {float(c):.4g} "
                    "(a missing or extra normalisation, e.g. dividing by the wrong count)")
    if e.dim() >= 1 and e.shape[-1] >= 3:
        if _close(g[..., :-1], e[..., 1:], atol, rtol):
            return "your values are shifted one step earlier in time than expected (an off-by-one in the time index)"
        if _close(g[..., 1:], e[..., :-1], atol, rtol):
            return "your values are shifted one step later in time than expected (an off-by-one in the time index)"
        if _close(g, e.flip(-1), atol, rtol):
            return ("your result is the reference reversed in time "
                    "(a backward recursion stored in forward order, or vice versa)")
    return None


def _compare(got_out, exp_out, atol: float, rtol: float, match_dtype: bool = False) -> str | None:
    """None if equal, else a description of the first difference (with ``match_dtype``, a
    floating-point tensor of another floating dtype than the expected one is a difference)."""
    got_items, exp_items = _flatten(got_out), _flatten(exp_out)
    if len(got_items) != len(exp_items):
        return f"expected {len(exp_items)} output(s), got {len(got_items)}"
    for k, (g, e) in enumerate(zip(got_items, exp_items)):
        where = f"output {k}: " if len(exp_items) > 1 else ""
        msg = _compare_one(g, e, where, atol, rtol, match_dtype)
        if msg is not None:
            return msg
    return None


def _dtype_difference(g, e, where: str, atol: float, rtol: float) -> str | None:
    """Why a floating-point tensor ``g`` does not have the expected tensor ``e``'s floating dtype (None if it does)."""
    if not (isinstance(g, torch.Tensor) and isinstance(e, torch.Tensor) and g.is_floating_point()
            and e.is_floating_point() and g.dtype != e.dtype):
        return None
    values = ("the values match the reference" if _close(_as_tensor(g), _as_tensor(e), atol, rtol)
              else "the values differ too")
    return (f"{where}wrong dtype: expected {e.dtype}, got {g.dtype} ({values}; compute in the dtype of the "
            f"inputs, or the one the exercise states: e.g. create buffers with torch.zeros_like(x) or "
            f"dtype=x.dtype, not torch.zeros(n), which is float32)")


def _compare_one(g, e, where: str, atol: float, rtol: float, match_dtype: bool = False) -> str | None:
    """One output against its reference: the kind, then the shape and dtype, then the values."""
    et, gt = _as_tensor(e), _as_tensor(g)
    if et is None:  # non-numeric expected output: compare by equality
        return f"{where}expected {e!r}, got {g!r}" if g != e else None
    if gt is None:
        return f"{where}expected a tensor or number, got {type(g).__name__}"
    if isinstance(e, torch.Tensor) and not isinstance(g, torch.Tensor):
        return f"{where}expected a torch.Tensor, got {type(g).__name__}"
    if gt.shape != et.shape:
        return f"{where}wrong shape: expected {tuple(et.shape)}, got {tuple(gt.shape)}{_shape_hint(gt, et)}"
    if et.is_floating_point() and not gt.is_floating_point():
        return (f"{where}expected a floating-point result, got dtype {gt.dtype} "
                "(integer arithmetic truncates; convert with .float())")
    if match_dtype and (msg := _dtype_difference(g, e, where, atol, rtol)) is not None:
        return msg
    if _close(gt, et, atol, rtol):
        return None
    return _value_difference(gt, et, where, atol, rtol)


def _shape_hint(gt: torch.Tensor, et: torch.Tensor) -> str:
    """A guess at the mistake behind a wrong shape ("" if none fits)."""
    if gt.numel() == et.numel() and gt.dim() != et.dim():
        return " (same elements, different rank: an extra or missing dimension of size 1?)"
    if gt.numel() == et.numel():
        return " (same number of elements: a transpose or a reshape in the wrong order?)"
    if gt.dim() == et.dim() - 1 or gt.numel() == 1:
        return " (did you reduce over a dimension that should be kept?)"
    if gt.dim() == et.dim() + 1:
        return " (an extra dimension: did you forget to reduce or squeeze?)"
    return ""


def _value_difference(gt: torch.Tensor, et: torch.Tensor, where: str, atol: float, rtol: float) -> str:
    """Where two same-shaped tensors that are not close differ, and the likely cause."""
    g64, e64 = gt.to(torch.float64), et.to(torch.float64)
    if torch.isnan(g64).any() and not torch.isnan(e64).any():
        idx = tuple(int(i) for i in torch.nonzero(torch.isnan(g64))[0]) if g64.dim() else ()
        return f"{where}your result has NaN at index {idx} where the reference is finite"
    bad = ~torch.isclose(g64, e64, atol=atol, rtol=rtol, equal_nan=True)
    if g64.dim() == 0:
        msg = f"{where}expected {_fmt(float(e64))}, got {_fmt(float(g64))}"
    else:
        idx = tuple(int(i) for i in torch.nonzero(bad)[0])
        msg = (f"{where}{int(bad.sum())} of {bad.numel()} elements differ; the first at index {idx}: "
               f"expected {_fmt(float(e64[idx]))}, got {_fmt(float(g64[idx]))}")
    cause = _generic_cause(gt, et, atol, rtol)
    if cause:
        msg += f"\n   likely cause: {cause}"
    return msg


def _run(fn: Callable, ex: Exercise | None, args: tuple, kwargs: dict):
    """``fn`` on these inputs, through the exercise's probe if it has one."""
    if ex is not None and ex.probe is not None:
        return ex.probe(fn, *args, **kwargs)
    return fn(*args, **kwargs)


def call_on_case(fn: Callable, case: Case, ex: Exercise | None = None):
    """``fn`` on a fresh copy of the case's inputs (through ``ex``'s probe, if any)."""
    return _run(fn, ex, _clone(case.args), _clone(case.kwargs))


def _differs(fn_a: Callable, fn_b: Callable, case: Case, ex: Exercise, match_dtype: bool = False) -> str | None:
    """How ``fn_a`` differs from ``fn_b`` on ``case`` (None if they agree; the floating dtypes are
    compared only with ``match_dtype``)."""
    return _compare(call_on_case(fn_a, case, ex), call_on_case(fn_b, case, ex), ex.atol, ex.rtol, match_dtype)


def _inputs_modified(before, after) -> list[str]:
    changed = []
    for k, (b, a) in enumerate(zip(_flatten(before), _flatten(after))):
        if isinstance(b, torch.Tensor) and isinstance(a, torch.Tensor):
            same = b.shape == a.shape and (torch.equal(b, a) or (
                b.is_floating_point() and bool(torch.isclose(b, a, rtol=0.0, atol=0.0, equal_nan=True).all())))
            if not same:
                changed.append(f"argument {k}")
    return changed


def _parameters(fn: Callable) -> str | None:
    try:
        return ", ".join(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        return None


def _signature_problem(student_fn: Callable, ex: Exercise, cases: list[Case]) -> str | None:
    """Why ``student_fn`` cannot be called the way the cases call it (None if it can, or if unknown)."""
    try:
        sig = inspect.signature(student_fn)
    except (TypeError, ValueError):
        return None
    for case in cases:
        try:
            sig.bind(*case.args, **case.kwargs)
        except TypeError as err:
            return (f"your function takes ({_parameters(student_fn)}) but the exercise calls it as "
                    f"{ex.name}({', '.join(ex.parameters)}) ({err}); give it the exercise's parameters")
    return None


def _library_problem(student_fn: Callable, ex: Exercise) -> str | None:
    """Why ``student_fn`` does not count: it calls a library function that answers the exercise
    outright (:data:`rlkit.exercises.library_answers.LIBRARY_ANSWERS`); None if it calls none."""
    from rlkit.exercises.library_answers import LIBRARY_ANSWERS, library_calls

    answers = LIBRARY_ANSWERS.get(ex.name)
    if not answers:
        return None
    used = library_calls(student_fn, answers)
    if not used:
        return None
    return (f"your function calls {' and '.join(used)}, the library's own answer to this exercise; the "
            f"exercise asks you to write that computation yourself (other library functions are fine)")


def detached_outputs(out):
    """``out`` with every tensor detached (what is stored and compared)."""
    if isinstance(out, torch.Tensor):
        return out.detach()
    if isinstance(out, (list, tuple)) and not hasattr(out, "_fields"):
        return type(out)(detached_outputs(o) for o in out)
    if isinstance(out, tuple):                     # a named tuple (e.g. torch.return_types): keep its items
        return tuple(detached_outputs(o) for o in out)
    return out


def outputs_or_none(fn: Callable, cases: list[Case], ex: Exercise) -> list:
    """``fn``'s outputs on each case (None where it raised)."""
    outs = []
    for case in cases:
        try:
            outs.append(detached_outputs(call_on_case(fn, case, ex)))
        except Exception:
            outs.append(None)
    return outs


def live_mistakes(ex: Exercise, cases: list[Case]) -> list[tuple[str, list]]:
    """``(cause, outputs per case)`` for each of ``ex``'s registered mistakes, run now."""
    return [(m.cause, outputs_or_none(m.fn, cases, ex)) for m in ex.mistakes]


def _expectations(ex: Exercise) -> tuple[list[Case], list, Callable[[], list]]:
    """The cases, the expected output on each, and (lazily) the mistakes' outputs: the stored ones
    when there are, else from the live reference and mistakes (an exercise registered at run time)."""
    st = _stored(ex)
    if st is not None:
        return st.cases, st.expected, lambda: st.mistakes
    cases = ex.get_cases()
    return cases, [call_on_case(ex.reference, c, ex) for c in cases], lambda: live_mistakes(ex, cases)


_RAISED = object()        # a student's function raised (or modified its input) on this case


def _same(got, theirs, ex: Exercise) -> bool:
    """Whether a student's output equals a mistake's (floating dtypes not compared), never raising."""
    if got is _RAISED or theirs is None:
        return False
    try:
        return _compare(got, theirs, ex.atol, ex.rtol) is None
    except Exception:
        return False


def _match_mistake(outputs: list, ex: Exercise, mistakes: list[tuple[str, list]]) -> str | None:
    """The cause of the first registered mistake whose outputs the student's match on every case."""
    for cause, theirs in mistakes:
        if len(theirs) == len(outputs) and all(_same(g, t, ex) for g, t in zip(outputs, theirs)):
            return cause
    return None


def _run_case(student_fn: Callable, ex: Exercise, case: Case, expected, where: str):
    """The student's output on one case and why it fails (None if it matches)."""
    args, kwargs = _clone(case.args), _clone(case.kwargs)
    try:
        got = _run(student_fn, ex, args, kwargs)
    except NotImplementedError:
        return _RAISED, f"{where}: not implemented yet (the function raised NotImplementedError)", False
    except Exception as err:  # report the student's exception, don't crash the notebook
        return _RAISED, f"{where}: your function raised {type(err).__name__}: {err}", False
    changed = _inputs_modified(case.args, args)
    if changed:
        return _RAISED, (f"{where}: your function modified its input in place ({', '.join(changed)}); "
                         f"work on a copy"), False
    diff = _compare(got, expected, ex.atol, ex.rtol, ex.match_dtype)
    return got, (None if diff is None else f"{where}: {diff}"), diff is not None


def _evaluate(student_fn: Callable, ex: Exercise, cases: list[Case], expected: list,
              mistakes: Callable[[], list], what: str = "case") -> tuple[int, str | None]:
    """Run the student's function on every case: (cases passed, the first failure and its cause, or None).

    A value difference gets the cause of the registered mistake whose outputs the student's match
    on every case (``mistakes()`` gives them), if any."""
    problem = _signature_problem(student_fn, ex, cases) or _library_problem(student_fn, ex)
    if problem is not None:
        return 0, problem
    outputs, passed, first, first_is_value = [], 0, None, False
    for i, (case, exp) in enumerate(zip(cases, expected)):
        where = f"{what} {i + 1}" + (f" ({case.label})" if case.label else "")
        got, failure, is_value = _run_case(student_fn, ex, case, exp, where)
        outputs.append(got)
        if failure is None:
            passed += 1
        elif first is None:
            first, first_is_value = failure, is_value
    if first is not None and first_is_value:
        known = _match_mistake(outputs, ex, mistakes())
        if known:
            first += f"\n   likely cause: {known}"
    return passed, first


def _result(ex: Exercise, passed: int, total: int, failure: str | None, what: str = "case") -> CheckResult:
    if failure is None:
        message = (f"✓ {ex.name}: " + (f"the {what} matches" if total == 1 else f"all {total} {what}s match")
                   + " the reference. Well done!")
    else:
        message = f"✗ {ex.name}: {passed} of {total} {what}s passed.\n   {failure}"
    return CheckResult(ex.name, failure is None, message, passed, total)


def check_on(student_fn: Callable, ex: Exercise, cases: list[Case], expected: list,
             mistakes: Callable[[], list], what: str = "case") -> CheckResult:
    """Check ``student_fn`` on given cases and expected outputs (the instructor's hidden cases use this)."""
    passed, failure = _evaluate(student_fn, ex, cases, expected, mistakes, what)
    return _result(ex, passed, len(cases), failure, what)


def check(student_fn: Callable, name: str | None = None, verbose: bool = True) -> CheckResult:
    """Check a student's function against the exercise of the same name (or ``name``).

    Refuses a non-callable (``TypeError``) and a name no exercise is registered under
    (:class:`UnknownExerciseError`, a ``ValueError``). Runs the student's function on every case
    and compares its outputs with the stored expected ones (a book exercise; an exercise
    registered at run time is compared with its reference, run now). ``cases_passed`` counts the
    cases that matched; the message reports the first case that differs (or a signature that
    cannot take the cases' arguments), what differs and its likely cause, a floating-point output
    of another dtype than the reference's included (unless the exercise leaves it open). A function
    that calls a library function answering its exercise outright
    (:data:`rlkit.exercises.library_answers.LIBRARY_ANSWERS`) is refused with no case passed. Prints
    the report when ``verbose`` and returns a :class:`CheckResult` (truthy iff every case matched).
    """
    V.is_callable(student_fn, "student_fn (your function)")
    if name is None:
        name = V.instance_of(getattr(student_fn, "__name__", None), "student_fn.__name__", str,
                             "str (pass name='...' for a callable without a __name__)")
    ex = get(V.instance_of(name, "name", str, "str (the exercise's name)"))
    cases, expected, mistakes = _expectations(ex)
    result = check_on(student_fn, ex, cases, expected, mistakes)
    if verbose:
        print(result.message)
    return result


def grade(namespace: dict, chapter: int | None = None, verbose: bool = False) -> list[CheckResult]:
    """Check every exercise (of ``chapter``, or all) whose function is defined in ``namespace``.

    For instructors: ``grade(vars(student_module))`` or, in a notebook, ``grade(globals())``.
    Exercises without a matching function are reported as missing (not passed).
    """
    V.instance_of(namespace, "namespace", dict, "dict (e.g. vars(module))")
    results = []
    for ex in exercises(chapter):
        fn = namespace.get(ex.name)
        if fn is None or not callable(fn):
            results.append(CheckResult(ex.name, False, f"✗ {ex.name}: missing", 0, 0))
            continue
        results.append(check(fn, name=ex.name, verbose=verbose))
    return results


def identical(a, b) -> bool:
    """Whether two case inputs (nested tuples, lists and dicts of tensors, numbers and strings) are
    the same: tensors of the same dtype, shape and values (NaN equal to NaN), everything else ``==``."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and bool(torch.equal(a, b) or (a.is_floating_point() and torch.isclose(
                    a, b, rtol=0.0, atol=0.0, equal_nan=True).all())))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(identical(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:     # NaN is NaN
        return True
    return type(a) is type(b) and a == b


def stale(ex: Exercise) -> list[str]:
    """How the stored expectations of a book exercise disagree with its live declaration (cheap:
    names, case labels and inputs, mistakes' causes; [] when they agree). Instructor's install only."""
    st = _stored(ex)
    if st is None:
        return [f"{ex.name}: no stored expectations"]
    problems = []
    cases = ex.get_cases()
    if [c.label for c in cases] != [c.label for c in st.cases]:
        problems.append(f"{ex.name}: the cases differ ({len(cases)} declared, {len(st.cases)} stored)")
    elif not all(identical((c.args, c.kwargs), (s.args, s.kwargs)) for c, s in zip(cases, st.cases)):
        problems.append(f"{ex.name}: the inputs of the cases differ from the stored ones")
    causes = [m.cause for m in ex.mistakes]
    if causes != [c for c, _ in st.mistakes]:
        problems.append(f"{ex.name}: the registered mistakes differ ({len(causes)} declared, "
                        f"{len(st.mistakes)} stored, or their causes changed)")
    sig = str(inspect.signature(ex.reference))
    if sig != st.signature:
        problems.append(f"{ex.name}: the signature is {sig}, the stored one {st.signature}")
    return problems


def self_check(name: str) -> list[str]:
    """Problems with the exercise ``name`` itself (an empty list when it is sound).

    For authors and the test suite (the instructor's install): the stored expectations agree
    with the declaration (else: re-record them), the reference passes its own check, and every
    registered mistake differs from the reference on some case, fails the check, and is diagnosed
    with its own cause. An unknown ``name`` raises :class:`UnknownExerciseError`; in the student
    bundle, which has no references, ``RuntimeError``.
    """
    ex = get(name)
    if isinstance(ex, StoredExercise):
        raise RuntimeError(f"self_check({name!r}) needs the reference and the mistakes' code, which stay with the "
                           "instructor (rlkit.exercises.solutions is not installed here)")
    problems = []
    if _stored(ex) is not None:
        problems += [f"{p} (run {RECORD_COMMAND.format(chapter=ex.chapter)})" for p in stale(ex)]
    ref = check(ex.reference, name=name, verbose=False)
    if not ref:
        problems.append(f"{name}: the reference fails its own check: {ref.message}")
    cases = ex.get_cases()
    for known in ex.mistakes:
        if not any(_differs(known.fn, ex.reference, c, ex, ex.match_dtype) is not None for c in cases):
            problems.append(f"{name}: the mistake {known.cause!r} gives the reference's answer on every case")
            continue
        result = check(known.fn, name=name, verbose=False)
        if result:
            problems.append(f"{name}: the mistake {known.cause!r} passes the check")
        elif known.cause not in result.message:
            problems.append(f"{name}: the mistake {known.cause!r} is not diagnosed; the checker said: {result.message}")
    return problems
