"""The instructor's side of the exercises: reference solutions, known mistakes, their cases, the
stored expectations, hidden cases and point values.

``rlkit/exercises/solutions/chNN.py`` declares each exercise of chapter NN: the reference
solution (decorated with :func:`rlkit.exercises.exercise`), the cases it is checked on, and the
known wrong variants (decorated with :func:`rlkit.exercises.mistake`). ``psN.py`` holds a problem
set's reference namespace and hidden tests. The student bundle
(``python -m rlkit.exercises student-bundle``) leaves this folder out.

This module adds what only the instructor needs:

* :func:`record` (``python -m rlkit.exercises.solutions record [--chapter N]``) runs each reference
  and each mistake on every case and writes ``rlkit/exercises/expected/chNN.pt``, which
  :func:`rlkit.exercises.check` compares against. Re-record a chapter after changing its exercises
  (``tests/test_exercises_framework.py`` fails, naming this command, when the data is stale).
* :func:`hidden_cases` draws fresh cases for grading: the exercise's case generator run again with
  every ``torch.Generator`` seed shifted by ``seed``; the cases that come out the same as the
  visible ones (hand-written ones) are dropped, so an exercise without seeded cases has none.
* :func:`points`: what each exercise is worth, from the difficulty mark of its ``{exercise}``
  title in the chapter (★ = 1, ★★ = 2, ★★★ = 3; 1 without a mark), overridable with a JSON file.
"""
from __future__ import annotations

import inspect
import json
import os
import re
from pathlib import Path

import torch

__all__ = ["record", "hidden_cases", "hidden_expectations", "points", "default_points", "SEED_STRIDE"]

#: The stride between hidden draws. With hidden seed ``seed``, a case generator's seed ``s`` becomes
#: ``s + SEED_STRIDE * seed``.
SEED_STRIDE = 1_000_003


# ------------------------------------------------------------------------------------------- record

def _probe_name(ex) -> str | None:
    from rlkit.exercises.probes import PROBES

    if ex.probe is None:
        return None
    name = getattr(ex.probe, "__name__", None)
    if PROBES.get(name) is not ex.probe:
        raise ValueError(f"exercise {ex.name!r}: its probe {name!r} is not one of rlkit.exercises.probes.PROBES; a "
                         "probe runs the student's function in the student bundle, so it must live there")
    return name


def _record_one(ex) -> dict:
    from rlkit.exercises import call_on_case, detached_outputs, outputs_or_none

    cases = ex.get_cases()
    sig = inspect.signature(ex.reference)
    return {
        "name": ex.name, "chapter": ex.chapter, "description": ex.description, "atol": float(ex.atol),
        "rtol": float(ex.rtol), "match_dtype": bool(ex.match_dtype), "probe": _probe_name(ex),
        "signature": str(sig), "parameters": list(sig.parameters), "doc": inspect.getdoc(ex.reference) or "",
        "cases": [{"args": tuple(c.args), "kwargs": dict(c.kwargs), "label": c.label} for c in cases],
        "expected": [detached_outputs(call_on_case(ex.reference, c, ex)) for c in cases],
        "mistakes": [{"cause": m.cause, "outputs": outputs_or_none(m.fn, cases, ex)} for m in ex.mistakes],
    }


def _chapters() -> list[int]:
    return sorted(int(p.stem[2:]) for p in Path(__file__).parent.glob("ch[0-9][0-9].py"))


def record(chapter: int | None = None) -> dict[int, tuple[Path, int]]:
    """Run every exercise's reference and mistakes (of ``chapter``, or of every chapter) on its cases
    and write ``rlkit/exercises/expected/chNN.pt``; returns ``{chapter: (path, number of exercises)}``.

    Only the chapters named are rewritten. The file is written to a temporary name and renamed,
    and read back with ``torch.load(..., weights_only=True)`` to prove it loads that way.
    """
    import rlkit.exercises as E

    E._load_all()
    chapters = _chapters() if chapter is None else [int(chapter)]
    E.EXPECTED_DIR.mkdir(parents=True, exist_ok=True)
    written = {}
    for ch in chapters:
        exs = [ex for ex in E.exercises(ch) if getattr(ex.reference, "__module__", "") == f"{__name__}.ch{ch:02d}"]
        if not exs:
            raise ValueError(f"chapter {ch}: no exercise is declared in rlkit/exercises/solutions/ch{ch:02d}.py")
        data = {"format": E.STORED_FORMAT, "chapter": ch, "exercises": [_record_one(ex) for ex in exs]}
        path = E.expected_path(ch)
        tmp = path.with_suffix(".pt.tmp")
        torch.save(data, tmp)
        torch.load(tmp, weights_only=True)
        os.replace(tmp, path)
        E._EXPECTED.pop(ch, None)
        for ex in exs:
            ex.stored = None
        written[ch] = (path, len(exs))
    return written


# ------------------------------------------------------------------------------------- hidden cases

class _Shifted:
    """While active, ``torch.Generator()`` makes generators whose ``manual_seed(s)`` seeds ``s + shift``."""

    def __init__(self, shift: int):
        self.shift, self.seeded = shift, 0

    def __enter__(self):
        outer = self
        self.original = original = torch.Generator

        class ShiftedGenerator(original):
            def manual_seed(self, seed):
                outer.seeded += 1
                return super().manual_seed((int(seed) + outer.shift) % (2 ** 63))

        torch.Generator = ShiftedGenerator
        return self

    def __exit__(self, *exc):
        torch.Generator = self.original
        return False


def hidden_cases(name: str, seed: int) -> list:
    """Cases of exercise ``name`` on fresh seeds: its case generator run again with each
    ``torch.Generator().manual_seed(s)`` seeding ``s + SEED_STRIDE * seed`` instead.

    Only the cases whose inputs differ from the visible case at the same place are kept, and only
    those the reference accepts. An exercise whose cases are a fixed list, or whose generator seeds
    no generator, has no hidden cases (``[]``); ``hidden_report`` lists them.
    """
    from rlkit.exercises import call_on_case, get, identical

    ex = get(name)
    if not callable(ex.cases) or int(seed) == 0:
        return []
    visible = ex.get_cases()
    with _Shifted(SEED_STRIDE * int(seed)) as shifted:
        fresh = ex.get_cases()
    if shifted.seeded == 0:
        return []
    out = []
    for i, case in enumerate(fresh):
        if i < len(visible) and identical((case.args, case.kwargs), (visible[i].args, visible[i].kwargs)):
            continue
        try:
            call_on_case(ex.reference, case, ex)
        except Exception:
            continue
        out.append(case)
    return out


def hidden_expectations(name: str, seed: int):
    """``(cases, expected outputs, mistakes)`` for ``rlkit.exercises.check_on`` on the hidden cases:
    the reference and the registered mistakes run now, live."""
    from rlkit.exercises import call_on_case, detached_outputs, get, live_mistakes

    ex = get(name)
    cases = hidden_cases(name, seed)
    return cases, [detached_outputs(call_on_case(ex.reference, c, ex)) for c in cases], lambda: live_mistakes(ex, cases)


def hidden_report(seed: int = 1) -> dict[str, int]:
    """The number of hidden cases of every exercise at ``seed`` (0 for those that have none)."""
    from rlkit.exercises import exercises

    return {ex.name: len(hidden_cases(ex.name, seed)) for ex in exercises() if not ex.name.startswith("_")}


# ------------------------------------------------------------------------------------------- points

_FENCE = re.compile(r"^(`{3,}|:{3,})\{exercise\}[ \t]*(.*)$")
_MARK = re.compile(r"\((★{1,3}),\s*\d+\s*min\)\s*$")


def _lessons_dir() -> Path:
    return Path(__file__).resolve().parents[3] / "lessons"


def _exercise_blocks(notebook: Path) -> list[tuple[str, str]]:
    """``(title, body)`` of every ``{exercise}`` directive in a chapter notebook's markdown."""
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    blocks = []
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "markdown":
            continue
        lines = "".join(cell.get("source", "")).splitlines()
        i = 0
        while i < len(lines):
            m = _FENCE.match(lines[i].strip())
            if not m:
                i += 1
                continue
            fence, body = m.group(1), []
            i += 1
            while i < len(lines) and lines[i].strip() != fence:
                body.append(lines[i])
                i += 1
            blocks.append((m.group(2).strip(), "\n".join(body)))
            i += 1
    return blocks


def default_points(lessons: Path | None = None) -> dict[str, float]:
    """Points per exercise from the difficulty marks: the ``{exercise}`` block of the exercise's
    chapter that names the function (```name(``` or ```name```) gives ★ = 1, ★★ = 2, ★★★ = 3;
    an exercise with no marked block found is worth 1."""
    from rlkit.exercises import exercises

    lessons = Path(lessons) if lessons is not None else _lessons_dir()
    out = {}
    blocks_of: dict[int, list] = {}
    for ex in exercises():
        if ex.name.startswith("_"):
            continue
        if ex.chapter not in blocks_of:
            nbs = sorted(lessons.glob(f"{ex.chapter:02d}_*.ipynb")) if lessons.is_dir() else []
            blocks_of[ex.chapter] = _exercise_blocks(nbs[0]) if nbs else []
        out[ex.name] = 1.0
        for title, body in blocks_of[ex.chapter]:
            if f"`{ex.name}(" in body or f"`{ex.name}`" in body:
                mark = _MARK.search(title)
                if mark:
                    out[ex.name] = float(len(mark.group(1)))
                break
    return out


def points(overrides: str | Path | dict | None = None, lessons: Path | None = None) -> dict[str, float]:
    """What each exercise is worth: :func:`default_points`, then ``overrides`` (a dict, or a JSON
    file holding one, from exercise names to non-negative numbers) on top. An unknown name or a bad
    value raises ``ValueError``."""
    pts = default_points(lessons)
    if overrides is None:
        return pts
    if not isinstance(overrides, dict):
        with open(overrides, encoding="utf-8") as f:
            overrides = json.load(f)
        if not isinstance(overrides, dict):
            raise ValueError("points: the JSON file must hold an object {exercise name: points}")
    for name, value in overrides.items():
        if name not in pts:
            raise ValueError(f"points: no exercise named {name!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"points: {name!r} must be a non-negative number, got {value!r}")
        pts[name] = float(value)
    return pts
