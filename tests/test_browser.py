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
import html as html_lib
import http.server
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from html.parser import HTMLParser
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


def _probe(browser, server, page: Path, attempts: int = 3, probe: str = PROBE, root: Path = HTML):
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
        url = f"{server}/{probe_page.relative_to(root).as_posix()}"
        for attempt in range(attempts):
            budget = 30000 * (attempt + 1)
            proc = _run_chromium(browser, ["--window-size=1280,1600", f"--virtual-time-budget={budget}",
                                           "--run-all-compositor-stages-before-draw",
                                           "--dump-dom", url], timeout=180)
            m = re.search(r'<pre id="rlkit-probe"[^>]*>(.*?)</pre>', proc.stdout, re.S)
            if m:
                return json.loads(html_lib.unescape(m.group(1)))
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


# ------------------------------------------------------------------ the student edition (issue 23, item 1)
#
# The student book (python -m rlkit.exercises.student book) renders the same sources with
# sphinx-exercise's hide_solutions, from the instructor build's cache, into _build/student/html.
# The oracle for "a solution survived": distinctive phrases of every {solution} block in the
# chapter notebooks (runs of six or more plain words of their prose, and their longest line of
# code), each one kept only if the instructor's page shows it (so a phrase that rendering changes
# cannot make the check vacuous), and none of them may appear anywhere in the student site.

STUDENT = ROOT / "_build" / "student"
STUDENT_HTML = STUDENT / "html"
LESSONS = ROOT / "lessons"
_SOLUTION_BLOCK = re.compile(r"^ {0,3}(`{3,}|~{3,}|:{3,})[ \t]*\{solution\}.*?$(.*?)^ {0,3}\1[ \t]*$",
                             re.S | re.M | re.I)


def _chapter_notebooks():
    return sorted(LESSONS.glob("[0-9][0-9]_*.ipynb"))


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


class _TextOf(HTMLParser):
    """The text of a page without scripts and styles; with ``drop_solutions``, without the solution
    elements (sphinx-exercise's ``class="solution ..."`` and everything inside them) too."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self, drop_solutions: bool):
        super().__init__(convert_charrefs=True)
        self.drop_solutions, self.skip, self.parts = drop_solutions, 0, []

    def handle_starttag(self, tag, attrs):
        if tag in self.VOID:
            return
        classes = (dict(attrs).get("class") or "").split()
        if self.skip or tag in ("script", "style") or (self.drop_solutions and "solution" in classes):
            self.skip += 1

    def handle_endtag(self, tag):
        if self.skip and tag not in self.VOID:
            self.skip -= 1

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


def _page_text(path: Path, drop_solutions: bool = False) -> str:
    """The visible text of a built page (scripts and styles dropped), whitespace squashed."""
    parser = _TextOf(drop_solutions)
    parser.feed(path.read_text(errors="replace"))
    parser.close()
    return _squash("".join(parser.parts))


def _solution_phrases(notebook: Path) -> list[list[str]]:
    """Per {solution} block of ``notebook``: its distinctive phrases (see above), before the control."""
    nb = json.loads(notebook.read_text())
    cells = [("".join(c["source"]), c["cell_type"]) for c in nb["cells"]]
    md = [src for src, kind in cells if kind == "markdown"]
    code = [src for src, kind in cells if kind == "code" and not src.lstrip().startswith("# Solutions")]
    outside = _squash(_SOLUTION_BLOCK.sub("", "\n".join(md)) + "\n" + "\n".join(code))
    found = []
    for block in (m.group(2) for text in md for m in _SOLUTION_BLOCK.finditer(text)):
        block = re.sub(r"^:\w+:.*$", "", block, flags=re.M)                    # the directive's options
        lines = [ln.strip() for f in re.findall(r"```\w*\n(.*?)```", block, re.S) for ln in f.splitlines()]
        prose = re.sub(r"```.*?```", " ", block, flags=re.S)
        prose = re.sub(r"\$\$.*?\$\$|\$[^$]*\$|\{[\w:-]+\}`[^`]*`|`[^`]*`", "|", prose, flags=re.S)
        runs = [_squash(r).strip(" ,.;:") for r in re.split(r"[|*_\[\]()\\{}<>\"'“”]|\n\s*\n", prose)]
        runs = sorted({r for r in runs if len(r.split()) >= 6 and r not in outside}, key=len, reverse=True)
        lines = sorted({_squash(ln) for ln in lines if len(ln) >= 30 and ln not in outside
                        and not ln.startswith("def ")}, key=len, reverse=True)
        found.append(runs[:3] + lines[:1])
    return found


@pytest.fixture(scope="module")
def student_book():
    """The student book, built once (strict: warnings are errors) from the instructor build's cache."""
    from rlkit.exercises.student import build_student_book, uncached_chapters

    missing = uncached_chapters(ROOT)
    if missing:
        pytest.fail(f"the instructor build's cache lacks {missing}: the student book reuses its outputs, so run "
                    f"the book build (tests/test_book.py, or jupyter-book build .) first")
    result = build_student_book(ROOT, STUDENT, strict=True)
    log = result["log"].read_text()
    assert result["returncode"] == 0, "the student book build failed:\n" + log[-4000:]
    print(f"student book built in {result['seconds']:.1f} s; left out: {result['dropped']}")
    return result


@pytest.fixture(scope="module")
def confirmed_phrases():
    """{chapter stem: phrases of its solutions that the instructor's book shows only in its solutions}.

    A phrase is kept if the chapter's instructor page shows it and no page of the instructor's book
    shows it outside a solution element (a loop a chapter also displays, a library docstring's
    words); every solution block must keep one."""
    if not (HTML / "lessons").is_dir():
        pytest.fail("the instructor's book is not built (_build/html/lessons missing): run the book build first")
    elsewhere = " | ".join(_page_text(p, drop_solutions=True) for p in sorted(HTML.rglob("*.html"))
                           if "_static" not in p.parts and not p.name.startswith("_probe_"))
    out, problems = {}, []
    for nb in _chapter_notebooks():
        page = _page_text(HTML / "lessons" / f"{nb.stem}.html")
        kept = []
        for i, phrases in enumerate(_solution_phrases(nb)):
            shown = [p for p in phrases if p in page and p not in elsewhere]
            if not shown:
                problems.append(f"{nb.stem}, solution {i + 1}: none of {phrases} is on the instructor's page "
                                f"in its solution only")
            kept += shown
        out[nb.stem] = kept
    assert not problems, "the oracle found no phrase to look for:\n" + "\n".join(problems)
    assert sum(map(len, out.values())) >= 2 * 87
    return out


def test_the_student_book_is_built_from_the_cache_and_leaves_the_instructors_pages_out(student_book):
    assert not student_book["executed"], f"the student build executed chapters again: {student_book['executed']}"
    for nb in _chapter_notebooks():
        assert (STUDENT_HTML / "lessons" / f"{nb.stem}.html").exists(), f"no student page for {nb.name}"
    assert not list(STUDENT_HTML.rglob("*quiz_bank*")) and not (STUDENT_HTML / "book" / "instructor").exists()
    title = re.compile(r"<title>[^<]*student edition[^<]*</title>")
    assert not title.search((HTML / "book" / "intro.html").read_text())
    assert title.search((STUDENT_HTML / "book" / "intro.html").read_text())


def test_the_student_site_holds_no_solution_anywhere(student_book, confirmed_phrases):
    """No solution phrase, solution element, solution cell, quiz answer or solutions module in any file."""
    quiz = (ROOT / "book" / "instructor" / "quiz_bank.md").read_text()
    answers = [_squash(a) for a in re.findall(r"^\*Answer\.\*(.{40,}?)$", quiz, re.M)][:20]
    assert answers, "no answers found in the quiz bank"
    forbidden = {p: stem for stem, phrases in confirmed_phrases.items() for p in phrases}
    leaks = []
    for path in sorted(p for p in STUDENT_HTML.rglob("*") if p.is_file()):
        if path.suffix not in (".html", ".js", ".txt", ".ipynb", ".md", ".json", ".inv") or "_static" in path.parts:
            continue
        raw = path.read_text(errors="replace")
        text = _page_text(path) if path.suffix == ".html" else _squash(raw)
        if path.suffix == ".ipynb":       # the downloadable student editions: markdown and code, no outputs
            nb = json.loads(raw)
            text = _squash("\n".join("".join(c["source"]) for c in nb["cells"]))
            assert nb["metadata"].get("rlkit", {}).get("edition") == "student", path
        name = path.relative_to(STUDENT_HTML).as_posix()
        leaks += [f"{name}: solution text of {forbidden[p]}: {p[:80]!r}" for p in forbidden if p in text]
        leaks += [f"{name}: quiz answer {a[:60]!r}" for a in answers if a in text]
        if re.search(r'class="[^"]*\bsolution\b', raw) or "Solution to Exercise" in text:
            leaks.append(f"{name}: a solution element")
        if re.search(r"# Solutions\b[^<\n]{0,40}checked", raw):     # the first line of every chapter's solution cell
            leaks.append(f"{name}: a chapter's solution cell")
        if re.search(r'id="rlkit\.exercises\.solutions\b', raw):
            leaks.append(f"{name}: documents rlkit.exercises.solutions")
    assert not leaks, f"{len(leaks)} leaks in the student site:\n" + "\n".join(leaks[:30])
    # the instructor's build does show them (the checks above could fail)
    assert re.search(r'class="[^"]*\bsolution\b', (HTML / "lessons" / "02_advantage_gae.html").read_text())


@pytest.fixture(scope="module")
def student_server(student_book):
    handler = functools.partial(_QuietHandler, directory=str(STUDENT_HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


STUDENT_PROBE = """
<script>
(function () {
  window.addEventListener('load', function () {
    var wait = (window.MathJax && MathJax.startup && MathJax.startup.promise) || Promise.resolve();
    wait.then(function () {
      setTimeout(function () {
        var main = document.querySelector('main') || document.body;
        // open every dropdown and <details>, so that hidden content would be in innerText too
        main.querySelectorAll('details').forEach(function (d) { d.open = true; });
        var r = {
          exercises: main.querySelectorAll('.exercise').length,
          solutions: main.querySelectorAll('.solution, [id*="-solution-"], #solution-content').length,
          solution_titles: (main.innerText.match(/Solution to Exercise/g) || []).length,
          answer_dropdowns: Array.prototype.slice
            .call(main.querySelectorAll('details summary, .dropdown .admonition-title'))
            .map(function (e) { return e.innerText.trim(); })
            .filter(function (t) { return /solution/i.test(t); }),
          text: main.innerText
        };
        var pre = document.createElement('pre');
        pre.id = 'rlkit-probe';
        pre.textContent = JSON.stringify(r);
        document.body.appendChild(pre);
      }, 500);
    });
  });
})();
</script>
"""


#: The student pages Chromium opens: the appendix (whose self-test keeps its "Answer" dropdowns) and
#: two chapters of each part. A page costs about 4-10 s of Chromium on two busy cores; every page and
#: every other file of the student site is searched for the same phrases without a browser above.
STUDENT_BROWSER_CHAPTERS = ("00_prerequisites", "02_advantage_gae", "07_tiny_llm", "12_clipping_staleness",
                            "16_offpolicy_multistep", "21_offline_rl_ope")


def test_student_pages_in_a_browser_show_no_solution(browser, student_server, confirmed_phrases):
    """Chromium opens student chapter pages: exercises, but no solution element, title or text."""
    import time

    problems, start = [], time.monotonic()
    for stem in STUDENT_BROWSER_CHAPTERS:
        nb = LESSONS / f"{stem}.ipynb"
        page = STUDENT_HTML / "lessons" / f"{nb.stem}.html"
        r = _probe(browser, student_server, page, probe=STUDENT_PROBE, root=STUDENT_HTML)
        text = _squash(r["text"])
        shown = [p for p in confirmed_phrases[nb.stem] if p in text]
        print(f"{nb.stem}: {r['exercises']} exercises, {r['solutions']} solution elements, "
              f"{len(shown)} of {len(confirmed_phrases[nb.stem])} solution phrases shown")
        if r["exercises"] < 3:
            problems.append(f"{nb.stem}: {r['exercises']} exercises rendered (expected 3 or more)")
        if r["solutions"] or r["solution_titles"] or r["answer_dropdowns"]:
            problems.append(f"{nb.stem}: solution elements {r['solutions']}, titles {r['solution_titles']}, "
                            f"dropdowns {r['answer_dropdowns']}")
        problems += [f"{nb.stem}: shows {p[:80]!r}" for p in shown]
    print(f"{len(STUDENT_BROWSER_CHAPTERS)} student pages in {time.monotonic() - start:.1f} s")
    assert not problems, "\n".join(problems)
