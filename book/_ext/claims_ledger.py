"""The claims ledger: a page built from the executed chapters, listing every claim their check cells test.

A check cell that calls ``rlkit.stats.claim`` (or ``report`` / ``claim_all``) displays its verdict
with a JSON payload of type ``application/vnd.rlkit.claim+json`` beside the plain text. myst-nb
writes each executed notebook to ``_build/jupyter_execute``; while Sphinx reads a chapter, this
extension reads that notebook, collects the payloads and notes the section each claim sits in
(the nearest ``(label)=`` target above the cell). The ``claims-ledger`` directive (in
``book/claims.md``) is replaced, once every page has been read, by a table per chapter: the
statement with a link to its section, the arms, n, the difference with its 95% interval, p,
and the verdict on the machine that executed the chapters for this build.

Nothing on the page is written by hand: a claim that a chapter stops testing disappears from it.
"""
from __future__ import annotations

import json
import platform
import re
from pathlib import Path

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

from rlkit.robustness import cpu_model

CLAIM_MIME = "application/vnd.rlkit.claim+json"
_LABEL = re.compile(r"^\(([A-Za-z0-9_:.\-]+)\)=\s*$", re.M)


class claims_ledger(nodes.General, nodes.Element):
    """Placeholder for the table, filled in at ``doctree-resolved``."""


class ClaimsLedgerDirective(SphinxDirective):
    has_content = False

    def run(self):
        self.env.rlkit_ledger_docs = getattr(self.env, "rlkit_ledger_docs", set()) | {self.env.docname}
        return [claims_ledger("")]


def executed_notebook(source: Path, build_dir: Path) -> dict | None:
    """The chapter ``source`` with its outputs from the book's jupyter-cache (``build_dir/.jupyter_cache``,
    where nbval's run or the build put them), or None when the cache has no match. (With
    ``execute_notebooks: cache`` myst-nb writes the notebooks in ``build_dir/jupyter_execute``
    *without* the cached outputs, so they cannot be read instead.)"""
    import nbformat

    cache_dir = Path(build_dir) / ".jupyter_cache"
    nb = nbformat.read(str(source), as_version=4)
    if cache_dir.is_dir():
        from jupyter_cache import get_cache
        try:
            _, merged = get_cache(str(cache_dir)).merge_match_into_notebook(nb)
            return json.loads(nbformat.writes(merged))
        except KeyError:
            pass
    return None


def claims_in_notebook(path) -> list[dict]:
    """The claim payloads of an executed notebook (a path or a notebook dict), each with the label
    of the section it sits in."""
    nb = path if isinstance(path, dict) else json.loads(Path(path).read_text(encoding="utf-8"))
    label = None
    out = []
    for cell in nb.get("cells", []):
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else src
        if cell.get("cell_type") == "markdown":
            found = _LABEL.findall(src)
            if found:
                label = found[-1]
            continue
        if cell.get("cell_type") != "code":
            continue
        for o in cell.get("outputs", []):
            data = o.get("data", {})
            if CLAIM_MIME in data:
                rec = data[CLAIM_MIME]
                if isinstance(rec, str):
                    rec = json.loads(rec)
                out.append({**rec, "section_label": label})
    return out


def _collect(app, doctree):
    env = app.env
    if not hasattr(env, "rlkit_claims"):
        env.rlkit_claims = {}
    source = Path(env.doc2path(env.docname))
    if source.suffix != ".ipynb":
        env.rlkit_claims.pop(env.docname, None)
        return
    build_dir = Path(app.outdir).parent
    nb = executed_notebook(source, build_dir)
    if nb is None:
        executed = build_dir / "jupyter_execute" / (env.docname + ".ipynb")
        if not executed.exists():
            env.rlkit_claims.pop(env.docname, None)
            return
        nb = json.loads(executed.read_text(encoding="utf-8"))
    env.rlkit_claims[env.docname] = claims_in_notebook(nb)


def _purge(app, env, docname):
    getattr(env, "rlkit_claims", {}).pop(docname, None)
    if hasattr(env, "rlkit_ledger_docs"):
        env.rlkit_ledger_docs.discard(docname)


def _merge(app, env, docnames, other):
    if not hasattr(env, "rlkit_claims"):
        env.rlkit_claims = {}
    env.rlkit_claims.update(getattr(other, "rlkit_claims", {}))
    env.rlkit_ledger_docs = getattr(env, "rlkit_ledger_docs", set()) | getattr(other, "rlkit_ledger_docs", set())


def _outdated(app, env, added, changed, removed):
    # the ledger depends on every chapter: rebuild it whenever one is read again
    if (added | changed | removed) and getattr(env, "rlkit_ledger_docs", None):
        return sorted(env.rlkit_ledger_docs - set(removed))
    return []


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def _p(x: float) -> str:
    return f"{x:.2g}" if x >= 1e-4 else f"{x:.1e}"


def _row(cells) -> nodes.row:
    row = nodes.row()
    for c in cells:
        entry = nodes.entry()
        entry += c if isinstance(c, nodes.Node) else nodes.paragraph(text=str(c))
        row += entry
    return row


def _table(app, fromdoc, docname, claims) -> nodes.table:
    heads = ["claim", "arms", "n", "difference (95% CI)", "p", "verdict"]
    table = nodes.table(classes=["rlkit-claims"])
    group = nodes.tgroup(cols=len(heads))
    table += group
    for w in (40, 18, 6, 20, 8, 8):
        group += nodes.colspec(colwidth=w)
    thead = nodes.thead()
    thead += _row(heads)
    group += thead
    body = nodes.tbody()
    labels = app.env.domains["std"].labels
    for c in claims:
        para = nodes.paragraph()
        target = labels.get(c.get("section_label") or "")
        uri = app.builder.get_relative_uri(fromdoc, docname)
        if target and target[0] == docname:
            uri += "#" + target[1]
        ref = nodes.reference("", "", internal=True, refuri=uri)
        ref += nodes.Text(c["statement"])
        para += ref
        if c.get("family"):
            para += nodes.Text(f" (family: {c['family']}; Holm)")
        comp = c["comparison"]
        kind = {"greater": ">", "less": "<", "differ": "≠", "equivalent": "≈", "not_separated": "~"}[c["kind"]]
        arms = f"{c['arms'][0]} {kind} {c['arms'][1]}"
        n = str(comp["n_a"]) + ("" if comp["n_a"] == comp["n_b"] else f" / {comp['n_b']}")
        n += " paired" if comp["paired"] else " Welch"
        diff = f"{_fmt(comp['diff'])} ({_fmt(comp['lo'])} to {_fmt(comp['hi'])})"
        if c.get("tol") is not None:
            diff += f", tolerance ±{_fmt(c['tol'])}"
        if c.get("margin"):
            diff += f", margin {_fmt(c['margin'])}"
        p = _p(comp["p"]) + ("" if c.get("p_adjusted") is None else f" (Holm {_p(c['p_adjusted'])})")
        if c.get("asserted", True):
            verdict = "holds" if c["holds"] else "FAILS"
        else:  # reported, not asserted: say whether the interval separates, not pass/fail
            sep = comp["lo"] > 0 or comp["hi"] < 0
            verdict = ("separated" if sep else "not separated") + " (reported)"
        body += _row([para, arms, n, diff, p, verdict])
    group += body
    return table


def _resolve(app, doctree, fromdoc):
    env = app.env
    claims = getattr(env, "rlkit_claims", {})
    for node in doctree.findall(claims_ledger):
        content = []
        total = sum(len(v) for v in claims.values())
        asserted = sum(1 for v in claims.values() for c in v if c.get("asserted", True))
        failed = sum(1 for v in claims.values() for c in v if not c["holds"] and c.get("asserted", True))
        content.append(nodes.paragraph(text=(
            f"{total} claims in {sum(1 for v in claims.values() if v)} chapters: {asserted} asserted by a "
            f"check cell ({failed} failing), {total - asserted} reported without an assertion. Executed "
            f"on: {cpu_model()}, Python {platform.python_version()}.")))
        for docname in sorted(claims):
            if not claims[docname]:
                continue
            title = env.titles[docname].astext() if docname in env.titles else docname
            head = nodes.rubric(ids=[nodes.make_id("ledger-" + docname)])
            ref = nodes.reference("", "", internal=True, refuri=app.builder.get_relative_uri(fromdoc, docname))
            ref += nodes.Text(title)
            head += ref
            content.append(head)
            content.append(_table(app, fromdoc, docname, claims[docname]))
        node.replace_self(content)


def setup(app):
    app.add_node(claims_ledger)
    app.add_directive("claims-ledger", ClaimsLedgerDirective)
    app.connect("doctree-read", _collect)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    app.connect("env-get-outdated", _outdated)
    app.connect("doctree-resolved", _resolve)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1.0", "env_version": 1}
