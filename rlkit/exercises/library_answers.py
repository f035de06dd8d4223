"""Library functions that answer an exercise, and the check that an answer does not call them.

A few exercises ask for something that rlkit itself computes elsewhere: ``cvar_of_samples`` is
what :func:`rlkit.risk.cvar` returns, ``doubly_robust`` is :func:`rlkit.offline.ope_dr`. A
student who writes ``return rlkit.risk.cvar(x, alpha)`` passes every case without having done the
exercise. :data:`LIBRARY_ANSWERS` lists, per exercise, the public rlkit functions that pass its
check when called with the exercise's arguments (in their order or another, with trailing
arguments dropped). :func:`search` finds them by trying every public function that way;
``python -m rlkit.exercises.library_answers`` runs it and prints where the table and the search
differ, and ``tests/test_library_answers.py`` keeps the two in step. :func:`rlkit.exercises.check`
refuses a function that calls one of its exercise's library answers: directly, through a module
attribute (``risk.cvar``), through a closure, a default argument or a helper function of the
student's own. Calling any other library function is fine.

This is a guard for honest slips ("I'll just use the library's"), not a sandbox: a student who
copies the library's source, or reaches it through ``getattr`` with a computed name, passes. The
course guide says so, and grading adds hidden cases and the written parts.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import io
import itertools
import pkgutil
import signal
import threading
import types
import warnings
from collections.abc import Callable, Iterable

__all__ = ["LIBRARY_ANSWERS", "SKIPPED_MODULES", "library_calls", "resolve", "search"]

#: For each exercise, the public rlkit functions (by dotted name) that answer it outright.
LIBRARY_ANSWERS: dict[str, tuple[str, ...]] = {
    "chi_square_divergence": ("rlkit.estimators.importance_weight_variance",),
    "cvar_of_samples": ("rlkit.risk.cvar", "rlkit.risk.cvar_from_quantiles"),
    "pinball": ("rlkit.risk.pinball_loss",),
    "lagrangian_policy": ("rlkit.safety.tilted_policy",),
    "lagrangian_advantage": ("rlkit.safety.lagrangian_advantages",),
    "cvar_prompts": ("rlkit.risk.cvar", "rlkit.risk.cvar_from_quantiles"),
    "group_dro_update": ("rlkit.dro.group_dro_step",),
    "best_of_n_exact": ("rlkit.llm.guided.best_of_n_binary",),
    "doubly_robust": ("rlkit.offline.ope_dr",),
    "mask_position_ids": ("rlkit.llm.hf.position_ids",),
}

_LIBRARIES = ("rlkit", "torch", "numpy", "math", "builtins", "functools", "itertools", "collections")
_MAX_DEPTH = 4          # helper functions followed (a helper of a helper of ...)


def resolve(dotted: str):
    """The object a dotted name such as ``"rlkit.risk.cvar"`` names (``ValueError`` if none)."""
    if not isinstance(dotted, str) or "." not in dotted:
        raise ValueError(f"dotted: expected a dotted name such as 'rlkit.risk.cvar', got {dotted!r}")
    module, _, attr = dotted.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"dotted: {dotted!r} names nothing importable ({err})") from err
    return obj


def _names(code: types.CodeType) -> set[str]:
    """Every global and attribute name a code object (and the functions nested in it) uses."""
    out = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= _names(const)
    return out


def _referenced(fn) -> tuple[list, list]:
    """The objects ``fn`` refers to: (values, user functions to follow). Values are what its globals,
    closure cells and defaults hold, and the attributes of referenced modules along the names the
    code uses (``risk.cvar``, ``rlkit.risk.cvar``)."""
    if isinstance(fn, functools.partial):
        return [fn.func, *fn.args, *fn.keywords.values()], [fn.func]
    fn = inspect.unwrap(fn)
    if inspect.ismethod(fn):
        fn = fn.__func__
    code = getattr(fn, "__code__", None)
    if code is None:                         # a callable object: look at its __call__
        call = type(fn).__dict__.get("__call__")
        return ([call], [call]) if isinstance(call, types.FunctionType) else ([], [])
    names = _names(code)
    g = getattr(fn, "__globals__", {}) or {}
    values = [g[n] for n in names if n in g]
    values += [c.cell_contents for c in (fn.__closure__ or ()) if _has_contents(c)]
    values += list(fn.__defaults__ or ()) + list((fn.__kwdefaults__ or {}).values())
    frontier = [v for v in values if inspect.ismodule(v)]
    for _ in range(4):                       # rlkit.llm.guided.best_of_n_binary: up to four attribute steps
        nxt = []
        for mod in frontier:
            for n in names:
                v = mod.__dict__.get(n)
                if v is not None:
                    values.append(v)
                    if inspect.ismodule(v):
                        nxt.append(v)
        frontier = nxt
    follow = [v for v in values if callable(v) and not inspect.ismodule(v) and not inspect.isclass(v)
              and (getattr(v, "__module__", None) or "").split(".")[0] not in _LIBRARIES]
    return values, follow


def _has_contents(cell) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:                       # an empty cell (a variable not yet assigned)
        return False
    return True


def library_calls(fn: Callable, names: Iterable[str]) -> list[str]:
    """Those of ``names`` (dotted names of library functions) that ``fn`` refers to.

    Follows the functions ``fn`` refers to that are not a library's own (a student's helper), up to
    four levels deep. Returns the dotted names found, in the order of ``names``; an empty list when
    ``fn`` uses none of them.
    """
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
    names = list(names)
    targets = {}
    for dotted in names:
        targets.setdefault(id(resolve(dotted)), []).append(dotted)
    found: set[str] = set()
    seen: set[int] = set()
    todo = [(fn, 0)]
    while todo:
        f, depth = todo.pop()
        if id(f) in seen or depth > _MAX_DEPTH:
            continue
        seen.add(id(f))
        values, follow = _referenced(f)
        for v in values:
            for dotted in targets.get(id(v), ()):
                found.add(dotted)
        todo += [(h, depth + 1) for h in follow]
    return [n for n in names if n in found]


# ------------------------------------------------------------------------------------------- search

#: The modules :func:`search` leaves out, the exercise machinery and those whose functions act outside
#: the process (files, processes, figures, widgets, command lines).
SKIPPED_MODULES = ("rlkit.exercises", "rlkit.robustness", "rlkit.distributed", "rlkit.plots", "rlkit.widgets",
                   "rlkit.llm.checkpoint")


def _public_functions() -> dict[str, Callable]:
    """Every public rlkit function, by its first public dotted name (one entry per function)."""
    import rlkit

    names = ["rlkit"] + [m.name for m in pkgutil.walk_packages(rlkit.__path__, "rlkit.")
                         if not any(p.startswith("_") for p in m.name.split("."))]
    out: dict[str, Callable] = {}
    seen: set[int] = set()
    for mod in names:
        if mod.startswith(SKIPPED_MODULES):
            continue
        m = importlib.import_module(mod)
        for n in getattr(m, "__all__", ()):
            v = getattr(m, n, None)
            if inspect.isfunction(v) and n != "main" and id(v) not in seen:
                seen.add(id(v))
                out[f"{mod}.{n}"] = v
    return out


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Raise :class:`_Timeout` after ``seconds`` (SIGALRM, main thread only; elsewhere no limit)."""
    if seconds <= 0 or not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(*_):
        raise _Timeout()
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _fits(sig: inspect.Signature, vals: list) -> list | None:
    """``vals``, with trailing values dropped until ``sig`` can take them positionally (None if never)."""
    vals = list(vals)
    while vals:
        try:
            sig.bind(*vals)
            return vals
        except TypeError:
            vals = vals[:-1]
    return None


def _arguments(exsig: inspect.Signature, sig: inspect.Signature, order: tuple, args: tuple, kwargs: dict):
    """The exercise's arguments (bound by ``exsig``, defaults filled in) in ``order``, fitted to ``sig``."""
    b = exsig.bind(*args, **kwargs)
    b.apply_defaults()
    vals = list(b.arguments.values())
    return _fits(sig, [vals[i] for i in order])


def _caller(fn: Callable, exsig: inspect.Signature, sig: inspect.Signature, order: tuple, name: str) -> Callable:
    """A function with the exercise's name and signature that returns ``fn`` on its arguments in ``order``."""
    def answer(*args, **kwargs):
        return fn(*_arguments(exsig, sig, order, args, kwargs))
    answer.__signature__ = exsig
    answer.__name__ = name
    return answer


def search(chapters: Iterable[int] | None = None, seconds: float = 5.0) -> dict[str, list[str]]:
    """The public rlkit functions that answer each exercise outright: what :data:`LIBRARY_ANSWERS` lists.

    For every exercise of ``chapters`` (all by default) and every public rlkit function (outside
    :data:`SKIPPED_MODULES`), the function is called with the exercise's arguments in each of their
    orders (every permutation up to four arguments, else the given order), dropping trailing
    arguments it does not take, and checked with the guard lifted. It answers the exercise when
    every visible case passes. Each call gets ``seconds`` (0: no limit). Returns
    ``{exercise name: [dotted names]}`` for the exercises that have an answer; takes under a
    minute for the whole book on one core (45 s measured).
    """
    from rlkit.exercises import exercises

    wanted = None if chapters is None else {int(c) for c in chapters}
    functions = _public_functions()
    found: dict[str, list[str]] = {}
    for ex in exercises():
        if ex.chapter < 0 or (wanted is not None and ex.chapter not in wanted):
            continue
        cases = ex.get_cases()
        ns: dict = {}
        exec(f"def _signature{ex.signature}: pass", {"inf": float("inf"), "nan": float("nan")}, ns)
        exsig = inspect.signature(ns["_signature"])
        k = len(exsig.parameters)
        orders = list(itertools.permutations(range(k))) if k <= 4 else [tuple(range(k))]
        saved = LIBRARY_ANSWERS.pop(ex.name, None)         # the guard lifted for this exercise's search
        try:
            answers = _answers(ex.name, cases, exsig, orders, functions, seconds)
        finally:
            if saved is not None:
                LIBRARY_ANSWERS[ex.name] = saved
        if answers:
            found[ex.name] = answers
    return found


def _answers(name: str, cases: list, exsig: inspect.Signature, orders: list, functions: dict,
             seconds: float) -> list[str]:
    """The functions of ``functions`` that pass exercise ``name`` in one of ``orders`` (guard lifted)."""
    from rlkit.exercises import check

    out = []
    for dotted, fn in functions.items():
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            continue
        for order in orders:
            try:
                if any(_arguments(exsig, sig, order, c.args, c.kwargs) is None for c in cases):
                    continue
            except TypeError:
                continue
            answer = _caller(fn, exsig, sig, order, name)
            try:
                with _time_limit(seconds), warnings.catch_warnings(), \
                        contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    warnings.simplefilter("ignore")
                    result = check(answer, name=name, verbose=False)
            except (Exception, _Timeout, SystemExit):
                result = None
            if result is not None and result.cases_total and result.cases_passed == result.cases_total:
                out.append(dotted)
                break
    return out


def _main() -> int:
    found = search()
    table = {n: set(ds) for n, ds in LIBRARY_ANSWERS.items()}
    print("LIBRARY_ANSWERS = {")
    for name, ds in found.items():
        print(f"    {name!r}: {tuple(ds)!r},")
    print("}")
    differ = sorted(set(table) ^ set(found) | {n for n in table if n in found and table[n] != set(found[n])})
    print(f"the table and the search differ on: {', '.join(differ)}" if differ else "the table matches the search")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(_main())
