"""The outbox on the UI's overview: the backlog, its age and the dead events (ADR 0072)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from airflow.api_fastapi.app import create_auth_manager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow.api_fastapi.core_api.security import get_user
from fastapi import FastAPI
from fastapi.testclient import TestClient

from publishers import add_events
from replayable.web import create_app

pytestmark = pytest.mark.db


@pytest.fixture
def client(dsn: str) -> Iterator[TestClient]:
    """A viewer's client of the app mounted as Airflow mounts it."""
    create_auth_manager()
    app = create_app(dsn_provider=lambda: dsn)
    # Only Airflow's identity step is replaced, as in test_app.
    app.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(
        username="carol", role="VIEWER"
    )
    root = FastAPI()
    root.mount("/replayable", app)
    yield TestClient(root)
    app.state.pool.close()


def execute(conn: Any, sql: str) -> None:
    with conn.cursor() as cur:
        cur.execute(sql)
    conn.commit()


def test_the_overview_shows_the_outbox_backlog_its_age_and_dead_events(
    client: TestClient, conn: Any
) -> None:
    add_events(conn, 4)
    execute(conn, "UPDATE replayable.outbox SET status = 'dead' WHERE aggregate_id = 'doc1'")
    execute(conn, "UPDATE replayable.outbox SET status = 'published' WHERE aggregate_id = 'doc2'")
    execute(
        conn,
        "UPDATE replayable.outbox SET created_at = now() - interval '2 hours'"
        " WHERE aggregate_id = 'doc3'",
    )
    outbox = client.get("/replayable/api/summary").json()["outbox"]
    assert (outbox["pending"], outbox["published"], outbox["dead"]) == (2, 1, 1)
    assert 7200 <= outbox["oldest_pending_age_s"] < 7300
    page = client.get("/replayable/").text
    assert "Outbox" in page
    assert "2 waiting" in page
    assert "oldest for 2 h 0 min" in page
    assert "1 dead" in page
    assert "replayable outbox list --status dead" in page


def test_an_empty_outbox_shows_nothing_waiting(client: TestClient, conn: Any) -> None:
    outbox = client.get("/replayable/api/summary").json()["outbox"]
    assert outbox == {
        "pending": 0,
        "published": 0,
        "dead": 0,
        "oldest_pending_age_s": None,
        "oldest_wait": None,
    }
    assert "0 waiting" in client.get("/replayable/").text
