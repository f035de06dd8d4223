"""Number figures and tables per chapter: "Figure 7.3" is the third captioned figure of chapter 7.

Sphinx numbers captioned figures through the whole book (Figure 1 ... Figure 60) unless the table
of contents is numbered, and Jupyter Book restarts a numbered table of contents in every part, so
its numbers would not be the chapters' (``lessons/07_tiny_llm`` is the eighth page of Part I).
After Sphinx has assigned its numbers (the ``env-get-updated`` event), this extension renumbers
each document's figures, tables and listings in their order on the page, prefixed by the chapter
number in the file name (``lessons/NN_...``). Pages outside ``lessons/`` (the front and back matter)
number theirs 1, 2, ... on their own. References (``{numref}``) and captions both read these
numbers, so they stay consistent.
"""
from __future__ import annotations

import re

CHAPTER = re.compile(r"^lessons/(\d+)_")


def chapter_of(docname: str) -> tuple[int, ...]:
    """``(7,)`` for ``lessons/07_tiny_llm``; ``()`` for a page that is not a chapter."""
    m = CHAPTER.match(docname)
    return (int(m.group(1)),) if m else ()


def renumber(fignumbers: dict) -> tuple[dict, list[str]]:
    """Per-document numbers from Sphinx's book-wide ones; returns them and the documents that changed.

    ``fignumbers`` maps docname -> figtype -> figure id -> number tuple (``env.toc_fignumbers``).
    Within a document and figure type the book-wide order is kept.
    """
    out, changed = {}, []
    for docname, by_type in fignumbers.items():
        prefix = chapter_of(docname)
        out[docname] = {}
        for figtype, ids in by_type.items():
            ordered = sorted(ids, key=lambda i: ids[i])
            out[docname][figtype] = {fid: (*prefix, n) for n, fid in enumerate(ordered, 1)}
        if out[docname] != by_type:
            changed.append(docname)
    return out, changed


def _on_env_get_updated(app, env) -> list[str]:
    env.toc_fignumbers, changed = renumber(env.toc_fignumbers)
    return changed


def setup(app):
    # after Sphinx's own TocTreeCollector (priority 500) has assigned the book-wide numbers
    app.connect("env-get-updated", _on_env_get_updated, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
