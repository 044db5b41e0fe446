"""Shared fixtures: a real Postgres (pgserver), the real local model server, Airflow's env.

Everything is started once per test session under a temporary folder and stopped at the
end, so a run leaves no process behind. The tests empty the tables they use, so they never
follow ``REPLAYABLE_DATABASE_URL``; ``REPLAYABLE_TEST_DATABASE_URL`` points them at another
(disposable) Postgres instead of the embedded one.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from devtools import devenv
from devtools.model_server import LocalModelServer
from replayable import db, sources
from strict_skips import pytest_runtest_makereport  # noqa: F401  # REPLAYABLE_STRICT=1

if TYPE_CHECKING:
    from in_process import PipelineInProcess

# The session's one running Airflow, for the e2e modules that need one (shared_airflow).
pytest_plugins = ["shared_airflow"]

# Airflow reads its home when first imported: keep the tests' own Airflow out of ~/airflow.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="replayable-airflow-"))
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
# Every process this session starts inherits the mark, so that the leftover check can tell
# this session's orphans from those of other sessions running on the same machine.
SESSION_ENV = "REPLAYABLE_TEST_SESSION"
os.environ[SESSION_ENV] = uuid.uuid4().hex
SERVICE_WORDS = ("airflow", "replayable", "postgres", "celery", "redis", "uvicorn", "gunicorn")


def adopt_orphans(adopt: bool = True) -> None:
    """Make this process the subreaper of what it starts (Linux): daemons stay its children.

    A server that detaches (`pg_ctl start`, a killed parent's children) is re-parented to
    this process instead of init, so it is never an orphan that another session's leftover
    check, on the same machine, could mistake for its own and stop mid-run.
    """
    if sys.platform != "linux":
        return
    import ctypes

    pr_set_child_subreaper = 36
    ctypes.CDLL(None).prctl(pr_set_child_subreaper, int(adopt), 0, 0, 0)


adopt_orphans()

ROOT = Path(__file__).resolve().parents[1]


def session_orphans(started: float) -> list[Any]:
    """This session's orphans: processes of the project's services re-parented to init.

    A parent that was killed leaves its children behind, re-parented to init; those started
    since ``started`` whose environment carries this session's mark are this session's.
    Other sessions' orphans (other test runs, `make airflow`) are not, whatever they run.
    """
    import psutil

    marker = os.environ[SESSION_ENV]
    found = []
    for proc in psutil.process_iter(["ppid", "create_time", "cmdline"]):
        info = proc.info
        if (
            info["ppid"] != 1
            or (info["create_time"] or 0) < started
            or not any(w in " ".join(info["cmdline"] or []) for w in SERVICE_WORDS)
        ):
            continue
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(SESSION_ENV) == marker:
                found.append(proc)
    return found


# Fixtures that reach a real Postgres: a test using one is in the `db` tier.
_DB_FIXTURES = frozenset(
    {"conn", "dsn", "services", "database", "airflow_env", "run_dag", "run_in_process"}
)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``-n``) the controller runs no test: only its workers adopt.

    Each worker is a session of its own (its own mark, Postgres and model server). Were the
    controller a subreaper too, a process a worker lets go to init, as the leftover-check
    tests do on purpose, would become the controller's child, which never reaps it.
    """
    numprocesses = config.getoption("numprocesses", default=None)
    if numprocesses and "PYTEST_XDIST_WORKER" not in os.environ:
        adopt_orphans(False)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses the real Postgres `db`, so tiers select by marker."""
    for item in items:
        if _DB_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.db)


# How long the leftover check waits for processes that are still ending; a sub-session that
# tests the check itself shortens it.
GRACE_ENV = "REPLAYABLE_TEST_LEFTOVER_GRACE_S"
# The helpers multiprocessing starts once for the process that uses them: each reads a pipe
# from that process and exits when it closes, so one started by this process ends with it.
_MULTIPROCESSING_HELPERS = (
    "from multiprocessing.resource_tracker import main",
    "from multiprocessing.forkserver import main",
)


def multiprocessing_helper(proc: Any, parent_pid: int) -> bool:
    """Whether ``proc`` is multiprocessing's resource tracker or forkserver of ``parent_pid``.

    Only a helper whose parent is ``parent_pid`` itself ends when that process does; a
    worker, a spawned child, or a helper of some other process is not one, whatever its
    command line mentions.
    """
    if proc.ppid() != parent_pid:
        return False
    cmdline = proc.cmdline()
    if "-c" not in cmdline[1:-1]:
        return False
    code = cmdline[cmdline.index("-c", 1) + 1]
    return code.startswith(_MULTIPROCESSING_HELPERS)


def left_running(me: Any, started: float) -> list[Any]:
    """This session's processes still running: descendants of ``me`` and its orphans."""
    import psutil

    found = {p.pid: p for p in me.children(recursive=True)}
    for proc in session_orphans(started):
        found.setdefault(proc.pid, proc)
    alive = []
    for proc in found.values():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and not multiprocessing_helper(proc, me.pid):
                alive.append(proc)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.fixture(scope="session", autouse=True)
def nothing_left_running() -> Iterator[None]:
    """After the whole session, no process started by a test may still be running.

    Set up first, so torn down last: every fixture that starts a server has stopped it by
    then. A survivor fails the session (and is killed, so that it cannot outlive CI).
    """
    import psutil

    me = psutil.Process()
    started = time.time()
    yield
    deadline = time.monotonic() + float(os.environ.get(GRACE_ENV, "15"))
    left = left_running(me, started)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = left_running(me, started)
    if left:
        names = []
        for proc in left:
            with contextlib.suppress(psutil.Error):
                names.append(f"{proc.pid}: {' '.join(proc.cmdline()[:3])}")
        for proc in left:
            devenv.stop_tree(proc.pid, timeout_s=2)
        pytest.fail(f"processes left running after the tests: {names}")


@pytest.fixture(scope="session")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("state")


@pytest.fixture(scope="session")
def model_server() -> Iterator[LocalModelServer]:
    with LocalModelServer(dim=32) as server:
        yield server


@pytest.fixture
def model(model_server: LocalModelServer) -> Iterator[LocalModelServer]:
    """The model server with no faults and zeroed counters, reset again afterwards."""
    model_server.clear_faults()
    model_server.reset_stats()
    yield model_server
    model_server.clear_faults()


def scratch_database(dsn: str) -> None:
    """Stop the tests' own Postgres from flushing to disk: its data lives for one session.

    Commits still reach the kernel before they return, so a killed Postgres (a test's
    restart, an outage) loses nothing; only a crash of the machine could, and the session
    would be lost with it.
    """
    conn = db.connect(dsn, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("ALTER SYSTEM SET fsync = off")
            cur.execute("ALTER SYSTEM SET full_page_writes = off")
            cur.execute("SELECT pg_reload_conf()")
    finally:
        conn.close()


@pytest.fixture(scope="session")
def services(state_dir: Path, model_server: LocalModelServer) -> Iterator[devenv.Services]:
    with pytest.MonkeyPatch.context() as env:
        env.delenv("REPLAYABLE_DATABASE_URL", raising=False)
        if test_db := os.environ.get("REPLAYABLE_TEST_DATABASE_URL"):
            env.setenv("REPLAYABLE_DATABASE_URL", test_db)
        started = devenv.start(state_dir, model_url=model_server.base_url)
    if started.pgdata:
        scratch_database(started.replayable_dsn)
    try:
        yield started
    finally:
        devenv.stop(state_dir)


@pytest.fixture(scope="session")
def dsn(services: devenv.Services) -> str:
    return services.replayable_dsn


# Up to this many rows a table is emptied with DELETE, above it with TRUNCATE (see below).
_DELETE_UP_TO = 1000


def empty_ledger(conn: Any) -> None:
    """Empty the replayable schema as ``devenv.empty_ledger`` does, in a few milliseconds.

    TRUNCATE of every table costs about 0.2 s (a new file per table and index), paid before
    each of several hundred tests. Most tests leave a few tables with a few rows: those are
    emptied with DELETE, with triggers and foreign-key checks off for the transaction
    (``session_replication_role``), so that no trigger writes a counter or a history row
    while it empties, as with TRUNCATE. Large tables are truncated, so that no test scans a
    bloated table. Without the superuser right that setting needs, it falls back to
    ``devenv.empty_ledger``.
    """
    from psycopg2 import sql

    with conn.cursor() as cur:
        cur.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        superuser = bool(cur.fetchone()[0])
    if not superuser:
        devenv.empty_ledger(conn)
        return
    with conn.cursor() as cur:
        cur.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'replayable'"
            " AND tablename <> 'schema_migrations' ORDER BY tablename"
        )
        names = [row[0] for row in cur.fetchall()]
        if not names:
            conn.commit()
            return
        # Rows per table, counted up to one past the DELETE limit, in one statement.
        cur.execute(
            sql.SQL("SELECT ARRAY[{}]").format(
                sql.SQL(", ").join(
                    sql.SQL("(SELECT count(*) FROM (SELECT FROM {} LIMIT {}) AS t)").format(
                        sql.Identifier("replayable", name), sql.Literal(_DELETE_UP_TO + 1)
                    )
                    for name in names
                )
            )
        )
        counts = dict(zip(names, cur.fetchone()[0], strict=True))
        large = [name for name, n in counts.items() if n > _DELETE_UP_TO]
        small = [name for name, n in counts.items() if 0 < n <= _DELETE_UP_TO]
        if large:
            tables = sql.SQL(", ").join(sql.Identifier("replayable", n) for n in large)
            cur.execute(sql.SQL("TRUNCATE {} CASCADE").format(tables))
        if small:
            cur.execute("SET LOCAL session_replication_role = replica")
            for name in small:
                cur.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier("replayable", name)))
    devenv.drop_search_indexes(conn)
    conn.commit()


@pytest.fixture
def conn(dsn: str) -> Iterator[Any]:
    """A connection to an emptied replayable database."""
    connection = db.connect(dsn)
    empty_ledger(connection)
    yield connection
    connection.close()


@pytest.fixture(scope="session")
def airflow_env(
    services: devenv.Services, state_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    env = devenv.airflow_env(services, state_dir)
    # The tests' documents live in their temporary folders: allow those as source roots.
    env[sources.ROOTS_ENV] = str(tmp_path_factory.getbasetemp())
    devenv.migrate_airflow(env)
    return env


class DagRunner:
    """Runs a pipeline DAG (document_pipeline unless ``dag_id`` says) through ``airflow dags
    test`` and reads back its report."""

    def __init__(self, env: dict[str, str], dsn: str, log_dir: Path) -> None:
        self.env = env
        self.dsn = dsn
        self.log_dir = log_dir
        self.runs = 0

    def __call__(
        self,
        conf: dict[str, Any],
        *,
        env: dict[str, str] | None = None,
        dag_id: str = devenv.DAG_ID,
    ) -> dict[str, Any]:
        self.runs += 1
        log_path = self.log_dir / f"dags-test-{self.runs}.log"
        airflow = str(Path(sys.executable).with_name("airflow"))
        started = datetime.now(UTC)
        with open(log_path, "w") as log:
            done = subprocess.run(
                [airflow, "dags", "test", dag_id, "--conf", json.dumps(conf)],
                env={**os.environ, **self.env, **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                check=False,
                timeout=900,
            )
        report = devenv.latest_report(self.dsn, started) or {}
        report["_returncode"] = done.returncode
        report["_log"] = str(log_path)
        return report


@pytest.fixture
def run_in_process(
    services: devenv.Services,
    state_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    conn: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> PipelineInProcess:
    """document_pipeline's tasks run in this process (tests/in_process.py), on an empty ledger.

    Only Airflow's connections and the source roots come from the environment the real
    Airflow gets; no Airflow metadata database or process is involved.
    """
    from in_process import PipelineInProcess

    for key, value in devenv.airflow_env(services, state_dir).items():
        if key.startswith("AIRFLOW_CONN_"):
            monkeypatch.setenv(key, value)
    monkeypatch.setenv(sources.ROOTS_ENV, str(tmp_path_factory.getbasetemp()))
    return PipelineInProcess(monkeypatch)


@pytest.fixture
def run_dag(airflow_env: dict[str, str], dsn: str, tmp_path: Path, conn: Any) -> DagRunner:
    return DagRunner(airflow_env, dsn, tmp_path)
