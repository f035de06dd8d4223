"""The student edition removes every solution MyST renders, and never damages what it writes over.

The oracle for "a solution survived" is independent of rlkit: the parser MyST itself builds for the
book (``myst_parser``'s markdown-it with the book's extensions, _config.yml), which finds every
fence whose info string names the ``{solution}`` directive, inside other directives too (MyST
parses their content again). Each synthetic cell holds one such block in a form the reliability
review found kept (S10) or in a form that tempts a line-based parser to close a block early; the
oracle must find it in the original and find nothing in the student edition, and the secret text
must be gone. The OUT folder (S11, 2.5): refused when it is not empty (without --force), a file,
or below a file; written file by file through a rename, so a symbolic link is replaced, not written
through; and left untouched when a chapter is bad.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlkit.exercises.student import SOLUTION_NOTE, strip_solutions, student_edition

myst = pytest.importorskip("myst_parser", reason="the oracle is MyST's own markdown parser (jupyter-book)")
from markdown_it.renderer import RendererHTML  # noqa: E402  (after the importorskip)
from myst_parser.config.main import MdParserConfig  # noqa: E402
from myst_parser.parsers.mdit import create_md_parser  # noqa: E402

MD = create_md_parser(MdParserConfig(enable_extensions={"amsmath", "dollarmath", "colon_fence", "deflist",
                                                        "substitution"}), RendererHTML)


def solutions(markdown: str) -> list[str]:
    """The content of every {solution} directive MyST would render in ``markdown`` (nested ones too)."""
    found = []
    for token in MD.parse(markdown):
        if token.type not in ("fence", "colon_fence"):
            continue
        name = (token.info.split() or [""])[0]
        if name.lower() == "{solution}":            # docutils looks directive names up in lower case
            found.append(token.content)
        elif name.startswith("{") and name.endswith("}"):
            found += solutions(token.content)        # a directive's body is parsed again
    return found


# (label, cell source, text that must survive). Every secret is a word starting with SECRET.
FORMS = [
    ("tilde fence", "~~~{solution} ex-a\nSECRET_tilde\n~~~\nAfter.\n", "After."),
    ("space before the brace", "``` {solution} ex-a\nSECRET_space\n```\nAfter.\n", "After."),
    ("spaces and a tab before the brace", "```  \t{solution}\nSECRET_tab\n```\nAfter.\n", "After."),
    ("four backticks, a shorter fence inside", "````{solution} ex-a\nSECRET_4\n```\nSECRET_inner\n````\nAfter.\n",
     "After."),
    ("a closing fence longer than the opening one", "```{solution} ex-a\nSECRET_long\n``````\nAfter.\n", "After."),
    ("colon fence closed by a longer one", ":::{solution} ex-a\nSECRET_colon\n::::\nAfter.\n", "After."),
    ("colon fence with a space", ":::: {solution}\nSECRET_colon2\n::::\nAfter.\n", "After."),
    ("indented three spaces", "   ```{solution}\n   SECRET_indent\n   ```\nAfter.\n", "After."),
    ("the name in capitals", "```{Solution} ex-a\nSECRET_caps\n```\nAfter.\n", "After."),
    ("trailing spaces and a tab after the closing fence", "```{solution}\nSECRET_trail\n```  \t\nAfter.\n",
     "After."),
    ("lines that are not closing fences", "```{solution}\nSECRET_1\n``` x\nSECRET_2\n    ```\nSECRET_3\n"
     "```\u00a0\nSECRET_4\n~~~\nSECRET_5\n:::\nSECRET_6\n``\nSECRET_7\n```\nAfter.\n", "After."),
    ("a Unicode line separator inside a line", "```{solution}\nSECRET_a\u2028```\nSECRET_b\n```\nAfter.\n", "After."),
    ("a form feed inside a line", "```{solution}\nSECRET_a\x0c```\nSECRET_b\n```\nAfter.\n", "After."),
    ("CRLF line ends", "```{solution}\r\nSECRET_crlf\r\n```\r\nAfter.\r\n", "After."),
    ("CR line ends", "```{solution}\rSECRET_cr\r```\rAfter.", "After."),
    ("a solution inside an exercise directive", "::::{exercise}\nDo it.\n:::{solution}\nSECRET_nested\n:::\n::::\n",
     "Do it."),
    ("no newline after the closing fence", "Do it.\n\n```{solution} ex-a\nSECRET_eof\n```", "Do it."),
    ("two blocks in one cell", "Q1\n```{solution}\nSECRET_one\n```\nQ2\n~~~~ {solution}\nSECRET_two\n~~~~\n", "Q2"),
]


def _cell(source, **extra):
    return {"cell_type": "markdown", "metadata": {}, "source": source, **extra}


def _student_text(source) -> str:
    nb, removed = strip_solutions({"cells": [_cell(source)]}, "t.ipynb")
    assert removed["blocks"] >= 1
    return "".join(nb["cells"][0]["source"])


@pytest.mark.parametrize("label, source, kept", FORMS, ids=[f[0] for f in FORMS])
@pytest.mark.parametrize("as_lines", [False, True], ids=["str", "lines"])
def test_every_solution_form_myst_renders_is_removed(label, source, kept, as_lines):
    assert solutions(source), f"the oracle finds no solution in the {label} form: the case is wrong"
    if as_lines:   # nbformat stores a source as a list of lines
        source = source.splitlines(keepends=True)
    text = _student_text(source)
    assert solutions(text) == [], f"{label}: MyST still renders a solution in\n{text}"
    assert "SECRET" not in text, f"{label}: a secret survived in\n{text}"
    assert kept in text and SOLUTION_NOTE in text


def test_a_longer_closing_fence_is_accepted_not_refused_as_never_closed():
    """Reliability review 2.5: valid CommonMark ("the same character, at least as long") was refused."""
    text = _student_text("```{solution}\nSECRET\n````\nAfter.\n")
    assert text == f"{SOLUTION_NOTE}\nAfter.\n"


def test_the_attachments_of_a_removed_solution_are_dropped_and_the_exercise_keeps_its_own():
    cell = _cell("![figure](attachment:question.png)\n\n```{solution} ex-a\n![answer](attachment:answer.png)\n```\n",
                 attachments={"question.png": {"image/png": "UVVFU1RJT04="},
                              "answer.png": {"image/png": "U0VDUkVU"}})
    nb, _ = strip_solutions({"cells": [cell, _cell("```{solution}\n![](attachment:a.png)\n```\n",
                                                   attachments={"a.png": {"image/png": "U0VDUkVU"}})]})
    assert nb["cells"][0]["attachments"] == {"question.png": {"image/png": "UVVFU1RJT04="}}
    assert "attachments" not in nb["cells"][1]
    assert "U0VDUkVU" not in json.dumps(nb)


@pytest.mark.parametrize("source", ["> ```{solution}\n> SECRET\n> ```\n", "- ```{solution}\n  SECRET\n  ```\n",
                                    "1. Do it.\n\n    ```{solution}\n    SECRET\n    ```\n"])
def test_a_solution_inside_a_quote_or_a_list_is_refused_clearly(source):
    with pytest.raises(ValueError, match=r"t.ipynb, cell 0, line \d: a \{solution\} block inside a quote or a list"):
        strip_solutions({"cells": [_cell(source)]}, "t.ipynb")


def test_a_cell_without_source_is_a_clear_error():
    """Reliability review 2.5: a cell without "source" ended in a raw KeyError."""
    nb = {"cells": [_cell("Text.\n"), {"cell_type": "code", "metadata": {}, "outputs": []}]}
    with pytest.raises(ValueError, match=r"ch.ipynb, cell 1: a code cell without 'source'"):
        strip_solutions(nb, "ch.ipynb")
    with pytest.raises(ValueError, match=r"ch.ipynb, cell 0: 'source' must be a string or a list of strings"):
        strip_solutions({"cells": [_cell(3)]}, "ch.ipynb")
    with pytest.raises(ValueError, match=r"ch.ipynb, cell 0: not a notebook cell"):
        strip_solutions({"cells": ["text"]}, "ch.ipynb")


# ---------------------------------------------------------------------------------------- OUT


def _notebook(*cells) -> str:
    return json.dumps({"cells": list(cells), "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


SOLUTION_CELL = {"cell_type": "code", "metadata": {"tags": ["remove-cell"]}, "execution_count": None,
                 "outputs": [], "source": "# Solutions\ndef secret():\n    return 'SECRET_cell'\n"}


@pytest.fixture
def lessons(tmp_path):
    d = tmp_path / "lessons"
    d.mkdir()
    (d / "01_a.ipynb").write_text(_notebook(_cell("Ex.\n```{solution}\nSECRET_a\n```\n"), SOLUTION_CELL))
    (d / "02_b.ipynb").write_text(_notebook(_cell("Ex.\n~~~{solution}\nSECRET_b\n~~~\n")))
    return d


def _cli(out, lessons, *extra):
    return subprocess.run([sys.executable, "-m", "rlkit.exercises", "student-edition", str(out), "--lessons",
                           str(lessons), *extra], capture_output=True, text=True, timeout=120)


def _tree(d: Path) -> dict:
    return {p.name: (os.readlink(p) if p.is_symlink() else p.read_bytes()) for p in sorted(d.iterdir())}


def test_a_folder_that_is_not_empty_is_refused_without_force(tmp_path, lessons):
    """S11: a student's own edited copy of a chapter in OUT was overwritten silently."""
    out = tmp_path / "rl"
    out.mkdir()
    (out / "01_a.ipynb").write_text("my answers")
    proc = _cli(out, lessons)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"out_dir: {out} is not empty" in proc.stderr and "--force" in proc.stderr, proc.stderr
    assert _tree(out) == {"01_a.ipynb": b"my answers"}
    # a hidden file is content too
    (out / "01_a.ipynb").unlink()
    (out / ".ipynb_checkpoints").mkdir()
    with pytest.raises(ValueError, match="is not empty"):
        student_edition(out, lessons)


def test_force_replaces_the_chapters_and_leaves_other_files(tmp_path, lessons):
    out = tmp_path / "rl"
    out.mkdir()
    (out / "01_a.ipynb").write_text("old copy")
    (out / "notes.txt").write_text("mine")
    proc = _cli(out, lessons, "--force")
    assert proc.returncode == 0, proc.stderr
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in out.iterdir()) == ["01_a.ipynb", "02_b.ipynb", "notes.txt"]   # no temporary left
    text = (out / "01_a.ipynb").read_text()
    assert "SECRET" not in text and SOLUTION_NOTE in text


def test_a_symbolic_link_in_out_is_replaced_not_written_through(tmp_path, lessons):
    """S11: with OUT's notebooks linked to a copy of lessons/, the command stripped the copy itself."""
    copy = tmp_path / "copy"
    copy.mkdir()
    for p in lessons.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    before = _tree(copy)
    out = tmp_path / "out"
    out.mkdir()
    for p in copy.iterdir():
        (out / p.name).symlink_to(p)
    assert _cli(out, lessons, "--force").returncode == 0
    assert _tree(copy) == before                                  # the link targets are untouched
    for p in out.iterdir():
        assert not p.is_symlink() and "SECRET" not in p.read_text()
    # a new OUT (and its missing parent) is built in a temporary sibling folder, then renamed
    fresh = tmp_path / "fresh" / "deeper"
    student_edition(fresh, lessons)
    assert sorted(p.name for p in fresh.iterdir()) == ["01_a.ipynb", "02_b.ipynb"]
    assert sorted(p.name for p in fresh.parent.iterdir()) == ["deeper"]      # no temporary sibling left


@pytest.mark.parametrize("where", ["file", "below a file"])
def test_out_that_is_a_file_or_below_one_is_a_clear_error(tmp_path, lessons, where):
    """2.5: these ended in a raw FileExistsError or NotADirectoryError traceback."""
    f = tmp_path / "taken"
    f.write_text("x")
    out = f if where == "file" else f / "sub" / "out"
    proc = _cli(out, lessons)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    said = f"out_dir: {out} is a file, not a folder" if where == "file" else \
        f"out_dir: {out} cannot be created: {f} is a file, not a folder"
    assert said in proc.stderr, proc.stderr
    assert f.read_text() == "x"


@pytest.mark.parametrize("bad, says", [
    ("{not json", r"03_bad.ipynb: not a notebook"),
    (_notebook(_cell("```{solution}\nSECRET\n")), r"03_bad.ipynb, cell 0: a \{solution\} block opened with '```' is "
                                                  r"never closed"),
    (_notebook(_cell("Text.\n"), {"cell_type": "markdown", "metadata": {}}),
     r"03_bad.ipynb, cell 1: a markdown cell without 'source'"),
])
@pytest.mark.parametrize("out_state", ["missing", "empty", "forced"])
def test_a_bad_chapter_leaves_out_as_it_was(tmp_path, lessons, bad, says, out_state):
    """2.5: a chapter that is not JSON, or has an unclosed block, left the chapters before it written in OUT."""
    (lessons / "03_bad.ipynb").write_text(bad)
    out = tmp_path / "out"
    if out_state != "missing":
        out.mkdir()
    if out_state == "forced":
        (out / "01_a.ipynb").write_text("my answers")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ValueError, match=says):
        student_edition(out, lessons, **({"force": True} if out_state == "forced" else {}))
    assert sorted(p.name for p in tmp_path.iterdir()) == before      # no OUT, no temporary sibling
    if out_state == "empty":
        assert list(out.iterdir()) == []
    if out_state == "forced":
        assert _tree(out) == {"01_a.ipynb": b"my answers"}


def test_the_cli_reports_a_bad_chapter_without_a_traceback(tmp_path, lessons):
    (lessons / "03_bad.ipynb").write_text(_notebook({"cell_type": "markdown", "metadata": {}}))
    proc = _cli(tmp_path / "out", lessons)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "KeyError" not in proc.stderr
    assert "03_bad.ipynb, cell 0: a markdown cell without 'source'" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_pathological_line_is_scanned_in_linear_time():
    """A line of many list markers and spaces once made the opening-fence pattern backtrack exponentially."""
    import time

    start = time.monotonic()
    nb, removed = strip_solutions({"cells": [_cell(("-" + " " * 10) * 3000 + "x\n" + "> " * 50000 + "\n")]})
    assert removed == {"blocks": 0, "cells": 0} and time.monotonic() - start < 5


def test_no_solution_survives_in_the_shipped_chapters_by_mysts_parser():
    chapters = sorted((Path(__file__).resolve().parent.parent / "lessons").glob("[0-9][0-9]_*.ipynb"))
    assert len(chapters) >= 25
    for path in chapters:
        original = json.loads(path.read_text(encoding="utf-8"))
        student, removed = strip_solutions(original, path.name)

        def markdown(nb):
            return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"]

        found = sum(len(solutions(text)) for text in markdown(original))
        assert found >= 3 and removed["blocks"] == found, (path.name, found, removed)
        assert all(solutions(text) == [] for text in markdown(student)), path.name
