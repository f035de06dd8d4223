"""Open built pages in a real browser (headless Chromium) and check what a reader sees.

For each chapter page (and the notation page) the test serves `_build/html` on 127.0.0.1,
loads a copy of the page with a small probe script appended, and reads the probe's report
from the rendered DOM, in a 1280-pixel-wide window: MathJax typeset the math (no raw `$$`, no
MathJax errors, no display equation cut at the right edge of the text column), every
figure image loaded, and ipywidgets rendered from the saved widget state. It also saves a
screenshot of chapter 1 under `_build/screenshots/`.

Without Chromium the test skips with a message on a reader's machine, and fails in CI
(`CI` set), where `.ci/run` installs Debian's `chromium`.
"""
from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars"]

PROBE = """
<script>
(function () {
  // display equations whose typeset width runs past the right edge of the text column with no
  // ancestor (up to <main>) that scrolls sideways: the reader sees them cut off
  function cutEquations(main) {
    var col = main.querySelector('article') || main;     // the text column, not the page's right sidebar
    var edge = col.getBoundingClientRect().right, cut = [];
    main.querySelectorAll('mjx-container[display="true"]').forEach(function (el) {
      var svg = el.querySelector('svg');
      if (!svg || svg.getBoundingClientRect().right <= edge + 1) return;
      for (var a = el; a && a !== main; a = a.parentElement) {
        var ox = getComputedStyle(a).overflowX;
        if ((ox === 'auto' || ox === 'scroll') && a.getBoundingClientRect().right <= edge + 1) return;
      }
      var box = el.closest('div.math');
      cut.push((box && box.id) || (el.textContent || '').slice(0, 40));
    });
    return cut;
  }
  function report() {
    var main = document.querySelector('main') || document.body;
    var imgs = Array.prototype.slice.call(main.querySelectorAll('img'));
    var text = main.innerText || '';
    var r = {
      math: main.querySelectorAll('mjx-container').length,
      math_errors: main.querySelectorAll('mjx-merror, [data-mjx-error]').length,
      raw_display_math: (text.match(/\\$\\$/g) || []).length,
      images: imgs.length,
      images_broken: imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); })
                         .map(function (i) { return i.getAttribute('src'); }),
      widget_views: main.querySelectorAll('.jupyter-widgets, .widget-slider, .widget-inline-hbox').length,
      widget_scripts: main.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]').length,
      math_cut: cutEquations(main)
    };
    var pre = document.createElement('pre');
    pre.id = 'rlkit-probe';
    pre.textContent = JSON.stringify(r);
    document.body.appendChild(pre);
  }
  window.addEventListener('load', function () {
    var wait = (window.MathJax && MathJax.startup && MathJax.startup.promise) || Promise.resolve();
    wait.then(function () { setTimeout(report, 1500); });
  });
})();
</script>
"""


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def browser():
    path = _chromium()
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is not installed; .ci/run must install Debian's 'chromium' package")
        pytest.skip("headless Chromium not found: install it (Debian/Ubuntu: apt install chromium) "
                    "to run the browser checks")
    if not (HTML / "index.html").exists():
        pytest.fail("the book is not built (_build/html/index.html missing): run the book build first")
    return path


@pytest.fixture(scope="module")
def server():
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _run_chromium(browser, args, timeout=120):
    with tempfile.TemporaryDirectory() as profile:
        cmd = [browser, *FLAGS, f"--user-data-dir={profile}", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _probe(browser, server, page: Path, attempts: int = 3, probe: str = PROBE):
    """Load `page` with the probe appended and return the probe's report.

    The report is read from a ``<pre id="rlkit-probe">`` that the probe appends. The book's theme
    gives every ``<pre>`` a ``tabindex`` once its own scripts have run, so the tag is matched with
    any attributes: an exact match of ``<pre id="rlkit-probe">`` failed whenever the theme's script
    ran after the probe (CI failed that way on chapter 4). A page that still does not report (the
    DOM dumped before the load event, on a busy machine) is loaded again with a larger
    virtual-time budget, up to `attempts` times. A page whose math, figures or widgets are broken
    reports every time and fails the checks below.
    """
    probe_page = page.with_name("_probe_" + page.name)
    html = page.read_text()
    probe_page.write_text(html.replace("</body>", probe + "</body>"))
    errors = []
    try:
        url = f"{server}/{probe_page.relative_to(HTML).as_posix()}"
        for attempt in range(attempts):
            budget = 30000 * (attempt + 1)
            proc = _run_chromium(browser, ["--window-size=1280,1600", f"--virtual-time-budget={budget}",
                                           "--run-all-compositor-stages-before-draw",
                                           "--dump-dom", url], timeout=180)
            m = re.search(r'<pre id="rlkit-probe"[^>]*>(.*?)</pre>', proc.stdout, re.S)
            if m:
                return json.loads(m.group(1).replace("&quot;", '"'))
            errors.append(f"attempt {attempt + 1} (virtual-time budget {budget} ms), exit "
                          f"{proc.returncode}, {len(proc.stdout)} bytes of DOM; stderr tail:\n"
                          f"{proc.stderr[-800:]}")
    finally:
        probe_page.unlink()
    raise AssertionError(f"the probe did not report for {page.name} in {attempts} loads:\n"
                         + "\n".join(errors))


SLIDER_PROBE = """
<script>
(function () {
  window.addEventListener('load', function () {
    setTimeout(function () {
      var out = [];
      try {
        document.querySelectorAll('.rlkit-live').forEach(function (root) {
          var img = root.querySelector('img.rlkit-live-figure');
          var input = root.querySelector('input[type=range].rlkit-live-input');
          var frames = JSON.parse(root.querySelector('.rlkit-live-frames').textContent);
          var r = {frames: Object.keys(frames).length, loaded: img.complete && img.naturalWidth > 0};
          if (input) {
            var before = img.src, label = input.parentNode.querySelector('output').textContent;
            input.value = String((parseInt(input.value, 10) + 1) % (parseInt(input.max, 10) + 1));
            input.dispatchEvent(new Event('input', {bubbles: true}));
            r.changed = img.src !== before;
            r.label_changed = input.parentNode.querySelector('output').textContent !== label;
          }
          out.push(r);
        });
      } catch (err) {
        out = {error: String(err)};
      }
      var pre = document.createElement('pre');
      pre.id = 'rlkit-probe';
      pre.textContent = JSON.stringify(out);
      document.body.appendChild(pre);
    }, 500);
  });
})();
</script>
"""

#: The chapters whose interactive figures are pre-rendered (rlkit.widgets.live_figure), so their
#: sliders work in the HTML book without a kernel. book/setup.md lists the same chapters.
# every chapter with a slider: they are all pre-rendered live figures (chapter 1's was an ipywidget,
# which the HTML book showed without a kernel to move it)
LIVE_CHAPTERS = ("01_policy_gradient", "02_advantage_gae", "03_importance_sampling", "04_kl_trpo_ppo",
                 "05_onpolicy_offpolicy_drift", "06_entropy_kl_lr", "07_tiny_llm", "08_why_offpolicy",
                 "09_single_policy_bound", "10_static_mixtures", "11_dynamic_mixing", "12_clipping_staleness",
                 "13_engineering_checklist")


def _pages():
    pages = sorted((HTML / "lessons").glob("[0-9]*.html")) if (HTML / "lessons").exists() else []
    notation = HTML / "book" / "notation.html"
    return pages + ([notation] if notation.exists() else [])


def test_chapter_pages_render_math_figures_and_widgets(browser, server):
    pages = _pages()
    assert pages, "no chapter pages in _build/html/lessons"
    problems = []
    for page in pages:
        r = _probe(browser, server, page)
        name = page.relative_to(HTML).as_posix()
        print(f"{name}: {r}")
        if r["math"] == 0:
            problems.append(f"{name}: no typeset math (MathJax did not run?)")
        if r["math_errors"]:
            problems.append(f"{name}: {r['math_errors']} MathJax errors (undefined macro or bad TeX)")
        if r["raw_display_math"]:
            problems.append(f"{name}: {r['raw_display_math']} raw '$$' left in the text")
        if r.get("math_cut"):
            problems.append(f"{name}: display equations cut at the right edge at 1280 px: {r['math_cut'][:5]}")
        if r["images_broken"]:
            problems.append(f"{name}: images that did not load: {r['images_broken'][:5]}")
        if page.parent.name == "lessons" and r["images"] == 0:
            problems.append(f"{name}: a chapter without a single figure")
        if r["widget_scripts"] and r["widget_views"] == 0:
            problems.append(f"{name}: {r['widget_scripts']} widget outputs but none rendered")
    assert not problems, "\n".join(problems)


def test_sliders_change_the_figure_without_a_kernel(browser, server):
    """In each chapter with pre-rendered figures, moving a slider in Chromium shows another figure."""
    for stem in LIVE_CHAPTERS:
        page = HTML / "lessons" / f"{stem}.html"
        assert page.exists(), f"{stem} is not built"
        size_kb = page.stat().st_size / 1024
        report = _probe(browser, server, page, probe=SLIDER_PROBE)
        print(f"{stem}: {len(report)} live figure(s), page {size_kb:.0f} kB: {report}")
        assert not isinstance(report, dict), f"{stem}: the probe failed: {report}"
        assert report, f"{stem}: no pre-rendered interactive figure in the page"
        for r in report:
            assert r["loaded"] and r["frames"] >= 2, (stem, r)
            assert r["changed"] and r["label_changed"], f"{stem}: moving the slider did not change the figure: {r}"


def test_screenshot_of_a_chapter(browser, server):
    pages = sorted((HTML / "lessons").glob("01_*.html")) or _pages()
    SHOTS.mkdir(parents=True, exist_ok=True)
    shot = SHOTS / (pages[0].stem + ".png")
    url = f"{server}/{pages[0].relative_to(HTML).as_posix()}"
    _run_chromium(browser, ["--window-size=1280,1600", "--virtual-time-budget=20000",
                            f"--screenshot={shot}", url])
    assert shot.exists() and shot.stat().st_size > 20_000, f"screenshot {shot} missing or blank"
