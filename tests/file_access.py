"""Make a file's permission bits bind even when the tests run as root, and swap files mid-run.

Root reads a mode-000 file through the capabilities CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH.
``permission_bits_bind`` drops both from the effective set of the calling thread (Linux keeps
capabilities per thread) and of the threads it starts meanwhile, then raises them again, so a
test sees what an unprivileged worker would: ``open`` fails with EACCES. Without root it
changes nothing, and the permission bits bind anyway.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

_CAPABILITY_VERSION_3 = 0x20080522
_CAP_DAC_OVERRIDE = 1
_CAP_DAC_READ_SEARCH = 2


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _capabilities(data: ctypes.Array[_Data] | None = None) -> ctypes.Array[_Data]:
    """Get (or, given ``data``, set) the calling thread's capability sets."""
    libc = ctypes.CDLL(None, use_errno=True)
    header = _Header(_CAPABILITY_VERSION_3, 0)
    current = data if data is not None else (_Data * 2)()
    call = libc.capset if data is not None else libc.capget
    if call(ctypes.byref(header), current) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return current


@contextlib.contextmanager
def permission_bits_bind() -> Iterator[None]:
    """Within the block, this thread (and threads it starts) obey file modes, root or not."""
    if not sys.platform.startswith("linux"):
        pytest.skip("capabilities are per thread on Linux only")
    saved = _capabilities()
    dropped = (_Data * 2)()
    ctypes.memmove(dropped, saved, ctypes.sizeof(dropped))
    dropped[0].effective &= ~((1 << _CAP_DAC_OVERRIDE) | (1 << _CAP_DAC_READ_SEARCH))
    _capabilities(dropped)
    try:
        yield
    finally:
        _capabilities(saved)


def unblock_fifo(fifo: Path) -> None:
    """Let a reader stuck opening or reading ``fifo`` go on: open its write end and close it."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def finishes(fn: Callable[[], object], *, fifo: Path, bound_s: float = 30) -> object:
    """Run ``fn`` in a thread; fail the test if it is still blocked after ``bound_s``.

    A reader blocked on ``fifo`` is released afterwards, so a failing test ends too.
    """
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as error:  # handed to the test below
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(bound_s)
    blocked = thread.is_alive()
    while thread.is_alive():
        unblock_fifo(fifo)
        thread.join(0.1)
    assert not blocked, f"blocked on the FIFO {fifo.name}"
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome.get("value")
