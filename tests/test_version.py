"""One version source: pyproject.toml, read back through the installed package's metadata."""
import re
from pathlib import Path

import rlkit


def test_version_comes_from_pyproject():
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]
    want = re.search(r'^version\s*=\s*"([^"]+)"', project, re.M).group(1)
    assert rlkit.__version__ == want, (
        f"rlkit.__version__ is {rlkit.__version__} but pyproject.toml says {want}: "
        f"the installed metadata is stale, run `pip install -e .` again")
