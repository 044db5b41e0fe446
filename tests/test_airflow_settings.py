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


def _outage_tolerated_s(interval: float, failures: int, retries: int, wait_min: float) -> float:
    """How long a supervisor keeps its task while the API server is unreachable, on average:
    each failed heartbeat is one call of the execution API client, which retries ``retries``
    times, waiting a random time up to wait_min x 2^n (tenacity's random exponential), and
    the next heartbeat comes ``interval`` later."""
    one_call = sum(wait_min * 2**n / 2 for n in range(retries - 1))
    return failures * (one_call + interval)


def test_a_shorter_heartbeat_does_not_shorten_the_api_outage_a_task_survives() -> None:
    """A heartbeat a second must not make a worker kill its tasks sooner when the API server
    is down for a restart or a deploy (chaos: the scheduler and API server restarted mid-run)
    than Airflow's defaults did (5 s, 3 failures)."""
    settings = _as_airflow_reads(
        "(lambda s, c: (s.MIN_HEARTBEAT_INTERVAL, s.MAX_FAILED_HEARTBEATS,"
        " c.getint('workers', 'execution_api_retries'),"
        " c.getfloat('workers', 'execution_api_retry_wait_min')))"
        "(__import__('airflow.sdk.execution_time.supervisor', fromlist=['x']),"
        " __import__('airflow.configuration', fromlist=['x']).conf)"
    )
    interval, failures, retries, wait_min = eval(settings)  # noqa: S307 - our own tuple
    ours = _outage_tolerated_s(interval, failures, retries, wait_min)
    defaults = _outage_tolerated_s(5, 3, retries, wait_min)
    assert ours >= defaults, f"{ours:.1f} s < {defaults:.1f} s with Airflow's defaults"
