"""The book's figure style and two plotting helpers used across chapters."""
from __future__ import annotations

import numpy as np
import torch

from . import _validate as V

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]

_STYLE = {
    "figure.figsize": (6.4, 3.8),
    "figure.dpi": 100,
    "savefig.dpi": 110,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "legend.fontsize": 9,
    "legend.frameon": False,
    "font.size": 10,
    "lines.linewidth": 1.8,
}


def use_book_style() -> None:
    """Apply the book's matplotlib style (light grid, no top/right spines, a fixed palette)."""
    import matplotlib as mpl
    from cycler import cycler

    mpl.rcParams.update(_STYLE)
    mpl.rcParams["axes.prop_cycle"] = cycler(color=COLORS)


def mean_band(ax, x, ys, label=None, color=None, band="minmax", alpha=0.2, **line_kw):
    """Plot the mean of ``ys`` over seeds as a line and a band around it.

    ``x`` has shape ``[points]`` and ``ys`` shape ``[seeds, points]``. ``band`` is
    ``"minmax"`` (the range over seeds), ``"std"`` (mean +- one standard deviation) or
    ``"sem"`` (mean +- one standard error). Returns the line.
    """
    x = np.asarray(x, dtype=float)
    ys = np.asarray(ys, dtype=float)
    V.layout("points", V.layout("seeds points", ys=torch.from_numpy(ys)), x=torch.from_numpy(x))
    V.int_in(ys.shape[0], "the number of seeds, ys.shape[0],")
    V.choice(band, "band", ["minmax", "std", "sem"])
    mean = np.nanmean(ys, axis=0)
    if band == "minmax":
        lo, hi = np.nanmin(ys, axis=0), np.nanmax(ys, axis=0)
    elif band == "std":
        s = np.nanstd(ys, axis=0)
        lo, hi = mean - s, mean + s
    else:                                                   # "sem"
        s = np.nanstd(ys, axis=0) / np.sqrt(max(1, ys.shape[0]))
        lo, hi = mean - s, mean + s
    (line,) = ax.plot(x, mean, label=label, color=color, **line_kw)
    ax.fill_between(x, lo, hi, color=line.get_color(), alpha=alpha, linewidth=0)
    return line


def smooth(y, window: int = 10):
    """Trailing moving average (the first points average over what is available)."""
    y = np.asarray(y, dtype=float)
    V.int_in(window, "window")
    c = np.cumsum(np.insert(y, 0, 0.0))
    out = np.empty_like(y)
    for i in range(len(y)):
        lo = max(0, i + 1 - window)
        out[i] = (c[i + 1] - c[lo]) / (i + 1 - lo)
    return out
