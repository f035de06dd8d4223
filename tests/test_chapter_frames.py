"""Every chapter's frame (issue 23, item 5) and the problem sets' parts (item 4).

A chapter opens with three to five learning objectives (right after its title cell), has a box of
two to five key equations before its summary, ends with a ``## Summary`` section before its
exercises, and marks every exercise with a difficulty and a time, ``(★★, 30 min)``. The markup is
fixed so that a reader (and these tests) can find each part; see the course guide.
"""
from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.ipynb"))

OBJECTIVES = re.compile(r"^:::\{admonition\} Learning objectives\n:class: learning-objectives\n(.*?)^:::[ \t]*$",
                        re.S | re.M)
KEY_EQUATIONS = re.compile(r"^:::\{admonition\} Key equations\n:class: key-equations\n(.*?)^:::[ \t]*$", re.S | re.M)
NUMBERED = re.compile(r"^\d+\.\s+\S", re.M)
BULLET = re.compile(r"^[-*]\s+\S", re.M)
DISPLAY = re.compile(r"^\$\$", re.M)
EXERCISE = re.compile(r"^\s{0,3}(`{3,}|:{3,})\{exercise\}(.*)$", re.M)
MARK = re.compile(r"\((★{1,3}), (\d+) min\)$")


def _markdown(path: Path) -> list[tuple[int, str]]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [(i, "".join(c["source"])) for i, c in enumerate(cells) if c["cell_type"] == "markdown"]


def _heading_cell(cells, pattern: str) -> int | None:
    rx = re.compile(pattern, re.M)
    return next((i for i, text in cells if rx.search(text)), None)


def test_there_are_26_chapters():
    assert len(CHAPTERS) == 26, [p.name for p in CHAPTERS]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_the_chapter_opens_with_three_to_five_learning_objectives(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    title = next(i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
                 and re.search(r"^# \S", "".join(c["source"]), re.M))
    after = cells[title + 1]
    text = "".join(after["source"])
    assert after["cell_type"] == "markdown" and len(OBJECTIVES.findall(text)) == 1, (
        f"{path.name}: the cell after the title (cell {title}) must hold one 'Learning objectives' admonition")
    items = NUMBERED.findall(OBJECTIVES.search(text).group(1))
    assert 3 <= len(items) <= 5, f"{path.name}: {len(items)} learning objectives (3 to 5 expected)"
    everywhere = sum(len(OBJECTIVES.findall(t)) for _, t in _markdown(path))
    assert everywhere == 1, f"{path.name}: {everywhere} learning-objective boxes"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_key_equations_then_a_summary_then_the_exercises(path):
    cells = _markdown(path)
    boxes = [(i, m.group(1)) for i, t in cells for m in KEY_EQUATIONS.finditer(t)]
    assert len(boxes) == 1, f"{path.name}: {len(boxes)} key-equation boxes (one expected)"
    box_cell, body = boxes[0]
    n = len(DISPLAY.findall(body)) // 2
    assert 2 <= n <= 5, f"{path.name}: the key-equation box has {n} display equations (2 to 5 expected)"
    assert "(eq-" not in body.replace("{eq}`", ""), f"{path.name}: the box must not define new equation labels"
    summary = _heading_cell(cells, r"^## Summary")
    exercises = _heading_cell(cells, r"^## Exercises")
    assert summary is not None, f"{path.name}: no '## Summary' section"
    assert exercises is not None, f"{path.name}: no '## Exercises' section"
    assert box_cell <= summary <= exercises, (
        f"{path.name}: expected key equations (cell {box_cell}) <= summary (cell {summary}) <= exercises "
        f"(cell {exercises})")
    text = dict(cells)[summary]
    section = re.split(r"^## Summary.*$", text, maxsplit=1, flags=re.M)[1]
    section = re.split(r"^## ", section, maxsplit=1, flags=re.M)[0]
    bullets = len(BULLET.findall(section)) + len(NUMBERED.findall(section))
    assert 4 <= bullets <= 8, f"{path.name}: the summary has {bullets} points (4 to 8 expected)"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_exercise_has_a_difficulty_and_a_time(path):
    titles = [m.group(2).strip() for _, t in _markdown(path) for m in EXERCISE.finditer(t)]
    assert titles, f"{path.name}: no exercises"
    for title in titles:
        m = MARK.search(title)
        assert m, f"{path.name}: exercise {title!r} lacks a mark such as '(★★, 30 min)' at the end of its title"
        stars, minutes = len(m.group(1)), int(m.group(2))
        assert 5 <= minutes <= 120, f"{path.name}: {title!r}: {minutes} min"
        low, high = {1: (5, 30), 2: (15, 60), 3: (30, 120)}[stars]
        assert low <= minutes <= high, f"{path.name}: {title!r}: {minutes} min does not fit {'★' * stars}"


# ------------------------------------------------------------------------------------- problem sets

def _problem_sets():
    from rlkit.exercises.problem_sets import problem_sets
    return problem_sets()


def test_there_are_at_least_five_problem_sets_that_span_chapters():
    sets = _problem_sets()
    assert len(sets) >= 5, [ps.key for ps in sets]
    for ps in sets:
        assert len(set(ps.chapters)) >= 2, f"{ps.key} spans {ps.chapters}"
        assert ps.visible, f"{ps.key} has no visible tests"
        assert ps.written_points > 0, f"{ps.key} has no written part"


@pytest.mark.parametrize("key", [f"ps{i}" for i in range(1, 6)])
def test_each_problem_set_has_its_parts(key):
    from rlkit.exercises.problem_sets import answer_cells, get_problem_set
    ps = get_problem_set(key)
    skeleton = ROOT / ps.notebook
    assert skeleton.is_file(), f"{key}: no skeleton at {ps.notebook}"
    nb = json.loads(skeleton.read_text(encoding="utf-8"))
    assert nb["metadata"].get("rlkit", {}).get("problem_set") == key
    names = [name for name, _ in answer_cells(nb)]
    assert sorted(names) == sorted(ps.tasks), f"{key}: answer cells {names} against tasks {ps.tasks}"
    assert any("written" in c.get("metadata", {}).get("tags", []) for c in nb["cells"]), f"{key}: no written part"
    assert (ROOT / "book" / "instructor" / f"{key}_rubric.md").is_file(), f"{key}: no rubric"
    hidden = importlib.import_module(f"rlkit.exercises.solutions.{key}")
    assert hidden.HIDDEN, f"{key}: no hidden tests"
    assert set(ps.tasks) <= set(hidden.reference_namespace()), f"{key}: the reference does not define every task"
