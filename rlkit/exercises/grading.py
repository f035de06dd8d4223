"""Grade a folder of submitted notebooks (the instructor's side): partial credit, hidden cases,
timeouts, and a machine-readable report.

    python -m rlkit.exercises grade-folder SUBMISSIONS/ --report report.json [--csv report.csv]
        [--timeout S] [--submission-timeout S] [--hidden-seed N] [--points points.json]

Every ``*.ipynb`` of the folder is one submission. Its notebook metadata says what it is:
``{"rlkit": {"edition": "student", "chapter": N}}`` for a student-edition chapter, or
``{"rlkit": {"problem_set": "psN"}}`` for a problem-set skeleton. Its answer cells are read with
:func:`rlkit.exercises.problem_sets.answer_source` into one module, which runs in fresh worker
processes (``rlkit.exercises._worker``): an item that hangs or crashes costs that item only.

* **A chapter:** one item per exercise of the chapter, worth :func:`rlkit.exercises.solutions.points`
  (★ = 1, ★★ = 2, ★★★ = 3 from the exercise's difficulty mark; ``--points`` overrides). The
  student's function runs on the visible (stored) cases and on hidden cases drawn on fresh seeds
  (``--hidden-seed``, default 1; 0: none), each item within ``--timeout`` seconds. Partial credit:
  ``points * (visible + hidden cases passed) / (visible + hidden cases)``.
* **A problem set:** one item per task, its points those of the task's tests: the visible tests of
  ``rlkit.exercises.problem_sets.psN`` and the hidden tests ``HIDDEN`` of
  ``rlkit.exercises.solutions.psN``, each within its own ``Test.timeout``; a test may give partial
  credit. The written part's points are reported as an item "written part", to grade by hand.

The JSON report is a list with one record per submission: ``file``, ``kind`` ("chapter",
"problem_set" or "unknown"), ``chapter`` / ``problem_set``, ``score`` (the points the grader gave),
``max`` (every point of the assignment, the written part included), ``to_grade_by_hand`` (the
written part's points), ``error`` (why the submission could not be graded, else None) and
``items``: ``name``, ``points``, ``max_points``, ``passed``/``total`` (cases, or tests),
``visible_passed``/``visible_total``/``hidden_passed``/``hidden_total`` for an exercise, and
``message`` (the first failure, or a pass). The CSV has one row per submission and item. A
submission that cannot be read or imported gets 0 with the reason.
"""
from __future__ import annotations

import csv
import json
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["ItemResult", "SubmissionResult", "grade_folder", "write_json", "write_csv"]

DEFAULT_HIDDEN_SEED = 1


@dataclass
class ItemResult:
    """One graded item: an exercise of a chapter, a task of a problem set, or its written part."""

    name: str
    points: float | None
    max_points: float
    passed: int = 0
    total: int = 0
    message: str = ""
    visible_passed: int | None = None
    visible_total: int | None = None
    hidden_passed: int | None = None
    hidden_total: int | None = None
    tests: list = field(default_factory=list)


@dataclass
class SubmissionResult:
    file: str
    kind: str
    chapter: int | None = None
    problem_set: str | None = None
    score: float = 0.0
    max: float = 0.0
    to_grade_by_hand: float = 0.0
    error: str | None = None
    seconds: float = 0.0
    items: list[ItemResult] = field(default_factory=list)


def _kind(nb: dict) -> tuple[str, int | str | None]:
    meta = nb.get("metadata", {}).get("rlkit", {}) if isinstance(nb, dict) else {}
    if not isinstance(meta, dict):
        return "unknown", None
    if isinstance(meta.get("problem_set"), str):
        return "problem_set", meta["problem_set"]
    if isinstance(meta.get("chapter"), int) and not isinstance(meta.get("chapter"), bool):
        return "chapter", meta["chapter"]
    return "unknown", None


class _Context:
    """What grading a folder needs once: the points, the visible and hidden case counts."""

    def __init__(self, hidden_seed: int, points_file, timeout: float, submission_timeout: float | None):
        from rlkit.exercises.solutions import points

        self.hidden_seed, self.timeout, self.submission_timeout = hidden_seed, timeout, submission_timeout
        self.points = points(points_file)
        self._hidden: dict[str, int] = {}

    def hidden_total(self, name: str) -> int:
        from rlkit.exercises.solutions import hidden_cases

        if name not in self._hidden:
            self._hidden[name] = len(hidden_cases(name, self.hidden_seed))
        return self._hidden[name]


def _first_line_after_header(message: str) -> str:
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    return " | ".join(lines[:3])


def _exercise_item(name: str, r: dict, pts: float, visible_total: int, hidden_total: int) -> ItemResult:
    total = visible_total + hidden_total
    if "failed" in r:
        return ItemResult(name, 0.0, pts, 0, total, f"✗ {name}: {r['failed']}", 0, visible_total, 0, hidden_total)
    if r.get("missing"):
        return ItemResult(name, 0.0, pts, 0, total, f"✗ {name}: missing (no answer defines {name})", 0,
                          visible_total, 0, hidden_total)
    vp, hp = int(r["cases_passed"]), int(r.get("hidden_passed", 0))
    passed = vp + hp
    if not r["passed"]:
        msg = r["message"]
    elif hidden_total and hp < hidden_total:
        msg = r["hidden_message"]
    else:
        msg = r["message"] + (f" All {hidden_total} hidden cases match too." if hidden_total else
                              " (No hidden cases: this exercise's cases are not seeded.)")
    earned = pts * passed / total if total else 0.0
    return ItemResult(name, earned, pts, passed, total, msg, vp, visible_total, hp, hidden_total)


def _source_file(nb: dict, tmp: Path, stem: str) -> Path:
    from rlkit.exercises.problem_sets import answer_source

    path = tmp / f"{stem}_answers.py"
    path.write_text(answer_source(nb), encoding="utf-8")
    return path


def _grade_chapter(nb: dict, chapter: int, res: SubmissionResult, ctx: _Context, tmp: Path, stem: str) -> None:
    from rlkit.exercises import exercises
    from rlkit.exercises.__main__ import run_items

    exs = exercises(chapter)
    if not exs:
        raise ValueError(f"chapter {chapter} has no registered exercises")
    names = [ex.name for ex in exs]
    visible = {ex.name: len(ex.get_cases()) for ex in exs}
    hidden = {n: ctx.hidden_total(n) for n in names}
    res.max = sum(ctx.points.get(n, 1.0) for n in names)
    try:
        src = _source_file(nb, tmp, stem)
        args = ["--chapter", str(chapter), "--hidden-seed", str(ctx.hidden_seed)]
        results = run_items(src, args, names, dict.fromkeys(names, ctx.timeout), ctx.timeout, ctx.submission_timeout)
    except (SyntaxError, ValueError, RuntimeError) as err:
        res.error = f"{type(err).__name__}: {err}" if isinstance(err, SyntaxError) else str(err)
        res.items = [ItemResult(n, 0.0, ctx.points.get(n, 1.0), 0, visible[n] + hidden[n], f"✗ {n}: {res.error}",
                                0, visible[n], 0, hidden[n]) for n in names]
        return
    res.items = [_exercise_item(n, results[n], ctx.points.get(n, 1.0), visible[n], hidden[n]) for n in names]
    res.score = sum(i.points for i in res.items)


def _grade_problem_set(nb: dict, key: str, res: SubmissionResult, ctx: _Context, tmp: Path, stem: str) -> None:
    from rlkit.exercises.__main__ import run_items
    from rlkit.exercises._worker import problem_set_tests
    from rlkit.exercises.problem_sets import get_problem_set

    ps = get_problem_set(key)
    tests = problem_set_tests(key)
    names = list(tests)
    res.to_grade_by_hand = float(ps.written_points)
    res.max = sum(t.points for t in tests.values()) + res.to_grade_by_hand
    error = None
    try:
        src = _source_file(nb, tmp, stem)
        results = run_items(src, ["--problem-set", key], names, {n: t.timeout for n, t in tests.items()},
                            ctx.timeout, ctx.submission_timeout)
    except (SyntaxError, ValueError, RuntimeError) as err:
        error = f"{type(err).__name__}: {err}" if isinstance(err, SyntaxError) else str(err)
        results = {n: {"failed": error} for n in names}
        res.error = error
    by_task: dict[str, ItemResult] = {task: ItemResult(task, 0.0, 0.0) for task in ps.tasks}
    for n, t in tests.items():
        r = results[n]
        item = by_task[t.task]
        earned = 0.0 if "failed" in r else float(r["points"])
        ok = "failed" not in r and bool(r["passed"])
        msg = f"✗ {n}: {r['failed']}" if "failed" in r else r["message"]
        item.points += earned
        item.max_points += t.points
        item.total += 1
        item.passed += ok
        item.tests.append({"name": n, "points": earned, "max_points": t.points, "passed": ok, "message": msg})
        if not ok and not item.message:
            item.message = msg
    for item in by_task.values():
        if not item.message:
            item.message = f"✓ {item.name}: all {item.total} tests passed" if item.total else f"{item.name}: no tests"
    res.items = list(by_task.values())
    if ps.written_points:
        res.items.append(ItemResult("written part", None, float(ps.written_points), 0, 0,
                                    "to grade by hand (book/instructor rubric)"))
    res.score = sum(i.points or 0.0 for i in res.items)


def grade_notebook(path: Path, ctx: _Context, tmp: Path) -> SubmissionResult:
    """Grade one submitted notebook (never raises for a bad submission: the reason goes in ``error``)."""
    start = time.monotonic()
    res = SubmissionResult(path.name, "unknown")
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(nb, dict):
            raise ValueError("not a notebook (the JSON is not an object)")
    except (OSError, UnicodeDecodeError, ValueError) as err:
        res.error = f"the notebook cannot be read: {err}"
        return res
    kind, key = _kind(nb)
    res.kind = kind
    try:
        if kind == "chapter":
            res.chapter = key
            _grade_chapter(nb, key, res, ctx, tmp, path.stem)
        elif kind == "problem_set":
            res.problem_set = key
            _grade_problem_set(nb, key, res, ctx, tmp, path.stem)
        else:
            res.error = ("the notebook's metadata names no chapter or problem set "
                         "(expected rlkit.chapter or rlkit.problem_set)")
    except (ValueError, TypeError) as err:
        res.error = res.error or str(err)
        res.score = 0.0
    res.seconds = round(time.monotonic() - start, 2)
    return res


def grade_folder(folder, timeout: float = 60.0, hidden_seed: int = DEFAULT_HIDDEN_SEED, points=None,
                 submission_timeout: float | None = None, progress=None) -> list[SubmissionResult]:
    """Grade every ``*.ipynb`` in ``folder`` (sorted by name); one :class:`SubmissionResult` each."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder")
    ctx = _Context(hidden_seed, points, timeout, submission_timeout)
    out = []
    with tempfile.TemporaryDirectory(prefix="rlkit_grade_") as tmp:
        for path in sorted(folder.glob("*.ipynb")):
            res = grade_notebook(path, ctx, Path(tmp))
            out.append(res)
            if progress is not None:
                progress(res)
    return out


def _record(r: SubmissionResult) -> dict:
    d = asdict(r)
    for item in d["items"]:
        if item["points"] is not None:
            item["points"] = round(item["points"], 6)
    d["score"] = round(d["score"], 6)
    return d


def write_json(results: list[SubmissionResult], path) -> None:
    """Write the results of :func:`grade_folder` as a JSON list, one record per submission."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump([_record(r) for r in results], f, indent=1, ensure_ascii=False)
        f.write("\n")


CSV_COLUMNS = ["file", "kind", "assignment", "submission_score", "submission_max", "item", "points", "max_points",
               "passed", "total", "hidden_passed", "hidden_total", "message"]


def write_csv(results: list[SubmissionResult], path) -> None:
    """One row per submission and item (a submission that could not be graded at all: one row, item empty)."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for r in results:
            assignment = r.problem_set if r.kind == "problem_set" else (r.chapter if r.chapter is not None else "")
            head = [r.file, r.kind, assignment, round(r.score, 6), r.max]
            if not r.items:
                w.writerow([*head, "", 0, 0, 0, 0, "", "", r.error or ""])
            for i in r.items:
                w.writerow([*head, i.name, "" if i.points is None else round(i.points, 6), i.max_points, i.passed,
                            i.total, "" if i.hidden_passed is None else i.hidden_passed,
                            "" if i.hidden_total is None else i.hidden_total, _first_line_after_header(i.message)])
