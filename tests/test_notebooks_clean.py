"""Chapters are committed clean and listed in the table of contents.

Notebooks carry no outputs, except the reference output of cells marked NBVAL_CHECK_OUTPUT
(nbval compares those), and no saved widget state. Every chapter in lessons/ is in _toc.yml,
and every page _toc.yml lists exists. Every public rlkit module has a section in the Library
reference (book/api/, listed in _toc.yml).
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "lessons").glob("*.ipynb"))


def _toc_files():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]

    def walk(entries):
        for e in entries or []:
            if "file" in e:
                files.append(e["file"])
            walk(e.get("sections"))
            walk(e.get("chapters"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    return files


def test_there_are_chapters():
    assert NOTEBOOKS, "lessons/ holds no notebooks"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(str(path), as_version=4)
    assert "widgets" not in nb.metadata, f"{path.name}: saved widget state in the notebook metadata"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", f"{path.name}: kernelspec must be python3"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if "NBVAL_CHECK_OUTPUT" in cell.source:
            # nbval only honours the marker alone on its comment line; otherwise it silently skips the comparison
            assert any(line.strip() == "# NBVAL_CHECK_OUTPUT" for line in cell.source.splitlines()), \
                f"{path.name} cell {i}: write the marker alone on its line: '# NBVAL_CHECK_OUTPUT'"
            assert cell.outputs, f"{path.name} cell {i}: NBVAL_CHECK_OUTPUT cell needs its reference output"
            continue
        assert not cell.outputs, f"{path.name} cell {i} has outputs; clear them (jupyter nbconvert --clear-output)"
        assert cell.execution_count is None, f"{path.name} cell {i} has an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_one_title_and_seeds_itself(path):
    nb = nbformat.read(str(path), as_version=4)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.lstrip().startswith("# "), \
        f"{path.name}: the first cell must be a markdown H1 title"
    h1 = [c for c in nb.cells if c.cell_type == "markdown"
          for line in c.source.splitlines() if re.match(r"^# \S", line)]
    assert len(h1) == 1, f"{path.name}: exactly one H1 title expected, found {len(h1)}"
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "seed_everything(" in code, f"{path.name}: the notebook must seed itself (rlkit.utils.seed_everything)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_uses_the_shared_statistics_and_seed_switch(path):
    """One statistics module and one seed switch (book/setup.md, "How the book tests its claims"):
    no private copies of mean/s.e./separation helpers, and every seed list comes from
    rlkit.utils.seeds, so that RLKIT_SEED_BASE moves all of them."""
    nb = nbformat.read(str(path), as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    private = re.findall(r"^\s*def (mean_se|fmt|separated|above)\(", code, flags=re.M)
    assert not private, f"{path.name} defines its own {private}: use rlkit.stats (summary, compare, claim)"
    for m in re.finditer(r"^\s*([A-Z][A-Z0-9_]*SEEDS)\s*=\s*(.+)$", code, flags=re.M):
        name, rhs = m.groups()
        assert "seeds(" in rhs or re.search(r"[A-Z_]*SEEDS\b", rhs), \
            f"{path.name}: {name} = {rhs.strip()} is a literal seed list; use rlkit.utils.seeds(n)"


def test_toc_and_lessons_agree():
    listed = set(_toc_files())
    for f in listed:
        matches = list(ROOT.glob(f + ".*"))
        assert matches, f"_toc.yml lists {f}, which does not exist"
    for nb in NOTEBOOKS:
        rel = str(nb.relative_to(ROOT).with_suffix(""))
        assert rel in listed, f"{rel} is not in _toc.yml"


def test_library_reference_covers_every_public_module(rlkit_public_modules):
    listed = set(_toc_files())
    documented = {}
    for page in sorted((ROOT / "book" / "api").glob("*.md")):
        rel = str(page.relative_to(ROOT).with_suffix(""))
        assert rel in listed, f"{rel} is not in _toc.yml"
        for mod in re.findall(r"^\.\. automodule:: (rlkit[\w.]*)$", page.read_text(), flags=re.M):
            documented.setdefault(mod, rel)
    missing = [m for m in rlkit_public_modules if m not in documented]
    assert not missing, f"public modules without a section in the Library reference (book/api/*.md): {missing}"
