"""rlkit.exercises: the checker's diagnoses, on a small exercise defined here."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from rlkit.exercises import Case, Exercise, Mistake, check, get, grade, register


def _reference(rewards, discounts):
    out = torch.zeros_like(rewards)
    g = torch.zeros(rewards.shape[:-1])
    for t in reversed(range(rewards.shape[-1])):
        g = rewards[..., t] + discounts[..., t] * g
        out[..., t] = g
    return out


def _no_reset(rewards, discounts):
    out = torch.zeros_like(rewards)
    g = torch.zeros(rewards.shape[:-1])
    for t in reversed(range(rewards.shape[-1])):
        g = rewards[..., t] + 0.9 * g
        out[..., t] = g
    return out


CASE = Case((torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([0.9, 0.9, 0.0, 0.9])), label="boundary")
register(Exercise("_test_rtg", 0, _reference, [CASE],
                  mistakes=[Mistake(_no_reset, "the discount is not zeroed at termination")]))


def test_a_correct_function_passes(capsys):
    result = check(_reference, name="_test_rtg")
    assert result and result.cases_passed == 1
    assert "Well done" in capsys.readouterr().out


@pytest.mark.parametrize("fn, expected", [
    (_no_reset, "not zeroed at termination"),
    (lambda r, d: -_reference(r, d), "sign flipped"),
    (lambda r, d: 2 * _reference(r, d), "times a constant 2"),
    (lambda r, d: torch.cat([_reference(r, d)[1:], torch.zeros(1)]), "one step earlier"),
    (lambda r, d: _reference(r, d).flip(-1), "reversed in time"),
    (lambda r, d: _reference(r, d)[None], "wrong shape"),
    (lambda r, d: _reference(r, d).long(), "floating-point"),
    (lambda r, d: _reference(r, d) * float("nan"), "NaN"),
    (lambda r, d: r.mul_(2), "in place"),
    (lambda r, d: 1 / 0, "ZeroDivisionError"),
    (lambda r, d: (_reference(r, d), r), "expected 1 output"),
])
def test_diagnoses(fn, expected):
    result = check(fn, name="_test_rtg", verbose=False)
    assert not result
    assert expected in result.message, result.message


def test_unknown_exercise_lists_known_names():
    with pytest.raises(KeyError, match="known exercises"):
        get("no_such_exercise")
    with pytest.raises(TypeError, match="student_fn"):
        check(42)


def test_grade_reports_missing_and_passed():
    results = {r.name: r for r in grade({"_test_rtg": _reference}, chapter=0)}
    assert results["_test_rtg"].passed
    results = grade({}, chapter=0)
    assert not results[0].passed and "missing" in results[0].message


def test_grading_cli(tmp_path):
    out = subprocess.run([sys.executable, "-m", "rlkit.exercises", "list"], capture_output=True, text=True)
    assert out.returncode == 0
    student = tmp_path / "student.py"
    student.write_text("def reward_to_go(*a, **k):\n    raise NotImplementedError\n")
    out = subprocess.run([sys.executable, "-m", "rlkit.exercises", "grade", str(student), "--chapter", "1"],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "score:" in out.stdout


def test_nan_in_an_input_is_not_a_modification():
    register(Exercise("_test_nan_input", 0, lambda x: torch.nan_to_num(x),
                      [Case((torch.tensor([1.0, float("nan")]),), label="nan")]))
    assert check(lambda x: torch.nan_to_num(x), name="_test_nan_input", verbose=False)


def _book_exercises():
    from rlkit.exercises import exercises
    return [e.name for e in exercises() if e.chapter > 0]


@pytest.mark.parametrize("name", _book_exercises())
def test_every_book_exercise_is_sound(name):
    """Each chapter's reference passes its checker and each registered mistake is caught with its cause."""
    from rlkit.exercises import self_check
    assert self_check(name) == []


def test_every_chapter_has_at_least_three_exercises():
    from collections import Counter
    from pathlib import Path

    from rlkit.exercises import exercises
    per_chapter = Counter(e.chapter for e in exercises() if e.chapter > 0)
    chapters = sorted(int(p.name[:2]) for p in (Path(__file__).parent.parent / "lessons").glob("[0-9][0-9]_*.ipynb"))
    for ch in chapters:
        assert per_chapter[ch] >= 3, f"chapter {ch} registers {per_chapter[ch]} exercises (3 or more expected)"
