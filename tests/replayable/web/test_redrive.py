"""Redrive from the UI (ADR 0062): runs asked of Airflow as the user, with no connection held."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio.to_thread
import psycopg2
import psycopg2.errors
import psycopg2.extensions
import pytest
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from fastapi import Request
from fastapi.testclient import TestClient
from ui_fixtures import (  # noqa: F401 - fixtures
    _as,
    _history,
    _hrefs,
    _iso,
    _letter,
    auth_manager_fixture,
    ledger_fixture,
    make_app_fixture,
)

from fake_airflow import FakeAirflow
from replayable.web.redrive import airflow_api_root


@pytest.fixture
def fake_airflow() -> Iterator[FakeAirflow]:
    with FakeAirflow() as airflow:
        yield airflow


def _redriver(make_app: Any, dsn: str, url: str, role: str = "USER") -> TestClient:
    """A client of an app that reaches Airflow at ``url``, logged in with the UI cookie."""
    app = make_app(lambda: dsn, airflow_api_url=url)
    client = _as(app, SimpleAuthManagerUser(username="erin", role=role))
    client.cookies.set("_token", f"cookie-jwt-{role}")
    return client


def test_redriving_ticked_letters_triggers_a_run_per_stage_as_the_user(
    make_app: Any, dsn: str, conn: Any, ledger: dict[str, int], fake_airflow: FakeAirflow
) -> None:
    client = _redriver(make_app, dsn, fake_airflow.url)
    ticked = [ledger["encrypted"], ledger["bad_input"], ledger["redriven"], ledger["bad_input"]]
    page = client.post(
        "/replayable/dead-letters/redrive",
        data={"scope": "selected", "ids": ticked, "reason": " provider fixed ", "stage": "embed"},
    )
    assert page.status_code == 200, page.text
    assert [s.path for s in fake_airflow.triggers] == ["/api/v2/dags/document_pipeline/dagRuns"] * 2
    assert {s.authorization for s in fake_airflow.triggers} == {"Bearer cookie-jwt-USER"}
    confs = {s.body["conf"]["redrive"]["stage"]: s.body for s in fake_airflow.triggers}
    assert confs["embed"]["conf"] == {
        "redrive": {
            "stage": "embed",
            "ids": [ledger["bad_input"]],  # the redriven letter is not open: left out
            "reason": "provider fixed",
            "by": "erin",
        }
    }
    assert confs["extract"]["conf"]["redrive"]["ids"] == [ledger["encrypted"]]
    assert all(body["logical_date"] is None for body in confs.values())
    assert "erin" in confs["embed"]["note"] and "provider fixed" in confs["embed"]["note"]
    hrefs = _hrefs(page)
    assert {
        "/dags/document_pipeline/runs/manual__fake-1",
        "/dags/document_pipeline/runs/manual__fake-2",
        "/replayable/dead-letters?stage=embed&status=open&limit=100",
    } <= hrefs
    # The page only asked Airflow: the run closes the letters when it takes them.
    assert _letter(conn, ledger["encrypted"])["status"] == "open"
    assert _history(conn, ledger["encrypted"]) == []


def test_redriving_the_matching_letters_ends_at_the_moment_they_were_counted(
    make_app: Any, dsn: str, conn: Any, ledger: dict[str, int], fake_airflow: FakeAirflow
) -> None:
    client = _redriver(make_app, dsn, fake_airflow.url)
    since = _iso(conn, "SELECT now() - interval '1 hour'")
    before = datetime.now(UTC)
    page = client.post(
        "/replayable/dead-letters/redrive",
        data={
            "scope": "matching",
            "stage": "embed",
            "error_class": "http_400",
            "since": since,
            "until": "",
            "reason": "provider fixed",
            "ids": [ledger["encrypted"]],  # ticked, but this asks for every match
        },
    )
    assert page.status_code == 200, page.text
    (sent,) = fake_airflow.triggers
    redrive = sent.body["conf"]["redrive"]
    assert {k: v for k, v in redrive.items() if k != "until"} == {
        "stage": "embed",
        "error_class": ["http_400"],
        "since": f"{since}+00:00",
        "reason": "provider fixed",
        "by": "erin",
    }
    until = datetime.fromisoformat(redrive["until"])
    assert before - timedelta(seconds=5) < until <= datetime.now(UTC)
    assert "1</td>" in page.text  # one letter, one document


def test_a_viewer_may_not_redrive_and_airflow_is_never_asked(
    make_app: Any, dsn: str, ledger: dict[str, int], fake_airflow: FakeAirflow
) -> None:
    viewer = _redriver(make_app, dsn, fake_airflow.url, role="VIEWER")
    refused = viewer.post(
        "/replayable/dead-letters/redrive",
        data={"scope": "selected", "ids": [ledger["encrypted"]], "reason": "try it"},
    )
    assert refused.status_code == 403
    assert fake_airflow.sent == []


def test_a_cross_origin_redrive_is_refused(
    make_app: Any, dsn: str, ledger: dict[str, int], fake_airflow: FakeAirflow
) -> None:
    client = _redriver(make_app, dsn, fake_airflow.url)
    refused = client.post(
        "/replayable/dead-letters/redrive",
        data={"scope": "selected", "ids": [ledger["encrypted"]], "reason": "try it"},
        headers={"Origin": "http://evil.example"},
    )
    assert refused.status_code == 403 and fake_airflow.sent == []


def test_a_bearer_token_is_forwarded_as_it_came(
    make_app: Any, dsn: str, ledger: dict[str, int], fake_airflow: FakeAirflow
) -> None:
    client = _redriver(make_app, dsn, fake_airflow.url)
    response = client.post(
        "/replayable/dead-letters/redrive",
        data={"scope": "selected", "ids": [ledger["encrypted"]], "reason": "try it"},
        headers={"Authorization": "Bearer api-client-jwt", "Origin": ""},
    )
    assert response.status_code == 200
    assert [s.authorization for s in fake_airflow.triggers] == ["Bearer api-client-jwt"]


@pytest.mark.parametrize(
    ("answer", "status", "words"),
    [
        ((403, {"detail": "Forbidden"}), 403, "Airflow refused"),
        ((401, {"detail": "Token expired"}), 401, "Token expired"),
        ((400, {"detail": "Invalid input for param redrive"}), 400, "Invalid input"),
        ((500, {"detail": "boom"}), 502, "500"),
    ],
)
def test_airflows_refusal_is_passed_on(
    make_app: Any,
    dsn: str,
    ledger: dict[str, int],
    answer: tuple[int, dict[str, Any]],
    status: int,
    words: str,
) -> None:
    with FakeAirflow(answer=answer) as airflow:
        client = _redriver(make_app, dsn, airflow.url)
        response = client.post(
            "/replayable/dead-letters/redrive",
            data={"scope": "selected", "ids": [ledger["encrypted"]], "reason": "try it"},
        )
    assert response.status_code == status
    assert words in response.json()["detail"]


def test_an_unreachable_airflow_is_502(make_app: Any, dsn: str, ledger: dict[str, int]) -> None:
    client = _redriver(make_app, dsn, "http://127.0.0.1:1")
    response = client.post(
        "/replayable/dead-letters/redrive",
        data={"scope": "selected", "ids": [ledger["encrypted"]], "reason": "try it"},
    )
    assert response.status_code == 502 and "airflow_api_url" in response.json()["detail"]


class _WatchedAirflow(FakeAirflow):
    """Airflow's stand-in that, while a trigger call is in, runs ``during`` and keeps its result."""

    def __init__(self, during: Callable[[], Any]) -> None:
        super().__init__()
        self.during = during
        self.seen: list[Any] = []

    def respond(self, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        if path.endswith("/dagRuns"):
            self.seen.append(self.during())
        return super().respond(path, body)


def _ui_connections_in_a_transaction(dsn: str) -> int:
    """The UI pool's connections that the server sees inside a transaction: checked out."""
    with contextlib.closing(psycopg2.connect(dsn)) as watcher, watcher.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = 'replayable-ui' AND xact_start IS NOT NULL"
        )
        return int(cur.fetchone()[0])


def test_a_redrive_holds_no_database_connection_while_it_calls_airflow(
    make_app: Any, dsn: str, ledger: dict[str, int]
) -> None:
    """The letters are read and the connection given back before Airflow is asked (ADR 0073):
    a slow Airflow cannot keep the UI's few connections."""
    with _WatchedAirflow(lambda: _ui_connections_in_a_transaction(dsn)) as airflow:
        client = _redriver(make_app, dsn, airflow.url)
        page = client.post(
            "/replayable/dead-letters/redrive",
            data={
                "scope": "selected",
                "ids": [ledger["encrypted"], ledger["bad_input"]],
                "reason": "provider fixed",
            },
        )
    assert page.status_code == 200, page.text
    assert len(airflow.triggers) == 2  # one run per stage, each asked with no connection held
    assert airflow.seen == [0, 0]


def test_a_redrive_waits_for_airflow_without_holding_a_worker_thread(
    make_app: Any, dsn: str, ledger: dict[str, int]
) -> None:
    """With a single worker thread left, a sync route of the same server still answers while a
    redrive waits for Airflow: Airflow's own routes (its trigger route, task heartbeats) are
    sync routes of the API server the redrive calls back (ADR 0073)."""
    app = make_app(lambda: dsn, airflow_api_url="http://unset")
    user = SimpleAuthManagerUser(username="erin", role="USER")
    with _as(app, user) as client:

        def one_worker_thread() -> None:
            anyio.to_thread.current_default_thread_limiter().total_tokens = 1

        client.portal.call(one_worker_thread)  # type: ignore[union-attr]  # set in __enter__

        def sync_route_answers() -> int | None:
            answered: list[int] = []
            asker = threading.Thread(
                target=lambda: answered.append(client.get("/replayable/api/summary").status_code)
            )
            asker.start()
            asker.join(timeout=5)  # a starved route answers only after the redrive gave up
            return answered[0] if answered else None

        with _WatchedAirflow(sync_route_answers) as airflow:
            app.state.airflow_api_url = airflow.url
            client.cookies.set("_token", "cookie-jwt")
            page = client.post(
                "/replayable/dead-letters/redrive",
                data={"scope": "selected", "ids": [ledger["encrypted"]], "reason": "try it"},
            )
    assert page.status_code == 200, page.text
    assert airflow.seen == [200]


@pytest.mark.parametrize(
    ("form", "status"),
    [
        ({"scope": "selected", "reason": "why not"}, 400),  # nothing ticked
        ({"scope": "matching", "stage": "chunk", "reason": "why not"}, 409),  # nothing open
        ({"scope": "matching", "reason": " ab "}, 422),  # too short a reason
        ({"scope": "matching", "reason": "two\nlines"}, 422),
        ({"scope": "all", "reason": "why not"}, 422),
    ],
)
def test_a_redrive_needs_a_reason_and_letters_to_take(
    make_app: Any,
    dsn: str,
    ledger: dict[str, int],
    fake_airflow: FakeAirflow,
    form: dict[str, str],
    status: int,
) -> None:
    client = _redriver(make_app, dsn, fake_airflow.url)
    assert client.post("/replayable/dead-letters/redrive", data=form).status_code == status
    assert fake_airflow.sent == []


def test_without_configuration_the_api_server_calls_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = type("State", (), {"airflow_api_url": None})()
    scope = {
        "type": "http",
        "app": type("App", (), {"state": state})(),
        "server": ("127.0.0.1", 8793),
        "headers": [(b"host", b"evil.example")],
    }
    monkeypatch.delenv("AIRFLOW__API__BASE_URL", raising=False)
    assert airflow_api_root(Request(scope)) == "http://127.0.0.1:8793"
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example/team/")
    assert airflow_api_root(Request(scope)) == "https://airflow.example/team"
    monkeypatch.setenv("AIRFLOW__REPLAYABLE__AIRFLOW_API_URL", "http://airflow-api:8080")
    assert airflow_api_root(Request(scope)) == "http://airflow-api:8080"
