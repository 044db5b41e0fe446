"""Shared fixtures: a real Postgres (pgserver), the real local model server, Airflow's env.

Everything is started once per test session under a temporary folder and stopped at the
end, so a run leaves no process behind. The tests empty the tables they use, so they never
follow ``REPLAYABLE_DATABASE_URL``; ``REPLAYABLE_TEST_DATABASE_URL`` points them at another
(disposable) Postgres instead of the embedded one.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
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
from helpers.ledger import empty_ledger, scratch_database
from helpers.session import GRACE_ENV, SESSION_ENV, adopt_orphans, left_running
from replayable import db, sources
from strict_skips import pytest_runtest_makereport  # noqa: F401  # REPLAYABLE_STRICT=1

if TYPE_CHECKING:
    from in_process import PipelineInProcess

# The session's one running Airflow, for the e2e modules that need one (shared_airflow).
pytest_plugins = ["shared_airflow"]

# Airflow reads its home when first imported: keep the tests' own Airflow out of ~/airflow.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="replayable-airflow-"))
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
# The guarded pools' workers fork from multiprocessing's forkserver (replayable.guards): with
# the extraction's modules imported there once, a worker that a test's pipeline run starts
# does not import PDFium again, a third of a second of CPU paid on every run otherwise.
multiprocessing.set_forkserver_preload(
    ["replayable.guards.worker", "replayable.stages.extract.pdf"]
)
# Every process this session starts inherits the mark (helpers.session).
os.environ[SESSION_ENV] = uuid.uuid4().hex
adopt_orphans()

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
