"""A test session's processes: what it starts stays its own, and none is left running.

The root conftest marks the session (``SESSION_ENV``), adopts what it starts
(:func:`adopt_orphans`) and, at the end, fails the session on what :func:`left_running` finds.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# Every process a session starts inherits the mark, so that the leftover check can tell this
# session's orphans from those of other sessions running on the same machine.
SESSION_ENV = "REPLAYABLE_TEST_SESSION"
# How long the leftover check waits for processes that are still ending; a sub-session that
# tests the check itself shortens it.
GRACE_ENV = "REPLAYABLE_TEST_LEFTOVER_GRACE_S"
SERVICE_WORDS = ("airflow", "replayable", "postgres", "celery", "redis", "uvicorn", "gunicorn")
# The helpers multiprocessing starts once for the process that uses them: each reads a pipe
# from that process and exits when it closes, so one started by this process ends with it.
_MULTIPROCESSING_HELPERS = (
    "from multiprocessing.resource_tracker import main",
    "from multiprocessing.forkserver import main",
)


def adopt_orphans(adopt: bool = True) -> None:
    """Make this process the subreaper of what it starts (Linux): daemons stay its children.

    A server that detaches (`pg_ctl start`, a killed parent's children) is re-parented to
    this process instead of init, so it is never an orphan that another session's leftover
    check, on the same machine, could mistake for its own and stop mid-run.
    """
    if sys.platform != "linux":
        return
    import ctypes

    pr_set_child_subreaper = 36
    ctypes.CDLL(None).prctl(pr_set_child_subreaper, int(adopt), 0, 0, 0)


def session_orphans(started: float) -> list[Any]:
    """This session's orphans: processes of the project's services re-parented to init.

    A parent that was killed leaves its children behind, re-parented to init; those started
    since ``started`` whose environment carries this session's mark are this session's.
    Other sessions' orphans (other test runs, `make airflow`) are not, whatever they run.
    """
    import psutil

    marker = os.environ[SESSION_ENV]
    found = []
    for proc in psutil.process_iter(["ppid", "create_time", "cmdline"]):
        info = proc.info
        if (
            info["ppid"] != 1
            or (info["create_time"] or 0) < started
            or not any(w in " ".join(info["cmdline"] or []) for w in SERVICE_WORDS)
        ):
            continue
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(SESSION_ENV) == marker:
                found.append(proc)
    return found


def multiprocessing_helper(proc: Any, parent_pid: int) -> bool:
    """Whether ``proc`` is multiprocessing's resource tracker or forkserver of ``parent_pid``.

    Only a helper whose parent is ``parent_pid`` itself ends when that process does; a
    worker, a spawned child, or a helper of some other process is not one, whatever its
    command line mentions.
    """
    if proc.ppid() != parent_pid:
        return False
    cmdline = proc.cmdline()
    if "-c" not in cmdline[1:-1]:
        return False
    code = cmdline[cmdline.index("-c", 1) + 1]
    return code.startswith(_MULTIPROCESSING_HELPERS)


def left_running(me: Any, started: float) -> list[Any]:
    """This session's processes still running: descendants of ``me`` and its orphans."""
    import psutil

    found = {p.pid: p for p in me.children(recursive=True)}
    for proc in session_orphans(started):
        found.setdefault(proc.pid, proc)
    alive = []
    for proc in found.values():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and not multiprocessing_helper(proc, me.pid):
                alive.append(proc)
        except psutil.NoSuchProcess:
            pass
    return alive


def pytest_session(
    folder: Path, *args: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run ``pytest args`` in a session of its own, in ``folder``, with ``env``: a test of the
    harness itself (its plugins, its leftover check). Two minutes at most."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
