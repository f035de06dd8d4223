"""The claims ledger's reader: claims found in an executed notebook, each under its section's label."""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("claims_ledger", ROOT / "book" / "_ext" / "claims_ledger.py")
ledger = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ledger)


def _out(rec):
    return {"output_type": "display_data", "metadata": {},
            "data": {"text/plain": "[claim holds] ...", ledger.CLAIM_MIME: rec}}


def test_claims_are_read_with_the_label_of_their_section(tmp_path):
    nb = {"cells": [
        {"cell_type": "markdown", "source": "# Title\n"},
        {"cell_type": "code", "source": "x", "outputs": [_out({"statement": "before any label"})]},
        {"cell_type": "markdown", "source": ["(sec-a)=\n", "## A\n"]},
        {"cell_type": "code", "source": "x", "outputs": [{"output_type": "stream", "text": "hi"},
                                                        _out({"statement": "one"})]},
        {"cell_type": "markdown", "source": "(sec-b)=\n## B\n(sec-b2)=\n### B2"},
        {"cell_type": "code", "source": "x", "outputs": [_out(json.dumps({"statement": "two"})),
                                                        _out({"statement": "three"})]},
    ], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    got = [(c["statement"], c["section_label"]) for c in ledger.claims_in_notebook(path)]
    assert got == [("before any label", None), ("one", "sec-a"), ("two", "sec-b2"), ("three", "sec-b2")]
