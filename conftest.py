"""pytest configuration shared by the unit tests, the notebooks and the book build.

`pytest` (bare) collects tests/ and lessons/ (see pyproject.toml). Notebooks run under nbval
in lax mode in the current environment: a notebook passes when every cell runs without an
exception (the chapter's check cells assert its claims), and cells marked
`# NBVAL_CHECK_OUTPUT` are also compared with their stored output.

Execute once: while nbval runs a notebook, this plugin keeps each cell's outputs, asks the
kernel for the ipywidgets state at the end, and stores the executed notebook in the book's
jupyter-cache (_build/.jupyter_cache). The book build (tests/test_book.py, ordered last) then
finds every chapter in the cache and renders it without executing it again. A notebook with a
failing cell is not cached, so the build would execute it and fail too.

What the bridge relies on. jupyter-cache: only its public cache API (`get_cache`,
`cache_notebook_bundle`, `match_cache_notebook`), called exactly as myst-nb calls it for the
book build. nbval documents no Python API, so the bridge reads four of its internals: the
`IPyNbCell` item type, `item.cell_num`, `item.test_outputs` and the notebook's running kernel
`item.parent.kernel`. requirements.txt therefore bounds nbval (and jupyter-cache) to the minor
versions this is tested with, and nothing fails silently: if one of those internals is missing
or a notebook that passed cannot be cached, the notebook's last cell reports an error at
teardown and `tests/test_book.py::test_notebooks_run_under_nbval_are_cached` fails; that test
and the book build also check that every notebook run in the session is found in the cache and
is not executed again by the build.
"""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
CACHE_DIR = ROOT / "_build" / ".jupyter_cache"
TESTED_VERSIONS = {"nbval": "0.11.", "jupyter_cache": "1.0."}  # keep in step with requirements.txt

# per notebook: {"path": Path, "outputs": {cell_num: outs}, "failed": bool, "seconds": float,
#                "status": None | "cached" | "failed" | "partial" | "error"}
_RUNS: dict[str, dict] = {}
_BRIDGE_ERRORS: list[str] = []  # why a notebook that passed under nbval was not cached


class CacheBridgeError(RuntimeError):
    """The execute-once bridge could not hand an executed notebook to the book's cache."""


def pytest_configure(config):
    """One torch thread for the unit tests, as in the chapters (see book/setup.md, "Threads")."""
    import os

    import torch

    torch.set_num_threads(int(os.environ.get("RLKIT_THREADS", "1")))


@pytest.fixture(scope="session")
def nbval_runs():
    """What the bridge saw in this session: ``{"runs": {path: run}, "errors": [message]}``.

    A run's ``status`` is ``"cached"`` (every code cell ran and passed, and the executed notebook
    is in the cache), ``"failed"`` (a cell failed or was skipped: not cached), ``"partial"`` (only
    some cells were selected: not cached) or ``"error"`` (it passed but could not be cached).
    """
    return {"runs": _RUNS, "errors": _BRIDGE_ERRORS, "cache_dir": CACHE_DIR}


@pytest.fixture
def one_torch_thread():
    """Run a test with one torch thread (the problem sets' learning tests are timed on one), then restore."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def rlkit_public_modules() -> list[str]:
    """rlkit and every module under it with no name part starting with "_" that exports something
    (a non-empty ``__all__``, or none): each has a section in the Library reference (book/api/)."""
    import importlib
    import pkgutil

    import rlkit

    names = ["rlkit"] + [m.name for m in pkgutil.walk_packages(rlkit.__path__, "rlkit.")
                         if not any(part.startswith("_") for part in m.name.split("."))]
    return [n for n in names if getattr(importlib.import_module(n), "__all__", None) != []]


def _is_nbval_cell(item) -> bool:
    return type(item).__name__ == "IPyNbCell" and type(item).__module__.startswith("nbval")


def _nbval_internals(item) -> list[str]:
    """The nbval internals the bridge reads that this item lacks (none, with nbval 0.11)."""
    missing = [f"item.{a}" for a in ("cell_num", "test_outputs") if not hasattr(item, a)]
    if not hasattr(item.parent, "kernel"):
        missing.append("item.parent.kernel")
    return missing


def pytest_collection_modifyitems(session, config, items):
    """Run the book build and the browser checks after everything else (they use its results)."""
    def order(item):
        if item.get_closest_marker("browser"):
            return 2
        if item.get_closest_marker("book"):
            return 1
        return 0
    items.sort(key=order)  # sort is stable: the rest keep their order
    _skip_hf_chapter_without_transformers(items)


#: Chapters that need the optional `hf` extra (transformers); CI installs it, so there they must run.
HF_CHAPTERS = ("25_hugging_face_models.ipynb",)


def _skip_hf_chapter_without_transformers(items):
    import importlib.util
    import os
    if os.environ.get("CI") or importlib.util.find_spec("transformers") is not None:
        return
    skip = pytest.mark.skip(reason='chapter 25 needs the hf extra: pip install -e ".[hf]" (transformers); '
                                   "CI installs it and runs the chapter")
    for item in items:
        if Path(str(item.fspath)).name in HF_CHAPTERS:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    start = time.perf_counter()
    outcome = yield
    if _is_nbval_cell(item):
        key = str(item.parent.path)
        run = _RUNS.setdefault(key, {"path": Path(item.parent.path), "outputs": {}, "failed": False,
                                     "seconds": 0.0, "status": None})
        run["seconds"] += time.perf_counter() - start
        missing = _nbval_internals(item)
        if missing:
            run["missing"] = missing
            return
        if outcome.excinfo is not None:  # an error, a failed check or a skip: the cell has no outputs
            run["failed"] = True
        run["outputs"][item.cell_num] = copy.deepcopy(item.test_outputs or [])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    error = None
    if _is_nbval_cell(item) and (nextitem is None or nextitem.parent is not item.parent):
        # before nbval's own teardown, which stops the kernel (the widget state is read from it)
        try:
            _finish_notebook(item)
        except Exception as err:
            run = _RUNS.get(str(item.parent.path))
            if run is not None:
                run["status"] = "error"
            error = f"could not cache executed notebook {item.parent.path}: {type(err).__name__}: {err}"
            _BRIDGE_ERRORS.append(error)
            error = CacheBridgeError(error + " (the book build would execute it again; see conftest.py)")
            error.__cause__ = err
    result = yield  # nbval's teardown runs here, whatever happened above
    if error is not None:
        raise error
    return result


def _widget_state(kernel) -> dict | None:
    """Ask the running kernel for the state of every live ipywidget (as nbclient would save it)."""
    code = (
        "import json as _json, sys as _sys\n"
        "if 'ipywidgets' in _sys.modules:\n"
        "    import ipywidgets as _w\n"
        "    print('__WIDGET_STATE__' + _json.dumps(_w.Widget.get_manager_state(drop_defaults=True)))\n"
    )
    msg_id = kernel.execute_cell_input(code, allow_stdin=False)
    kernel.await_reply(msg_id, timeout=60)
    text = ""
    while True:
        msg = kernel.get_message("iopub", timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            text += msg["content"]["text"]
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    marker = "__WIDGET_STATE__"
    if marker not in text:
        return None
    state = json.loads(text.split(marker, 1)[1].strip().splitlines()[0])
    return state if state.get("state") else None


def _finish_notebook(item) -> None:
    import nbformat

    key = str(item.parent.path)
    run = _RUNS.get(key)
    if run is None:
        return
    if run.get("missing"):
        raise CacheBridgeError(f"nbval has changed: the bridge needs {', '.join(run['missing'])} (tested with "
                               f"nbval {TESTED_VERSIONS['nbval']}x; see requirements.txt)")
    nb = nbformat.read(str(run["path"]), as_version=4)
    n_code = sum(1 for c in nb.cells if c.cell_type == "code")
    if run["failed"]:
        run["status"] = "failed"
        return
    if len(run["outputs"]) != n_code:
        run["status"] = "partial"  # some cells were deselected: nothing complete to cache
        return
    kernel = item.parent.kernel
    state = _widget_state(kernel) if kernel is not None and kernel.is_alive() else None
    count = 0
    code_i = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outs = []
        for out in run["outputs"][code_i]:
            out = nbformat.from_dict(dict(out))
            if out.get("output_type") == "execute_result":
                count += 1
                out["execution_count"] = count
            outs.append(out)
        cell.outputs = outs
        cell.execution_count = code_i + 1
        code_i += 1
    if state is not None:
        nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": state}
    nbformat.validate(nb)
    _store_in_cache(nb, run["path"], run["seconds"])
    run["status"] = "cached"


def _store_in_cache(nb, path: Path, seconds: float) -> None:
    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    cache = get_cache(str(CACHE_DIR))
    cache.cache_notebook_bundle(
        CacheBundleIn(nb, str(path), data={"execution_seconds": seconds}),
        check_validity=False,
        overwrite=True,
    )
    # read it back as the build will: by the hash of the notebook file as committed
    cache.match_cache_notebook(nbformat.read(str(path), as_version=4))  # KeyError if the match fails


def _untested_versions() -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for dist, prefix in TESTED_VERSIONS.items():
        try:
            v = version(dist.replace("_", "-"))
        except PackageNotFoundError:
            continue
        if not v.startswith(prefix):
            out.append(f"{dist} {v} (tested: {prefix}x)")
    return out


def pytest_terminal_summary(terminalreporter):
    if not _RUNS:
        return
    tr = terminalreporter
    tr.section("notebook durations (nbval, seconds)")
    total = 0.0
    for key, run in sorted(_RUNS.items()):
        total += run["seconds"]
        status = {"cached": "ok", None: "ok"}.get(run["status"], run["status"].upper())
        tr.write_line(f"{run['seconds']:8.1f}  {status:7s}  {Path(key).relative_to(ROOT)}")
    tr.write_line(f"{total:8.1f}  total")
    untested = _untested_versions()
    if _BRIDGE_ERRORS or untested:
        tr.section("execute-once bridge (conftest.py)", red=True)
        for line in _BRIDGE_ERRORS:
            tr.write_line(line, red=True)
        if untested:
            tr.write_line("untested versions: " + ", ".join(untested) + "; see requirements.txt", red=True)
