r"""Sliders that work in Jupyter *and* in the static HTML book.

A chapter's interactive figure is a function ``show(**values)`` that draws one matplotlib figure,
and a set of ipywidgets controls for its arguments. In Jupyter, with a kernel, the figure is
redrawn whenever a control moves. The HTML book has no kernel, so there a slider can only switch
between figures drawn in advance. :func:`live_figure` does both from one call:

* it builds a widget of the controls and an output area, which Jupyter renders and runs live
  (moving a control calls ``show`` again, as ``ipywidgets.interactive`` does);
* it draws ``show`` once for every point of a small grid of control values (the product of the
  values given for each control) and adds, as the same output's ``text/html``, the grid's
  figures as PNG images with range inputs (and drop-downs) and a few lines of local JavaScript
  that show the figure of the chosen point.

The output is one display bundle with both representations. Jupyter prefers the widget view;
the book's ``_config.yml`` (``nb_mime_priority_overrides``) makes the HTML build prefer the
pre-rendered ``text/html``. Nothing is loaded from the network. The HTML costs about the grid's
number of figures times the size of one PNG: 6 to 16 kB for the book's figures at the default
``dpi`` (a palette of 64 colours), so 80 to 260 kB for a grid of 9 to 19 figures; the number of
figures is capped by ``max_frames``.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import html
import io
import itertools
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence

__all__ = ["live_figure", "render_frames", "static_html"]

_ID = itertools.count()


def _grid_values(name: str, control, values) -> list:
    """The grid values of one control: given, or the options of a selection widget."""
    if values is not None:
        vals = list(values)
    elif hasattr(control, "options") and not isinstance(control, str):
        opts = control.options
        vals = [o[1] if isinstance(o, tuple) else o for o in (opts.items() if isinstance(opts, dict) else opts)]
    else:
        raise ValueError(f"grid[{name!r}] is missing: give the values to pre-render for the control {name!r} "
                         f"(a slider with a continuous range has no finite list of its own)")
    if not vals:
        raise ValueError(f"grid[{name!r}] must list at least one value, got none")
    return vals


def render_frames(show: Callable, grid: Mapping[str, Sequence], *, dpi: int = 72,
                  max_frames: int = 48) -> dict[tuple, str]:
    r"""Draw ``show(**point)`` at every point of the grid; return PNG data URLs keyed by index tuples.

    The grid is the product :math:`\prod_c \text{grid}[c]` over the controls ``c`` in order; the
    key of a point is the tuple of its indices. ``plt.show`` is a no-op while ``show`` runs and
    what it prints is discarded; the figure it leaves open is saved (as a PNG with a palette of 64
    colours, about a quarter of the size of matplotlib's full-colour PNG) and closed.

    Args:
        show: a function of the controls' names that draws one matplotlib figure.
        grid: ``{control name: values}``, each a non-empty sequence.
        dpi: resolution of the PNGs, an int in ``[20, 300]``.
        max_frames: the most figures to draw, an int >= 1 (a larger grid raises ``ValueError``).

    Returns:
        ``{(i_1, ..., i_C): "data:image/png;base64,..."}``. Chapter: 03_importance_sampling.
    """
    import matplotlib.pyplot as plt

    if not callable(show):
        raise TypeError(f"show must be a function that draws a figure, got {type(show).__name__}")
    if not isinstance(grid, Mapping) or not grid:
        raise ValueError(f"grid must be a non-empty mapping of control names to values, got {grid!r}")
    if not isinstance(dpi, int) or not 20 <= dpi <= 300:
        raise ValueError(f"dpi must be an int in [20, 300], got {dpi!r}")
    if not isinstance(max_frames, int) or max_frames < 1:
        raise ValueError(f"max_frames must be an int >= 1, got {max_frames!r}")
    sizes = [len(v) for v in grid.values()]
    if any(s == 0 for s in sizes):
        raise ValueError(f"every grid entry must list at least one value, got sizes {sizes}")
    total = math.prod(sizes)
    if total > max_frames:
        raise ValueError(f"grid has {total} points ({' x '.join(map(str, sizes))}), more than max_frames="
                         f"{max_frames}: give fewer values per control")
    names = list(grid)
    frames = {}
    real_show = plt.show
    try:
        plt.show = lambda *a, **k: None
        for idx in itertools.product(*(range(s) for s in sizes)):
            before = set(plt.get_fignums())
            with contextlib.redirect_stdout(io.StringIO()):
                show(**{n: grid[n][i] for n, i in zip(names, idx)})
            new = [n for n in plt.get_fignums() if n not in before]
            if len(new) != 1:
                for n in new:
                    plt.close(n)
                raise ValueError(f"show must draw exactly one new figure per call, drew {len(new)} at "
                                 f"{dict(zip(names, idx))}")
            fig = plt.figure(new[0])
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=dpi)
            plt.close(fig)
            frames[idx] = "data:image/png;base64," + base64.b64encode(_palette_png(buf.getvalue())).decode("ascii")
    finally:
        plt.show = real_show
    return frames


def _palette_png(png: bytes, colors: int = 64) -> bytes:
    """The same image with a palette of ``colors`` colours: about a quarter of the bytes for a line plot."""
    from PIL import Image  # a dependency of matplotlib

    img = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=colors, method=Image.Quantize.MEDIANCUT)
    out = io.BytesIO()
    img.save(out, format="png", optimize=True)
    return out.getvalue()


def _label(control, name: str) -> str:
    desc = getattr(control, "description", "") or name
    return html.escape(str(desc))


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def static_html(frames: Mapping[tuple, str], grid: Mapping[str, Sequence], defaults: Mapping[str, object],
                labels: Mapping[str, str] | None = None, alt: str = "interactive figure") -> str:
    """The HTML of a pre-rendered figure: one control per grid entry and the figure of the chosen point.

    Args:
        frames: from :func:`render_frames`, keyed by index tuples.
        grid: the same grid, ``{name: values}``.
        defaults: the value each control starts at; it must be one of the grid's values.
        labels: text shown before each control (default: its name).
        alt: the images' alt text.

    Returns:
        an HTML fragment with an inline script; it needs nothing from the network.
        Chapter: 03_importance_sampling.
    """
    names = list(grid)
    start = []
    for n in names:
        vals = list(grid[n])
        if n not in defaults:
            raise ValueError(f"defaults must give a start value for {n!r}")
        matches = [i for i, v in enumerate(vals) if v == defaults[n]
                   or (isinstance(v, float) and isinstance(defaults[n], (int, float))
                       and math.isclose(v, defaults[n], rel_tol=1e-9, abs_tol=1e-12))]
        if not matches:
            raise ValueError(f"defaults[{n!r}] = {defaults[n]!r} is not one of grid[{n!r}] = {vals}: the "
                             f"page would open on a figure that was not drawn")
        start.append(matches[0])
    keyed = {",".join(map(str, k)): v for k, v in frames.items()}
    digest = hashlib.sha1(json.dumps([names, sorted(keyed.items())]).encode()).hexdigest()[:10]
    uid = f"rlkit-live-{next(_ID)}-{digest}"            # unique on a page, the same on every run
    missing = [k for k in itertools.product(*(range(len(grid[n])) for n in names))
               if ",".join(map(str, k)) not in keyed]
    if missing:
        raise ValueError(f"frames is missing grid points {missing[:3]}")
    labels = labels or {}
    rows = []
    for j, n in enumerate(names):
        vals = list(grid[n])
        text = html.escape(labels.get(n, n))
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            rows.append(f'<label style="display:inline-block;margin-right:1.5em">{text} '
                        f'<input type="range" class="rlkit-live-input" data-axis="{j}" min="0" '
                        f'max="{len(vals) - 1}" step="1" value="{start[j]}" style="vertical-align:middle"> '
                        f'<output>{html.escape(_fmt(vals[start[j]]))}</output></label>')
        else:
            opts = "".join(f'<option value="{i}"{" selected" if i == start[j] else ""}>{html.escape(_fmt(v))}'
                           f'</option>' for i, v in enumerate(vals))
            rows.append(f'<label style="display:inline-block;margin-right:1.5em">{text} '
                        f'<select class="rlkit-live-input" data-axis="{j}">{opts}</select></label>')
    values_js = json.dumps([[_fmt(v) for v in grid[n]] for n in names])
    first = keyed[",".join(map(str, start))]
    return (f'<div class="rlkit-live" id="{uid}">'
            f'<div class="rlkit-live-controls">{"".join(rows)}</div>'
            f'<img class="rlkit-live-figure" alt="{html.escape(alt)}" src="{first}" style="max-width:100%">'
            f'<script type="application/json" class="rlkit-live-frames">{json.dumps(keyed)}</script>'
            f'<script>(function () {{'
            f'var root = document.getElementById("{uid}");'
            f'var frames = JSON.parse(root.querySelector(".rlkit-live-frames").textContent);'
            f'var values = {values_js};'
            f'var inputs = root.querySelectorAll(".rlkit-live-input");'
            f'var img = root.querySelector(".rlkit-live-figure");'
            f'function update() {{ var key = [];'
            f'  inputs.forEach(function (el) {{ var i = parseInt(el.value, 10); key.push(i);'
            f'    var out = el.parentNode.querySelector("output");'
            f'    if (out) out.textContent = values[parseInt(el.dataset.axis, 10)][i]; }});'
            f'  var src = frames[key.join(",")]; if (src) img.src = src; }}'
            f'inputs.forEach(function (el) {{ el.addEventListener("input", update);'
            f' el.addEventListener("change", update); }});'
            f'}})();</script></div>')


def _default_png(show: Callable, values: Mapping[str, object]) -> bytes:
    """``show(**values)`` as a full-colour PNG at the figure's own resolution (the live widget's first figure)."""
    import matplotlib.pyplot as plt

    real_show = plt.show
    try:
        plt.show = lambda *a, **k: None
        before = set(plt.get_fignums())
        with contextlib.redirect_stdout(io.StringIO()):
            show(**values)
        new = [n for n in plt.get_fignums() if n not in before]
        fig = plt.figure(new[-1])
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        for n in new:
            plt.close(n)
    finally:
        plt.show = real_show
    return buf.getvalue()


def live_figure(show: Callable, controls: Mapping[str, object], grid: Mapping[str, Sequence] | None = None, *,
                dpi: int = 72, max_frames: int = 48, alt: str | None = None):
    """Display ``show`` with controls that are live in Jupyter and pre-rendered in the HTML book.

    In Jupyter the controls and an output area form one widget; moving a control redraws the
    figure in the output area, as ``ipywidgets.interactive`` does. The first figure is put in the
    output area as data (``Output.append_display_data``) rather than drawn by a call of ``show``
    inside it, so that it is not also recorded as a separate output of the cell when the notebook
    is executed without a browser (as nbval and the book build do).

    Args:
        show: draws one matplotlib figure from keyword arguments named like ``controls``.
        controls: ``{argument name: ipywidgets control}``, as for ``ipywidgets.interactive``.
        grid: ``{argument name: values}`` to pre-render for the HTML book; a selection control
            (``SelectionSlider``, ``Dropdown``) defaults to its options, every other control must
            be given. Each control's current value must be one of its grid values.
        dpi, max_frames: as in :func:`render_frames`.
        alt: alt text of the images (default: the function's name).

    Returns:
        the widget (an ``ipywidgets.VBox`` of the controls and the output area), already
        displayed. Chapter: 03_importance_sampling.
    """
    import ipywidgets as widgets
    from IPython.display import Image, clear_output, display

    if not callable(show):
        raise TypeError(f"show must be a function that draws a figure, got {type(show).__name__}")
    if not isinstance(controls, Mapping) or not controls:
        raise ValueError(f"controls must be a non-empty mapping of argument names to widgets, got {controls!r}")
    bad = [n for n, c in controls.items() if not isinstance(c, widgets.ValueWidget)]
    if bad:
        raise TypeError(f"controls[{bad[0]!r}] must be an ipywidgets control with a value, got "
                        f"{type(controls[bad[0]]).__name__}")
    grid = dict(grid or {})
    unknown = [n for n in grid if n not in controls]
    if unknown:
        raise ValueError(f"grid names {unknown} are not controls; the controls are {list(controls)}")
    full = {n: _grid_values(n, c, grid.get(n)) for n, c in controls.items()}
    defaults = {n: c.value for n, c in controls.items()}
    frames = render_frames(show, full, dpi=dpi, max_frames=max_frames)
    labels = {n: html.unescape(re.sub(r"\s+", " ", _label(c, n))) for n, c in controls.items()}
    page = static_html(frames, full, defaults, labels=labels,
                       alt=alt or getattr(show, "__name__", "interactive figure"))

    out = widgets.Output()
    out.append_display_data(Image(data=_default_png(show, defaults), format="png"))

    def redraw(change=None):
        with out:
            clear_output(wait=True)
            show(**{n: c.value for n, c in controls.items()})

    for c in controls.values():
        c.observe(redraw, "value")
    ui = widgets.VBox([*controls.values(), out])
    bundle = dict(ui._repr_mimebundle_())
    bundle["text/html"] = page
    display(bundle, raw=True)
    return ui
