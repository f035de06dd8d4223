"""Build the HTML book with warnings as errors (after the notebooks have run; see conftest.py).

The notebooks executed under nbval earlier in the same pytest run are in the jupyter-cache, so
the build renders them without executing them again. Run alone (`pytest tests/test_book.py`),
it executes whatever the cache lacks.
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


def test_every_chapter_has_a_page(built_book):
    for nb in sorted((ROOT / "lessons").glob("*.ipynb")):
        page = HTML / "lessons" / (nb.stem + ".html")
        assert page.exists(), f"no HTML page for {nb.name}"
        text = page.read_text()
        assert "cell_output" in text or "output" in text, f"{page.name} shows no executed output"


def test_pages_load_nothing_from_the_network(built_book):
    """Scripts and stylesheets come from the build: an offline reader sees everything."""
    offenders = []
    for page in HTML.rglob("*.html"):
        html = page.read_text(errors="replace")
        for tag in re.findall(r"<(?:script|link)[^>]+(?:src|href)=\"(https?://[^\"]+)\"[^>]*>", html):
            if tag.endswith((".js", ".css")) or "cdn" in tag:
                offenders.append(f"{page.relative_to(HTML)}: {tag}")
    assert not offenders, "pages load assets from the network:\n" + "\n".join(offenders[:20])
