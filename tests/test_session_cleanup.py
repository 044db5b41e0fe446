"""The leftover-process check of a test session counts its own orphans, never another session's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from helpers.session import (
    GRACE_ENV,
    SESSION_ENV,
    adopt_orphans,
    pytest_session,
    session_orphans,
)

# Each test starts pytest sub-sessions: the harness checking itself (not in test-fast).
pytestmark = pytest.mark.harness


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


def _sub_session(tmp_path: Path, test_body: str) -> subprocess.CompletedProcess[str]:
    """Run one test in a pytest session of its own, with this suite's conftest as a plugin."""
    (tmp_path / "test_sub.py").write_text(test_body)
    here = Path(__file__).parent
    # The conftest imports devtools/, which lives at the repository root (never installed).
    paths = [str(here), str(here.parent), os.environ.get("PYTHONPATH")]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, paths)),
        GRACE_ENV: "1",
    }
    return pytest_session(
        tmp_path,
        *("-q", "-p", "conftest", "--rootdir", str(tmp_path), "--basetemp", str(tmp_path / "tmp")),
        str(tmp_path / "test_sub.py"),
        env=env,
    )


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended; a survivor is stopped here, so that this test leaks nothing."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return True
    except psutil.NoSuchProcess:
        return True
    proc.kill()
    return False


def test_a_multiprocessing_child_left_running_fails_the_session_and_is_stopped(tmp_path):
    """A spawned child the test never joined fails the session, though its command line names
    multiprocessing, and the check stops it."""
    pidfile = tmp_path / "leaked.pid"
    done = _sub_session(
        tmp_path,
        f"""
import multiprocessing, time

def test_leaks():
    child = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(30,))
    child.start()
    open({str(pidfile)!r}, "w").write(str(child.pid))
""",
    )
    pid = int(pidfile.read_text())
    assert _gone(pid)
    assert done.returncode != 0, done.stdout
    assert "processes left running after the tests" in done.stdout
    assert f"{pid}: " in done.stdout


def test_multiprocessing_helpers_of_the_session_itself_do_not_fail_it(tmp_path):
    """The forkserver and resource tracker a session starts for itself end with it: tolerated."""
    done = _sub_session(
        tmp_path,
        """
import multiprocessing

def test_uses_the_forkserver():
    ctx = multiprocessing.get_context("forkserver")
    child = ctx.Process(target=print, args=("hello",))
    child.start()
    child.join()
    assert child.exitcode == 0
""",
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_helper_of_another_process_is_not_tolerated(tmp_path):
    """A forkserver's command line whose parent is not the session is no helper of the session."""
    pidfile = tmp_path / "impostor.pid"
    done = _sub_session(
        tmp_path,
        f"""
import subprocess, sys

def test_leaks_a_grandchild():
    code = "from multiprocessing.forkserver import main; import time; time.sleep(30)"
    sleeper = f"{{sys.executable}} -c '{{code}}' & echo $! > {str(pidfile)!r}; wait"
    subprocess.Popen(["sh", "-c", sleeper])
""",
    )
    pid = int(pidfile.read_text())
    assert _gone(pid)
    assert done.returncode != 0, done.stdout
    assert f"{pid}: " in done.stdout
