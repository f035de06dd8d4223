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
the student's function and the reference on every case and explains the first thing that
differs: a signature that does not fit, an exception, the wrong number of outputs, the wrong shape
or dtype (a floating-point output must have the reference's dtype: the dtype of the floating-point
inputs, by torch's type promotion, or the one the exercise states, e.g. "a float64 tensor"), NaNs,
an input modified in place, or the first differing element, followed by a likely cause. Likely
causes come from two places: the exercise's registered mistakes (a buggy variant whose outputs the
student's match exactly), and generic patterns (a sign flip, a constant factor, a shift by one step
in time, time reversed).

``check`` returns a :class:`CheckResult`, truthy when every case matched, so a notebook can
``assert check(my_fn)``. Instructors can grade with :func:`grade`, which runs the checks for
a whole namespace of student functions and returns a table of results.
"""
from __future__ import annotations

import difflib
import importlib
import inspect
import pkgutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from rlkit import _validate as V

__all__ = ["Case", "Mistake", "Exercise", "CheckResult", "UnknownExerciseError", "register", "exercise", "mistake",
           "check", "grade", "exercises", "get", "self_check"]


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
    """A known wrong variant of the reference and the cause to report when a student matches it."""

    fn: Callable
    cause: str


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

    def get_cases(self) -> list[Case]:
        cases = list(self.cases() if callable(self.cases) else self.cases)
        V.int_in(len(cases), f"the number of cases of exercise {self.name!r}")
        for i, c in enumerate(cases):
            V.instance_of(c, f"exercise {self.name!r}: case {i}", Case, "Case")
        return cases


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
    ex = next((e for e in _REGISTRY.values() if e.reference is reference), None)
    if ex is None:
        raise ValueError(f"mistake: {getattr(reference, '__name__', reference)!r} is not the reference of a "
                         "registered exercise (decorate it with @exercise first)")

    def decorate(fn: Callable) -> Callable:
        ex.mistakes = [*ex.mistakes, Mistake(fn, cause)]
        return fn
    return decorate


def _load_all() -> None:
    global _LOADED
    if _LOADED:
        return
    from rlkit.exercises import solutions
    for info in pkgutil.iter_modules(solutions.__path__):
        if info.name.startswith("ch"):
            importlib.import_module(f"{solutions.__name__}.{info.name}")
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
        return ("your result is the reference with the sign flipped "
                "(a loss must be minimised: did you drop or add a minus sign?)")
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


def _describe_case(case: Case, i: int) -> str:
    return f"case {i + 1}" + (f" ({case.label})" if case.label else "")


def _run(fn: Callable, ex: Exercise | None, args: tuple, kwargs: dict):
    """``fn`` on these inputs, through the exercise's probe if it has one."""
    if ex is not None and ex.probe is not None:
        return ex.probe(fn, *args, **kwargs)
    return fn(*args, **kwargs)


def _call(fn: Callable, case: Case, ex: Exercise | None = None):
    """``fn`` on a fresh copy of the case's inputs (through ``ex``'s probe, if any)."""
    return _run(fn, ex, _clone(case.args), _clone(case.kwargs))


def _differs(fn_a: Callable, fn_b: Callable, case: Case, ex: Exercise, match_dtype: bool = False) -> str | None:
    """How ``fn_a`` differs from ``fn_b`` on ``case`` (None if they agree; the floating dtypes are
    compared only with ``match_dtype``)."""
    return _compare(_call(fn_a, case, ex), _call(fn_b, case, ex), ex.atol, ex.rtol, match_dtype)


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
                    f"{ex.name}({_parameters(ex.reference)}) ({err}); give it the exercise's parameters")
    return None


def _first_failure(student_fn: Callable, ex: Exercise, cases: list[Case]) -> tuple[int, str | None]:
    """Run the student's function on the cases in order: (cases passed, the first failure or None)."""
    problem = _signature_problem(student_fn, ex, cases)
    if problem is not None:
        return 0, problem
    for i, case in enumerate(cases):
        expected = _call(ex.reference, case, ex)
        args, kwargs = _clone(case.args), _clone(case.kwargs)
        try:
            got = _run(student_fn, ex, args, kwargs)
        except NotImplementedError:
            return i, f"{_describe_case(case, i)}: not implemented yet (the function raised NotImplementedError)"
        except Exception as err:  # report the student's exception, don't crash the notebook
            return i, f"{_describe_case(case, i)}: your function raised {type(err).__name__}: {err}"
        changed = _inputs_modified(case.args, args)
        if changed:
            return i, (f"{_describe_case(case, i)}: your function modified its input in place "
                       f"({', '.join(changed)}); work on a copy")
        diff = _compare(got, expected, ex.atol, ex.rtol, ex.match_dtype)
        if diff is not None:
            known = _match_mistake(student_fn, ex, cases)
            return i, f"{_describe_case(case, i)}: {diff}" + (f"\n   likely cause: {known}" if known else "")
    return len(cases), None


def check(student_fn: Callable, name: str | None = None, verbose: bool = True) -> CheckResult:
    """Check a student's function against the exercise of the same name (or ``name``).

    Refuses a non-callable (``TypeError``) and a name no exercise is registered under
    (:class:`UnknownExerciseError`, a ``ValueError``). Runs the student's function and the
    reference on every case, stops at the first case that differs (or at a signature that cannot
    take the cases' arguments), and reports what differs and its likely cause, a floating-point
    output of another dtype than the reference's included (unless the exercise leaves it open).
    Prints the report when ``verbose`` and returns a :class:`CheckResult` (truthy iff every case
    matched).
    """
    V.is_callable(student_fn, "student_fn (your function)")
    if name is None:
        name = V.instance_of(getattr(student_fn, "__name__", None), "student_fn.__name__", str,
                             "str (pass name='...' for a callable without a __name__)")
    ex = get(V.instance_of(name, "name", str, "str (the exercise's name)"))
    cases = ex.get_cases()
    passed, failure = _first_failure(student_fn, ex, cases)
    total = len(cases)
    if failure is None:
        message = (f"✓ {ex.name}: " + ("the case matches" if total == 1 else f"all {total} cases match")
                   + " the reference. Well done!")
    else:
        message = f"✗ {ex.name}: {passed} of {total} cases passed.\n   {failure}"
    if verbose:
        print(message)
    return CheckResult(ex.name, failure is None, message, passed, total)


def _match_mistake(student_fn, ex: Exercise, cases: list[Case]) -> str | None:
    """The cause of the first registered mistake whose outputs the student's match on every case."""
    for known in ex.mistakes:
        try:
            if all(_differs(student_fn, known.fn, case, ex) is None for case in cases):
                return known.cause
        except Exception:
            continue
    return None


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


def self_check(name: str) -> list[str]:
    """Problems with the exercise ``name`` itself (an empty list when it is sound).

    For authors and the test suite: the reference passes its own checker; every registered
    mistake differs from the reference on some case, fails the check, and is diagnosed with its
    own cause. An unknown ``name`` raises :class:`UnknownExerciseError`.
    """
    ex = get(name)
    problems = []
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
