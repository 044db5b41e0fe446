"""A stage class's code as a hash: what ``version = "auto"`` and the identity check read.

Comments, layout and docstrings are left out, so only a change of what the code does changes
the hash (ADR 0140). Nothing here imports Airflow.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from collections.abc import Iterator

from replayable.keys import sha256_bytes

__all__ = ["PACKAGE", "class_path", "code_hash", "own_classes", "shipped"]

# Airflow imports a DAG file as ``unusual_prefix_<sha1 of its path>_<name>``: the prefix
# names where the file is, not what the class is.
_DAG_FILE_PREFIX = re.compile(r"^unusual_prefix_[0-9a-f]{40}_")
PACKAGE = "replayable"


def class_path(cls: type) -> str:
    """``module.QualifiedName`` of a stage class, wherever the DAG file that holds it is."""
    return f"{_DAG_FILE_PREFIX.sub('', cls.__module__)}.{cls.__qualname__}"


def shipped(path_or_module: str) -> bool:
    return path_or_module == PACKAGE or path_or_module.startswith(f"{PACKAGE}.")


def own_classes(cls: type) -> Iterator[type]:
    """The classes of ``cls``'s hierarchy that are the user's: not Replayable's, not Python's."""
    for klass in cls.__mro__:
        module = klass.__module__
        if not (shipped(module) or module in ("builtins", "abc", "typing")):
            yield klass


def _code_of(klass: type) -> str:
    """The class's code as a syntax tree: its comments, layout and docstrings left out."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def code_hash(cls: type) -> str | None:
    """A hash of the code of a stage class and of its own base classes (comments, layout and
    docstrings aside); None for a stage Replayable ships (its release keeps its version) or
    one whose source Python cannot find (made in a REPL or by ``exec``)."""
    try:
        code = [_code_of(klass) for klass in own_classes(cls)]
    except (OSError, TypeError, SyntaxError):
        return None
    return sha256_bytes("\n".join(code).encode()) if code else None
