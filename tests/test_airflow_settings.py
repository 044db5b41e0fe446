"""The Airflow settings every deployment shares (airflow.env), as Airflow itself reads them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from devtools import devenv

# Run in a fresh interpreter whose environment has airflow.env: Airflow's modules read their
# settings once, at import.
_READ_SETTINGS = """
import json
from airflow.configuration import conf
from airflow.sdk.execution_time import supervisor
print(json.dumps({
    "interval": supervisor.MIN_HEARTBEAT_INTERVAL,
    "failures": supervisor.MAX_FAILED_HEARTBEATS,
    "retries": conf.getint("workers", "execution_api_retries"),
    "wait_min": conf.getfloat("workers", "execution_api_retry_wait_min"),
}))
"""


def _supervisor_settings() -> dict[str, Any]:
    """The supervisor's heartbeat settings as Airflow reads them from airflow.env."""
    env = {**os.environ, **devenv.shared_airflow_env()}
    out = subprocess.run(
        [sys.executable, "-c", _READ_SETTINGS],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def test_a_task_supervisor_waits_at_most_a_second_between_looks_at_its_task() -> None:
    """A task's supervisor reports the end of its task (and so frees its downstream tasks)
    only once it has seen the process exit. When the task closes its sockets just before it
    exits, the supervisor waits in select() with nothing to watch for up to
    ``[workers] min_heartbeat_interval``: 5 s by default, which was a third of the task
    instances of a run on 2 cores and most of an identical re-run's time (ADR 0122)."""
    assert _supervisor_settings()["interval"] <= 1


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
    settings = _supervisor_settings()
    ours = _outage_tolerated_s(**settings)
    defaults = _outage_tolerated_s(5, 3, settings["retries"], settings["wait_min"])
    assert ours >= defaults, f"{ours:.1f} s < {defaults:.1f} s with Airflow's defaults"
