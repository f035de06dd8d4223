"""The student bundle (issue 23, item 3): what students receive holds no reference code, and its
checkers still pass a correct answer and name a known mistake's cause.

``python -m rlkit.exercises student-bundle OUT/`` is built once in a temporary folder; a
subprocess that can import only the bundle's rlkit (``python -I``, the editable install's finder
removed, ``rlkit.__file__`` checked) then uses it as a student would."""
from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import rlkit
from rlkit.exercises import exercises

ROOT = Path(rlkit.__file__).resolve().parents[1]

STUDENT = r'''
import json, sys
OUT = sys.argv[1]
sys.path.insert(0, OUT)
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in getattr(f, "__name__", type(f).__name__).lower()]
report = {}
import rlkit
report["rlkit_file"] = rlkit.__file__
try:
    import rlkit.exercises.solutions
    report["solutions"] = "imported"
except ModuleNotFoundError as err:
    report["solutions"] = f"ModuleNotFoundError: {err}"
import torch
from rlkit.exercises import check, exercises, get, has_solutions
report["has_solutions"] = has_solutions()
report["exercises"] = len(exercises())
ex = get("reward_to_go")
try:
    ex.reference
    report["reference"] = "present"
except AttributeError as err:
    report["reference"] = f"AttributeError: {err}"
report["mistake_fns"] = [m.fn is None for m in ex.mistakes]
report["signature"] = ex.signature

def reward_to_go(rewards, discounts):
    out = torch.zeros_like(rewards)
    g = torch.zeros_like(rewards[..., 0])
    for t in reversed(range(rewards.shape[-1])):
        g = rewards[..., t] + discounts[..., t] * g
        out[..., t] = g
    return out

r = check(reward_to_go, verbose=False)
report["correct"] = [r.passed, r.cases_passed, r.cases_total]
r = check(lambda rewards, discounts: reward_to_go(rewards, discounts) - rewards, name="reward_to_go", verbose=False)
report["mistake"] = [r.passed, r.message]

def reinforce_loss(logits, actions, weights, mask):   # the weights are not detached: caught by the probe
    logp = torch.log_softmax(logits, -1).gather(-1, actions[..., None]).squeeze(-1)
    return -(mask.to(logits.dtype) * weights * logp).sum() / logits.shape[0]

r = check(reinforce_loss, verbose=False)
report["probe"] = [r.passed, r.message]
print("REPORT" + json.dumps(report))
'''


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle") / "rlkit_student"
    proc = subprocess.run([sys.executable, "-m", "rlkit.exercises", "student-bundle", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return out


def test_the_bundle_has_the_package_lessons_and_an_installable_project(bundle):
    assert (bundle / "rlkit" / "exercises" / "expected" / "ch01.pt").is_file()
    assert not (bundle / "rlkit" / "exercises" / "solutions").exists()
    assert not (bundle / "rlkit" / "exercises" / "grading.py").exists()
    assert sorted(p.name for p in bundle.glob("lessons/[0-9][0-9]_*.ipynb")) == \
        sorted(p.name for p in (ROOT / "lessons").glob("[0-9][0-9]_*.ipynb"))
    assert sorted(p.name for p in bundle.glob("lessons/problem_sets/*.ipynb")) == \
        sorted(p.name for p in (ROOT / "lessons" / "problem_sets").glob("*.ipynb"))
    assert (bundle / "pyproject.toml").is_file() and (bundle / "README.md").is_file()


def test_pip_installs_the_bundle_offline(bundle, tmp_path):
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(target),
                           str(bundle)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (target / "rlkit" / "exercises" / "expected" / "ch01.pt").is_file()
    assert not (target / "rlkit" / "exercises" / "solutions").exists()


def test_with_only_the_bundle_the_checker_works_without_references(bundle):
    proc = subprocess.run([sys.executable, "-I", "-c", STUDENT, str(bundle)], cwd=bundle, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.split("REPORT", 1)[1])
    assert Path(report["rlkit_file"]).resolve().is_relative_to(bundle.resolve()), report["rlkit_file"]
    assert report["solutions"].startswith("ModuleNotFoundError"), report["solutions"]
    assert report["has_solutions"] is False
    assert report["exercises"] == len([e for e in exercises() if not e.name.startswith("_")])
    assert report["reference"].startswith("AttributeError") and "stay with the instructor" in report["reference"]
    assert all(report["mistake_fns"]) and report["signature"] == "(rewards, discounts)"
    passed, got, total = report["correct"]
    assert passed and got == total >= 3
    passed, message = report["mistake"]
    assert not passed and "likely cause: the sum starts at r_{t+1}" in message, message
    passed, message = report["probe"]
    assert not passed and "the weights are not detached" in message, message


def _without_decorators(fn) -> str | None:
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    lines = src.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith(("def ", "async def "))), 0)
    return _normalise("\n".join(lines[start:]))


def _normalise(text: str) -> str:
    return "\n".join(ln.strip() for ln in text.splitlines() if ln.strip())


def _instructor_functions():
    """Every reference and registered mistake, and every function the problem sets' solutions define."""
    from rlkit.exercises import solutions

    fns = []
    for ex in exercises():
        if ex.name.startswith("_"):
            continue
        fns.append(ex.reference)
        fns += [m.fn for m in ex.mistakes]
    for info in pkgutil.iter_modules(solutions.__path__):
        if info.name.startswith("ps"):
            mod = importlib.import_module(f"{solutions.__name__}.{info.name}")
            fns += [f for _, f in inspect.getmembers(mod, inspect.isfunction) if f.__module__ == mod.__name__]
    return fns


def _bundle_texts(bundle: Path):
    for p in bundle.rglob("*"):
        if not p.is_file() or "__pycache__" in p.parts:
            continue
        if p.suffix == ".ipynb":
            nb = json.loads(p.read_text(encoding="utf-8"))
            parts = []
            for cell in nb.get("cells", []):
                src = cell.get("source", "")
                parts.append("".join(src) if isinstance(src, list) else src)
            yield p, _normalise("\n".join(parts))
        else:
            yield p, _normalise(p.read_bytes().decode("utf-8", errors="replace"))


def test_no_file_of_the_bundle_holds_the_source_of_a_reference_or_a_mistake(bundle):
    needles = {s for s in map(_without_decorators, _instructor_functions()) if s and s.count("\n") >= 1}
    assert len(needles) >= 250, len(needles)
    leaks = [(p.relative_to(bundle).as_posix(), n.splitlines()[0]) for p, text in _bundle_texts(bundle)
             for n in needles if n in text]
    assert leaks == [], leaks[:10]
