"""The UI's database: which one, read-only reads, the statement timeout and a busy pool's 503."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import pytest
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from ui_fixtures import (  # noqa: F401 - fixtures
    _as,
    _letter,
    app_fixture,
    auth_manager_fixture,
    ledger_fixture,
    make_app_fixture,
)

from devtools import devenv
from replayable.web.database import ReadConn, read_connection, write_connection
from replayable.web.pool import RETRY_AFTER_S


def test_an_unreachable_database_is_503_without_the_dsn(make_app: Any) -> None:
    unreachable = "postgresql://u:hunter2@127.0.0.1:1/replayable?connect_timeout=2"
    client = _as(make_app(lambda: unreachable), SimpleAuthManagerUser(username="c", role="ADMIN"))
    response = client.get("/replayable/api/summary")
    assert response.status_code == 503
    assert "hunter2" not in response.text and "replayable_db" in response.text


def test_a_database_without_the_schema_is_503(dsn: str, make_app: Any) -> None:
    other = psycopg2.extensions.make_dsn(dsn, dbname="postgres")
    client = _as(make_app(lambda: other), SimpleAuthManagerUser(username="c", role="ADMIN"))
    response = client.get("/replayable/api/summary")
    assert response.status_code == 503
    assert "schema" in response.json()["detail"]


def test_the_default_dsn_comes_from_the_airflow_connection(
    services: devenv.Services,
    state_dir: Path,
    ledger: dict[str, int],
    make_app: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conn_json = devenv.airflow_env(services, state_dir)["AIRFLOW_CONN_REPLAYABLE_DB"]
    monkeypatch.setenv("AIRFLOW_CONN_REPLAYABLE_DB", conn_json)
    client = _as(make_app(), SimpleAuthManagerUser(username="c", role="VIEWER"))
    assert client.get("/replayable/api/summary").json()["open_dead_letters"] == 2


def _dependencies(dependant: Dependant) -> set[Any]:
    found = {dependant.call}
    for sub in dependant.dependencies:
        found |= _dependencies(sub)
    return found


def test_every_read_route_gets_a_read_only_connection(app: FastAPI) -> None:
    # The search takes its read-only connections itself, only while it reads, never while
    # the provider answers (web/search.py, test_web_search.py).
    searches = {"/search", "/api/search"}
    for route in app.routes:
        if isinstance(route, APIRoute) and "GET" in route.methods:
            calls = _dependencies(route.dependant)
            assert write_connection not in calls, route.path
            assert (read_connection in calls) is (route.path not in searches), route.path


def test_a_read_route_cannot_write(
    make_app: Any, dsn: str, conn: Any, ledger: dict[str, int]
) -> None:
    """Even a read route with a bug that writes is stopped by its read-only transaction."""
    app = make_app(lambda: dsn)

    @app.get("/careless")
    def careless(conn: ReadConn) -> None:
        with conn.cursor() as cur:
            cur.execute("UPDATE replayable.dead_letters SET owner = 'mallory'")

    client = _as(app, SimpleAuthManagerUser(username="c", role="ADMIN"))
    with pytest.raises(psycopg2.errors.ReadOnlySqlTransaction):
        client.get("/replayable/careless")
    assert _letter(conn, ledger["bad_input"])["owner"] == "alice"


def test_a_slow_query_is_cut_off_by_the_statement_timeout(
    make_app: Any, dsn: str, conn: Any, ledger: dict[str, int]
) -> None:
    """A page whose query waits (here on a lock) answers 503 at the timeout, not later."""
    app = make_app(lambda: dsn, statement_timeout_s=0.5)
    client = _as(app, SimpleAuthManagerUser(username="c", role="VIEWER"))
    with conn.cursor() as cur:
        cur.execute("LOCK TABLE replayable.dead_letters IN ACCESS EXCLUSIVE MODE")
    try:
        started = time.monotonic()
        response = client.get("/replayable/api/dead-letters")
        elapsed = time.monotonic() - started
    finally:
        conn.rollback()
    assert response.status_code == 503 and "0.5 s" in response.json()["detail"]
    assert elapsed < 3
    assert client.get("/replayable/api/dead-letters").status_code == 200  # the pool recovers


def test_a_busy_pool_answers_503(make_app: Any, dsn: str, ledger: dict[str, int]) -> None:
    app = make_app(lambda: dsn, pool_size=1)
    client = _as(app, SimpleAuthManagerUser(username="c", role="VIEWER"))
    with app.state.pool.connection(readonly=True):
        assert client.get("/replayable/api/summary").status_code == 503
    assert client.get("/replayable/api/summary").status_code == 200


def test_a_request_that_finds_every_connection_taken_is_refused_before_one_comes_free(
    make_app: Any, dsn: str, ledger: dict[str, int]
) -> None:
    """No request waits in a worker thread for a connection (ADR 0073): it is answered 503,
    with Retry-After, while the only connection is still taken."""
    app = make_app(lambda: dsn, pool_size=1)
    client = _as(app, SimpleAuthManagerUser(username="c", role="VIEWER"))
    answers: list[Any] = []
    asker = threading.Thread(target=lambda: answers.append(client.get("/replayable/api/summary")))
    with app.state.pool.connection(readonly=True):
        asker.start()
        # A request that waited for the connection would get it once this block gives it back.
        asker.join(timeout=5)
    asker.join(timeout=60)
    (answer,) = answers
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"] == str(RETRY_AFTER_S)
    assert "busy" in answer.json()["detail"]
    assert client.get("/replayable/api/summary").status_code == 200
