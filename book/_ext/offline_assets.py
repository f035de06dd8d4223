"""Serve MathJax and the ipywidgets HTML manager from the build, not from CDNs.

Jupyter Book 1.x (through Sphinx and myst-nb) points both at CDNs by default; offline,
math stays raw and widgets render empty. This extension copies ``book/_vendor`` into
``<outdir>/_static/vendor`` and points ``mathjax_path`` and myst-nb's ``nb_ipywidgets_js``
at the copies. The files live outside any ``_static`` source folder on purpose: Jupyter
Book adds every ``.js`` file found there to every page, which would load them twice.

It also adds ``rlkit-layout.css`` (next to this file) to every page: a display equation wider than
the text column scrolls inside the column instead of being cut at its edge.
"""
from __future__ import annotations

import shutil
from pathlib import Path

VENDOR = Path(__file__).resolve().parent.parent / "_vendor"
LAYOUT_CSS = Path(__file__).resolve().parent / "rlkit-layout.css"

MATHJAX = "vendor/mathjax/tex-svg-full.js"
WIDGETS_JS = {
    "vendor/requirejs/require.js": {},
    # data-jupyter-widgets-cdn-only is not set: core widgets are bundled in embed-amd.js.
    "vendor/html-manager/embed-amd.js": {},
}


def _configure(app, config):
    config.mathjax_path = MATHJAX
    config.nb_ipywidgets_js = dict(WIDGETS_JS)


def _copy(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    target = Path(app.outdir) / "_static" / "vendor"
    for sub in ("mathjax", "html-manager", "requirejs"):
        src = VENDOR / sub
        if not src.is_dir():
            raise FileNotFoundError(f"offline_assets: {src} is missing; run book/_vendor/fetch.sh")
        shutil.copytree(src, target / sub, dirs_exist_ok=True)
    shutil.copyfile(LAYOUT_CSS, Path(app.outdir) / "_static" / LAYOUT_CSS.name)


def setup(app):
    # priority > 500 so that this runs after myst-nb and jupyter-book set their defaults
    app.connect("config-inited", _configure, priority=900)
    app.connect("build-finished", _copy)
    app.add_css_file(LAYOUT_CSS.name)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1.0"}
