"""Where documents may be read from: allowed source roots, and finding PDFs inside them.

A run's ``source`` param makes workers read files, so it is confined (ADR 0012): it must lie
inside one of the allowed roots, which are the project's ``data/`` folder plus whatever
``REPLAYABLE_SOURCE_ROOTS`` lists (``os.pathsep``-separated). Paths are compared after
resolving symlinks and ``..``, globs are expanded inside the roots only, and the extract
stage checks each document's path again before reading it.

Folders and globs are listed by one walker that never descends a directory symlink (ADR
0074): ``glob.iglob(recursive=True)`` follows them, so two links back to their own folder
made ``**/*.pdf`` enumerate an exponential number of paths.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from replayable import config

# The variable's name, kept here too because devtools, chaos, bench and the tests set it
# through this module; config.py is where it is defined and read.
ROOTS_ENV = config.SOURCE_ROOTS_ENV
PROJECT_DATA = Path(__file__).resolve().parents[2] / "data"
_GLOB_CHARS = "*?["


class SourceError(ValueError):
    """A source that is not allowed or does not exist; the message names ``source``."""


def allowed_roots(extra: str | None = None) -> tuple[str, ...]:
    """The resolved allowed roots: the project's data folder and ``$REPLAYABLE_SOURCE_ROOTS``."""
    listed = config.listed_source_roots() if extra is None else extra
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


def is_whole(source: str) -> bool:
    """Whether ``source`` names a whole source (a folder or a file), not a glob's subset."""
    return not any(ch in source for ch in _GLOB_CHARS)


def find_pdfs(
    source: str, roots: Sequence[str], unlisted: list[str] | None = None
) -> Iterator[os.DirEntry[str] | Path]:
    """Yield the PDFs of ``source`` (a folder, searched recursively, a file or a glob).

    Only regular files that resolve inside ``roots`` are yielded; symlinks are not followed
    out of them, and directory symlinks are not descended into, by a folder walk and a glob
    alike. A glob matches as ``glob.glob(recursive=True)`` does: wildcards stay within one
    path component, ``**`` spans any number of them, and a wildcard skips dotfiles.
    """
    check_source(source, roots)
    path = Path(source).expanduser()
    if any(ch in source for ch in _GLOB_CHARS):
        yield from _glob(str(path), roots, unlisted)
    elif path.is_dir():
        yield from _walk(str(path), roots, unlisted)
    elif path.is_file():
        if is_inside(path, roots):
            yield path
    else:
        raise SourceError(f"source: {source!r} is neither a folder, a file nor a glob")


def _glob(
    pattern: str, roots: Sequence[str], unlisted: list[str] | None
) -> Iterator[os.DirEntry[str]]:
    """Yield the files matching ``pattern``, walking from its static prefix without links.

    The walk keeps, per folder, the set of pattern positions its path can have reached (an
    NFA over the components), so a folder no position survives is never listed.
    """
    base = _static_prefix(pattern)
    parts = Path(pattern).parts[len(Path(base).parts) :]
    # Matches are named under the resolved prefix, as glob's results were once resolved.
    start = os.path.realpath(base)
    stack: list[tuple[str, frozenset[int]]] = [(start, _closure(parts, frozenset({0})))]
    while stack:
        current, states = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError:
            if unlisted is not None:
                unlisted.append(current)
            continue
        for entry in entries:
            after = _closure(parts, _step(parts, states, entry.name))
            if not after:
                continue
            if entry.is_dir(follow_symlinks=False):
                stack.append((entry.path, after))
            elif (
                len(parts) in after
                and entry.is_file()
                and (not entry.is_symlink() or is_inside(entry.path, roots))
            ):
                yield entry


def _closure(parts: Sequence[str], states: frozenset[int]) -> frozenset[int]:
    """``states`` plus the positions reached by letting each ``**`` match no component."""
    reached = set(states)
    for position in sorted(states):
        while position < len(parts) and parts[position] == "**":
            position += 1
            reached.add(position)
    return frozenset(reached)


def _step(parts: Sequence[str], states: frozenset[int], name: str) -> frozenset[int]:
    """The pattern positions reached from ``states`` by one path component called ``name``."""
    reached: set[int] = set()
    for position in states:
        if position == len(parts):
            continue
        part = parts[position]
        if part == "**":
            if not name.startswith("."):
                reached.add(position)
        elif not any(ch in part for ch in _GLOB_CHARS):
            if name == part:
                reached.add(position + 1)
        elif (not name.startswith(".") or part.startswith(".")) and fnmatch.fnmatchcase(name, part):
            reached.add(position + 1)
    return frozenset(reached)


def _walk(
    folder: str, roots: Sequence[str], unlisted: list[str] | None
) -> Iterator[os.DirEntry[str]]:
    stack = [folder]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError:
            if unlisted is not None:
                unlisted.append(current)
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
