r"""The student edition: the chapter notebooks without their solutions, with answer cells, and the
student HTML book.

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

and one thing added: an **answer cell** under each exercise (:func:`add_answer_cells`), a code
cell tagged ``answer`` (metadata ``{"tags": ["answer"], "rlkit": {"answer": NAME}}``) with the
function's signature and docstring, ``# YOUR CODE HERE``, ``raise NotImplementedError`` and
``check(NAME)``. Every exercise registered for the chapter (:func:`rlkit.exercises.exercises`)
gets exactly one, right under the ``{exercise}`` block that asks for its function; a markdown
cell that holds several exercise blocks is split so that each answer cell sits under its own
exercise. Run as handed out, each answer cell says "not implemented yet" and the notebook goes
on. The notebook's metadata says ``"rlkit": {"edition": "student", "chapter": N}``.

Everything else stays as it is: the text, every other code cell in its order, the exercises
themselves and the calls to :func:`rlkit.exercises.check`. Outputs are cleared. A chapter
notebook runs in the student edition exactly as it does in the book, up to and including its
exercises, because no code cell before the solutions is touched.

``OUT`` must be missing or empty: a folder that holds anything (a student's own copy of a
chapter, say) is refused unless ``--force`` is given, and then only the chapter files are
replaced. Every chapter is read and stripped before anything is written, so a chapter that is not
a notebook leaves ``OUT`` as it was. A missing ``OUT`` is built in a temporary folder next to it
and renamed into place; in an existing one, each file is written to a temporary file in ``OUT``
and then renamed over its name, so a symbolic link there is replaced, never written through.

The student HTML book:

    python -m rlkit.exercises.student book [--out _build/student] [--strict] [--allow-execute]

builds the book a second time into ``_build/student/html`` (:func:`build_student_book`) from a
config generated from the repository's own (:func:`student_book_config`): sphinx-exercise's
``hide_solutions``, the chapters' outputs taken from the instructor build's cache
(``_build/.jupyter_cache``; nothing is executed again), no page under ``book/instructor/`` and no
page documenting ``rlkit.exercises.solutions``, and the chapter notebooks offered for download
are their student editions.

The notebooks hold no solution; the checkers' references live in ``rlkit/exercises/solutions/``,
the instructor's side, which what a student installs should leave out.
"""
from __future__ import annotations

import copy
import json
import os
import re
import secrets
import shutil
import sys
from pathlib import Path
from urllib.parse import unquote

__all__ = ["strip_solutions", "add_answer_cells", "answer_cell", "exercise_stub", "student_edition",
           "student_book_config", "build_student_book", "uncached_chapters", "is_solution_cell", "SOLUTION_NOTE",
           "ANSWER_TAG"]

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
        nb, report[path.name]["answers"] = add_answer_cells(nb, int(path.name[:2]), path.name)
        files[path.name] = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    (_write_into_existing if exists else _write_into_new)(out, files)
    return report


# ------------------------------------------------------------------------------------------ answer cells

#: The tag of an answer cell, one code cell per answer as in nbgrader and otter.
ANSWER_TAG = "answer"

#: A fence that opens an ``{exercise}`` directive at the top level of a markdown cell.
_EXERCISE = re.compile(r" {0,3}(?P<fence>`{3,}|~{3,}|:{3,})[ \t]*\{exercise\}", re.IGNORECASE)
#: Any fence that opens a block (a directive or code), at the top level of a markdown cell.
_ANY_OPEN = re.compile(r" {0,3}(?P<fence>`{3,}|~{3,}|:{3,})")


def exercise_stub(name: str) -> tuple[str, str]:
    """The signature (``"(rewards, discounts)"``) and the docstring of the exercise ``name``.

    Taken from the exercise's stored ``signature`` and ``doc`` where the registry provides them
    (the student bundle, which holds no reference code), else from the reference solution's
    signature without annotations and its docstring. The one place the answer cells read them.
    """
    import inspect

    from rlkit.exercises import get

    ex = get(name)
    signature, doc = getattr(ex, "signature", None), getattr(ex, "doc", None)
    if signature is None:
        sig = inspect.signature(ex.reference)
        sig = sig.replace(parameters=[p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()],
                          return_annotation=inspect.Signature.empty)
        signature = str(sig)
    if doc is None:
        doc = ex.reference.__doc__ or ex.description or ""
    return signature, inspect.cleandoc(doc)


def answer_cell(name: str) -> dict:
    """The student's answer cell for the exercise ``name`` (an nbformat-4 code cell).

    Its source is the function's signature and docstring, ``# YOUR CODE HERE``,
    ``raise NotImplementedError``, a blank line and ``check(name)``; its metadata
    ``{"tags": ["answer"], "rlkit": {"answer": name}}``. Run as it is, the cell prints that the
    exercise is not implemented yet (``check`` catches the ``NotImplementedError``) and does not
    stop the notebook.
    """
    signature, doc = exercise_stub(name)
    doc = doc.replace('"""', r'\"\"\"')
    prefix = "r" if "\\" in doc else ""
    lines = doc.splitlines() or [""]
    if len(lines) == 1 and not lines[0].endswith("\\"):
        docstring = f'    {prefix}"""{lines[0]}"""\n'
    else:
        body = "".join(f"    {ln}".rstrip() + "\n" for ln in lines[1:])
        docstring = f'    {prefix}"""{lines[0]}\n{body}    """\n'
    source = (f"def {name}{signature}:\n{docstring}    # YOUR CODE HERE\n    raise NotImplementedError\n"
              f"\ncheck({name})")
    return {"cell_type": "code", "execution_count": None, "id": f"answer-{name}"[:64],
            "metadata": {"tags": [ANSWER_TAG], "rlkit": {"answer": name}}, "outputs": [],
            "source": _lines(source)}


def _exercise_blocks(text: str) -> list[tuple[int, int]]:
    """(first line, line after the end) of each top-level ``{exercise}`` block of markdown ``text``."""
    lines, blocks = _lines(text), []
    fence, start, is_exercise = None, 0, False
    for i, line in enumerate(lines):
        bare = line.rstrip("\r\n")
        if fence is None:
            m = _ANY_OPEN.match(bare)
            if m is not None:
                fence, start, is_exercise = m["fence"], i, _EXERCISE.match(bare) is not None
        elif _closes(line, fence):
            if is_exercise:
                blocks.append((start, i + 1))
            fence = None
    if fence is not None and is_exercise:
        blocks.append((start, len(lines)))
    return blocks


def _asked_in(name: str, texts: list[str]) -> int | None:
    """Index of the exercise block that asks for the function ``name``: the first one that writes
    ```name(``, else ``name(``, else the name as a word; None if no block names it."""
    for pattern in (rf"`{re.escape(name)}\(", rf"\b{re.escape(name)}\(", rf"\b{re.escape(name)}\b"):
        hits = [k for k, t in enumerate(texts) if re.search(pattern, t)]
        if hits:
            return hits[0]
    return None


def _match(found: list[tuple], chapter: int, name: str) -> dict[int, list[str]]:
    """{index of an exercise block: the registered exercises it asks for, in the order it names them}."""
    from rlkit.exercises import exercises

    asks: dict[int, list[str]] = {}
    texts = [t for *_, t in found]
    for ex in exercises(chapter):
        k = _asked_in(ex.name, texts)
        if k is None:
            raise ValueError(f"{name}: no {{exercise}} block asks for {ex.name}(...), registered for chapter "
                             f"{chapter}; write `{ex.name}(...)` in its exercise")
        asks.setdefault(k, []).append(ex.name)
    for k, names in asks.items():
        names.sort(key=lambda n: re.search(rf"\b{re.escape(n)}\b", texts[k]).start())
    return asks


def _fresh_id(base: str, ids: set) -> str:
    new = base[:64]
    while new in ids:
        new = f"x{new}"[:64]
    ids.add(new)
    return new


def _split(cell: dict, lines: list[str], cuts: list[int], ids: set) -> list[dict]:
    """``cell`` cut into pieces at the line indices ``cuts`` (the first piece keeps the cell's id)."""
    parts = []
    for piece in range(len(cuts) - 1):
        part = copy.deepcopy(cell) if piece else cell
        part["source"] = lines[cuts[piece]:cuts[piece + 1]]
        if len(cuts) > 2 and "attachments" in cell:     # each piece keeps the images it shows
            kept = _referenced(cell["attachments"] or {}, "".join(part["source"]))
            if kept:
                part["attachments"] = kept
            else:
                del part["attachments"]
        if piece and "id" in cell:
            part["id"] = _fresh_id(f"{cell['id']}-{piece}", ids)
        parts.append(part)
    return parts


def add_answer_cells(notebook: dict, chapter: int, name: str = "notebook") -> tuple[dict, int]:
    """A copy of ``notebook`` with one answer cell (:func:`answer_cell`) per exercise of ``chapter``.

    Each exercise registered for the chapter (:func:`rlkit.exercises.exercises`) is matched with
    the ``{exercise}`` block that asks for its function (the first block that writes
    ```name(``), and its answer cell goes right after the markdown cell holding that block. A
    markdown cell with several exercise blocks is split before each block after the first, so
    every answer cell sits under its own exercise. The notebook's metadata gets
    ``"rlkit": {"edition": "student", "chapter": chapter}``. A notebook without exercise
    blocks gets no answer cell; one with exercise blocks that name no block for a registered
    exercise raises ``ValueError``.

    Returns:
        ``(student_notebook, number of answer cells)``.
    """
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise TypeError(f"notebook must be an nbformat-4 notebook dict with a 'cells' list, got "
                        f"{type(notebook).__name__}")
    if isinstance(chapter, bool) or not isinstance(chapter, int) or chapter < 0:
        raise ValueError(f"chapter must be a chapter number (an int >= 0), got {chapter!r}")
    nb = copy.deepcopy(notebook)
    nb.setdefault("metadata", {})["rlkit"] = {"edition": "student", "chapter": chapter}
    found = []          # every top-level exercise block: (cell index, first line, end line, text)
    for i, cell in enumerate(nb["cells"]):
        if cell.get("cell_type") == "markdown":
            lines = _lines(_source(cell, f"{name}, cell {i}"))
            found += [(i, a, b, "".join(lines[a:b])) for a, b in _exercise_blocks("".join(lines))]
    if not found:
        return nb, 0
    asks = _match(found, chapter, name)
    cells, ids, count = [], {c.get("id") for c in nb["cells"]}, 0
    for i, cell in enumerate(nb["cells"]):
        mine = [k for k, (j, *_) in enumerate(found) if j == i]
        if not mine:
            cells.append(cell)
            continue
        lines = _lines(_source(cell, f"{name}, cell {i}"))
        cuts = [0] + [found[k][1] for k in mine[1:]] + [len(lines)]
        for k, part in zip(mine, _split(cell, lines, cuts, ids)):
            cells.append(part)
            for ex_name in asks.get(k, []):
                answer = answer_cell(ex_name)
                if "id" in cell:
                    answer["id"] = _fresh_id(answer["id"], ids)
                else:
                    answer.pop("id")
                cells.append(answer)
                count += 1
    nb["cells"] = cells
    return nb, count


# ------------------------------------------------------------------------------------ the student HTML book

#: Toc entries under these folders are the instructor's: the student book never builds them.
INSTRUCTOR_ONLY = ("book/instructor/",)
#: A page that documents this module is left out of the student book.
SOLUTIONS_MODULE = "rlkit.exercises.solutions"


def _repo_root(root) -> Path:
    if root is not None:
        return Path(root).resolve()
    lessons = default_lessons()
    if lessons is None:
        raise FileNotFoundError("root: no book found next to the installed rlkit; pass the repository's root")
    return lessons.parent


def _documents_solutions(root: Path, docname: str) -> bool:
    """Does the page ``docname`` (a toc entry) document the instructor's solutions module?"""
    for suffix in (".md", ".ipynb", ".rst"):
        path = root / f"{docname}{suffix}"
        if path.exists():
            return bool(re.search(rf"auto\w+::\s*{re.escape(SOLUTIONS_MODULE)}\b", path.read_text(encoding="utf-8")))
    return False


def _student_toc(entry, root: Path, dropped: list[str]):
    """The toc (or one of its entries) without the instructor's pages."""
    if isinstance(entry, list):
        kept = [_student_toc(e, root, dropped) for e in entry]
        return [e for e in kept if e is not None]
    if not isinstance(entry, dict):
        return entry
    doc = entry.get("file") or entry.get("root")
    if isinstance(doc, str):
        doc = doc.strip("/")
        if doc.startswith(INSTRUCTOR_ONLY) or _documents_solutions(root, doc):
            dropped.append(doc)
            return None
    out = {k: _student_toc(v, root, dropped) if k in ("parts", "chapters", "sections") else v
           for k, v in entry.items()}
    emptied = [k for k in ("parts", "chapters", "sections") if entry.get(k) and not out[k]]
    for k in emptied:
        del out[k]
    return None if emptied and doc is None else out     # a part whose every page was left out


def student_book_config(root=None, out="_build/student") -> dict:
    """Write ``out/_config.yml`` and ``out/_toc.yml``: the book's own, made into the student edition.

    Both are generated from the repository's ``_config.yml`` and ``_toc.yml`` at every build, so
    the two editions never drift apart. The differences: sphinx-exercise's ``hide_solutions``
    (no ``{solution}`` block is rendered), the executed outputs are read from the instructor
    build's cache ``_build/.jupyter_cache`` (no chapter is executed again), the pages under
    ``book/instructor/`` and any page documenting ``rlkit.exercises.solutions`` are left out,
    and the title says "student edition". Returns ``{"config": path, "toc": path, "dropped":
    [toc entries left out]}``.
    """
    import yaml

    root = _repo_root(root)
    out = (root / out) if not Path(out).is_absolute() else Path(out)
    config = yaml.safe_load((root / "_config.yml").read_text(encoding="utf-8"))
    toc = yaml.safe_load((root / "_toc.yml").read_text(encoding="utf-8"))
    config["title"] = f"{config.get('title', 'The book')} (student edition)"
    execute = config.setdefault("execute", {})
    execute["execute_notebooks"] = "cache"
    execute["cache"] = str(root / "_build" / ".jupyter_cache")
    config["only_build_toc_files"] = True
    config["exclude_patterns"] = [*config.get("exclude_patterns", []), "book/instructor/**",
                                  "rlkit/exercises/solutions/**"]
    sphinx = config.setdefault("sphinx", {})
    # jupyter-book reads local extensions relative to the config file, which moves to OUT
    sphinx["local_extensions"] = {name: str((root / path).resolve())
                                  for name, path in (sphinx.get("local_extensions") or {}).items()}
    sphinx.setdefault("config", {})["hide_solutions"] = True
    dropped: list[str] = []
    toc = _student_toc(toc, root, dropped)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"config": out / "_config.yml", "toc": out / "_toc.yml"}
    head = "# Generated by `python -m rlkit.exercises.student book` from the repository's {}: do not edit.\n"
    paths["config"].write_text(head.format("_config.yml") + yaml.safe_dump(config, sort_keys=False, allow_unicode=True),
                               encoding="utf-8")
    paths["toc"].write_text(head.format("_toc.yml") + yaml.safe_dump(toc, sort_keys=False, allow_unicode=True),
                            encoding="utf-8")
    return {**paths, "dropped": dropped}


def _toc_notebooks(root: Path, toc_path: Path) -> list[Path]:
    files = re.findall(r"^\s*-?\s*(?:file|root):\s*(\S+)\s*$", toc_path.read_text(encoding="utf-8"), re.M)
    return [root / f"{f}.ipynb" for f in files if (root / f"{f}.ipynb").exists()]


def uncached_chapters(root=None, toc=None) -> list[str]:
    """The notebooks of the toc that the instructor build's cache (``_build/.jupyter_cache``) lacks."""
    import nbformat
    from jupyter_cache import get_cache

    root = _repo_root(root)
    cache_dir = root / "_build" / ".jupyter_cache"
    notebooks = _toc_notebooks(root, Path(toc) if toc else root / "_toc.yml")
    if not cache_dir.is_dir():
        return [p.relative_to(root).as_posix() for p in notebooks]
    cache, missing = get_cache(str(cache_dir)), []
    for path in notebooks:
        try:
            cache.match_cache_notebook(nbformat.read(str(path), as_version=4))
        except KeyError:
            missing.append(path.relative_to(root).as_posix())
    return missing


def _student_sources(html: Path, lessons: Path) -> int:
    """Make the page sources the student site offers for download (``_sources/``) the student's.

    A chapter's ``.ipynb`` there becomes its student edition (no solutions, with answer cells);
    any other source file loses its ``{solution}`` blocks. Returns the number of files replaced.
    """
    sources, replaced = html / "_sources", 0
    if not sources.is_dir():
        return 0
    for path in sorted(p for p in sources.rglob("*") if p.is_file()):
        text = path.read_text(encoding="utf-8", errors="replace")
        if path.suffix == ".ipynb" or path.name.endswith(".ipynb.txt"):
            stem = path.name.split(".ipynb")[0]
            src = lessons / f"{stem}.ipynb"
            nb, _ = strip_solutions(json.loads((src if src.exists() else path).read_text(encoding="utf-8")), stem)
            if re.match(r"\d\d_", stem):
                nb, _ = add_answer_cells(nb, int(stem[:2]), stem)
            new = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
        else:
            new, _ = _strip_blocks(text, path.name)
        if new != text:
            path.write_text(new, encoding="utf-8")
            replaced += 1
    return replaced


def build_student_book(root=None, out="_build/student", *, strict: bool = False, allow_execute: bool = False,
                       quiet: bool = True) -> dict:
    """Build the student edition of the HTML book into ``out/html`` (default ``_build/student/html``).

    It renders the same sources as the instructor's book (``jupyter-book build .``) with the
    generated config of :func:`student_book_config`, and takes every chapter's outputs from the
    instructor build's cache: build the instructor's book (or run the notebooks under pytest)
    first. A chapter missing from the cache is an error unless ``allow_execute`` (then it is
    executed and cached). ``strict`` turns warnings into errors (``-W -n --keep-going``). After
    the build, the page sources offered for download are the student editions of the chapters
    (answer cells, no solutions).

    Returns ``{"returncode", "html", "seconds", "executed", "dropped", "sources_replaced"}``.
    """
    import contextlib
    import io
    import time

    from jupyter_book.sphinx import build_sphinx

    root = _repo_root(root)
    out = (root / out) if not Path(out).is_absolute() else Path(out)
    files = student_book_config(root, out)
    missing = uncached_chapters(root, files["toc"])
    if missing and not allow_execute:
        raise RuntimeError(f"the instructor build's cache ({root / '_build' / '.jupyter_cache'}) lacks "
                           f"{len(missing)} chapter(s): {', '.join(missing)}; build the instructor's book first "
                           f"(jupyter-book build .) or pass --allow-execute")
    html = out / "html"
    start = time.perf_counter()
    log = io.StringIO()
    cwd = os.getcwd()
    os.chdir(root)          # the config's relative paths (book/_ext, book/references.bib) are the root's
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            rc = build_sphinx(root, html, use_external_toc=True, noconfig=True, path_config=str(files["config"]),
                              confoverrides={"external_toc_path": files["toc"].as_posix(),
                                             "latex_individualpages": False,
                                             **({"nitpicky": True} if strict else {})},
                              builder="html", warningiserror=strict, keep_going=strict, quiet=quiet)
    finally:
        os.chdir(cwd)
    text = log.getvalue()
    (out / "build.log").write_text(text, encoding="utf-8")
    replaced = _student_sources(html, root / "lessons") if rc == 0 else 0
    executed = re.findall(r"^(.+?\.ipynb): Executing notebook", re.sub(r"\x1b\[[0-9;]*m", "", text), re.M)
    return {"returncode": rc if isinstance(rc, int) else 1, "html": html, "log": out / "build.log",
            "seconds": time.perf_counter() - start, "executed": executed, "dropped": files["dropped"],
            "sources_replaced": replaced}


def main(argv=None) -> int:
    """``python -m rlkit.exercises.student book [--out _build/student] [--strict] [--allow-execute]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m rlkit.exercises.student",
                                     description="Build the student edition of the HTML book (no solutions).")
    sub = parser.add_subparsers(dest="command", required=True)
    book = sub.add_parser("book", help="build the student HTML book into OUT/html, from the instructor build's "
                                       "cache (_build/.jupyter_cache)")
    book.add_argument("--root", default=None, help="the repository (default: the one next to rlkit)")
    book.add_argument("--out", default="_build/student", help="output folder (default: _build/student)")
    book.add_argument("--strict", action="store_true", help="warnings are errors (-W -n --keep-going)")
    book.add_argument("--allow-execute", action="store_true",
                      help="execute the chapters missing from the cache instead of refusing")
    args = parser.parse_args(argv)
    try:
        result = build_student_book(args.root, args.out, strict=args.strict, allow_execute=args.allow_execute,
                                    quiet=False)
    except (OSError, ValueError, RuntimeError) as err:
        parser.error(str(err))
    if result["returncode"] != 0:
        print(f"the student book build failed (exit {result['returncode']}); see {result['log']}", file=sys.stderr)
        return 1
    print(f"student book: {result['html'] / 'index.html'} in {result['seconds']:.0f} s; chapters executed: "
          f"{len(result['executed'])}; left out: {', '.join(result['dropped']) or 'none'}; "
          f"sources replaced by the student editions: {result['sources_replaced']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
