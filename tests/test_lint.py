"""The repository is clean under its one ruff style (pyproject.toml, [tool.ruff]), notebooks included.

To see and fix what this reports:  ruff check .   then   ruff check --fix .
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _ruff() -> list[str]:
    exe = Path(sys.executable).with_name("ruff")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("ruff")
    assert found, "ruff is not installed: pip install -r requirements.txt"
    return [found]


def test_ruff_finds_the_notebooks():
    """The configuration covers the chapters: ruff lists every notebook in lessons/."""
    proc = subprocess.run(_ruff() + ["check", "--show-files", "."], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    listed = {Path(line.strip()).resolve() for line in proc.stdout.splitlines() if line.strip()}
    notebooks = sorted((ROOT / "lessons").glob("*.ipynb"))
    assert notebooks
    missing = [nb.name for nb in notebooks if nb.resolve() not in listed]
    assert not missing, f"ruff does not check these notebooks: {missing}\n{proc.stderr}"
    assert (ROOT / "rlkit" / "returns.py").resolve() in listed


def test_ruff_is_clean():
    proc = subprocess.run(_ruff() + ["check", "--no-fix", "--output-format", "concise", "."], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, "ruff check . found problems:\n" + proc.stdout[-6000:] + proc.stderr[-2000:]
