"""The course kit: the prerequisite appendix, the syllabus and the instructor's quiz bank.

* the prerequisite appendix exists and its self-test has at least ten questions, each with an answer
  in a collapsed dropdown;
* book/course_guide.md has a 13-week and a 24-week plan, one row per week, each with a primary
  reading, and grading weights (and project milestone weights) that add up;
* every citation key of the course guide and of the quiz bank is in book/references.bib;
* the quiz bank covers every chapter with at least three answered questions, and stays on the
  instructor's side: it is not in _toc.yml, and the book builds only the files _toc.yml lists.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from test_notebooks_clean import _toc_files  # the one walker of _toc.yml

ROOT = Path(__file__).resolve().parent.parent
PREREQ = ROOT / "lessons" / "00_prerequisites.ipynb"
GUIDE = ROOT / "book" / "course_guide.md"
BANK = ROOT / "book" / "instructor" / "quiz_bank.md"
BIB = ROOT / "book" / "references.bib"

CITE = re.compile(r"\{cite(?::[a-z]+)?\}`([^`]+)`")
QUESTION = re.compile(r"^\*\*Question (\d+)\.\*\*", re.M)
DROPDOWN = re.compile(r"^```\{dropdown\} Answer\n(.*?)^```[ \t]*$", re.S | re.M)


def _markdown_cells(path: Path) -> list[str]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"]


def _section(text: str, heading: str) -> str:
    """The text from ``## heading`` up to the next second-level heading."""
    start = text.index(f"\n## {heading}\n")
    nxt = text.find("\n## ", start + 1)
    return text[start:] if nxt < 0 else text[start:nxt]


def _table_rows(section: str) -> list[list[str]]:
    """The body rows of the first markdown table in ``section``, split into stripped cells."""
    rows, seen_table = [], False
    for line in section.splitlines():
        if line.startswith("|"):
            seen_table = True
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if set("".join(cells)) <= set("-: "):
                continue                                   # the separator row
            rows.append(cells)
        elif seen_table:
            break
    return rows[1:]                                        # without the header row


def _bib_keys() -> set[str]:
    return set(re.findall(r"^@\w+\{([^,\s]+),", BIB.read_text(encoding="utf-8"), flags=re.M))


def _cited(text: str) -> set[str]:
    return {k.strip() for m in CITE.finditer(text) for k in m.group(1).split(",") if k.strip()}


# ----------------------------------------------------------------------------- prerequisites

def test_the_prerequisite_appendix_has_a_self_test_of_ten_answered_questions():
    assert PREREQ.exists(), "lessons/00_prerequisites.ipynb is missing"
    cells = _markdown_cells(PREREQ)
    assert any(re.search(r"^## Self-test\s*$", c, re.M) for c in cells), "no '## Self-test' section"
    numbers, unanswered = [], []
    for cell in cells:
        found = [int(n) for n in QUESTION.findall(cell)]
        if not found:
            continue
        assert len(found) == 1, f"one question per cell expected, found questions {found} in one cell"
        numbers += found
        answers = DROPDOWN.findall(cell)
        question = QUESTION.split(cell, maxsplit=1)[-1].split("```{dropdown}")[0]
        if len(answers) != 1 or len(answers[0].split()) < 10 or len(question.split()) < 5:
            unanswered.append(found[0])
    assert len(numbers) >= 10, f"the self-test has {len(numbers)} questions (10 or more expected)"
    assert numbers == list(range(1, len(numbers) + 1)), f"questions are not numbered 1..n: {numbers}"
    assert not unanswered, f"questions without a question text or a (collapsed) answer: {unanswered}"


def test_the_course_guide_points_to_the_appendix():
    assert "00_prerequisites" in GUIDE.read_text(encoding="utf-8")


# ----------------------------------------------------------------------------- the syllabus

@pytest.mark.parametrize("heading, weeks", [("The 13-week plan", 13), ("The full 24-week plan", 24)])
def test_each_plan_has_one_row_per_week_with_a_reading(heading, weeks):
    text = GUIDE.read_text(encoding="utf-8")
    rows = _table_rows(_section(text, heading))
    assert [r[0] for r in rows] == [str(w) for w in range(1, weeks + 1)], \
        f"{heading}: week column {[r[0] for r in rows]}"
    header = [c.strip() for c in _section(text, heading).split("\n|", 1)[1].split("\n", 1)[0].strip("|").split("|")]
    assert "Primary reading" in header[-1] and "objectives" in " ".join(header), header
    for r in rows:
        assert _cited(r[-1]), f"{heading}, week {r[0]}: no primary reading cited"
        objectives = r[header.index(next(h for h in header if "objectives" in h))]
        assert len(objectives.split()) >= 5, f"{heading}, week {r[0]}: no learning objectives"


def _percent(cell: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*%", cell)
    assert m, f"not a percentage: {cell!r}"
    return float(m.group(1))


def test_the_grading_weights_sum_to_100_percent_and_the_milestones_to_the_project():
    text = GUIDE.read_text(encoding="utf-8")
    grading = _table_rows(_section(text, "Grading"))
    weights = {r[0]: _percent(r[1]) for r in grading}
    assert len(weights) >= 4 and sum(weights.values()) == pytest.approx(100.0), weights
    project = next(w for name, w in weights.items() if name.lower().startswith("project"))
    section = _section(text, "The project and its milestones")
    header = section.split("\n|", 1)[1].split("\n", 1)[0]
    col = [c.strip() for c in header.strip("|").split("|")].index("Weight")
    milestones = [_percent(r[col]) for r in _table_rows(section)]
    assert len(milestones) >= 3 and sum(milestones) == pytest.approx(project), (milestones, project)
    assert section.count("**") >= 8, "each milestone needs a rubric (a bold-faced entry per milestone)"


def test_the_guide_keeps_the_handout_and_grading_instructions():
    text = GUIDE.read_text(encoding="utf-8")
    for needle in ("student-edition", "--force", "--timeout", "python -m rlkit.exercises grade",
                   "python -m rlkit.exercises list"):
        assert needle in text, f"the course guide lost {needle!r}"


# ----------------------------------------------------------------------------- citations

@pytest.mark.parametrize("path", [GUIDE, BANK, PREREQ], ids=lambda p: p.name)
def test_every_citation_key_is_in_the_bibliography(path):
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".ipynb":
        text = "\n".join(_markdown_cells(path))
    keys = _cited(text)
    assert keys or path == PREREQ, f"{path.name} cites nothing"
    missing = sorted(keys - _bib_keys())
    assert not missing, f"{path.name} cites keys that book/references.bib lacks: {missing}"


# ----------------------------------------------------------------------------- the quiz bank

def test_the_quiz_bank_covers_every_chapter_with_answered_questions():
    text = BANK.read_text(encoding="utf-8")
    chapters = sorted(int(p.name[:2]) for p in (ROOT / "lessons").glob("[0-9][0-9]_*.ipynb"))
    per_chapter: dict[int, int] = {}
    blocks = re.split(r"^(?=\*\*Q\d+\.\d+\*\*)", text, flags=re.M)[1:]
    for block in blocks:
        ch = int(re.match(r"\*\*Q(\d+)\.", block).group(1))
        answer = re.search(r"^\*Answer\.\*(.+)", block, flags=re.M | re.S)
        assert answer and len(answer.group(1).split()) >= 5, f"no answer to {block[:40]!r}"
        per_chapter[ch] = per_chapter.get(ch, 0) + 1
    thin = {ch: per_chapter.get(ch, 0) for ch in chapters if per_chapter.get(ch, 0) < 3}
    assert not thin, f"chapters with fewer than 3 questions in the bank: {thin}"


def test_the_quiz_bank_is_not_published():
    listed = _toc_files()
    assert not [f for f in listed if f.startswith("book/instructor")], "the quiz bank must stay out of _toc.yml"
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    excluded = any("instructor" in str(p) for p in config.get("exclude_patterns", []))
    assert config.get("only_build_toc_files") is True or excluded, \
        "Jupyter Book would build book/instructor/: set only_build_toc_files or exclude the folder"


# ----------------------------------------------------------------------------- the appendix's checkers

def _appendix_exercises() -> list[str]:
    from rlkit.exercises import exercises
    # chapter 0 is also where the framework's own tests register throw-away exercises ("_test_..."),
    # which is why tests/test_exercises_framework.py filters chapter 0 out
    return [e.name for e in exercises(0) if not e.name.startswith("_")]


def test_the_appendix_registers_three_exercises():
    assert len(_appendix_exercises()) >= 3, _appendix_exercises()


@pytest.mark.parametrize("name", _appendix_exercises())
def test_every_appendix_exercise_is_sound(name):
    """The reference passes its checker and each registered mistake is caught with its cause."""
    from rlkit.exercises import self_check
    assert self_check(name) == []
