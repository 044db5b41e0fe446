"""The local services under a state folder: the embedded Postgres and the model server.

``start`` starts (or reuses) them and writes ``services.json``; ``stop`` stops what
``start`` started, Postgres with its own ``pg_ctl stop``, the model server by killing its
process group. Also here: what the tests, benchmarks and chaos runs need of the database
(``empty_ledger``, ``latest_report``, ``postgres_conn_json``) and ``stop_tree``, which every
part of the dev environment stops its processes with.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from replayable.vocabulary import DATABASE_URL_ENV

# The repository root: devtools/ is a source-checkout tool, never installed.
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_STATE = ROOT / ".local"


@dataclass(frozen=True)
class Services:
    """Where the running services are."""

    replayable_dsn: str  # libpq URI of the replayable database
    airflow_db_url: str  # SQLAlchemy URL of Airflow's metadata database
    model_url: str  # OpenAI-compatible API root, ending in /v1
    model_pid: int | None
    pgdata: str | None  # set when the embedded server is ours to stop
    # The model server's start time (psutil's create_time): with it, a pid reused since is
    # never taken for the server (ADR 0079). Records without it are never signalled.
    model_started: float | None = None

    @classmethod
    def load(cls, state: Path) -> Services:
        path = state / "services.json"
        if not path.exists():
            raise SystemExit(f"no services are running under {state}: run `make start` first")
        return cls(**json.loads(path.read_text()))


def _import_pgserver() -> Any:
    # pgserver asks platformdirs for a runtime dir at import; without XDG_RUNTIME_DIR that
    # only warns and falls back to /tmp, which is what we want anyway.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver
    return pgserver


def _embedded_postgres(state: Path) -> tuple[str, str]:
    get_server = _import_pgserver().get_server

    server = get_server(state / "pg", cleanup_mode=None)
    # `stop` owns the server's lifetime; pgserver's exit hook would only log into closed streams.
    atexit.unregister(server._cleanup)
    uri = server.get_uri()
    _size_shared_buffers(server)
    existing = server.psql("SELECT datname FROM pg_database;")
    for name in ("airflow", "replayable"):
        if f" {name}\n" not in existing:
            server.psql(f"CREATE DATABASE {name};")
    host = parse_qs(urlparse(uri).query)["host"][0]
    return (
        f"postgresql://postgres@/replayable?host={host}",
        f"postgresql+psycopg2://postgres@/airflow?host={host}",
    )


def shared_buffers_mb() -> int:
    """The embedded server's shared buffers: a quarter of this machine's memory, as
    Postgres's own tuning guide advises, within 128 MB (initdb's default) and 2 GB. A
    search index read through 128 MB while a million chunks' index is 1.3 GB waits on the
    kernel for most of its pages (ADR 0120). Postgres touches only the pages it uses."""
    import psutil

    quarter = int(psutil.virtual_memory().total) // 4 // 2**20
    return min(2048, max(128, quarter))


def _size_shared_buffers(server: Any) -> None:
    """Give a new embedded server its shared buffers: set once in its data folder, with the
    one restart that takes; later starts read it from there."""
    wanted = shared_buffers_mb()
    now = server.psql("SELECT pg_size_bytes(current_setting('shared_buffers')) / 2^20;")
    if int(float(now.split()[2])) == wanted:
        return
    server.psql(f"ALTER SYSTEM SET shared_buffers = '{wanted}MB';")
    _import_pgserver().pg_ctl(
        ["-w", "-m", "fast", "-l", str(server.log), "restart"],
        pgdata=server.pgdata,
        user=server.system_user,
        timeout=60,
    )


def _start_model_server(state: Path) -> tuple[str, int, float]:
    """Start the local model server detached: it outlives this process until ``stop``.

    Returns its URL, pid and start time.
    """
    import psutil

    from devtools.model_server import LocalModelServer

    server = LocalModelServer(
        port_file=state / "model.port",
        log_path=state / "model-server.log",
        tie_to_parent=False,
    ).start()
    return server.base_url, server.pid, psutil.Process(server.pid).create_time()


def same_process(pid: int, started: float | None) -> bool:
    """Whether ``pid`` is still the process that was recorded as started at ``started``."""
    import psutil

    if started is None:
        return False
    try:
        created: float = psutil.Process(pid).create_time()
    except psutil.Error:
        return False
    return abs(created - started) < 1


def model_server_running(services: Services) -> bool:
    """Whether the model server ``services`` recorded is still that process."""
    return services.model_pid is not None and same_process(
        services.model_pid, services.model_started
    )


def start(state: Path = DEFAULT_STATE, *, model_url: str | None = None) -> Services:
    """Start (or reuse) the database and the model server; write ``services.json``.

    With ``model_url`` no model server is started: that endpoint is used instead.
    """
    state.mkdir(parents=True, exist_ok=True)
    path = state / "services.json"
    if path.exists():
        services = Services.load(state)
        if services.model_pid is None or model_server_running(services):
            return services
        stop(state)
    external = os.environ.get(DATABASE_URL_ENV)
    if external:
        replayable_dsn = external
        airflow_db = os.environ.get(
            "REPLAYABLE_AIRFLOW_DATABASE_URL",
            "postgresql+psycopg2://" + external.split("://", 1)[1],
        )
        pgdata = None
    else:
        replayable_dsn, airflow_db = _embedded_postgres(state)
        pgdata = str(state / "pg")
    model_pid = model_started = None
    if model_url is None:
        model_url, model_pid, model_started = _start_model_server(state)
    services = Services(replayable_dsn, airflow_db, model_url, model_pid, pgdata, model_started)
    path.write_text(json.dumps(asdict(services), indent=2))
    _ensure_schema(services)
    return services


def stop(state: Path = DEFAULT_STATE) -> None:
    """Stop whatever ``start`` started under ``state``; safe to call twice.

    The model server is only stopped while its pid is still the process that was started
    (same start time), as ``stop_cluster`` does: after a crash or a reboot the number may
    belong to something else, and its whole process group would be killed.
    """
    path = state / "services.json"
    if not path.exists():
        return
    services = Services(**json.loads(path.read_text()))
    if model_server_running(services):
        assert services.model_pid is not None
        stop_tree(services.model_pid)
    elif services.model_pid:
        print(
            f"model server pid {services.model_pid} is no longer the server that was started;"
            " not signalled",
            file=sys.stderr,
        )
    if services.pgdata:
        _stop_postgres(Path(services.pgdata))
    path.unlink()


@contextlib.contextmanager
def running(state: Path) -> Iterator[Services]:
    """Start the services for the duration of a command; stop them if they were started here.

    SIGTERM and SIGHUP end the command like Ctrl-C does, so the services are stopped on
    every way out.
    """
    started_here = not (state / "services.json").exists()

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield start(state)
    finally:
        # A second Ctrl-C must not cut the clean-up short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if started_here:
            stop(state)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _stop_postgres(pgdata: Path) -> None:
    # pgserver builds its command wrappers at import time.
    pg_ctl = _import_pgserver().pg_ctl

    if not (pgdata / "postmaster.pid").exists():
        return
    user = "pgserver" if os.geteuid() == 0 else None
    with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user)


def stop_tree(pid: int, timeout_s: float = 10.0) -> None:
    """Stop ``pid``, its process group and every process it started, however they detached.

    The descendants are listed before any signal is sent: once a parent dies, its children
    are re-parented to init and can no longer be found from it. SIGTERM first, then SIGKILL
    for whatever is still there after ``timeout_s``.
    """
    import psutil

    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    for proc in family:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(family, timeout=timeout_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)


def _ensure_schema(services: Services) -> None:
    from replayable import db

    conn = db.connect(services.replayable_dsn)
    try:
        db.migrate(conn)
    finally:
        conn.close()


def postgres_conn_json(dsn: str) -> str:
    """The libpq URI ``dsn`` as an Airflow postgres connection in JSON form."""
    url = urlparse(dsn)
    query = parse_qs(url.query)
    host = query.get("host", [url.hostname or ""])[0]
    return json.dumps(
        {
            "conn_type": "postgres",
            "host": host,
            "port": url.port,
            "login": unquote(url.username or "postgres"),
            "password": unquote(url.password or ""),
            "schema": url.path.lstrip("/") or "postgres",
        }
    )


def empty_ledger(conn: Any) -> None:
    """Empty every table of the replayable schema but its migration record, drop the
    search indexes that searches built (replayable.search.ensure_index), and commit.

    For the tests, the benchmarks and the chaos runs, between one case and the next. The
    tables are read from the catalog, so a table a migration adds is emptied too.
    """
    from psycopg2 import sql

    with conn.cursor() as cur:
        cur.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'replayable'"
            " AND tablename <> 'schema_migrations' ORDER BY tablename"
        )
        names = [row[0] for row in cur.fetchall()]
        if names:
            tables = sql.SQL(", ").join(sql.Identifier("replayable", n) for n in names)
            cur.execute(sql.SQL("TRUNCATE {} CASCADE").format(tables))
    drop_search_indexes(conn)
    conn.commit()


def drop_search_indexes(conn: Any) -> None:
    """Drop the search indexes that searches built (``embeddings_hnsw_*``); the caller
    commits. They are derived from the vectors, and the next search builds them again."""
    from psycopg2 import sql

    with conn.cursor() as cur:
        cur.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = 'replayable'"
            " AND indexname LIKE 'embeddings\\_hnsw\\_%'"
        )
        for (index,) in cur.fetchall():
            cur.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier("replayable", index)))


def latest_report(dsn: str, since: datetime, dag_id: str | None = None) -> dict[str, Any] | None:
    """The newest run report written at or after ``since`` (by ``dag_id``'s runs if given)."""
    from replayable import db

    conn = db.connect(dsn)
    try:
        rows = db.fetch_all(conn, "report/latest_report", {"since": since, "dag_id": dag_id})
    finally:
        conn.close()
    return rows[0]["report"] if rows else None
