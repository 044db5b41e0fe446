"""The machine's cores, taken by one wide extraction at a time (ADR 0123).

An extract batch runs its documents on a guarded worker per core. Two such batches side by
side on one machine share the cores and end together, at twice the time of either; one after
the other, the first ends at half that, and its chunks go to the provider while the second is
read. The total CPU is the same: only the order changes, and with it when the first request of
a run can go out.

``machine_cores(width)`` holds a lock on a file in the machine's temporary folder while a
batch uses ``width`` workers:

- a batch as wide as the machine (``width`` at least its cores) takes it exclusively, so it
  waits for every other extraction on the machine to end, and every other waits for it;
- a narrower batch (fewer documents than cores) takes it shared: narrow batches run side by
  side, as they need each other's idle cores, but never beside a wide one.

The lock is ``flock``'s, on an open file description of this process only (``os.open`` makes
it non-inheritable, so no worker or forkserver holds a copy): the kernel drops it when the
process exits, however it exits, so a killed task never leaves the machine locked. A holder
that lives on but makes no progress (a frozen task, stopped with its supervisor) would hold
up every extraction on the machine, so a batch waits at most ``MAX_WAIT_S`` (2 minutes) and
then extracts beside the holder, as with no lock at all: the lock orders the work, it never
stops it. The wait is a sleep in the task, so Airflow's execution timeout still ends it.

The file is per user (a task running as another user has a lock of its own) and per
temporary folder, so a container with its own ``/tmp`` (and usually its own CPU quota) has
its own.
"""

from __future__ import annotations

import fcntl
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["lock_path", "machine_cores"]

log = logging.getLogger(__name__)

# How long a batch waits for the cores before it extracts beside their holder.
MAX_WAIT_S = 120.0
# How often a waiting batch tries again. The wait polls rather than blocks in flock, which
# has no timeout of its own (SIGALRM is Airflow's, for the task's execution timeout).
POLL_S = 0.02


def lock_path() -> Path:
    """The file whose lock stands for this machine's cores, for this user."""
    return Path(tempfile.gettempdir()) / f"replayable-cores-{os.getuid()}.lock"


@contextmanager
def machine_cores(width: int, *, max_wait_s: float = MAX_WAIT_S) -> Iterator[bool]:
    """Hold the machine's cores for ``width`` workers: all of them exclusively, fewer shared.

    Yields whether they were got: after ``max_wait_s`` the batch goes on without them (see
    the module), side by side with their holder, as with no lock at all.
    """
    mode = fcntl.LOCK_EX if width >= (os.cpu_count() or 1) else fcntl.LOCK_SH
    fd = os.open(lock_path(), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        yield _take(fd, mode, max_wait_s)
    finally:
        os.close(fd)  # closing the only descriptor of the open file releases its lock


def _take(fd: int, mode: int, max_wait_s: float) -> bool:
    """Lock ``fd`` in ``mode`` within ``max_wait_s``; whether it was locked."""
    started = time.monotonic()
    waiting = False
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            waited = time.monotonic() - started
            if waited >= max_wait_s:
                log.warning(
                    "the machine's cores were still taken after %.0f s; extracting beside "
                    "their holder",
                    waited,
                )
                return False
            if not waiting:
                waiting = True
                log.info(
                    "waiting for the machine's cores (%s): another extraction is using them",
                    "all of them" if mode == fcntl.LOCK_EX else "shared",
                )
            time.sleep(POLL_S)
            continue
        if waiting:
            log.info("got the machine's cores after %.1f s", time.monotonic() - started)
        return True
