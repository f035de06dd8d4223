"""rlkit: the small library behind the book *Reinforcement learning for large language models*.

Modules: ``utils`` (device, seeding, masked means), ``plots`` (the book's figure style),
``exercises`` (checkers for the exercises), and the math and trainers the chapters use.
"""
from rlkit._show import show

__version__ = "0.2.0"
__all__ = ["show", "__version__"]
