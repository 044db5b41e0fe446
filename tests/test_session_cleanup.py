"""The leftover-process check of a test session counts its own orphans, never another session's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from conftest import SESSION_ENV, session_orphans


def _orphan(env: dict[str, str], pidfile: Path) -> int:
    """Start a process that is re-parented to init at once, as a killed parent leaves it."""
    sleeper = f'{sys.executable} -c "import time; time.sleep(60)" replayable-orphan'
    subprocess.run(["sh", "-c", f"{sleeper} & echo $! > {pidfile}"], env=env, check=True)
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while psutil.Process(pid).ppid() != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    return pid


def test_only_this_sessions_orphans_count_as_left_running(tmp_path):
    """An orphan from another session on the same machine is neither reported nor killed."""
    started = time.time() - 1
    other = _orphan({**os.environ, SESSION_ENV: "another-session"}, tmp_path / "other.pid")
    ours = _orphan(dict(os.environ), tmp_path / "ours.pid")
    try:
        found = {proc.pid for proc in session_orphans(started)}
        assert ours in found
        assert other not in found
    finally:
        for pid in (ours, other):
            os.kill(pid, signal.SIGKILL)
            psutil.Process(pid).wait(timeout=10)
