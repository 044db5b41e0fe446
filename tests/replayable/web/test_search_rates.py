"""Searches are rated and costed per user (ADR 0153): at most ``[replayable]
searches_per_user_per_minute`` of a user's searches in a minute, counted in the ledger so that
every API server process shares the count; each user's searches and what their question
vectors cost on the overview's cost card and in its JSON twin, escaped."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from fastapi import FastAPI
from fastapi.testclient import TestClient
from markupsafe import escape
from ui_fixtures import (  # noqa: F401 - fixtures
    HOSTILE,
    _as,
    app_fixture,
    auth_manager_fixture,
    connections_fixture,
    make_app_fixture,
)

from checks import TOPICS, fresh_minute, rows, topic_pdfs
from replayable.vocabulary import MODEL_CONN_ID

MODEL = "local-wordllama-256"
API = "/replayable/api/search"
PAGE = "/replayable/search"
LIMIT_ENV = "AIRFLOW__REPLAYABLE__SEARCHES_PER_USER_PER_MINUTE"
pytestmark = pytest.mark.db


@pytest.fixture
def searchable(run_in_process: Any, connections: dict[str, str], tmp_path: Path) -> Path:
    """Four one-chunk documents embedded with the local server's real model."""
    folder = topic_pdfs(tmp_path / "topics", TOPICS)
    assert not run_in_process({"source": str(folder), "model": MODEL})["_failed"]
    return folder


def _user(app: FastAPI, name: str) -> TestClient:
    return _as(app, SimpleAuthManagerUser(username=name, role="VIEWER"))


def _searches_of(client: TestClient) -> dict[str, dict[str, Any]]:
    summary = client.get("/replayable/api/summary").json()
    return {row["user"]: row for row in summary["searches"]["by_user"]}


def test_the_31st_search_in_a_minute_is_429_with_retry_after_while_another_user_searches(
    app: FastAPI, searchable: Path, conn: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(LIMIT_ENV, raising=False)  # the default, 30
    alice, bob = _user(app, "alice"), _user(app, "bob")
    fresh_minute(conn, 30)
    for n in range(30):
        found = alice.get(API, params={"q": "when is honey harvested", "model": MODEL})
        assert found.status_code == 200, (n, found.text)
    refused = alice.get(API, params={"q": "when is honey harvested", "model": MODEL})
    assert refused.status_code == 429, refused.text
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    detail = refused.json()["detail"]
    assert "30 searches" in detail and "[replayable] searches_per_user_per_minute" in detail
    # The page shows the refusal as it shows its others: in the page, with its status.
    page = alice.get(PAGE, params={"q": "bread", "model": MODEL})
    assert page.status_code == 429 and "retry-after" in page.headers
    assert str(escape(detail)).split(";")[0] in page.text and 'value="bread"' in page.text
    # Another user's searches are their own.
    assert bob.get(API, params={"q": "bread", "model": MODEL}).status_code == 200
    counted = _searches_of(alice)
    assert (counted["alice"]["searches"], counted["bob"]["searches"]) == (30, 1)


def test_two_api_server_apps_on_one_ledger_share_a_users_count(
    make_app: Any, dsn: str, searchable: Path, conn: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LIMIT_ENV, "3")
    first = _user(make_app(dsn_provider=lambda: dsn), "alice")
    second = _user(make_app(dsn_provider=lambda: dsn), "alice")
    fresh_minute(conn, 15)
    answers = [
        client.get(API, params={"q": "tide pools", "model": MODEL}).status_code
        for client in (first, second, first, second, first)
    ]
    assert answers == [200, 200, 200, 429, 429]


def test_a_cached_question_counts_as_a_search_but_adds_no_paid_call(
    app: FastAPI, searchable: Path, conn: Any
) -> None:
    erin = _user(app, "erin")
    for _ in range(2):
        assert erin.get(API, params={"q": "sourdough starter", "model": MODEL}).status_code == 200
    # The page's search and the API's count alike.
    assert erin.get(PAGE, params={"q": "sourdough starter", "model": MODEL}).status_code == 200
    counted = _searches_of(erin)["erin"]
    assert (counted["searches"], counted["paid_calls"]) == (3, 1)
    # The paid call is the user's: its row says who searched.
    paid = rows(conn, "SELECT searched_by FROM replayable.model_calls WHERE stage = 'search'")
    assert paid == [("erin",)]


def test_the_overview_shows_each_users_searches_and_their_cost_escaped(
    app: FastAPI, searchable: Path, conn: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    variable = f"AIRFLOW_CONN_{MODEL_CONN_ID.upper()}"
    connection = json.loads(os.environ[variable])
    # A dollar per thousand input tokens: a question's few tokens show in the card.
    connection["extra"] = {**connection.get("extra", {}), "prices": {MODEL: {"input": 1000}}}
    monkeypatch.setenv(variable, json.dumps(connection))
    odd, plain = _user(app, HOSTILE), _user(app, "dave")
    assert odd.get(API, params={"q": "rock pools", "model": MODEL}).status_code == 200
    assert odd.get(API, params={"q": "rock pools", "model": MODEL}).status_code == 200
    assert plain.get(API, params={"q": "bees", "model": MODEL, "mode": "text"}).status_code == 200
    ((cost,),) = rows(
        conn, "SELECT cost_usd FROM replayable.model_calls WHERE searched_by = %s", HOSTILE
    )
    assert cost > 0

    searches = plain.get("/replayable/api/summary").json()["searches"]
    assert searches["days"] == 30
    by_user = {row["user"]: row for row in searches["by_user"]}
    assert by_user[HOSTILE]["searches"] == 2 and by_user[HOSTILE]["paid_calls"] == 1
    assert by_user[HOSTILE]["usd"] == pytest.approx(float(cost))
    assert (by_user["dave"]["searches"], by_user["dave"]["paid_calls"]) == (1, 0)
    assert by_user["dave"]["usd"] == 0

    page = plain.get("/replayable/").text
    assert "Searches, last 30 days" in page
    assert str(escape(HOSTILE)) in page and HOSTILE not in page
    assert f"${float(cost):.6f}" in page
    assert "dave" in page
