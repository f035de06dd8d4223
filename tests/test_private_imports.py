"""No rlkit module imports another module's private (underscore) name (CONTRIBUTING.md, "What goes where").

A helper that two modules need is public in the lower one, with a docstring. The one private module
every part of the library imports is ``rlkit._validate`` (the argument checks), imported whole.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "rlkit"


def _private_imports():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                for alias in node.names:
                    if alias.name.startswith("_") and alias.name != "_validate":
                        found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} imports {alias.name} "
                                     f"from {'.' * node.level}{node.module or ''}")
    return found


def test_no_module_imports_a_private_name_of_another():
    found = _private_imports()
    assert not found, "private names imported across modules:\n" + "\n".join(found)
