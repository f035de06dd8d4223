"""The student bundle: what students receive, with no reference solution in it (the instructor's side).

    python -m rlkit.exercises student-bundle OUT/ [--lessons lessons/]

writes, into a missing or empty folder OUT:

* ``OUT/rlkit``: the package without ``rlkit/exercises/solutions/`` (the references, the mistakes'
  code, the hidden tests of the problem sets) and without the instructor's tools
  (``rlkit/exercises/grading.py``, this module). Its checkers compare against the stored expected
  outputs, ``rlkit/exercises/expected/chNN.pt``, and keep their diagnoses (see
  :mod:`rlkit.exercises`);
* ``OUT/lessons``: the student edition of the chapters (:func:`rlkit.exercises.student.student_edition`:
  no solution blocks or cells; answer cells to fill in);
* ``OUT/lessons/problem_sets``: the problem-set skeletons, with their solution blocks removed if any;
* ``OUT/pyproject.toml`` and ``OUT/_build/rlkit_bundle_backend.py``: ``pip install OUT/`` works
  offline (a build backend with no dependency: it zips ``rlkit/`` into a wheel);
* ``OUT/README.md``: what is in the bundle and how to use it.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import rlkit
from rlkit.exercises.student import default_lessons, strip_solutions, student_edition

__all__ = ["student_bundle", "INSTRUCTOR_ONLY"]

#: paths inside the rlkit package that never leave the instructor's machine
INSTRUCTOR_ONLY = ("exercises/solutions", "exercises/grading.py", "exercises/bundle.py")

_DEPENDENCIES = ["torch>=2.2,<=2.13.0", "numpy>=1.26", "gymnasium>=1.0,<2", "matplotlib>=3.8", "ipywidgets>=8.1",
                 "tqdm>=4.66"]

_BACKEND = '''"""A PEP 517 build backend with no dependencies, so that ``pip install .`` works offline.

It writes a pure-Python wheel of the ``rlkit/`` folder next to it (written by
``python -m rlkit.exercises student-bundle``)."""
import base64
import hashlib
import io
import pathlib
import tarfile
import zipfile

NAME, VERSION = "rlkit", {version!r}
DEPENDENCIES = {dependencies!r}
ROOT = pathlib.Path(__file__).resolve().parents[1]
DIST_INFO = f"{{NAME}}-{{VERSION}}.dist-info"


def _metadata():
    lines = ["Metadata-Version: 2.1", f"Name: {{NAME}}", f"Version: {{VERSION}}",
             "Summary: rlkit, student edition (no reference solutions)", "Requires-Python: >=3.10"]
    return "\\n".join(lines + [f"Requires-Dist: {{d}}" for d in DEPENDENCIES]) + "\\n"


def _wheel_info():
    return "Wheel-Version: 1.0\\nGenerator: rlkit_bundle_backend\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"


def _files():
    for p in sorted((ROOT / "rlkit").rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo"):
            yield p


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = pathlib.Path(metadata_directory) / DIST_INFO
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text(_metadata())
    (d / "WHEEL").write_text(_wheel_info())
    return DIST_INFO


def _digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = f"{{NAME}}-{{VERSION}}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(pathlib.Path(wheel_directory) / name, "w", zipfile.ZIP_DEFLATED) as z:
        entries = [(p.relative_to(ROOT).as_posix(), p.read_bytes()) for p in _files()]
        entries += [(f"{{DIST_INFO}}/METADATA", _metadata().encode()), (f"{{DIST_INFO}}/WHEEL", _wheel_info().encode())]
        for arc, data in entries:
            z.writestr(arc, data)
            record.append(f"{{arc}},{{_digest(data)}},{{len(data)}}")
        record.append(f"{{DIST_INFO}}/RECORD,,")
        z.writestr(f"{{DIST_INFO}}/RECORD", "\\n".join(record) + "\\n")
    return name


def build_sdist(sdist_directory, config_settings=None):
    base = f"{{NAME}}-{{VERSION}}"
    name = f"{{base}}.tar.gz"
    with tarfile.open(pathlib.Path(sdist_directory) / name, "w:gz") as tar:
        for p in [*_files(), ROOT / "pyproject.toml", ROOT / "README.md", pathlib.Path(__file__)]:
            tar.add(p, arcname=f"{{base}}/{{p.relative_to(ROOT).as_posix()}}")
        info = tarfile.TarInfo(f"{{base}}/PKG-INFO")
        data = _metadata().encode()
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return name
'''

_PYPROJECT = '''[build-system]
# a backend with no dependencies (it ships here), so that `pip install .` works offline
requires = []
build-backend = "rlkit_bundle_backend"
backend-path = ["_build"]

[project]
name = "rlkit"
version = "{version}"
description = "rlkit, student edition: the book's library and its checkers, without the reference solutions"
requires-python = ">=3.10"
dependencies = {dependencies}
'''

_README = '''# rlkit: the student bundle

This folder is what you need to work the book's exercises and problem sets:

- `rlkit/`: the book's library. Its checkers (`from rlkit.exercises import check`) compare your
  function with the expected outputs on fixed cases and tell you what differs and its likely cause.
  The reference solutions are not in this bundle.
- `lessons/`: the chapters, student edition. Under each exercise there is an answer cell: the
  function's signature and docstring, `raise NotImplementedError` to replace with your code, and
  a `check(...)` call.
- `lessons/problem_sets/`: the problem sets' skeletons. Their visible tests run with
  `check_task(globals(), "psN", "<task>")`; your instructor grades with hidden tests as well.

## Install (offline)

    pip install ./{name}

(or, to edit the library in place, work from this folder: `cd {name}` and start Jupyter there).
It needs Python 3.10 or newer and PyTorch, numpy, gymnasium, matplotlib, ipywidgets and tqdm.

## Working an exercise

Fill in the answer cell and run it: `check(reward_to_go)` prints `✓ ... Well done!` or what is
wrong, e.g. `✗ reward_to_go: 3 of 5 cases passed` with the first case that differs and a likely
cause. `python -m rlkit.exercises grade my_answers.py --chapter N` checks a file of functions.
'''


def _copy_package(dst: Path) -> int:
    src = Path(rlkit.__file__).resolve().parent
    skip = {src / p for p in INSTRUCTOR_ONLY}

    def ignore(folder, names):
        here = Path(folder)
        return [n for n in names if n == "__pycache__" or n.endswith((".pyc", ".pyo", ".egg-info"))
                or (here / n) in skip]

    shutil.copytree(src, dst, ignore=ignore)
    return sum(1 for p in dst.rglob("*") if p.is_file())


def _problem_sets(src: Path, dst: Path) -> int:
    if not src.is_dir():
        return 0
    n = 0
    for nb_path in sorted(src.glob("*.ipynb")):
        nb = json.loads(nb_path.read_text(encoding="utf-8"))
        stripped, _ = strip_solutions(nb, nb_path.name)
        dst.mkdir(parents=True, exist_ok=True)
        (dst / nb_path.name).write_text(json.dumps(stripped, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        n += 1
    return n


def student_bundle(out, lessons=None) -> dict:
    """Write the student bundle into ``out`` (missing, or an empty folder); returns counts:
    ``{"files": files of rlkit, "notebooks": student chapters, "problem_sets": skeletons}``."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"out: {out} exists and is not an empty folder")
    src_lessons = Path(lessons) if lessons is not None else default_lessons()
    if src_lessons is None or not src_lessons.is_dir():
        raise FileNotFoundError(f"lessons: no chapter folder found (got {lessons!r}); pass the repository's lessons/")
    out.mkdir(parents=True, exist_ok=True)
    files = _copy_package(out / "rlkit")
    report = student_edition(out / "lessons", src_lessons)
    sets = _problem_sets(src_lessons / "problem_sets", out / "lessons" / "problem_sets")
    (out / "_build").mkdir()
    (out / "_build" / "rlkit_bundle_backend.py").write_text(
        _BACKEND.format(version=rlkit.__version__ if hasattr(rlkit, "__version__") else "0.3.0",
                        dependencies=_DEPENDENCIES), encoding="utf-8")
    (out / "pyproject.toml").write_text(_PYPROJECT.format(
        version=getattr(rlkit, "__version__", "0.3.0"), dependencies=json.dumps(_DEPENDENCIES)), encoding="utf-8")
    (out / "README.md").write_text(_README.format(name=out.name), encoding="utf-8")
    return {"files": files, "notebooks": len(report), "problem_sets": sets}
