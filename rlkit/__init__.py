"""rlkit: the small library behind the book *Reinforcement learning for large language models*.

Modules: ``utils`` (device, seeding, masked means), ``plots`` (the book's figure style),
``exercises`` (checkers for the exercises), and the math and trainers the chapters use.
"""
import importlib.metadata as _metadata

from rlkit._show import show

# The one version source is pyproject.toml; the installed metadata carries it here. An
# editable install records the version when it is installed: after changing it, run
# `pip install -e .` again (tests/test_version.py checks the two agree).
try:
    __version__ = _metadata.version("rlkit")
except _metadata.PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"
__all__ = ["show", "__version__"]
