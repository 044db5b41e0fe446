"""The leftover-process check of a test session counts its own orphans, never another session's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from conftest import SESSION_ENV, adopt_orphans, session_orphans


def _orphan(env: dict[str, str], pidfile: Path) -> int:
    """Start a process that is re-parented to init at once, as a killed parent leaves it."""
    sleeper = f'{sys.executable} -c "import time; time.sleep(60)" replayable-orphan'
    subprocess.run(["sh", "-c", f"{sleeper} & echo $! > {pidfile}"], env=env, check=True)
    # `sh` has exited: its child is re-parented already (to init, or to a subreaper).
    return int(pidfile.read_text())


def test_only_this_sessions_orphans_count_as_left_running(tmp_path):
    """An orphan from another session on the same machine is neither reported nor killed."""
    started = time.time() - 1
    adopt_orphans(False)  # let these two go to init, as they would on another machine
    try:
        other = _orphan({**os.environ, SESSION_ENV: "another-session"}, tmp_path / "other.pid")
        ours = _orphan(dict(os.environ), tmp_path / "ours.pid")
    finally:
        adopt_orphans()
    try:
        found = {proc.pid for proc in session_orphans(started)}
        assert ours in found
        assert other not in found
    finally:
        for pid in (ours, other):
            os.kill(pid, signal.SIGKILL)
            psutil.Process(pid).wait(timeout=10)


def test_a_server_that_detaches_stays_a_child_of_the_session(tmp_path):
    """What the tests start and then detaches is re-parented to the session, not to init,
    so no other session's leftover check can take it for an orphan of its own."""
    pid = _orphan(dict(os.environ), tmp_path / "detached.pid")
    try:
        assert psutil.Process(pid).ppid() == os.getpid()
    finally:
        os.kill(pid, signal.SIGKILL)
        psutil.Process(pid).wait(timeout=10)
