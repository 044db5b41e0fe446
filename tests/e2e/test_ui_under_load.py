"""The UI under load inside a running Airflow leaves Airflow's own threads alone (ADR 0073).

The plugin runs in the API server, whose sync routes share one pool of worker threads: the
UI's, Airflow's REST API and the execution API that task supervisors heartbeat to. Here a
task heartbeats (a probe DAG whose one task waits for a file) while 50 clients keep loading
heavy UI pages: pages whose queries wait on a lock the test holds, so that the UI's few
database connections stay taken. Each client honours ``Retry-After`` as a well-behaved one
would, and asks again at once when not told when. The workers run with a short heartbeat
leash (a heartbeat unanswered after two tries of 3 s kills the task), so a starved
heartbeat route kills the task within seconds instead of minutes.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg2
import pytest

from devtools import devenv
from replayable import sources

pytestmark = pytest.mark.e2e

PROBE = "heartbeat_probe"
CLIENTS = 50
HEAVY_PAGES = (
    "/replayable/",
    "/replayable/failed",
    "/replayable/dead-letters",
    "/replayable/api/summary",
)
PROBE_DAG = '''
"""One task that heartbeats until the test releases it."""

import time
from pathlib import Path

from airflow.sdk import dag, get_current_context, task

STARTED = Path({started!r})
RELEASE = Path({release!r})


@dag(schedule=None, catchup=False)
def {dag_id}():
    @task(retries=0)
    def wait_for_release() -> None:
        if get_current_context()["dag_run"].conf.get("warm_up"):
            return
        STARTED.touch()
        deadline = time.monotonic() + 600
        while not RELEASE.exists():
            if time.monotonic() > deadline:
                raise TimeoutError("never released")
            time.sleep(0.2)

    wait_for_release()


{dag_id}()
'''


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Probe:
    url: str
    token: str
    metadata_dsn: str
    started: Path
    release: Path

    def http(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def trigger(self, http: httpx.Client, conf: dict[str, Any]) -> str:
        triggered = http.post(
            f"/api/v2/dags/{PROBE}/dagRuns", json={"logical_date": None, "conf": conf}
        )
        assert triggered.status_code == 200, triggered.text
        return str(triggered.json()["dag_run_id"])

    def task(self, run_id: str) -> tuple[str | None, int, datetime | None]:
        """The probe task's state, try and last heartbeat, from Airflow's metadata database.

        Read from the database, not the REST API: the REST API needs the very threads a
        starved server does not have.
        """
        with psycopg2.connect(self.metadata_dsn) as conn, conn.cursor() as cur:
            cur.execute(
                "SELECT state, try_number, last_heartbeat_at FROM task_instance"
                " WHERE dag_id = %s AND run_id = %s",
                (PROBE, run_id),
            )
            found = cur.fetchone()
        conn.close()
        return (found[0], int(found[1]), found[2]) if found else (None, 0, None)


@pytest.fixture(scope="module")
def probe(
    services: devenv.Services, state_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Probe]:
    folder = tmp_path_factory.mktemp("ui-under-load")
    dags = folder / "dags"
    dags.mkdir()
    started, release = folder / "started", folder / "release"
    source = PROBE_DAG.format(dag_id=PROBE, started=str(started), release=str(release))
    (dags / f"{PROBE}.py").write_text(source)
    env = devenv.airflow_env(services, state_dir, api_port=_free_port())
    env[sources.ROOTS_ENV] = str(tmp_path_factory.getbasetemp())
    env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags)
    env.update(
        {
            # A short leash: one heartbeat that gets no answer in two tries of 3 s kills the
            # task (defaults: three, in five tries of 5 s with up to 90 s between them). A
            # starved server still records late heartbeats; only the leash tells in time.
            "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "3",
            "AIRFLOW__WORKERS__EXECUTION_API_RETRIES": "2",
            "AIRFLOW__WORKERS__EXECUTION_API_RETRY_WAIT_MIN": "0.1",
            "AIRFLOW__WORKERS__EXECUTION_API_RETRY_WAIT_MAX": "0.3",
            "AIRFLOW__WORKERS__MAX_FAILED_HEARTBEATS": "1",
            # A page stuck on the lock keeps its connection for the whole burst.
            "AIRFLOW__REPLAYABLE__UI_STATEMENT_TIMEOUT_S": "60",
        }
    )
    with devenv.AirflowProcesses(env, folder / "logs") as procs:
        found = Probe(
            url=procs.url,
            token=procs.token(),
            metadata_dsn=services.airflow_db_url.replace(
                "postgresql+psycopg2://", "postgresql://", 1
            ),
            started=started,
            release=release,
        )
        with found.http() as http:
            deadline = time.monotonic() + 180
            while http.get(f"/api/v2/dags/{PROBE}").status_code != 200:
                assert time.monotonic() < deadline, f"{PROBE} was never parsed"
                time.sleep(1)
            # One run through start, heartbeat and finish first: the execution API's first
            # answers are slow (imports, keys), and the leash above is short.
            warm_up = found.trigger(http, {"warm_up": True})
            while found.task(warm_up)[0] not in ("success", "failed"):
                assert time.monotonic() < deadline, f"the warm-up run never ended: {warm_up}"
                time.sleep(0.5)
        yield found


@dataclass
class Burst:
    """``CLIENTS`` clients loading heavy pages until told to stop; what each answer was."""

    probe: Probe
    stop: threading.Event = field(default_factory=threading.Event)
    sent: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    answers: list[tuple[int, str | None]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def client(self, number: int) -> None:
        path = HEAVY_PAGES[number % len(HEAVY_PAGES)]
        first = True
        with self.probe.http() as http:
            while not self.stop.is_set():
                if first:
                    self.sent.release()
                    first = False
                try:
                    response = http.get(path)
                except httpx.HTTPError as err:
                    with self.lock:
                        self.failures.append(repr(err))
                    continue
                retry_after = response.headers.get("retry-after")
                with self.lock:
                    self.answers.append((response.status_code, retry_after))
                # As a page that reloads would: at once, unless told when.
                if response.status_code == 503 and retry_after:
                    self.stop.wait(float(retry_after))


def test_a_task_keeps_heartbeating_while_50_clients_load_heavy_ui_pages(
    probe: Probe, conn: Any
) -> None:
    with probe.http() as http:
        run_id = probe.trigger(http, {})
    deadline = time.monotonic() + 180
    while not probe.started.exists():
        assert time.monotonic() < deadline, f"the probe task never started: {probe.task(run_id)}"
        time.sleep(0.5)

    # Every heavy page reads one of these: its query waits, holding its connection.
    with conn.cursor() as cur:
        cur.execute(
            "LOCK TABLE replayable.stage_runs, replayable.dead_letters IN ACCESS EXCLUSIVE MODE"
        )
    burst = Burst(probe)
    clients = [threading.Thread(target=burst.client, args=(n,)) for n in range(CLIENTS)]
    heartbeats: set[datetime] = set()
    try:
        for client in clients:
            client.start()
        for _ in range(CLIENTS):
            assert burst.sent.acquire(timeout=60)
        # Every client has a request in; from here on, watch the task's heartbeats.
        _, _, before = probe.task(run_id)
        state = "running"
        deadline = time.monotonic() + 120
        while len(heartbeats) < 5 and state == "running" and time.monotonic() < deadline:
            time.sleep(0.2)
            state, _, beat = probe.task(run_id)
            if beat is not None and beat != before:
                heartbeats.add(beat)
    finally:
        burst.stop.set()
        conn.rollback()  # the pages stuck on the lock answer now
        for client in clients:
            client.join(timeout=120)
        probe.release.touch()

    deadline = time.monotonic() + 120
    while (found := probe.task(run_id))[0] not in ("success", "failed", "up_for_retry"):
        assert time.monotonic() < deadline, f"the probe task did not end: {found}"
        time.sleep(0.5)
    state, try_number, _ = found
    assert (state, try_number) == ("success", 1), "the task was killed while the UI was busy"
    assert len(heartbeats) >= 5, "the task stopped heartbeating while the UI was busy"

    # The UI was under load, and said so: every refusal carried Retry-After.
    assert burst.failures == []
    statuses = {status for status, _ in burst.answers}
    assert statuses <= {200, 503}, burst.answers
    refused = [retry_after for status, retry_after in burst.answers if status == 503]
    assert refused and all(retry_after == "1" for retry_after in refused)
    with probe.http() as http:
        assert http.get("/replayable/api/summary").status_code == 200
