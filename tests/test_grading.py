"""python -m rlkit.exercises grade-folder (issue 23, item 3): a folder of submitted notebooks graded
in fresh processes with timeouts, partial credit over visible and hidden cases, JSON and CSV reports.

Three synthetic chapter-1 submissions (all correct; partly right with a registered mistake; one
answer that never returns), one that is not a notebook, one whose answer cell is not Python, and
the unfilled skeleton of problem set 1 (graded by task, with its hidden tests, 0 points)."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rlkit
from rlkit.exercises import exercises, get
from rlkit.exercises.solutions import hidden_cases

ROOT = Path(rlkit.__file__).resolve().parents[1]
CHAPTER = 1
SEED = 1
RTG_LOOP = '''def reward_to_go(rewards, discounts):
    out = torch.zeros_like(rewards)
    g = torch.zeros_like(rewards[..., 0])
    for t in reversed(range(rewards.shape[-1])):
        g = rewards[..., t] + discounts[..., t] * g
        out[..., t] = g
    return out
'''


def _notebook(answers: dict[str, str]) -> dict:
    cells = [{"cell_type": "markdown", "metadata": {}, "source": "# Chapter 1 (student edition)"}]
    for name, src in answers.items():
        cells.append({"cell_type": "code", "metadata": {"tags": ["answer"], "rlkit": {"answer": name}},
                      "source": src + f"\ncheck({name})\n", "outputs": [], "execution_count": None})
    return {"cells": cells, "metadata": {"rlkit": {"edition": "student", "chapter": CHAPTER}},
            "nbformat": 4, "nbformat_minor": 5}


def _by_reference(name: str) -> str:
    # the grading process is the instructor's install: an answer may borrow the reference there
    return f"from rlkit.exercises import get\n{name} = get({name!r}).reference\n"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    names = [ex.name for ex in exercises(CHAPTER)]
    assert "reward_to_go" in names and "bandit_gradient" in names and len(names) >= 3, names
    others = [n for n in names if n not in ("reward_to_go", "bandit_gradient")]
    folder = tmp_path_factory.mktemp("submissions")
    correct = {n: _by_reference(n) for n in names}
    correct["reward_to_go"] = RTG_LOOP
    partly = {others[0]: _by_reference(others[0]),
              # registered mistake: "you kept only pi_a r_a" (no baseline)
              "bandit_gradient": ("def bandit_gradient(logits, rewards):\n"
                                  "    return torch.softmax(logits, -1) * rewards\n"),
              # right on 1-D rollouts only
              "reward_to_go": RTG_LOOP.replace("    return out", "    return out if rewards.dim() == 1 else out + 1"),
              others[1]: f"def {others[1]}(*args):\n    raise NotImplementedError\n"}
    hang = dict(correct)
    hang["reward_to_go"] = "def reward_to_go(rewards, discounts):\n    while True:\n        pass\n"
    for stem, answers in (("a_correct", correct), ("b_partly", partly), ("c_hangs", hang)):
        (folder / f"{stem}.ipynb").write_text(json.dumps(_notebook(answers)))
    (folder / "d_broken.ipynb").write_text("{not json")
    bad = _notebook({"reward_to_go": "def reward_to_go(rewards, discounts)\n    return rewards\n"})
    (folder / "e_syntax.ipynb").write_text(json.dumps(bad))
    skeleton = ROOT / "lessons" / "problem_sets" / "ps1_reinforce_to_ppo.ipynb"
    (folder / "f_ps1.ipynb").write_text(skeleton.read_text(encoding="utf-8"))
    pts = {n: 2.0 for n in names}
    pts["reward_to_go"] = 3.0
    (folder.parent / "points.json").write_text(json.dumps(pts))
    report, table = folder.parent / "report.json", folder.parent / "report.csv"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "rlkit.exercises", "grade-folder", str(folder), "--report",
                           str(report), "--csv", str(table), "--timeout", "5", "--hidden-seed", str(SEED),
                           "--points", str(folder.parent / "points.json")], capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    records = {r["file"]: r for r in json.loads(report.read_text())}
    with open(table, newline="") as f:
        rows = list(csv.DictReader(f))
    return dict(names=names, pts=pts, records=records, rows=rows, seconds=seconds, stdout=proc.stdout, others=others)


def _items(record):
    return {i["name"]: i for i in record["items"]}


def _totals(name):
    return len(get(name).get_cases()), len(hidden_cases(name, SEED))


def test_a_correct_submission_gets_every_point_on_visible_and_hidden_cases(graded):
    r = graded["records"]["a_correct.ipynb"]
    assert r["kind"] == "chapter" and r["chapter"] == CHAPTER and r["error"] is None
    assert r["max"] == sum(graded["pts"].values()) and r["score"] == pytest.approx(r["max"])
    rtg = _items(r)["reward_to_go"]
    visible, hidden = _totals("reward_to_go")
    assert hidden > 0
    assert (rtg["visible_passed"], rtg["visible_total"], rtg["hidden_passed"], rtg["hidden_total"]) == (
        visible, visible, hidden, hidden)
    assert rtg["passed"] == rtg["total"] == visible + hidden and rtg["message"].startswith("✓ reward_to_go")


def test_partial_credit_counts_visible_and_hidden_cases_and_names_the_mistake(graded):
    r = graded["records"]["b_partly.ipynb"]
    items = _items(r)
    rtg = items["reward_to_go"]
    visible, hidden = _totals("reward_to_go")
    one_d = sum(c.args[0].dim() == 1 for c in get("reward_to_go").get_cases())
    assert rtg["visible_passed"] == one_d and 0 < one_d < visible
    assert rtg["points"] == pytest.approx(3.0 * rtg["passed"] / (visible + hidden))
    bandit = items["bandit_gradient"]
    assert bandit["points"] == 0.0 and "likely cause: you kept only pi_a r_a" in bandit["message"], bandit
    assert items[graded["others"][1]]["points"] == 0.0 and "not implemented" in items[graded["others"][1]]["message"]
    missing = [n for n in graded["names"] if n not in ("reward_to_go", "bandit_gradient", *graded["others"][:2])]
    for n in missing:
        assert items[n]["points"] == 0.0 and "missing" in items[n]["message"]
    assert r["score"] == pytest.approx(sum(i["points"] for i in r["items"]))
    assert r["score"] == pytest.approx(graded["pts"][graded["others"][0]] + rtg["points"])


def test_a_hanging_answer_costs_that_item_only(graded):
    r = graded["records"]["c_hangs.ipynb"]
    items = _items(r)
    assert items["reward_to_go"]["points"] == 0.0
    assert "timed out: the check did not finish within 5 s" in items["reward_to_go"]["message"]
    others = [i for n, i in items.items() if n != "reward_to_go"]
    assert all(i["points"] == i["max_points"] and "timed out" not in i["message"] for i in others)
    assert r["score"] == pytest.approx(r["max"] - graded["pts"]["reward_to_go"])


def test_unreadable_submissions_get_zero_with_the_reason(graded):
    broken = graded["records"]["d_broken.ipynb"]
    assert broken["score"] == 0 and "cannot be read" in broken["error"]
    syntax = graded["records"]["e_syntax.ipynb"]
    assert syntax["score"] == 0 and "SyntaxError" in syntax["error"] and "reward_to_go" in syntax["error"]
    assert syntax["max"] == sum(graded["pts"].values())


def test_a_problem_set_skeleton_is_graded_by_task_with_its_hidden_tests_and_written_part(graded):
    import importlib

    from rlkit.exercises.problem_sets import get_problem_set

    ps = get_problem_set("ps1")
    hidden = importlib.import_module("rlkit.exercises.solutions.ps1").HIDDEN
    r = graded["records"]["f_ps1.ipynb"]
    assert r["kind"] == "problem_set" and r["problem_set"] == "ps1" and r["error"] is None
    assert r["score"] == 0 and r["to_grade_by_hand"] == ps.written_points
    assert r["max"] == pytest.approx(sum(t.points for t in (*ps.visible, *hidden)) + ps.written_points)
    items = _items(r)
    assert list(items) == [*ps.tasks, "written part"]
    assert sum(i["total"] for i in r["items"]) == len(ps.visible) + len(hidden)
    assert items["written part"]["points"] is None and "by hand" in items["written part"]["message"]
    assert all("not implemented" in i["message"] for n, i in items.items() if n != "written part")


def test_the_csv_has_one_row_per_submission_and_item(graded):
    rows = graded["rows"]
    n = len(graded["names"])
    n_ps = len(graded["records"]["f_ps1.ipynb"]["items"])
    assert len(rows) == 4 * n + 1 + n_ps   # 4 chapter submissions x items, the unreadable one, the problem set
    hang = [row for row in rows if row["file"] == "c_hangs.ipynb"]
    assert [row["item"] for row in hang] == graded["names"]
    assert sum("timed out" in row["message"] for row in rows) == 1
    assert {row["submission_score"] for row in hang} == {str(round(graded["records"]["c_hangs.ipynb"]["score"], 6))}


def test_every_submission_of_the_folder_is_reported(graded):
    # grading time is reported, not asserted (speed is for benchmarks): about 70 s on 2 busy cores
    assert sorted(graded["records"]) == ["a_correct.ipynb", "b_partly.ipynb", "c_hangs.ipynb", "d_broken.ipynb",
                                         "e_syntax.ipynb", "f_ps1.ipynb"]
    print(f"grade-folder: {graded['seconds']:.1f} s for 6 submissions")


def test_the_submission_time_limit_stops_a_whole_submission(tmp_path):
    """--submission-timeout bounds a submission, whatever the per-item limit: with an answer that never
    returns, a 30 s item limit and a 3 s submission limit, grading ends in seconds and every item not
    graded by then gets 0 with the submission limit as its reason."""
    names = [ex.name for ex in exercises(CHAPTER)]
    answers = {n: _by_reference(n) for n in names}
    answers["reward_to_go"] = "def reward_to_go(rewards, discounts):\n    while True:\n        pass\n"
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "hangs.ipynb").write_text(json.dumps(_notebook(answers)))
    report = tmp_path / "r.json"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "rlkit.exercises", "grade-folder", str(tmp_path / "sub"), "--report",
                           str(report), "--timeout", "30", "--submission-timeout", "3"],
                          capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    items = _items(json.loads(report.read_text())[0])
    assert items["reward_to_go"]["points"] == 0.0
    limit = "the submission's time limit (3 s) ran out"
    assert f"{limit} while grading this item" in items["reward_to_go"]["message"], items["reward_to_go"]
    after = names[names.index("reward_to_go") + 1:]
    assert after and all(items[n]["points"] == 0.0 and f"{limit} before this item was graded" in items[n]["message"]
                         for n in after), items
    assert seconds < 30, f"grading took {seconds:.0f} s: the 3 s submission limit did not stop it"
