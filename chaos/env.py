"""A real Airflow for the chaos scenarios, with everything it runs on.

:class:`ChaosEnv` starts, under one working folder:

- the replayable database on its own embedded Postgres (pgserver), which scenario (c)
  stops and starts again, on the same socket;
- Airflow's metadata database on a second embedded Postgres, so that restarting the first
  does not take the scheduler and the API server down with it (ADR 0030);
- the local model server (``devtools.model_server``), with fault injection;
- Airflow's API server, scheduler (LocalExecutor) and DAG processor as separate processes
  (:class:`devtools.devenv.AirflowProcesses`), each killable or restartable on its own;
- a REST client logged in as the generated admin user.

Everything started here is stopped on the way out, whichever way that is.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import psycopg2

from devtools import devenv
from devtools.model_server import LocalModelServer
from replayable import db, sources

DAG = devenv.DAG_ID
MODEL = "text-embedding-3-small"

# Airflow settings for a 2-core machine and for faults that must be noticed within a scenario.
AIRFLOW_SETTINGS = {
    # More slots than a run has batches (six): batches that wait for a frozen task's chunks
    # must leave one for its next try (ADR 30). LocalExecutor forks them all at start.
    "AIRFLOW__CORE__PARALLELISM": "8",
    # Scenario (b): a frozen task is given up after 20 s without a heartbeat (default 300 s);
    # a live one heartbeats every 5 s ([workers] min_heartbeat_interval).
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
    # Scenario (e): task instances of a scheduler that is gone are reset within seconds
    # (defaults: checked every 300 s, a scheduler is gone after 30 s without a heartbeat).
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "10",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "20",
}
# The provider's request deadline: far above a healthy answer, short enough that a hang is
# given up on quickly in scenario (f).
MODEL_TIMEOUT_S = 5
MODEL_MAX_IN_FLIGHT = 4
# The webhook every run's publish task delivers its events to (the model server's receiver).
# One delivery try per event per round: an outage is judged across rounds (scenario j), and a
# round over a down receiver must not spend minutes in per-event retries.
WEBHOOK = "chaos-events"
WEBHOOK_EXTRA = {"timeout_s": 5, "max_attempts": 1, "max_total_s": 0}
# A standby name no server answers to: every commit then waits after it is durable (ADR 0081).
_NO_STANDBY = "chaos_no_such_standby"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pgserver() -> Any:
    # pgserver asks platformdirs for a runtime dir at import; without XDG_RUNTIME_DIR that
    # only warns and falls back to /tmp, which is what we want anyway.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver
    return pgserver


class EmbeddedPostgres:
    """One pgserver data folder whose server runs as a child of this process.

    pgserver creates the folder and picks the socket folder; the server is then run here,
    not through ``pg_ctl start``, which leaves it re-parented to init: an orphan that the
    leftover-process checks of other test sessions on the same machine would stop. Stopping
    is a fast shutdown (sessions ended, transactions rolled back), as a restart does, and
    :meth:`resume` starts it again on the same socket.
    """

    def __init__(self, pgdata: Path) -> None:
        self.pgdata = pgdata
        self.host = ""
        self._user = "pgserver" if os.geteuid() == 0 else None
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> EmbeddedPostgres:
        """Create the folder (first time) and start the server."""
        import atexit
        from urllib.parse import parse_qs, urlparse

        pgserver = _pgserver()
        server = pgserver.get_server(self.pgdata, cleanup_mode=None)
        # stop() owns the server's lifetime; pgserver's exit hook would only log into closed
        # streams.
        atexit.unregister(server._cleanup)
        self.host = parse_qs(urlparse(server.get_uri()).query)["host"][0]
        pgserver.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=self._user)
        self.resume()
        return self

    def dsn(self, database: str) -> str:
        return f"postgresql://postgres@/{database}?host={self.host}"

    def hold_commits(self, hold: bool) -> None:
        """Make every writing commit wait, once durable, for a standby that never answers.

        With ``synchronous_standby_names`` set, a commit is flushed to the WAL (it survives
        anything from then on) and its session then waits for the standby before it tells
        the client, still holding its locks; until then no other session sees it. Whoever
        holds the commits can kill the client in that window: the transaction is committed
        and the client never heard so, which is "killed after its commit" exactly, with no
        race. Read-only transactions write no commit record and never wait.
        """
        conn = db.connect(self.dsn("postgres"), autocommit=True)
        try:
            with conn.cursor() as cur:
                if hold:
                    cur.execute("ALTER SYSTEM SET synchronous_standby_names = %s", (_NO_STANDBY,))
                else:
                    cur.execute("ALTER SYSTEM RESET synchronous_standby_names")
                cur.execute("SELECT pg_reload_conf()")
        finally:
            conn.close()

    def create_database(self, name: str) -> None:
        conn = db.connect(self.dsn("postgres"), autocommit=True)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
                if cur.fetchone() is None:
                    # A constant name chosen here, not input.
                    cur.execute(f"CREATE DATABASE {name}")
        finally:
            conn.close()

    def resume(self, timeout_s: float = 60) -> None:
        """Start the (stopped) server and wait until it accepts connections."""
        from pgserver._commands import POSTGRES_BIN_PATH

        with open(self.pgdata.parent / f"{self.pgdata.name}.log", "ab") as log:
            self._proc = subprocess.Popen(
                [
                    str(POSTGRES_BIN_PATH / "postgres"),
                    "-D",
                    str(self.pgdata),
                    "-h",
                    "",
                    "-k",
                    self.host,
                ],
                user=self._user,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                db.connect(self.dsn("postgres")).close()
                return
            except psycopg2.OperationalError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        """Fast shutdown: SIGINT to the server, which ends every session and exits."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class AirflowApi:
    """The REST API of the running Airflow, logged in as its admin."""

    def __init__(self, url: str, token: Callable[[], str]) -> None:
        self._token = token
        self.http = httpx.Client(base_url=f"{url}/api/v2", timeout=30, trust_env=False)
        self.login()

    def login(self) -> None:
        self.http.headers["Authorization"] = f"Bearer {self._token()}"

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One call, retried while the API server is away (it restarts in scenario (e))."""
        deadline = time.monotonic() + 180
        while True:
            try:
                response = self.http.request(method, path, **kwargs)
                if response.status_code == 401:
                    self.login()
                    response = self.http.request(method, path, **kwargs)
                if response.status_code < 500:
                    return response
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
            if time.monotonic() > deadline:
                response.raise_for_status()
            time.sleep(1)

    def wait_for_dag(self, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while self.request("GET", f"/dags/{DAG}").status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the DAG {DAG} was not parsed within {timeout_s:.0f} s")
            time.sleep(1)

    def trigger(self, conf: dict[str, Any]) -> str:
        body = {"logical_date": None, "conf": conf}
        response = self.request("POST", f"/dags/{DAG}/dagRuns", json=body)
        if response.status_code != 200:
            raise RuntimeError(f"trigger refused ({response.status_code}): {response.text}")
        return str(response.json()["dag_run_id"])

    def state(self, run_id: str) -> str:
        response = self.request("GET", f"/dags/{DAG}/dagRuns/{run_id}")
        response.raise_for_status()
        return str(response.json()["state"])

    def wait(self, run_id: str, timeout_s: float = 1200) -> str:
        """Wait for the run to end; return ``success`` or ``failed``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.state(run_id)
            if state in ("success", "failed"):
                return state
            time.sleep(2)
        raise TimeoutError(f"run {run_id} did not end within {timeout_s:.0f} s")

    def params(self) -> dict[str, Any]:
        """The DAG's params as Airflow serialised them (name -> spec)."""
        response = self.request("GET", f"/dags/{DAG}/details")
        response.raise_for_status()
        return dict(response.json().get("params") or {})

    def fail_run(self, run_id: str) -> None:
        """Mark a run failed (what an operator does with a run that cannot end)."""
        response = self.request("PATCH", f"/dags/{DAG}/dagRuns/{run_id}", json={"state": "failed"})
        response.raise_for_status()

    def task_instances(self, run_id: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        while True:
            response = self.request(
                "GET",
                f"/dags/{DAG}/dagRuns/{run_id}/taskInstances",
                params={"limit": 100, "offset": len(found)},
            )
            response.raise_for_status()
            page = response.json()["task_instances"]
            found += page
            if len(page) < 100:
                return found

    def clear_failed(self, run_id: str) -> list[dict[str, Any]]:
        """Clear the run's failed task instances (and what they hold up): one operator action."""
        response = self.request(
            "POST",
            f"/dags/{DAG}/clearTaskInstances",
            json={
                "dag_run_id": run_id,
                "only_failed": True,
                "include_downstream": True,
                "reset_dag_runs": True,
                "dry_run": False,
            },
        )
        response.raise_for_status()
        return list(response.json()["task_instances"])

    def close(self) -> None:
        self.http.close()


class ChaosEnv:
    """Two embedded Postgres servers, the local model server and Airflow, under ``workdir``.

    :param workdir: an empty folder for every server's data and logs.
    :param source_root: the folder the corpora are written to (an allowed source root).
    """

    def __init__(self, workdir: Path, source_root: Path) -> None:
        self.workdir = workdir
        self.source_root = source_root
        self.data_pg = EmbeddedPostgres(workdir / "pg-replayable")
        self.meta_pg = EmbeddedPostgres(workdir / "pg-airflow")
        self._stack = contextlib.ExitStack()
        self.model: LocalModelServer
        self.airflow: devenv.AirflowProcesses
        self.api: AirflowApi
        self.dsn = ""

    def __enter__(self) -> ChaosEnv:
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stack.close()

    def _start(self) -> None:
        stack = self._stack
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.source_root.mkdir(parents=True, exist_ok=True)
        for pg, name in ((self.data_pg, "replayable"), (self.meta_pg, "airflow")):
            stack.callback(pg.stop)
            pg.start()
            pg.create_database(name)
        self.dsn = self.data_pg.dsn("replayable")
        conn = db.connect(self.dsn)
        try:
            db.migrate(conn)
        finally:
            conn.close()
        self.model = stack.enter_context(
            LocalModelServer(
                dim=32,
                port_file=self.workdir / "model.port",
                log_path=self.workdir / "model-server.log",
            )
        )
        services = devenv.Services(
            replayable_dsn=self.dsn,
            airflow_db_url=f"postgresql+psycopg2://postgres@/airflow?host={self.meta_pg.host}",
            model_url=self.model.base_url,
            model_pid=None,
            pgdata=None,
        )
        env = devenv.airflow_env(services, self.workdir, api_port=free_port())
        env.update(AIRFLOW_SETTINGS)
        # Every component signs or checks the same task tokens, across restarts.
        env["AIRFLOW__API_AUTH__JWT_SECRET"] = secrets.token_urlsafe(32)
        env[sources.ROOTS_ENV] = str(self.source_root)
        env["AIRFLOW_CONN_REPLAYABLE_EVENTS"] = json.dumps(
            {"conn_type": "http", "host": self.webhook_url, "extra": WEBHOOK_EXTRA}
        )
        env["AIRFLOW_CONN_REPLAYABLE_MODEL"] = json.dumps(
            {
                "conn_type": "http",
                "host": self.model.base_url,
                "extra": {
                    "model": MODEL,
                    "timeout_s": MODEL_TIMEOUT_S,
                    "max_in_flight": MODEL_MAX_IN_FLIGHT,
                },
            }
        )
        self.airflow = stack.enter_context(
            devenv.AirflowProcesses(env, self.workdir / "airflow-logs")
        )
        self.api = AirflowApi(self.airflow.url, self.airflow.token)
        stack.callback(self.api.close)
        self.api.wait_for_dag()

    # -- between scenarios -------------------------------------------------------------

    @property
    def webhook_url(self) -> str:
        """Where every run's publish task delivers its events."""
        return str(self.model.webhook_url(WEBHOOK))

    def reset(self, faults: dict[str, Any]) -> None:
        """Empty the replayable database, zero the provider's counters, set its faults."""
        with self.connection() as conn:
            devenv.empty_ledger(conn)
        self.model.clear_faults()
        self.model.reset_stats()
        self.model.set_faults(faults)

    @contextlib.contextmanager
    def connection(self) -> Iterator[Any]:
        """A fresh connection to the replayable database, retried while it restarts."""
        deadline = time.monotonic() + 120
        while True:
            try:
                conn = db.connect(self.dsn)
                break
            except psycopg2.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        try:
            yield conn
        finally:
            conn.close()

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        with self.connection() as conn, conn.cursor() as cur:
            cur.execute(sql, params)
            rows = list(cur.fetchall())
            conn.commit()
            return rows

    def scalar(self, sql: str, params: Any = None) -> Any:
        return self.query(sql, params)[0][0]

    def settle_provider(self, timeout_s: float = 120) -> dict[str, Any]:
        """Release held requests, wait until none is in flight, return the provider's stats."""
        self.model.clear_faults()
        deadline = time.monotonic() + timeout_s
        stats = self.model.stats()
        while stats["in_flight"] and time.monotonic() < deadline:
            time.sleep(0.5)
            stats = self.model.stats()
        return stats
