"""``replayable outbox``: the backlog and the dead events, and sending dead ones again."""

from __future__ import annotations

import json
from typing import Any

import pytest

from publishers import add_events
from replayable.cli import main

pytestmark = pytest.mark.db


def execute(conn: Any, sql: str, *params: Any) -> None:
    with conn.cursor() as cur:
        cur.execute(sql, params)
    conn.commit()


def statuses(conn: Any) -> list[tuple[str, str, int]]:
    with conn.cursor() as cur:
        cur.execute("SELECT aggregate_id, status, attempts FROM replayable.outbox ORDER BY seq")
        found = cur.fetchall()
    conn.commit()
    return found


@pytest.fixture
def outbox(conn: Any) -> list[str]:
    """Five events: doc1-doc2 dead (http_400, http_410), doc3-doc5 pending (one retried)."""
    ids = add_events(conn, 5)
    execute(
        conn,
        "UPDATE replayable.outbox SET status = 'dead', attempts = 8, error_class = %s,"
        " last_error = %s WHERE aggregate_id = %s",
        "http_400",
        "HTTPStatusError: 400 Bad Request from the webhook at https://hooks.example.com",
        "doc1",
    )
    execute(
        conn,
        "UPDATE replayable.outbox SET status = 'dead', attempts = 1, error_class = 'http_410'"
        " WHERE aggregate_id = 'doc2'",
    )
    execute(conn, "UPDATE replayable.outbox SET attempts = 2 WHERE aggregate_id = 'doc4'")
    return ids


def run_json(capsys: Any, dsn: str, *args: str) -> Any:
    assert main(["--dsn", dsn, "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_list_shows_the_dead_events_with_their_errors_and_the_counts(capsys, dsn, outbox):
    data = run_json(capsys, dsn, "outbox", "list")
    assert data["counts"] == {"pending": 3, "published": 0, "dead": 2}
    assert data["oldest_pending_age_s"] >= 0
    assert [(e["doc_id"], e["error_class"], e["attempts"]) for e in data["events"]] == [
        ("doc1", "http_400", 8),
        ("doc2", "http_410", 1),
    ]
    assert "hooks.example.com" in data["events"][0]["last_error"]


def test_list_shows_the_backlog_oldest_first(capsys, dsn, outbox):
    data = run_json(capsys, dsn, "outbox", "list", "--status", "pending", "--limit", "2")
    assert [e["doc_id"] for e in data["events"]] == ["doc3", "doc4"]


def test_list_renders_a_table(capsys, dsn, outbox):
    assert main(["--dsn", dsn, "outbox", "list"]) == 0
    out = capsys.readouterr().out
    assert "http_410" in out
    assert "3 pending" in out


def test_requeue_by_id_sends_only_that_dead_event_again(capsys, conn, dsn, outbox):
    data = run_json(capsys, dsn, "outbox", "requeue", "--id", outbox[0], outbox[2])
    assert data == {"requeued": [outbox[0]]}  # the pending one is left as it is
    assert statuses(conn) == [
        ("doc1", "pending", 0),
        ("doc2", "dead", 1),
        ("doc3", "pending", 0),
        ("doc4", "pending", 2),
        ("doc5", "pending", 0),
    ]


def test_requeue_by_error_class_and_all(capsys, conn, dsn, outbox):
    assert run_json(capsys, dsn, "outbox", "requeue", "--error-class", "http_410") == {
        "requeued": [outbox[1]]
    }
    assert run_json(capsys, dsn, "outbox", "requeue", "--all") == {"requeued": [outbox[0]]}
    assert {status for _, status, _ in statuses(conn)} == {"pending"}


def test_requeue_without_a_selection_is_refused(capsys, conn, dsn, outbox):
    assert main(["--dsn", dsn, "outbox", "requeue"]) == 2
    assert "--all" in capsys.readouterr().err
    assert [s for _, s, _ in statuses(conn)].count("dead") == 2


def test_requeue_that_matches_nothing_exits_1(capsys, dsn, outbox):
    assert main(["--dsn", dsn, "outbox", "requeue", "--id", "evt_none"]) == 1
