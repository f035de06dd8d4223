"""rlkit.widgets: figures pre-rendered over a grid of slider values, and the HTML that switches them.

Independent checks: the number of frames is the product of the grid's sizes, each frame decodes to
a PNG whose content depends on the values drawn, and the HTML holds one control per grid entry and
every frame under its index key. The browser test (tests/test_browser.py) moves a slider.
"""
from __future__ import annotations

import base64
import json
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from rlkit.widgets import live_figure, render_frames, static_html  # noqa: E402


def draw(a=1.0, kind="line"):
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1], [0, a], "-" if kind == "line" else "o")
    ax.set_ylim(0, 3)
    print("this is discarded")
    plt.show()


def test_one_frame_per_grid_point_each_a_png_of_its_values():
    frames = render_frames(draw, {"a": [0.5, 1.0, 2.0], "kind": ["line", "dots"]}, dpi=30)
    assert sorted(frames) == [(i, j) for i in range(3) for j in range(2)]
    pngs = {k: base64.b64decode(v.split(",", 1)[1]) for k, v in frames.items()}
    assert all(p[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs.values())
    assert len(set(pngs.values())) == 6                   # different values, different figures
    again = render_frames(draw, {"a": [0.5, 1.0, 2.0], "kind": ["line", "dots"]}, dpi=30)
    assert again == frames                                # reproducible
    assert plt.get_fignums() == []                        # every figure closed


def test_html_has_a_control_per_entry_and_every_frame():
    grid = {"a": [0.5, 1.0, 2.0], "kind": ["line", "dots"]}
    frames = render_frames(draw, grid, dpi=30)
    page = static_html(frames, grid, {"a": 1.0, "kind": "dots"}, labels={"a": "slope"})
    assert page.count('type="range"') == 1 and page.count("<select") == 1
    assert 'value="1"' in page and "slope" in page and "<option value=\"1\" selected>dots" in page
    data = json.loads(re.search(r'class="rlkit-live-frames">(.*?)</script>', page).group(1))
    assert sorted(data) == sorted(f"{i},{j}" for i in range(3) for j in range(2))
    assert re.search(r'<img class="rlkit-live-figure"[^>]+src="([^"]+)"', page).group(1) == frames[(1, 1)]
    assert "src=\"http" not in page and "cdn" not in page


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="max_frames"):
        render_frames(draw, {"a": list(range(10)), "kind": ["line"] * 10}, max_frames=20)
    with pytest.raises(ValueError, match="exactly one new figure"):
        render_frames(lambda a: None, {"a": [1]})
    with pytest.raises(TypeError, match="show must be"):
        render_frames(3, {"a": [1]})
    with pytest.raises(ValueError, match="dpi"):
        render_frames(draw, {"a": [1.0]}, dpi=5)
    frames = render_frames(draw, {"a": [1.0, 2.0]}, dpi=30)
    with pytest.raises(ValueError, match="not one of grid"):
        static_html(frames, {"a": [1.0, 2.0]}, {"a": 1.5})
    with pytest.raises(ValueError, match="missing grid points"):
        static_html({(0,): frames[(0,)]}, {"a": [1.0, 2.0]}, {"a": 1.0})


def test_live_figure_displays_the_widget_and_the_static_html(monkeypatch):
    widgets = pytest.importorskip("ipywidgets")
    shown = []
    import IPython.display

    monkeypatch.setattr(IPython.display, "display", lambda obj, raw=False: shown.append((obj, raw)))
    ui = live_figure(draw, {"a": widgets.FloatSlider(value=1.0, min=0.5, max=2.0, step=0.5),
                            "kind": widgets.Dropdown(options=["line", "dots"], value="line")},
                     grid={"a": [0.5, 1.0, 2.0]}, dpi=30)
    (bundle, raw), = shown
    assert raw and isinstance(ui, widgets.VBox) and len(ui.children) == 3
    assert "application/vnd.jupyter.widget-view+json" in bundle and "text/html" in bundle
    assert bundle["text/html"].count("data:image/png;base64,") == 6 + 1    # six frames + the first shown
    with pytest.raises(ValueError, match="grid\\['a'\\] is missing"):
        live_figure(draw, {"a": widgets.FloatSlider(value=1.0)})
    with pytest.raises(ValueError, match="not controls"):
        live_figure(draw, {"a": widgets.FloatSlider(value=1.0)}, grid={"b": [1]})
    plt.close("all")
