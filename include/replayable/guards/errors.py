"""What a broken guard raises, and the one guard that runs before any worker: ``check_size``.

``GuardError`` names the guard an item broke (its ``error_class``); ``RemoteError`` stands in
for an exception of the item that could not cross the process boundary. Both pickle, so
that they reach the caller from a worker.
"""

from __future__ import annotations

import os
import stat
from typing import Final

ERROR_CLASSES: Final = ("timeout", "memory", "crash", "oversize")


class GuardError(Exception):
    """An item broke a guard; error_class is one of 'timeout', 'memory', 'crash', 'oversize'."""

    error_class: str
    message: str

    def __init__(self, error_class: str, message: str) -> None:
        """Record which guard broke (``error_class``) and a human-readable ``message``."""
        if error_class not in ERROR_CLASSES:
            raise ValueError(
                f"unknown error class {error_class!r}; expected one of {ERROR_CLASSES}"
            )
        super().__init__(message)
        self.error_class = error_class
        self.message = message

    def __reduce__(self) -> tuple[type[GuardError], tuple[str, str]]:
        """Rebuild from both init arguments: the default pickling would pass only ``args``."""
        return (type(self), (self.error_class, self.message))

    def __str__(self) -> str:
        """Return ``'<error_class>: <message>'``."""
        return f"{self.error_class}: {self.message}"


class RemoteError(Exception):
    """An exception from ``fn`` that could not be pickled back; it keeps the type name and text."""

    type_name: str
    message: str

    def __init__(self, type_name: str, message: str) -> None:
        """Record the original exception's qualified type name and ``str()``."""
        super().__init__(type_name, message)
        self.type_name = type_name
        self.message = message

    def __str__(self) -> str:
        """Return ``'<type_name>: <message>'``."""
        return f"{self.type_name}: {self.message}"


def check_size(path: str | os.PathLike[str], max_bytes: int) -> int:
    """Return the size from os.stat, never reading the file; GuardError('oversize') above max_bytes.

    Anything but a regular file is refused as well, as a terminal ``ItemError('unreadable')``:
    the size of a FIFO or a device says nothing about how much a read of it returns, and
    such a file is no document that can be read (ADR 0074).
    """
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        from replayable.retry import ItemError

        raise ItemError("unreadable", f"{os.fspath(path)} is not a regular file")
    if info.st_size > max_bytes:
        raise GuardError(
            "oversize", f"{os.fspath(path)} is {info.st_size} bytes, over the limit of {max_bytes}"
        )
    return info.st_size
