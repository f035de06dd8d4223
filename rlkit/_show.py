"""``rlkit.show(fn)``: print a function's (or class's) source in a notebook."""
from __future__ import annotations

import inspect
import types

from . import _validate as V


def show(obj, docstring: bool = True):
    """Display the source code of ``obj`` (a function, class or method).

    In a notebook the source is rendered as highlighted Python (and, in the HTML book,
    as a code block); elsewhere it is printed. ``docstring=False`` drops the docstring
    so that only the code remains.
    """
    V.instance_of(obj, "obj", (types.FunctionType, types.MethodType, type), "function, method or class")
    src = inspect.getsource(obj)
    if not docstring:
        src = _strip_docstring(src)
    try:
        from IPython import get_ipython
        from IPython.display import Code, display

        if get_ipython() is not None:
            display(Code(src, language="python"))
            return None
    except ImportError:  # pragma: no cover
        pass
    print(src)
    return None


def _strip_docstring(src: str) -> str:
    import ast
    import textwrap

    tree = ast.parse(textwrap.dedent(src))
    node = tree.body[0]
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        lines = textwrap.dedent(src).splitlines()
        start, end = body[0].lineno - 1, body[0].end_lineno
        return "\n".join(lines[:start] + lines[end:]) + "\n"
    return src
