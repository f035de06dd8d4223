"""rlkit.exercises: the checker's diagnoses, on a small exercise defined here."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from rlkit.exercises import (
    Case,
    Exercise,
    Mistake,
    UnknownExerciseError,
    check,
    exercise,
    get,
    grade,
    mistake,
    register,
    self_check,
)


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


#: the test-only exercises live in a chapter the book does not have, so that nothing that walks the
#: book's chapters (the student edition, the bundle) meets them
TEST_CHAPTER = -1
CASE = Case((torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([0.9, 0.9, 0.0, 0.9])), label="boundary")
register(Exercise("_test_rtg", TEST_CHAPTER, _reference, [CASE],
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
    with pytest.raises(ValueError, match="known exercises"):
        get("no_such_exercise")
    with pytest.raises(TypeError, match="student_fn"):
        check(42)
    with pytest.raises(TypeError, match="name must be a str"):
        check(_reference, name=3)


@pytest.mark.parametrize("fn, says", [
    (lambda rewards: rewards, r"takes \(rewards\) but the exercise calls it as _test_rtg\(rewards, discounts\)"),
    (lambda: 0, r"takes \(\) but"),
    (lambda rewards, discounts, lam: rewards, "missing a required argument: 'lam'"),
])
def test_a_submission_with_the_wrong_signature_is_refused_before_it_runs(fn, says):
    calls = []

    def spy(*args):
        calls.append(args)
        return fn(*args)

    spy.__signature__ = __import__("inspect").signature(fn)
    result = check(spy, name="_test_rtg", verbose=False)
    assert not result and result.cases_passed == 0 and calls == []
    assert re.search(says, result.message), result.message


def test_a_callable_without_an_inspectable_signature_is_still_run():
    # builtins such as max have no signature: the checker runs them and reports what they return
    result = check(max, name="_test_rtg", verbose=False)
    assert not result and "your function raised" in result.message


def test_every_book_checker_refuses_a_non_callable_or_a_wrong_signature():
    import inspect

    for name in _book_exercises():
        with pytest.raises(TypeError, match="must be callable"):
            check(None, name=name)
        result = check(lambda: 0, name=name, verbose=False)
        params = ", ".join(inspect.signature(get(name).reference).parameters)
        assert not result and result.cases_passed == 0, name
        assert f"your function takes () but the exercise calls it as {name}({params})" in result.message, name


def test_exercise_and_mistake_decorators_register_in_order():
    @exercise(chapter=TEST_CHAPTER, cases=[Case((torch.tensor([1.0, -2.0]),), label="two")], atol=0.0,
              description="abs")
    def _test_abs(x):
        return x.abs()

    @mistake(_test_abs, "you returned x itself")
    def _identity(x):
        return x

    @mistake(_test_abs, "you negated x")
    def _negated(x):
        return -x

    ex = get("_test_abs")
    assert ex.reference is _test_abs and ex.atol == 0.0 and ex.description == "abs"
    assert [m.cause for m in ex.mistakes] == ["you returned x itself", "you negated x"]
    assert "you negated x" in check(lambda x: -x, name="_test_abs", verbose=False).message
    assert self_check("_test_abs") == []
    with pytest.raises(ValueError, match="not the reference of a registered exercise"):
        mistake(lambda x: x, "a cause")


def test_layout_validator_binds_named_dimensions():
    from rlkit import _validate as V

    sizes = V.layout("N T A", floating=True, logits=torch.zeros(2, 3, 4))
    assert sizes == {"N": 2, "T": 3, "A": 4}
    assert V.layout("N T", sizes, weights=torch.zeros(2, 3), mask=torch.ones(2, 3, dtype=torch.bool))["T"] == 3
    with pytest.raises(ValueError, match=r"weights has shape \(2, 4\), which does not fit \[N, T\]: T must be 3"):
        V.layout("N T", sizes, weights=torch.zeros(2, 4))
    with pytest.raises(ValueError, match="must have 2 dimension"):
        V.layout("N T", weights=torch.zeros(2, 3, 1))
    batch = V.layout("... S A", pi=torch.zeros(5, 2, 3, 4))
    assert batch["..."] == (5, 2)
    with pytest.raises(ValueError, match=r"the leading dimensions must be \(5, 2\) \(as in pi\)"):
        V.layout("... S", batch, d=torch.zeros(5, 3))
    with pytest.raises(ValueError, match="S must be 2 .as in P."):
        V.layout("S A S", P=torch.zeros(2, 3, 4))
    with pytest.raises(TypeError, match="x must have a floating dtype"):
        V.layout("...", floating=True, x=torch.zeros(3, dtype=torch.int64))
    with pytest.raises(TypeError, match="y must be a torch.Tensor"):
        V.layout("...", y=[1.0])


def test_real_list_validator():
    from rlkit import _validate as V

    assert V.real_list((1, 2.5), "v") == [1.0, 2.5]
    assert V.real_list(torch.tensor([0.5, float("nan")]), "v")[0] == 0.5
    with pytest.raises(TypeError, match=r"v\[1\] must be a real number"):
        V.real_list([1.0, "x"], "v")
    with pytest.raises(TypeError, match="v must be a list"):
        V.real_list(3.0, "v")
    with pytest.raises(ValueError, match="1-D"):
        V.real_list(torch.zeros(2, 2), "v")


def test_grade_reports_missing_and_passed():
    results = {r.name: r for r in grade({"_test_rtg": _reference}, chapter=TEST_CHAPTER)}
    assert results["_test_rtg"].passed
    results = grade({}, chapter=TEST_CHAPTER)
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
    register(Exercise("_test_nan_input", TEST_CHAPTER, lambda x: torch.nan_to_num(x),
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
    per_chapter = Counter(e.chapter for e in exercises() if not e.name.startswith("_"))   # not the test-only exercises
    chapters = sorted(int(p.name[:2]) for p in (Path(__file__).parent.parent / "lessons").glob("[0-9][0-9]_*.ipynb"))
    for ch in chapters:
        assert per_chapter[ch] >= 3, f"chapter {ch} registers {per_chapter[ch]} exercises (3 or more expected)"


@pytest.mark.parametrize("call", [get, self_check, lambda name: check(_reference, name=name, verbose=False),
                                  lambda name: check(_reference, name=name)])
def test_an_unknown_name_is_a_clear_error_not_a_key_error(call):
    """Reliability review 2.6: exercises.check and get ended in a raw KeyError for an unknown name."""
    with pytest.raises(UnknownExerciseError) as info:
        call("rewards_to_go")
    err = info.value
    assert isinstance(err, ValueError) and not isinstance(err, KeyError)
    msg = str(err)
    assert msg.startswith("no exercise named 'rewards_to_go' (did you mean 'reward_to_go'"), msg
    assert "known exercises:" in msg and "rewards_from_advantages" in msg
    with pytest.raises(UnknownExerciseError, match=r"no exercise named 'zzzz_qqq'; known exercises"):
        get("zzzz_qqq")           # nothing close: no "did you mean"


def test_a_student_function_named_after_no_exercise_is_a_clear_error():
    def rewards_to_go(rewards, discounts):
        return rewards

    with pytest.raises(UnknownExerciseError, match="did you mean 'reward_to_go'"):
        check(rewards_to_go)


def _as_float32(r, d):
    return _reference(r, d).float()


def test_a_float32_answer_to_a_float64_case_fails_and_names_the_dtype():
    """Reliability review 2.6: a float32 answer to a float64 exercise passed (the dtype was not compared)."""
    x64 = Case((torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64),
                torch.tensor([0.9, 0.9, 0.0, 0.9], dtype=torch.float64)), label="float64")
    register(Exercise("_test_rtg64", TEST_CHAPTER, _reference_like, [x64]))
    assert check(_reference_like, name="_test_rtg64", verbose=False)
    result = check(_as_float32, name="_test_rtg64", verbose=False)
    assert not result, result.message
    assert "wrong dtype: expected torch.float64, got torch.float32 (the values match the reference" in result.message
    result = check(lambda r, d: _reference(r, d).float() + 1, name="_test_rtg64", verbose=False)
    assert "expected torch.float64, got torch.float32 (the values differ too" in result.message
    # an exercise that leaves the floating dtype open accepts both
    register(Exercise("_test_rtg64_any", TEST_CHAPTER, _reference_like, [x64], match_dtype=False))
    assert check(_as_float32, name="_test_rtg64_any", verbose=False)


def _reference_like(rewards, discounts):
    out = torch.zeros_like(rewards)
    g = torch.zeros(rewards.shape[:-1], dtype=rewards.dtype)
    for t in reversed(range(rewards.shape[-1])):
        g = rewards[..., t] + discounts[..., t] * g
        out[..., t] = g
    return out


def test_every_book_exercise_with_a_float64_case_refuses_a_float32_answer():
    """The dtype is compared where the exercise states one: for every book exercise with a float64
    output (except model_token_mask, which asks for "a float 0/1 mask"), the reference with its
    floating outputs cast to float32 fails, and the message names the expected dtype."""
    from rlkit.exercises import _flatten, call_on_case, exercises

    def to32(out):
        if isinstance(out, torch.Tensor) and out.dtype == torch.float64:
            return out.float()
        if isinstance(out, (tuple, list)):
            return type(out)(to32(o) for o in out)
        return out

    tried = 0
    for ex in exercises():
        if ex.chapter <= 0 or not any(isinstance(o, torch.Tensor) and o.dtype == torch.float64
                                      for c in ex.get_cases() for o in _flatten(call_on_case(ex.reference, c, ex))):
            continue
        ref = ex.reference

        def cast(*args, _ref=ref, **kwargs):
            return to32(_ref(*args, **kwargs))

        cast.__signature__ = __import__("inspect").signature(ref)
        result = check(cast, name=ex.name, verbose=False)
        if ex.name == "model_token_mask":
            raise AssertionError("model_token_mask has no float64 output")
        assert not result, ex.name
        assert "wrong dtype: expected torch.float64, got torch.float32" in result.message, (ex.name, result.message)
        tried += 1
    assert tried >= 70, tried


def _grade(tmp_path, source: str, *extra: str) -> subprocess.CompletedProcess:
    student = tmp_path / "submission.py"
    student.write_text(source)
    return subprocess.run([sys.executable, "-m", "rlkit.exercises", "grade", str(student), *extra],
                          capture_output=True, text=True, timeout=240)


def test_grade_reports_a_function_that_never_returns_as_timed_out(tmp_path):
    """Reliability review 2.6: a submission whose reward_to_go never returns hung `grade` (no timeout).

    The loop is reported as timed out, a function that ends the process as such, and the other
    exercises are still graded; what the submission prints does not disturb the report."""
    import time

    start = time.monotonic()
    out = _grade(tmp_path, (
        "print('noise from the submission')\n"
        "from rlkit.exercises import get\n"
        "softmax_score = get('softmax_score').reference\n"
        "reinforce_loss = get('reinforce_loss').reference\n"
        "def reward_to_go(rewards, discounts):\n"
        "    while True:\n"
        "        pass\n"
        "def bandit_gradient(logits, rewards):\n"
        "    import os\n"
        "    os._exit(3)\n"), "--chapter", "1", "--timeout", "2")
    assert time.monotonic() - start < 120
    assert out.returncode == 1, out.stderr
    lines = out.stdout.splitlines()
    assert "✗ reward_to_go: timed out: the check did not finish within 2 s" in out.stdout, out.stdout
    assert any(ln.startswith("✗ bandit_gradient: the grading process ended (exit code 3)") for ln in lines), out.stdout
    assert sum(ln.startswith(("✓ softmax_score", "✓ reinforce_loss")) for ln in lines) == 2, out.stdout
    assert lines[-1] == "score: 2/4 exercises passed (4 attempted)"
    assert "noise from the submission" not in out.stdout and "noise from the submission" in out.stderr


def test_grade_bounds_the_import_of_the_file_and_reports_an_import_error(tmp_path):
    out = _grade(tmp_path, "while True:\n    pass\n", "--chapter", "1", "--timeout", "2")
    assert out.returncode == 1
    assert "did not finish importing within 2 s" in out.stderr and "score: 0/4" in out.stdout
    out = _grade(tmp_path, "raise RuntimeError('broken submission')\n", "--chapter", "1")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "raised RuntimeError: broken submission while being imported" in out.stderr


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "soon"])
def test_grade_refuses_a_timeout_that_is_not_a_positive_number(tmp_path, capsys, bad):
    from rlkit.exercises.__main__ import main

    student = tmp_path / "submission.py"
    student.write_text("")
    with pytest.raises(SystemExit) as info:
        main(["grade", str(student), "--timeout", bad])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--timeout" in err and "seconds" in err, err


# ------------------------------------------------------------- stored expectations (issue 23, item 3)

def _declared():
    """The book's exercises as declared in rlkit/exercises/solutions/chNN.py, by chapter."""
    from collections import defaultdict

    from rlkit.exercises import exercises
    out = defaultdict(dict)
    for ex in exercises():
        if getattr(ex.reference, "__module__", "").startswith("rlkit.exercises.solutions.ch"):
            out[ex.chapter][ex.name] = ex
    return out


def _record_hint(chapter):
    return f"stale stored expectations: run python -m rlkit.exercises.solutions record --chapter {chapter}"


def test_the_stored_expectations_list_the_declared_exercises_cases_and_mistakes():
    """A helper who changes an exercise and forgets to re-record fails here, told which command to run."""
    from rlkit.exercises import EXPECTED_DIR, read_expected, stale

    declared = _declared()
    stored_chapters = sorted(int(p.stem[2:]) for p in EXPECTED_DIR.glob("ch[0-9][0-9].pt"))
    assert stored_chapters == sorted(declared), (
        f"chapters with stored expectations {stored_chapters} != chapters declaring exercises {sorted(declared)}: "
        "run python -m rlkit.exercises.solutions record")
    for ch, exs in declared.items():
        assert sorted(read_expected(ch)) == sorted(exs), f"chapter {ch}: {_record_hint(ch)}"
        for ex in exs.values():
            assert stale(ex) == [], f"{stale(ex)}: {_record_hint(ch)}"


def test_the_stored_outputs_are_the_references_and_mistakes_outputs_now():
    """Each stored output equals what the reference (and each mistake) gives on the case today,
    within the exercise's atol/rtol and with the same dtypes; the signature and docstring are the reference's."""
    import inspect

    from rlkit.exercises import _compare, call_on_case, outputs_or_none, read_expected

    n = 0
    for ch, exs in _declared().items():
        stored = read_expected(ch)
        for name, ex in exs.items():
            if name not in stored:           # the test above names the command to run
                continue
            st = stored[name].stored
            assert st.signature == str(inspect.signature(ex.reference)), _record_hint(ch)
            assert st.doc == (inspect.getdoc(ex.reference) or ""), _record_hint(ch)
            for i, (case, exp) in enumerate(zip(st.cases, st.expected)):
                diff = _compare(call_on_case(ex.reference, case, ex), exp, ex.atol, ex.rtol, True)
                assert diff is None, f"{name} case {i + 1}: {diff}; {_record_hint(ch)}"
                n += 1
            for m, (cause, outs) in zip(ex.mistakes, st.mistakes):
                for i, (now, then) in enumerate(zip(outputs_or_none(m.fn, st.cases, ex), outs)):
                    where = f"{name}, mistake {cause!r}, case {i + 1}"
                    assert (now is None) == (then is None), f"{where}: {_record_hint(ch)}"
                    if now is not None:
                        assert _compare(now, then, ex.atol, ex.rtol, True) is None, \
                            f"{name}, mistake {cause!r}, case {i + 1}: {_record_hint(ch)}"
    assert n >= 300, n


def test_the_stored_data_loads_with_weights_only_and_is_small():
    from rlkit.exercises import EXPECTED_DIR

    files = sorted(EXPECTED_DIR.glob("ch[0-9][0-9].pt"))
    for f in files:
        data = torch.load(f, weights_only=True)
        rec = data["exercises"][0]
        assert {"name", "chapter", "description", "atol", "rtol", "match_dtype", "probe", "signature", "doc",
                "cases", "expected", "mistakes"} <= set(rec), f.name
    assert sum(f.stat().st_size for f in files) < 3_000_000


def test_check_never_runs_a_book_reference():
    """A book exercise is checked against its stored outputs: with the reference and every mistake
    replaced by functions that fail if called, a correct answer still passes and a mistake is diagnosed."""
    from rlkit.exercises import Mistake

    ex = get("reward_to_go")
    saved = (ex.reference, ex.mistakes)

    def boom(*args, **kwargs):
        raise AssertionError("the reference was called")

    try:
        ex.reference = boom
        boom.__module__ = saved[0].__module__
        ex.mistakes = [Mistake(boom, m.cause) for m in saved[1]]

        def reward_to_go(rewards, discounts):
            out, g = torch.zeros_like(rewards), torch.zeros_like(rewards[..., 0])
            for t in reversed(range(rewards.shape[-1])):
                g = rewards[..., t] + discounts[..., t] * g
                out[..., t] = g
            return out

        assert check(reward_to_go, verbose=False)
        bad = check(lambda rewards, discounts: reward_to_go(rewards, discounts) - rewards, name="reward_to_go",
                    verbose=False)
        assert "the sum starts at r_{t+1}" in bad.message, bad.message
    finally:
        ex.reference, ex.mistakes = saved


def test_check_counts_every_case_for_partial_credit():
    """cases_passed counts every case that matches, not the cases before the first failure; the
    message still reports the first failing case."""
    def gae_like(r, d):
        out = _reference(r, d)
        return out if r.shape[-1] != 4 else out + 1

    cases = [Case((torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([0.9, 0.9, 0.0, 0.9])), label="four"),
             Case((torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.9, 0.0, 0.9])), label="three"),
             Case((torch.tensor([1.0, 2.0]), torch.tensor([0.5, 0.5])), label="two")]
    register(Exercise("_test_rtg_partial", TEST_CHAPTER, _reference, cases))
    result = check(gae_like, name="_test_rtg_partial", verbose=False)
    assert not result and result.cases_passed == 2 and result.cases_total == 3
    assert "2 of 3 cases passed" in result.message and "case 1 (four)" in result.message


def test_exercise_signature_and_doc_for_answer_cells():
    ex = get("reward_to_go")
    assert ex.signature == "(rewards, discounts)" and ex.parameters == ("rewards", "discounts")
    assert ex.doc.startswith(":math:`G_t")
