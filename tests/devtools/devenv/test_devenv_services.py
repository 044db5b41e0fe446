"""`make start` / `make stop` (devenv.services): what is stopped is only what was started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from devtools import devenv


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A process in its own group that devenv did not start: a pid recycled since `start`."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _record(state: Path, model_pid: int, model_started: float | None) -> None:
    services = {
        "replayable_dsn": "postgresql://unused",
        "airflow_db_url": "postgresql+psycopg2://unused",
        "model_url": "http://127.0.0.1:1/v1",
        "model_pid": model_pid,
        "pgdata": None,
    }
    if model_started is not None:
        services["model_started"] = model_started
    (state / "services.json").write_text(json.dumps(services))


def test_stop_leaves_alone_a_process_that_took_over_the_model_servers_pid(tmp_path, bystander):
    """The recorded start time is not the process's: the number was reused, so no signal."""
    started = psutil.Process(bystander.pid).create_time()
    _record(tmp_path, bystander.pid, started - 3600)
    devenv.stop(tmp_path)
    assert bystander.poll() is None
    assert not (tmp_path / "services.json").exists()


def test_stop_leaves_alone_a_pid_recorded_without_its_start_time(tmp_path, bystander):
    """A record from before start times were kept cannot prove the pid is still ours."""
    _record(tmp_path, bystander.pid, None)
    devenv.stop(tmp_path)
    assert bystander.poll() is None


def test_stop_stops_the_model_server_it_recorded(tmp_path, bystander):
    _record(tmp_path, bystander.pid, psutil.Process(bystander.pid).create_time())
    devenv.stop(tmp_path)
    assert bystander.wait(timeout=15) is not None


def test_start_does_not_take_a_reused_pid_for_a_running_model_server(tmp_path, bystander):
    """`start` reuses services.json only while its model server is the recorded process."""
    started = psutil.Process(bystander.pid).create_time()
    _record(tmp_path, bystander.pid, started - 3600)
    assert not devenv.model_server_running(devenv.Services.load(tmp_path))
    _record(tmp_path, bystander.pid, started)
    assert devenv.model_server_running(devenv.Services.load(tmp_path))


@pytest.mark.db
def test_the_embedded_server_has_a_quarter_of_the_memory_as_shared_buffers(services, conn):
    """initdb's 128 MB leaves a million chunks' search index (1.3 GB) to the kernel's cache,
    and a search after a full scan took 69 ms at p95 instead of 15 (ADR 0120)."""
    if services.pgdata is None:
        pytest.skip("an external server's memory is its operator's to size")
    assert 128 <= devenv.shared_buffers_mb() <= 2048
    with conn.cursor() as cur:
        cur.execute("SELECT pg_size_bytes(current_setting('shared_buffers')) / 2^20")
        assert cur.fetchone()[0] == devenv.shared_buffers_mb()
    conn.rollback()
