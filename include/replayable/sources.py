"""Where documents may be read from: allowed source roots, and finding PDFs inside them.

A run's ``source`` param makes workers read files, so it is confined (ADR 0012): it must lie
inside one of the allowed roots, which are the project's ``data/`` folder plus whatever
``REPLAYABLE_SOURCE_ROOTS`` lists (``os.pathsep``-separated). Paths are compared after
resolving symlinks and ``..``, globs are expanded inside the roots only, and the extract
stage checks each document's path again before reading it.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOTS_ENV = "REPLAYABLE_SOURCE_ROOTS"
PROJECT_DATA = Path(__file__).resolve().parents[2] / "data"
_GLOB_CHARS = "*?["


class SourceError(ValueError):
    """A source that is not allowed or does not exist; the message names ``source``."""


def allowed_roots(extra: str | None = None) -> tuple[str, ...]:
    """The resolved allowed roots: the project's data folder and ``$REPLAYABLE_SOURCE_ROOTS``."""
    listed = os.environ.get(ROOTS_ENV, "") if extra is None else extra
    roots = [PROJECT_DATA, *(Path(p) for p in listed.split(os.pathsep) if p.strip())]
    return tuple(dict.fromkeys(str(Path(root).expanduser().resolve()) for root in roots))


def is_inside(path: str | os.PathLike[str], roots: Sequence[str]) -> bool:
    """Whether ``path``, resolved (symlinks and ``..``), lies inside one of ``roots``."""
    real = Path(path).expanduser().resolve()
    return any(real == Path(root) or Path(root) in real.parents for root in roots)


def check_inside(path: str | os.PathLike[str], roots: Sequence[str]) -> None:
    """Raise a terminal item error if ``path`` resolves outside ``roots`` (checked at read time)."""
    if not is_inside(path, roots):
        from replayable.retry import ItemError

        raise ItemError(
            "outside_roots", f"{path} resolves outside the allowed source roots {list(roots)}"
        )


def _static_prefix(pattern: str) -> str:
    """The part of a glob before its first wildcard component."""
    parts = Path(pattern).parts
    fixed: list[str] = []
    for part in parts:
        if any(ch in part for ch in _GLOB_CHARS):
            break
        fixed.append(part)
    return str(Path(*fixed)) if fixed else "."


def check_source(source: str, roots: Sequence[str]) -> None:
    """Refuse a ``source`` outside the roots, with a message naming the field."""
    if not source or "\x00" in source:
        raise SourceError("source: must be a non-empty path without NUL characters")
    base = _static_prefix(source) if any(ch in source for ch in _GLOB_CHARS) else source
    if not Path(base).expanduser().is_absolute():
        raise SourceError(f"source: {source!r} must be an absolute path or glob")
    if not is_inside(base, roots):
        raise SourceError(
            f"source: {source!r} is outside the allowed source roots {list(roots)}; "
            f"add its folder to {ROOTS_ENV} to allow it"
        )


def find_pdfs(source: str, roots: Sequence[str]) -> Iterator[os.DirEntry[str] | Path]:
    """Yield the PDFs of ``source`` (a folder, searched recursively, a file or a glob).

    Only regular files that resolve inside ``roots`` are yielded; symlinks are not followed
    out of them, and directory symlinks are not descended into.
    """
    check_source(source, roots)
    path = Path(source).expanduser()
    if any(ch in source for ch in _GLOB_CHARS):
        for found in glob.iglob(str(path), recursive=True):
            candidate = Path(found)
            if candidate.is_file() and is_inside(candidate, roots):
                yield candidate
    elif path.is_dir():
        yield from _walk(str(path), roots)
    elif path.is_file():
        if is_inside(path, roots):
            yield path
    else:
        raise SourceError(f"source: {source!r} is neither a folder, a file nor a glob")


def _walk(folder: str, roots: Sequence[str]) -> Iterator[os.DirEntry[str]]:
    stack = [folder]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
            elif (
                entry.name.lower().endswith(".pdf")
                and entry.is_file()
                and (not entry.is_symlink() or is_inside(entry.path, roots))
            ):
                yield entry
