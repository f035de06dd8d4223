r"""The student edition: the chapter notebooks without their solutions.

    python -m rlkit.exercises student-edition OUT/ [--lessons lessons/]

writes a copy of every chapter notebook to ``OUT/`` with two kinds of content removed:

* **solution blocks**, the ``{solution}`` directives of sphinx-exercise in markdown cells (the
  dropdowns under each exercise in the HTML book), each replaced by one line saying that the
  solution is not included;
* **solution cells**, the code cell at the end of each chapter that defines the reference
  solutions and checks them (tagged ``remove-cell`` and starting with ``# Solutions``, or tagged
  ``solution``).

Everything else stays as it is: the text, every other code cell in its order, the exercises
themselves and the calls to :func:`rlkit.exercises.check`, which compare a student's function
with the reference registered in ``rlkit/exercises/chNN.py``. Outputs are cleared. A chapter
notebook runs in the student edition exactly as it does in the book, up to and including its
exercises, because no code cell before the solutions is touched.

The checkers need the reference solutions, so the installed ``rlkit`` still contains them: the
student edition hides the solutions from the page, not from a student who reads the library's
source. For graded work, grade on the instructor's machine (``python -m rlkit.exercises grade``).
"""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

__all__ = ["strip_solutions", "student_edition", "is_solution_cell", "SOLUTION_NOTE"]

#: The line that replaces each solution block in the student edition.
SOLUTION_NOTE = "*The solution to this exercise is not included in the student edition.*"

_OPEN = re.compile(r"^(\s*)(`{3,}|:{3,})\{solution\}")


def is_solution_cell(cell: dict) -> bool:
    """True for a code cell that holds reference solutions.

    Such a cell is tagged ``solution``, or tagged ``remove-cell`` (hidden in the book) with a
    first line that starts with ``# Solutions``, as every chapter's last cell is.

    Args:
        cell: a notebook cell (a dict in nbformat 4's layout).

    Returns:
        True for a solution cell, False for any other cell.
        Chapter: 01_policy_gradient (every chapter's exercises).
    """
    if not isinstance(cell, dict) or "cell_type" not in cell:
        raise TypeError(f"cell must be a notebook cell (a dict with a 'cell_type'), got {type(cell).__name__}")
    if cell["cell_type"] != "code":
        return False
    tags = cell.get("metadata", {}).get("tags", [])
    src = "".join(cell.get("source", "")).lstrip()
    return "solution" in tags or ("remove-cell" in tags and src.startswith("# Solutions"))


def _strip_blocks(text: str, where: str) -> tuple[str, int]:
    """Remove every ``{solution}`` block from markdown ``text``; return the text and the count."""
    out, removed, fence = [], 0, None
    for line in text.splitlines(keepends=True):
        if fence is None:
            m = _OPEN.match(line)
            if m:
                fence, indent = m.group(2), m.group(1)
                removed += 1
                continue
            out.append(line)
        elif line.strip() == fence:
            out.append(f"{indent}{SOLUTION_NOTE}\n")
            fence = None
    if fence is not None:
        raise ValueError(f"{where}: a {{solution}} block opened with {fence!r} is never closed")
    return "".join(out), removed


def strip_solutions(notebook: dict, name: str = "notebook") -> tuple[dict, dict]:
    """A copy of ``notebook`` without solution blocks and solution cells, and what was removed.

    Args:
        notebook: an nbformat-4 notebook as a dict (``json.load`` of an ``.ipynb``).
        name: used in error messages.

    Returns:
        ``(student_notebook, {"blocks": int, "cells": int})``. Outputs and execution counts of
        the copy are cleared. A solution block that is never closed raises ``ValueError``.
        Chapter: 01_policy_gradient (every chapter's exercises).
    """
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise TypeError(f"notebook must be an nbformat-4 notebook dict with a 'cells' list, got "
                        f"{type(notebook).__name__}")
    nb = copy.deepcopy(notebook)
    cells, blocks, removed_cells = [], 0, 0
    for i, cell in enumerate(nb["cells"]):
        if is_solution_cell(cell):
            removed_cells += 1
            continue
        if cell["cell_type"] == "markdown":
            text, k = _strip_blocks("".join(cell["source"]), f"{name}, cell {i}")
            if k:
                cell["source"] = text.splitlines(keepends=True)
                blocks += k
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
        cells.append(cell)
    nb["cells"] = cells
    return nb, {"blocks": blocks, "cells": removed_cells}


def default_lessons() -> Path | None:
    """The ``lessons/`` folder next to the installed package (an editable install), if it exists."""
    here = Path(__file__).resolve().parents[2] / "lessons"
    return here if here.is_dir() else None


def student_edition(out_dir, lessons_dir=None) -> dict[str, dict]:
    """Write the student edition of every chapter notebook in ``lessons_dir`` to ``out_dir``.

    Args:
        out_dir: the folder to write to (created if missing). It must not be ``lessons_dir``.
        lessons_dir: the chapter notebooks (``NN_*.ipynb``); default: the repository's
            ``lessons/`` next to an editable install of rlkit.

    Returns:
        ``{file name: {"blocks": removed solution blocks, "cells": removed solution cells}}``.
        Chapter: 01_policy_gradient (every chapter's exercises).
    """
    src = Path(lessons_dir) if lessons_dir is not None else default_lessons()
    if src is None or not src.is_dir():
        raise FileNotFoundError(f"lessons_dir: no chapter folder found (got {lessons_dir!r}); pass the "
                                f"repository's lessons/ folder")
    out = Path(out_dir)
    if out.resolve() == src.resolve():
        raise ValueError(f"out_dir must differ from lessons_dir ({src}): the student edition would "
                         f"overwrite the chapters")
    books = sorted(src.glob("[0-9][0-9]_*.ipynb"))
    if not books:
        raise FileNotFoundError(f"lessons_dir: {src} holds no chapter notebooks (NN_*.ipynb)")
    out.mkdir(parents=True, exist_ok=True)
    report = {}
    for path in books:
        nb, removed = strip_solutions(json.loads(path.read_text()), path.name)
        (out / path.name).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        report[path.name] = removed
    return report
