r"""The student edition: the chapter notebooks without their solutions.

    python -m rlkit.exercises student-edition OUT/ [--lessons lessons/] [--force]

writes a copy of every chapter notebook to ``OUT/`` with two kinds of content removed:

* **solution blocks**, the ``{solution}`` directives of sphinx-exercise in markdown cells (the
  dropdowns under each exercise in the HTML book), each replaced by one line saying that the
  solution is not included. A block is recognised in every form MyST renders as a directive: a
  fence of three or more backticks, tildes or colons, indented at most three spaces, whose info
  string starts with ``{solution}`` (spaces before the brace allowed, the name in any case). It
  ends at the first closing fence, as in CommonMark: the same character, at least as long as the
  opening one, indented at most three spaces, followed by nothing but spaces or tabs (a block shown
  as an example inside another code block is removed too). The cell's
  attachments that its remaining text no longer references (a solution's images) are dropped. A
  block that is never closed is an error, and so is a ``{solution}`` fence inside a quote or a list
  item, or indented four spaces or more (move it to the top level of the cell);
* **solution cells**, the code cell at the end of each chapter that defines the reference
  solutions and checks them (tagged ``remove-cell`` and starting with ``# Solutions``, or tagged
  ``solution``).

Everything else stays as it is: the text, every other code cell in its order, the exercises
themselves and the calls to :func:`rlkit.exercises.check`, which compare a student's function
with the reference registered in ``rlkit/exercises/solutions/chNN.py``. Outputs are cleared. A chapter
notebook runs in the student edition exactly as it does in the book, up to and including its
exercises, because no code cell before the solutions is touched.

``OUT`` must be missing or empty: a folder that holds anything (a student's own copy of a
chapter, say) is refused unless ``--force`` is given, and then only the chapter files are
replaced. Every chapter is read and stripped before anything is written, so a chapter that is not
a notebook leaves ``OUT`` as it was. A missing ``OUT`` is built in a temporary folder next to it
and renamed into place; in an existing one, each file is written to a temporary file in ``OUT``
and then renamed over its name, so a symbolic link there is replaced, never written through.

The checkers need the reference solutions, so the installed ``rlkit`` still contains them: the
student edition hides the solutions from the page, not from a student who reads the library's
source. For graded work, grade on the instructor's machine (``python -m rlkit.exercises grade``).
"""
from __future__ import annotations

import copy
import json
import os
import re
import secrets
import shutil
from pathlib import Path
from urllib.parse import unquote

__all__ = ["strip_solutions", "student_edition", "is_solution_cell", "SOLUTION_NOTE"]

#: The line that replaces each solution block in the student edition.
SOLUTION_NOTE = "*The solution to this exercise is not included in the student edition.*"

#: A line as CommonMark splits them (only \n, \r\n and \r end a line; str.splitlines also splits on
#: \v, \f, \x1c-\x1e, \x85, \u2028 and \u2029, which markdown keeps inside a line).
_LINES = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")
#: A {solution} fence anywhere in a line: ``lead`` is what precedes it (indentation, quote and list markers).
#: (Each unit of ``lead`` starts with a character no other unit starts with: no exponential backtracking.)
_OPEN = re.compile(r"(?P<lead>(?:[ \t>]|[-+*][ \t]|\d{1,9}[.)][ \t])*)(?P<fence>`{3,}|~{3,}|:{3,})"
                   r"[ \t]*(?P<info>\{solution\}(?:[ \t].*)?)$", re.IGNORECASE)
_FENCE = re.compile(r" {0,3}(?P<fence>`{3,}|~{3,}|:{3,})[ \t]*$")
_ATTACHMENT = re.compile(r"attachment:([^\s)\"'<>]+)")


def _lines(text: str) -> list[str]:
    return _LINES.findall(text)


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


def _opening(line: str, where: str, number: int) -> str | None:
    """The fence that opens a {solution} block on ``line`` (None if it opens none)."""
    m = _OPEN.match(line.rstrip("\r\n"))
    if m is None or (m["fence"][0] == "`" and "`" in m["info"]):   # a backtick fence's info has no backtick
        return None
    if not re.fullmatch(r" {0,3}", m["lead"]):
        raise ValueError(f"{where}, line {number}: a {{solution}} block inside a quote or a list item, or indented "
                         f"4 spaces or more ({line.strip()!r}); the student edition removes only blocks at the top "
                         f"level of a cell: move it there")
    return m["fence"]


def _closes(line: str, fence: str) -> bool:
    """Is ``line`` a closing fence for ``fence`` (the same character, at least as long, indented at most 3 spaces)?"""
    m = _FENCE.fullmatch(line.rstrip("\r\n"))
    return m is not None and m["fence"][0] == fence[0] and len(m["fence"]) >= len(fence)


def _strip_blocks(text: str, where: str) -> tuple[str, int]:
    """Remove every ``{solution}`` block from markdown ``text``; return the text and the count."""
    out, removed, fence, indent = [], 0, None, ""
    for number, line in enumerate(_lines(text), start=1):
        if fence is None:
            fence = _opening(line, where, number)
            if fence is not None:
                indent = line[:len(line) - len(line.lstrip(" "))]
                removed += 1
                continue
            out.append(line)
        elif _closes(line, fence):
            out.append(f"{indent}{SOLUTION_NOTE}\n")
            fence = None
    if fence is not None:
        raise ValueError(f"{where}: a {{solution}} block opened with {fence!r} is never closed")
    return "".join(out), removed


def _referenced(attachments: dict, text: str) -> dict:
    """The attachments that ``text`` still references (``attachment:NAME``)."""
    names = set(_ATTACHMENT.findall(text))
    names |= {unquote(n) for n in names}
    return {k: v for k, v in attachments.items() if k in names}


def _source(cell, where: str) -> str:
    if not isinstance(cell, dict) or not isinstance(cell.get("cell_type"), str):
        raise ValueError(f"{where}: not a notebook cell (a dict with a 'cell_type'), got {type(cell).__name__}")
    if "source" not in cell:
        raise ValueError(f"{where}: a {cell['cell_type']} cell without 'source' (nbformat 4 requires one)")
    src = cell["source"]
    if isinstance(src, list) and all(isinstance(x, str) for x in src):
        return "".join(src)
    if not isinstance(src, str):
        raise ValueError(f"{where}: 'source' must be a string or a list of strings, got {type(src).__name__}")
    return src


def strip_solutions(notebook: dict, name: str = "notebook") -> tuple[dict, dict]:
    """A copy of ``notebook`` without solution blocks and solution cells, and what was removed.

    Args:
        notebook: an nbformat-4 notebook as a dict (``json.load`` of an ``.ipynb``).
        name: used in error messages.

    Returns:
        ``(student_notebook, {"blocks": int, "cells": int})``. Outputs and execution counts of
        the copy are cleared; a cell whose solution blocks were removed keeps only the
        attachments its remaining text references. A solution block that is never closed or is
        not at the top level of its cell, and a cell without a ``source``, raise ``ValueError``
        naming the notebook and the cell.
        Chapter: 01_policy_gradient (every chapter's exercises).
    """
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise TypeError(f"notebook must be an nbformat-4 notebook dict with a 'cells' list, got "
                        f"{type(notebook).__name__}")
    nb = copy.deepcopy(notebook)
    cells, blocks, removed_cells = [], 0, 0
    for i, cell in enumerate(nb["cells"]):
        where = f"{name}, cell {i}"
        text = _source(cell, where)
        if is_solution_cell(cell):
            removed_cells += 1
            continue
        if cell["cell_type"] == "markdown":
            text, k = _strip_blocks(text, where)
            if k:
                cell["source"] = _lines(text)
                blocks += k
                if "attachments" in cell:
                    kept = _referenced(cell["attachments"] or {}, text)
                    if kept:
                        cell["attachments"] = kept
                    else:
                        del cell["attachments"]
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
        cells.append(cell)
    nb["cells"] = cells
    return nb, {"blocks": blocks, "cells": removed_cells}


def default_lessons() -> Path | None:
    """The ``lessons/`` folder next to the installed package (an editable install), if it exists."""
    here = Path(__file__).resolve().parents[2] / "lessons"
    return here if here.is_dir() else None


def _check_out(out: Path, force: bool) -> bool:
    """Refuse an ``out_dir`` that is a file, lies below one, or (without ``force``) is not empty.

    Returns True if ``out`` exists (then as a folder)."""
    if os.path.lexists(out) and not out.exists():
        raise ValueError(f"out_dir: {out} is a broken symbolic link")
    if out.exists():
        if not out.is_dir():
            raise ValueError(f"out_dir: {out} is a file, not a folder")
        if not force and any(out.iterdir()):
            raise ValueError(f"out_dir: {out} is not empty; the student edition would replace its chapter "
                             f"notebooks (and a student's own work in them): choose an empty or new folder, or pass "
                             f"--force (force=True) to replace them")
        return True
    for parent in out.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"out_dir: {out} cannot be created: {parent} is a file, not a folder")
            break
    return False


def _write_new(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, which must not exist (no symbolic link is followed)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o666)
    with open(fd, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def _write_into_new(out: Path, files: dict[str, str]) -> None:
    """Build ``out`` (missing) in a temporary folder next to it, then rename it into place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{secrets.token_hex(6)}"
    tmp.mkdir()
    try:
        for name, text in files.items():
            _write_new(tmp / name, text)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_into_existing(out: Path, files: dict[str, str]) -> None:
    """Write each file to a temporary file in ``out``, then rename it over its name (a link there is replaced)."""
    for name in files:
        target = out / name
        if target.is_dir() and not target.is_symlink():
            raise ValueError(f"out_dir: {target} is a folder; remove it or choose another out_dir")
    staged = {}
    try:
        for name, text in files.items():
            staged[name] = out / f".{name}.tmp-{secrets.token_hex(6)}"
            _write_new(staged[name], text)
        for name, tmp in staged.items():
            os.replace(tmp, out / name)
    finally:
        for tmp in staged.values():
            if os.path.lexists(tmp):
                os.unlink(tmp)


def student_edition(out_dir, lessons_dir=None, *, force: bool = False) -> dict[str, dict]:
    """Write the student edition of every chapter notebook in ``lessons_dir`` to ``out_dir``.

    Args:
        out_dir: the folder to write to: missing (it is created), or empty. It must not be
            ``lessons_dir``, a file, or below a file.
        lessons_dir: the chapter notebooks (``NN_*.ipynb``); default: the repository's
            ``lessons/`` next to an editable install of rlkit.
        force: replace the chapter notebooks of an ``out_dir`` that is not empty (other files
            in it are left alone).

    Returns:
        ``{file name: {"blocks": removed solution blocks, "cells": removed solution cells}}``.
        Every chapter is read and stripped before anything is written: a chapter that is not
        a notebook raises ``ValueError`` and leaves ``out_dir`` as it was. Each file is written
        to a temporary file and renamed into place, so a symbolic link in ``out_dir`` is
        replaced, not written through.
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
    exists = _check_out(out, force)
    books = sorted(src.glob("[0-9][0-9]_*.ipynb"))
    if not books:
        raise FileNotFoundError(f"lessons_dir: {src} holds no chapter notebooks (NN_*.ipynb)")
    files, report = {}, {}
    for path in books:
        try:
            notebook = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as err:            # JSONDecodeError and UnicodeDecodeError
            raise ValueError(f"{path}: not a notebook ({err})") from None
        if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
            raise ValueError(f"{path}: not a notebook (no 'cells' list)")
        nb, report[path.name] = strip_solutions(notebook, path.name)
        files[path.name] = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    (_write_into_existing if exists else _write_into_new)(out, files)
    return report
