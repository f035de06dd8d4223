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
"""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
CACHE_DIR = ROOT / "_build" / ".jupyter_cache"

# per notebook: {"path": Path, "outputs": {cell_num: outs}, "failed": bool, "seconds": float}
_RUNS: dict[str, dict] = {}


def pytest_configure(config):
    """One torch thread for the unit tests, as in the chapters (see book/setup.md, "Threads")."""
    import os

    import torch

    torch.set_num_threads(int(os.environ.get("RLKIT_THREADS", "1")))


def _is_nbval_cell(item) -> bool:
    return type(item).__name__ == "IPyNbCell"


def pytest_collection_modifyitems(session, config, items):
    """Run the book build and the browser checks after everything else (they use its results)."""
    def order(item):
        if item.get_closest_marker("browser"):
            return 2
        if item.get_closest_marker("book"):
            return 1
        return 0
    items.sort(key=order)  # sort is stable: the rest keep their order


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    start = time.perf_counter()
    outcome = yield
    if _is_nbval_cell(item):
        key = str(item.parent.path)
        run = _RUNS.setdefault(key, {"path": Path(item.parent.path), "outputs": {}, "failed": False,
                                     "seconds": 0.0, "counts": {}})
        run["seconds"] += time.perf_counter() - start
        if outcome.excinfo is not None:
            run["failed"] = True
        run["outputs"][item.cell_num] = copy.deepcopy(item.test_outputs or [])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    if _is_nbval_cell(item) and (nextitem is None or nextitem.parent is not item.parent):
        try:
            _finish_notebook(item)
        except Exception as err:  # caching is an optimisation: never fail a test because of it
            print(f"\n[conftest] could not cache executed notebook {item.parent.path}: {err}")
    yield


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
    nb = nbformat.read(str(run["path"]), as_version=4)
    n_code = sum(1 for c in nb.cells if c.cell_type == "code")
    if run["failed"] or len(run["outputs"]) != n_code:
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


def _store_in_cache(nb, path: Path, seconds: float) -> None:
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    cache = get_cache(str(CACHE_DIR))
    cache.cache_notebook_bundle(
        CacheBundleIn(nb, str(path), data={"execution_seconds": seconds}),
        check_validity=False,
        overwrite=True,
    )


def pytest_terminal_summary(terminalreporter):
    if not _RUNS:
        return
    tr = terminalreporter
    tr.section("notebook durations (nbval, seconds)")
    total = 0.0
    for key, run in sorted(_RUNS.items()):
        total += run["seconds"]
        status = "FAILED" if run["failed"] else "ok"
        tr.write_line(f"{run['seconds']:8.1f}  {status:6s}  {Path(key).relative_to(ROOT)}")
    tr.write_line(f"{total:8.1f}  total")

