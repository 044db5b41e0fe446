"""The server as a process: loopback only, stopped whole, tied to its parent unless detached."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from devtools.model_server import LocalModelServer
from devtools.model_server.cli import PARENT_CHECK_S, serve
from helpers import ROOT


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "example.com"])  # noqa: S104 - refused
def test_non_loopback_host_is_refused(host: str) -> None:
    with pytest.raises(ValueError, match=host.replace(".", r"\.")):
        serve(host=host, port=0)


def test_stop_leaves_no_process_and_is_idempotent(tmp_path: Path) -> None:
    log_path = tmp_path / "server.log"
    running = LocalModelServer(port_file=tmp_path / "port", log_path=log_path).start()
    pgid = running.pid
    assert f"listening on http://127.0.0.1:{running.port}" in log_path.read_text()
    running.stop()
    running.stop()
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    assert not (tmp_path / "port").exists()


_PARENT = """
import sys, time
from devtools.model_server import LocalModelServer
server = LocalModelServer(port_file=sys.argv[1], log_path=sys.argv[2]).start()
print(server.pid, flush=True)
time.sleep(600)
"""


def _start_parent(tmp_path: Path, code: str) -> subprocess.Popen[bytes]:
    """Start a process that starts a LocalModelServer and prints its pid."""
    # The repository root holds devtools/, whatever directory the tests run from.
    path = os.pathsep.join([str(ROOT / "include"), str(ROOT)])
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path / "port"), str(tmp_path / "server.log")],
        env=env,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )


def _kill_groups(*pids: int) -> None:
    for pid in pids:
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def test_the_server_exits_when_the_process_that_started_it_is_killed(tmp_path: Path) -> None:
    """A SIGKILLed parent runs no cleanup; the server must notice on its own and exit."""
    import psutil

    parent = _start_parent(tmp_path, _PARENT)
    server_pid = 0
    try:
        assert parent.stdout is not None
        server_pid = int(parent.stdout.readline())
        server = psutil.Process(server_pid)
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
        try:
            server.wait(timeout=15)
        except psutil.TimeoutExpired:
            pytest.fail("the model server outlived the process that started it")
        server_pid = 0
    finally:
        _kill_groups(parent.pid, server_pid)
    # It shut down the way SIGTERM does: the port file it wrote is gone.
    assert not (tmp_path / "port").exists()


def test_a_detached_server_outlives_the_process_that_started_it(tmp_path: Path) -> None:
    """`make start` returns and leaves the server to `make stop`: tie_to_parent=False."""
    import psutil

    code = _PARENT.replace("log_path=sys.argv[2])", "log_path=sys.argv[2], tie_to_parent=False)")
    parent = _start_parent(tmp_path, code)
    server_pid = 0
    try:
        assert parent.stdout is not None
        server_pid = int(parent.stdout.readline())
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
        port = int((tmp_path / "port").read_text())
        # Still answering after several of the watchdog's checks would have fired.
        for _ in range(3):
            time.sleep(PARENT_CHECK_S)
            with httpx.Client(trust_env=False) as client:
                assert client.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
    finally:
        _kill_groups(parent.pid, server_pid)
        with contextlib.suppress(psutil.Error):
            psutil.Process(server_pid).wait(timeout=10)
