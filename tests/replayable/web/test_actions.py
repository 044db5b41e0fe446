"""Ignore and assign: who may change an open letter, and the history that keeps each change."""

from __future__ import annotations

from typing import Any

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import pytest
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from fastapi import FastAPI
from fastapi.testclient import TestClient
from ui_fixtures import (  # noqa: F401 - fixtures
    HOSTILE,
    _as,
    _history,
    _letter,
    app_fixture,
    auth_manager_fixture,
    editor_fixture,
    ledger_fixture,
)


def test_ignore_resolves_an_open_letter_as_the_user_with_the_reason(
    editor: TestClient, conn: Any, ledger: dict[str, int]
) -> None:
    letter = ledger["encrypted"]
    response = editor.post(
        f"/replayable/dead-letters/{letter}/ignore",
        data={"reason": "  known encrypted sample  ", "stage": "extract", "status": "open"},
    )
    assert response.status_code == 303
    target = response.url.join(response.headers["location"])
    assert target.path == "/replayable/dead-letters"
    assert dict(target.params) == {"stage": "extract", "status": "open", "limit": "100"}
    state = _letter(conn, letter)
    assert state["status"] == "ignored"
    assert state["resolved_by"] == "erin"
    assert state["resolution"] == "known encrypted sample"
    assert state["resolved_at"] is not None
    assert editor.get(str(target)).status_code == 200


def test_ignoring_keeps_the_owners_note(
    editor: TestClient, conn: Any, ledger: dict[str, int]
) -> None:
    letter = ledger["bad_input"]  # alice's, noted "looking"
    response = editor.post(f"/replayable/dead-letters/{letter}/ignore", data={"reason": "dup"})
    assert response.status_code == 303
    state = _letter(conn, letter)
    assert (state["owner"], state["note"], state["resolution"]) == ("alice", "looking", "dup")


def test_ignore_without_a_reason_is_422(
    editor: TestClient, conn: Any, ledger: dict[str, int]
) -> None:
    letter = ledger["encrypted"]
    for data in ({}, {"reason": "   "}, {"reason": "\x00why"}, {"reason": "\x1b[2Jwhy"}):
        assert (
            editor.post(f"/replayable/dead-letters/{letter}/ignore", data=data).status_code == 422
        )
    assert _letter(conn, letter)["status"] == "open"


def test_assign_sets_owner_and_note_and_blanks_clear_them(
    editor: TestClient, conn: Any, ledger: dict[str, int]
) -> None:
    letter = ledger["bad_input"]
    url = f"/replayable/dead-letters/{letter}/assign"
    assert editor.post(url, data={"owner": "bob", "note": "mine now"}).status_code == 303
    state = _letter(conn, letter)
    assert (state["status"], state["owner"], state["note"]) == ("open", "bob", "mine now")
    assert state["resolved_by"] is None
    assert editor.post(url, data={"owner": " ", "note": ""}).status_code == 303
    state = _letter(conn, letter)
    assert (state["owner"], state["note"]) == (None, None)


def test_every_change_is_kept_in_the_letters_history_with_who_and_when(
    app: FastAPI, editor: TestClient, conn: Any, ledger: dict[str, int]
) -> None:
    letter = ledger["bad_input"]  # alice's, noted "looking"
    url = f"/replayable/dead-letters/{letter}"
    editor.post(f"{url}/assign", data={"owner": "bob", "note": "mine now"})
    operator = _as(app, SimpleAuthManagerUser(username="olga", role="OP"))
    operator.post(f"{url}/assign", data={"owner": "bob", "note": "provider bug"})
    operator.post(f"{url}/ignore", data={"reason": "fixed upstream"})
    assert _history(conn, letter) == [
        ("erin", "assigned", "open", "bob", "mine now", None, True),
        ("olga", "noted", "open", "bob", "provider bug", None, True),
        ("olga", "ignored", "ignored", "bob", "provider bug", "fixed upstream", True),
    ]
    shown = operator.get(f"/replayable/api/dead-letters/{letter}").json()
    assert [(c["actor"], c["action"], c["note"]) for c in shown["history"]] == [
        ("erin", "assigned", "mine now"),
        ("olga", "noted", "provider bug"),
        ("olga", "ignored", "provider bug"),
    ]
    page = operator.get(url).text
    assert "mine now" in page and "erin" in page and "fixed upstream" in page


def test_the_history_is_append_only(editor: TestClient, conn: Any, ledger: dict[str, int]) -> None:
    letter = ledger["bad_input"]
    editor.post(f"/replayable/dead-letters/{letter}/assign", data={"owner": "bob"})
    for statement in (
        "UPDATE replayable.dead_letter_history SET actor = 'mallory'",
        "DELETE FROM replayable.dead_letter_history",
    ):
        with conn.cursor() as cur, pytest.raises(psycopg2.errors.RaiseException):
            cur.execute(statement)
        conn.rollback()
    assert [row[0] for row in _history(conn, letter)] == ["erin"]


def test_pipeline_resolutions_enter_the_history_under_their_resolver(
    conn: Any, ledger: dict[str, int]
) -> None:
    letter = ledger["encrypted"]
    with conn.cursor() as cur:
        cur.execute(
            "UPDATE replayable.dead_letters SET status = 'redriven', resolved_at = now(),"
            " resolved_by = 'run r9', resolution = 'provider fixed' WHERE id = %s",
            (letter,),
        )
    conn.commit()
    assert _history(conn, letter) == [
        ("run r9", "redriven", "redriven", None, HOSTILE, "provider fixed", True)
    ]


@pytest.mark.parametrize("action", ["ignore", "assign"])
def test_changing_a_letter_that_is_not_open_is_409(
    editor: TestClient, conn: Any, ledger: dict[str, int], action: str
) -> None:
    letter = ledger["redriven"]
    response = editor.post(
        f"/replayable/dead-letters/{letter}/{action}", data={"owner": "x", "reason": "why"}
    )
    assert response.status_code == 409
    assert "redriven" in response.json()["detail"]
    assert _letter(conn, letter)["note"] == "redriven by r3"


@pytest.mark.parametrize("action", ["ignore", "assign"])
def test_changing_a_missing_letter_is_404(
    editor: TestClient, ledger: dict[str, int], action: str
) -> None:
    missing = max(ledger.values()) + 1000
    response = editor.post(f"/replayable/dead-letters/{missing}/{action}", data={"reason": "n"})
    assert response.status_code == 404
    assert editor.get(f"/replayable/dead-letters/{missing}").status_code == 404
