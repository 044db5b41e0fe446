"""The Airflow settings every deployment shares (airflow.env), as Airflow itself reads them."""

from __future__ import annotations

import os
import subprocess
import sys

from devtools import devenv


def _as_airflow_reads(expression: str) -> str:
    """Evaluate ``expression`` in a fresh interpreter whose environment has airflow.env."""
    env = {**os.environ, **devenv.shared_airflow_env()}
    return subprocess.run(
        [sys.executable, "-c", f"print({expression})"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.strip()


def test_a_task_supervisor_notices_its_task_ended_within_a_second() -> None:
    """A task's supervisor reports the end of its task (and so frees its downstream tasks)
    only once it has seen the process exit. When the task closes its sockets just before it
    exits, the supervisor waits in select() with nothing to watch for up to
    ``[workers] min_heartbeat_interval``: 5 s by default, which was a third of the task
    instances of a run on 2 cores and most of an identical re-run's time (ADR 0122)."""
    value = _as_airflow_reads(
        "__import__('airflow.sdk.execution_time.supervisor', fromlist=['x']).MIN_HEARTBEAT_INTERVAL"
    )
    assert int(value) <= 1
