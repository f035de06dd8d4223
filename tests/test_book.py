"""Build the HTML book with warnings as errors (after the notebooks have run; see conftest.py).

The notebooks executed under nbval earlier in the same pytest run are in the jupyter-cache, so
the build renders them without executing them again; two tests check that this execute-once
bridge (conftest.py) still works, because otherwise the build would quietly execute every
chapter a second time. Run alone (`pytest tests/test_book.py`), the build executes whatever
the cache lacks and those two tests skip: no notebook ran in the session.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"


def _passed_under_nbval(nbval_runs) -> list[Path]:
    """Notebooks that ran in full and passed under nbval in this session: the bridge must cache them."""
    runs = nbval_runs["runs"]
    if not runs:
        pytest.skip("no notebook ran under nbval in this session: nothing to check (run them in the same "
                    "pytest call, e.g. `pytest lessons tests/test_book.py`)")
    passed = [Path(key) for key, run in runs.items() if run["status"] not in ("failed", "partial")]
    if not passed:
        pytest.skip("no notebook passed in full under nbval in this session")
    return passed


def test_notebooks_run_under_nbval_are_cached(nbval_runs):
    """Every chapter that passed under nbval is in the book's jupyter-cache, found as the build finds it."""
    import nbformat
    from jupyter_cache import get_cache

    passed = _passed_under_nbval(nbval_runs)
    assert not nbval_runs["errors"], "the execute-once bridge failed:\n" + "\n".join(nbval_runs["errors"])
    cache = get_cache(str(nbval_runs["cache_dir"]))
    problems = []
    for path in passed:
        nb = nbformat.read(str(path), as_version=4)
        try:
            record = cache.match_cache_notebook(nb)
        except KeyError:
            problems.append(f"{path.name}: not in the cache")
            continue
        cached = cache.get_cache_bundle(record.pk).nb
        n_out = sum(len(c.get("outputs", [])) for c in cached.cells if c.cell_type == "code")
        n_ran = sum(len(o) for o in nbval_runs["runs"][str(path)]["outputs"].values())
        if n_out != n_ran:
            problems.append(f"{path.name}: {n_out} outputs cached, {n_ran} produced under nbval")
    assert not problems, "the execute-once bridge did not cache:\n" + "\n".join(problems)


@pytest.fixture(scope="session")
def built_book():
    exe = Path(sys.executable).with_name("jupyter-book")
    assert exe.exists(), f"jupyter-book is not installed next to {sys.executable}"
    if (HTML / "index.html").exists():
        (HTML / "index.html").unlink()  # never pass on a stale build
    cmd = [str(exe), "build", str(ROOT), "-W", "-n", "--keep-going"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    log = proc.stdout + proc.stderr
    (ROOT / "_build").mkdir(exist_ok=True)
    (ROOT / "_build" / "build.log").write_text(log)
    return proc.returncode, log


def test_book_builds_cleanly(built_book):
    rc, log = built_book
    warnings = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line]
    assert rc == 0, "jupyter-book build failed:\n" + "\n".join(warnings[:40]) + "\n" + log[-3000:]
    assert (HTML / "index.html").exists()
    executed = re.findall(r"Executing notebook", log)
    print(f"notebooks executed by the build (not found in the cache): {len(executed)}")


def test_build_executes_no_notebook_run_under_nbval(built_book, nbval_runs):
    """The build found every chapter run under nbval in the cache: none was executed a second time."""
    passed = _passed_under_nbval(nbval_runs)
    _, log = built_book
    log = re.sub(r"\x1b\[[0-9;]*m", "", log)
    executed = {Path(p).resolve() for p in re.findall(r"^(.+?\.ipynb): Executing notebook", log, flags=re.M)}
    again = sorted(p.name for p in passed if p.resolve() in executed)
    assert not again, f"the book build executed again notebooks that nbval ran in this session: {again}"


def test_every_chapter_has_a_page(built_book):
    for nb in sorted((ROOT / "lessons").glob("*.ipynb")):
        page = HTML / "lessons" / (nb.stem + ".html")
        assert page.exists(), f"no HTML page for {nb.name}"
        text = page.read_text()
        assert "cell_output" in text or "output" in text, f"{page.name} shows no executed output"


def test_figures_are_numbered_per_chapter(built_book):
    """Captioned figures read "Figure N.k": N the chapter, k = 1, 2, ... in page order.

    (book/_ext/chapter_figures.py renumbers Sphinx's book-wide numbers.)
    """
    seen = 0
    for nb in sorted((ROOT / "lessons").glob("*.ipynb")):
        chapter = int(nb.stem.split("_")[0])
        html = (HTML / "lessons" / (nb.stem + ".html")).read_text()
        numbers = re.findall(r'<span class="caption-number">Figure ([\d.]+)', html)
        assert numbers == [f"{chapter}.{k}" for k in range(1, len(numbers) + 1)], (nb.name, numbers)
        seen += len(numbers)
    assert seen >= 20


def test_renumbering_keeps_each_pages_order_and_prefixes_the_chapter():
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    from chapter_figures import renumber
    book_wide = {"lessons/07_tiny_llm": {"figure": {"b": (9,), "a": (8,), "c": (12,)}, "table": {"t": (3,)}},
                 "book/setup": {"figure": {"s": (1,)}},
                 "lessons/12_clipping_staleness": {"figure": {"x": (30,)}}}
    out, changed = renumber(book_wide)
    assert out["lessons/07_tiny_llm"] == {"figure": {"a": (7, 1), "b": (7, 2), "c": (7, 3)}, "table": {"t": (7, 1)}}
    assert out["book/setup"] == {"figure": {"s": (1,)}}
    assert out["lessons/12_clipping_staleness"]["figure"] == {"x": (12, 1)}
    assert sorted(changed) == ["lessons/07_tiny_llm", "lessons/12_clipping_staleness"]


def test_no_button_leads_nowhere(built_book):
    """No launch button (Binder, Colab, JupyterHub) and no repository link: the book has no public home yet.

    _config.yml sets neither ``repository.url`` nor ``launch_buttons`` (see its comment and the
    README); a button that points at a repository that does not exist would lead nowhere.
    """
    offenders = []
    for page in HTML.rglob("*.html"):
        html = page.read_text(errors="replace")
        for pattern in ("mybinder.org", "colab.research.google.com", "launch-buttons", "github.com/rlkit-book",
                        'class="btn btn-sm btn-source-repository-button'):
            if pattern in html:
                offenders.append(f"{page.relative_to(HTML)}: {pattern}")
    assert not offenders, "pages offer buttons that lead nowhere:\n" + "\n".join(offenders[:20])


def test_pages_load_nothing_from_the_network(built_book):
    """Scripts and stylesheets come from the build: an offline reader sees everything."""
    offenders = []
    for page in HTML.rglob("*.html"):
        html = page.read_text(errors="replace")
        for tag in re.findall(r"<(?:script|link)[^>]+(?:src|href)=\"(https?://[^\"]+)\"[^>]*>", html):
            if tag.endswith((".js", ".css")) or "cdn" in tag:
                offenders.append(f"{page.relative_to(HTML)}: {tag}")
    assert not offenders, "pages load assets from the network:\n" + "\n".join(offenders[:20])


def test_library_reference_documents_every_public_name(built_book, rlkit_public_modules):
    """Each name in a public module's __all__ has exactly one entry in the Library reference.

    An entry sits under the module or under a package that re-exports the name (``rlkit.llm.GPT``
    for ``rlkit.llm.model.GPT``). Data (constants) are the exception: autodoc documents them only
    where they are assigned (their ``#:`` doc comment is there), so a package's re-exported
    constant has its entry under the submodule that assigns it (``rlkit.llm.tasks.ADDITION`` for
    ``rlkit.llm.ADDITION``). Autodoc silently leaves out a name without a docstring, or one the
    module provides only through a module ``__getattr__``; this catches both.
    """
    import importlib

    ids = set()
    for page in (HTML / "book" / "api").glob("*.html"):
        ids |= set(re.findall(r'<dt class="sig sig-object py" id="([^"]+)"', page.read_text()))
    problems = []
    for mod in rlkit_public_modules:
        m = importlib.import_module(mod)
        names = getattr(m, "__all__", None)
        if names is None:
            names = [n for n, v in vars(m).items() if not n.startswith("_") and callable(v)
                     and getattr(v, "__module__", None) == mod]
        parts = mod.split(".")
        for name in names:
            if name.startswith("__"):
                continue
            homes = [".".join(parts[:i]) + "." + name for i in range(len(parts), 0, -1)]
            value = getattr(m, name)
            if not callable(value):      # data: also its home in the submodule that assigns it
                homes += [f"{sub}.{name}" for sub in rlkit_public_modules if sub.startswith(mod + ".")
                          and name in getattr(importlib.import_module(sub), "__all__", ())
                          and getattr(importlib.import_module(sub), name) is value]
            found = [h for h in homes if h in ids]
            if len(found) != 1:
                problems.append(f"{mod}.{name}: " + (f"documented {len(found)} times ({found})" if found
                                                     else "no entry (no docstring?)"))
    assert not problems, "the Library reference is incomplete:\n" + "\n".join(problems)


def test_claims_ledger_lists_every_claim_of_the_executed_chapters(built_book):
    """book/claims.md is generated: every claim a chapter displayed is a row of the ledger page."""
    import html
    import importlib.util

    spec = importlib.util.spec_from_file_location("claims_ledger", ROOT / "book" / "_ext" / "claims_ledger.py")
    ledger = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ledger)
    executed = [ledger.executed_notebook(p, ROOT / "_build") for p in sorted((ROOT / "lessons").glob("*.ipynb"))]
    assert all(nb is not None for nb in executed), "a chapter is missing from the book's jupyter-cache"
    claims = [c for nb in executed for c in ledger.claims_in_notebook(nb)]
    assert len(claims) >= 50, \
        f"only {len(claims)} claims found in the executed chapters: is the claim output lost?"
    page = html.unescape((HTML / "book" / "claims.html").read_text())
    assert f"{len(claims)} claims in" in page, "the ledger's count disagrees with the executed chapters"
    missing = [c["statement"] for c in claims if c["statement"] not in page]
    assert not missing, f"claims missing from the ledger page: {missing[:5]}"


def test_every_figure_cell_has_a_caption_and_a_name():
    """Issue 21 and 22 (item 10): every figure of chapters 0-25 is captioned and can be referenced.

    A code cell that draws (``plt.subplots``, ``plt.figure``, ``live_figure(``) carries myst-nb's
    ``mystnb.figure`` metadata with a non-empty ``caption`` and a ``name`` of the form ``fig-chNN-...``.
    """
    import json as _json
    draws = re.compile(r"plt\.subplots|plt\.figure\(|live_figure\(")
    missing, seen = [], 0
    for nb in sorted((ROOT / "lessons").glob("[0-9][0-9]_*.ipynb")):
        cells = _json.loads(nb.read_text())["cells"]
        for i, cell in enumerate(cells):
            if cell["cell_type"] != "code" or not draws.search("".join(cell["source"])):
                continue
            seen += 1
            fig = cell.get("metadata", {}).get("mystnb", {}).get("figure", {})
            name = fig.get("name", "")
            if not str(fig.get("caption", "")).strip() or not re.fullmatch(rf"fig-ch{nb.name[:2]}-[\w-]+", name):
                missing.append(f"{nb.name} cell {i}: caption {bool(fig.get('caption'))}, name {name!r}")
    assert seen >= 80, seen
    assert not missing, "figures without a caption or a fig-chNN- name:\n" + "\n".join(missing)
