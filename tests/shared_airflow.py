"""One Airflow per test session, shared by the e2e modules that need a running one.

A pytest plugin (tests/conftest.py loads it). Booting Airflow (API server, scheduler, DAG
processor, triggerer) costs tens of seconds on two cores; the API, UI and sweeper modules
used to boot their own each. Now the first test that asks for ``shared_airflow`` starts it,
on the session's Postgres and model server.

The modules that use it run one after the other, first (``pytest_collection_modifyitems``
below), and it is stopped right after the last of their tests: an idle Airflow still costs
CPU (scheduler and DAG-processor loops), which every later test would pay on two cores.

Between tests every DAG is paused, so that a run triggered by a test stays queued unless
that test asks for the scheduler (``scheduling``), and so that the scheduler never takes a
task of an ``airflow dags test`` run (``run_dag``) that shares the metadata database. Each
test isolates its data: its own source folder, its own runs, and the ledger emptied by
``conn``.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from devtools import devenv
from replayable import sources
from replayable.vocabulary import (
    DEAD_LETTER_WATCH_DAG_ID,
    OUTBOX_PUBLISHER_DAG_ID,
    PIPELINE_DAG_ID,
    SWEEPER_DAG_ID,
)

# Users of Airflow's simple auth manager, as name:role: one per role the UI tests check.
USERS = "admin:admin,viewer:viewer,user:user,op:op"
# What `scheduling` unpauses for a test.
DAGS = (PIPELINE_DAG_ID, SWEEPER_DAG_ID)
# Every DAG in dags/: all stay paused outside `scheduling`. The scheduled ones (the watch,
# the publisher) would otherwise run on their own schedule and take the tasks of a test's
# `airflow dags test` run of the same DAG in the shared metadata database.
# The example pipeline of a stage of your own (dags/keyword_pipeline.py), and a pipeline of
# a stage defined only in tests/ (tests/airflow_dags/, a second DAG bundle of this Airflow).
KEYWORD_PIPELINE = "keyword_pipeline"
WORDCOUNT_PIPELINE = "wordcount_pipeline"
TEST_BUNDLE = Path(__file__).resolve().parent / "airflow_dags"
ALL_DAGS = (
    *DAGS,
    DEAD_LETTER_WATCH_DAG_ID,
    OUTBOX_PUBLISHER_DAG_ID,
    KEYWORD_PIPELINE,
    WORDCOUNT_PIPELINE,
    # Each pipeline's own sweeper (replayable.airflow.dag_factory.sweeper_dag).
    f"{KEYWORD_PIPELINE}_sweeper",
    f"{WORDCOUNT_PIPELINE}_sweeper",
)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class SharedAirflow:
    """The session's running Airflow: its URL, environment, users and REST API."""

    url: str
    env: dict[str, str]
    passwords: Path
    procs: devenv.AirflowProcesses
    _tokens: dict[str, str] = field(default_factory=dict)

    def password(self, username: str) -> str:
        return str(json.loads(self.passwords.read_text())[username])

    def token(self, username: str = "admin") -> str:
        """A JWT for ``username`` (fetched once per session)."""
        if username not in self._tokens:
            response = httpx.post(
                f"{self.url}/auth/token",
                json={"username": username, "password": self.password(username)},
                timeout=30,
            )
            response.raise_for_status()
            self._tokens[username] = str(response.json()["access_token"])
        return self._tokens[username]

    def api(self, username: str = "admin") -> httpx.Client:
        """A client of ``/api/v2`` as ``username``."""
        return httpx.Client(
            base_url=f"{self.url}/api/v2",
            headers={"Authorization": f"Bearer {self.token(username)}"},
            timeout=30,
        )

    def pause(self, dag_id: str, paused: bool) -> None:
        with self.api() as api:
            response = api.patch(f"/dags/{dag_id}", json={"is_paused": paused})
        assert response.status_code == 200, response.text

    def wait_for_dags(self, timeout_s: float = 180) -> None:
        """Wait until the DAG processor has parsed every DAG of dags/."""
        deadline = time.monotonic() + timeout_s
        with self.api() as api:
            for dag_id in ALL_DAGS:
                while api.get(f"/dags/{dag_id}").status_code != 200:
                    assert time.monotonic() < deadline, f"{dag_id} was never parsed"
                    time.sleep(1)


# Whether a test uses the shared Airflow, and the one running, for the early stop below.
FIXTURE = "shared_airflow"
_running: list[SharedAirflow] = []
_last_user: list[str] = []


def _uses_it(item: pytest.Item) -> bool:
    return FIXTURE in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules that use the shared Airflow first, in their order; the rest after, in theirs.

    Module by module, so a module's own fixtures are still set up once.
    """
    users = {item.nodeid.split("::")[0] for item in items if _uses_it(item)}
    items.sort(key=lambda item: 0 if item.nodeid.split("::")[0] in users else 1)
    last = [item.nodeid for item in items if _uses_it(item)]
    _last_user[:] = last[-1:]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Stop the shared Airflow once the last test that uses it is torn down."""
    yield
    if _running and [item.nodeid] == _last_user:
        _running[0].procs.stop()


@pytest.fixture(scope="session")
def shared_airflow(
    services: devenv.Services, state_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SharedAirflow]:
    """Airflow's API server, scheduler, DAG processor and triggerer, started once."""
    env = devenv.airflow_env(services, state_dir, api_port=free_port())
    # dags/, and tests/airflow_dags/: a pipeline whose stage is defined only in tests/.
    local = "airflow.dag_processing.bundles.local.LocalDagBundle"
    env["AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST"] = json.dumps(
        [
            {"name": "dags-folder", "classpath": local, "kwargs": {}},
            {"name": "tests", "classpath": local, "kwargs": {"path": str(TEST_BUNDLE)}},
        ]
    )
    # The file whose existence ships wordcount's fix (tests/airflow_dags/wordcount_stage.py).
    env["WORDCOUNT_FIXED_FLAG"] = str(tmp_path_factory.getbasetemp() / "wordcount-fixed")
    # The tests' documents live in their temporary folders: allow those as source roots.
    env[sources.ROOTS_ENV] = str(tmp_path_factory.getbasetemp())
    env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] = USERS
    env["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] = "True"
    # A sweep's trigger looks for the end of its re-run every 2 s, not 30.
    env["AIRFLOW__REPLAYABLE__SWEEPER_POKE_INTERVAL_S"] = "2"
    # Where the auth manager writes its generated passwords (its default, named).
    passwords = Path(env["AIRFLOW_HOME"]) / "simple_auth_manager_passwords.json.generated"
    env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] = str(passwords)
    # A sweep's triggers wait for their re-runs in the triggerer (ADR 0076).
    components = (*devenv.AirflowProcesses.DEFAULT, "triggerer")
    logs = tmp_path_factory.mktemp("airflow-logs")
    with devenv.AirflowProcesses(env, logs, components) as procs:
        airflow = SharedAirflow(procs.url, env, passwords, procs)
        _running[:] = [airflow]
        airflow.wait_for_dags()
        for dag_id in ALL_DAGS:
            airflow.pause(dag_id, True)
            # A run a scheduled DAG got before it was paused (its rows may predate this
            # Airflow: a test's `airflow dags test` registers the DAG unpaused).
            delete_queued_runs(airflow, dag_id, states=("queued", "running"))
        yield airflow


@pytest.fixture
def scheduling(shared_airflow: SharedAirflow) -> Iterator[SharedAirflow]:
    """The shared Airflow with the pipeline and the sweeper unpaused for this test only."""
    for dag_id in DAGS:
        shared_airflow.pause(dag_id, False)
    try:
        yield shared_airflow
    finally:
        for dag_id in DAGS:
            shared_airflow.pause(dag_id, True)
            delete_queued_runs(shared_airflow, dag_id)


def delete_queued_runs(
    airflow: SharedAirflow, dag_id: str = PIPELINE_DAG_ID, states: tuple[str, ...] = ("queued",)
) -> None:
    """Delete the runs of ``dag_id`` still queued: a paused DAG's runs wait for a scheduler,
    and would start in whichever later test unpauses it."""
    with airflow.api() as api:
        found = api.get(f"/dags/{dag_id}/dagRuns", params={"state": list(states), "limit": 100})
        found.raise_for_status()
        for run in found.json()["dag_runs"]:
            deleted = api.delete(f"/dags/{dag_id}/dagRuns/{run['dag_run_id']}")
            assert deleted.status_code == 204, deleted.text
