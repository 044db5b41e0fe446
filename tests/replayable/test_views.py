"""The read model: each read against a ledger whose rows are known."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from publishers import add_events
from replayable import views

A, B, C = "a" * 64, "b" * 64, "c" * 64


def _insert(conn: Any, sql: str, rows: list[tuple[Any, ...]]) -> None:
    with conn.cursor() as cur:
        for row in rows:
            cur.execute(sql, row)


@pytest.fixture
def ledger(conn: Any) -> Any:
    """Run r1 touched A and B, r2 touched C; B failed, C is dead with an open letter."""
    _insert(
        conn,
        "INSERT INTO replayable.documents (doc_id, uri, size_bytes) VALUES (%s, %s, 10)",
        [(A, "/data/a.pdf"), (B, "/data/b.pdf"), (C, "/data/c.pdf")],
    )
    _insert(
        conn,
        "INSERT INTO replayable.stage_runs (stage, item_key, doc_id, status, attempts,"
        " error_class, last_error, code_version, config_hash, run_id, is_current, updated_at)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, '1.1', 'cfg', %s, true,"
        " now() - make_interval(mins => %s))",
        [
            ("extract", "ea", A, "done", 1, None, None, "r1", 60),
            ("extract", "eb", B, "failed", 1, "http_503", "503", "r1", 30),
            ("extract", "ec", C, "dead", 3, "encrypted", "locked", "r2", 10),
            ("embed", "ma", A, "failed", 2, "http_429", "429", "r1", 1),
        ],
    )
    _insert(
        conn,
        "INSERT INTO replayable.runs (dag_id, run_id, documents, created_at)"
        " VALUES ('d', %s, %s, now() - make_interval(mins => %s))",
        [("r1", 2, 10), ("r2", 1, 5)],
    )
    _insert(
        conn,
        "INSERT INTO replayable.run_docs (dag_id, run_id, doc_id) VALUES ('d', %s, %s)",
        [("r1", A), ("r1", B), ("r2", C)],
    )
    _insert(
        conn,
        "INSERT INTO replayable.dead_letters (stage, item_key, doc_id, error_class, error_kind,"
        " error, attempts, code_version, run_id, status, created_at)"
        " VALUES (%s, %s, %s, %s, 'terminal', 'boom', 3, '1.1', %s, %s,"
        " now() - make_interval(hours => %s))",
        [
            ("extract", "ec", C, "encrypted", "r2", "open", 1),
            ("embed", "mb", B, "http_400", "r1", "open", 30),
            ("embed", "ma", A, "http_500", "r1", "redriven", 2),
        ],
    )
    _insert(
        conn,
        "INSERT INTO replayable.model_calls (stage, item_key, attempt, status, latency_ms,"
        " n_inputs, tokens, idempotency_key, run_id)"
        " VALUES ('embed', 'ma', 1, %s, 5, 1, %s, 'k', %s)",
        [("ok", 100, "r1"), ("http_429", 0, "r1"), ("ok", 50, "r2")],
    )
    conn.commit()
    return conn


def test_stage_status_lists_every_stage_in_order_with_counts_letters_and_calls(ledger):
    found = {s.stage: s for s in views.stage_status(ledger)}
    assert list(found) == ["extract", "chunk", "embed", "summarize"]
    extract = found["extract"]
    assert (extract.done, extract.failed, extract.dead, extract.total) == (1, 1, 1, 3)
    assert extract.open_dead_letters == 1
    assert found["chunk"] == views.StageStatus("chunk")
    assert found["embed"].model_calls == views.ModelCalls(calls=3, ok=2, tokens=150)


def test_stage_status_of_a_run_counts_only_its_documents_and_calls(ledger):
    found = {s.stage: s for s in views.stage_status(ledger, "r1")}
    assert (found["extract"].total, found["extract"].dead) == (2, 0)
    assert found["embed"].open_dead_letters == 1
    assert found["embed"].model_calls == views.ModelCalls(calls=2, ok=1, tokens=100)


def test_stage_status_without_model_calls_leaves_them_zero(ledger):
    found = {s.stage: s for s in views.stage_status(ledger, with_model_calls=False)}
    assert found["embed"].model_calls == views.ModelCalls()
    assert found["embed"].failed == 1


def test_run_state_is_the_named_run_or_else_the_newest(ledger):
    assert views.run_state(ledger)["run_id"] == "r2"
    assert views.run_state(ledger, "r1")["reported"] is False
    assert views.run_state(ledger, "nope") is None


def test_failed_items_are_newest_first_with_the_count_of_every_match(ledger):
    page = views.failed_items(ledger, limit=1)
    assert page.matched == 2
    assert [(r["stage"], r["doc_id"], r["uri"]) for r in page.rows] == [("embed", A, "/data/a.pdf")]
    assert "matched" not in page.rows[0]
    last = page.rows[0]
    rest = views.failed_items(
        ledger, limit=5, after=(last["updated_at"], last["stage"], last["doc_id"])
    )
    assert [r["doc_id"] for r in rest.rows] == [B]
    only = views.failed_items(ledger, stage="extract", error_classes=["http_503"], limit=5)
    assert (only.matched, [r["doc_id"] for r in only.rows]) == (1, [B])


def test_dead_letters_filter_by_status_stage_class_and_time(ledger):
    assert views.dead_letters(ledger, status="open", limit=5).matched == 2
    every = views.dead_letters(ledger, status="all", limit=5)
    assert [r["doc_id"] for r in every.rows] == [C, A, B]  # newest first
    embed = views.dead_letters(ledger, stage="embed", error_classes=["http_400"], limit=5)
    assert [r["item_key"] for r in embed.rows] == ["mb"]
    recent = views.dead_letters(ledger, since=datetime.now(UTC) - timedelta(hours=3), limit=5)
    assert recent.matched == 2
    first = every.rows[0]
    after = views.dead_letters(ledger, limit=5, after=(first["created_at"], first["id"]))
    assert [r["doc_id"] for r in after.rows] == [A, B]


def test_redrive_scope_counts_open_letters_per_stage(ledger):
    scopes = views.redrive_scope(ledger)
    assert [(s.stage, s.letters, s.documents, s.ids) for s in scopes] == [
        ("embed", 1, 1, None),
        ("extract", 1, 1, None),
    ]
    assert scopes[0].as_of <= datetime.now(UTC)
    letter = views.dead_letters(ledger, stage="extract", limit=1).rows[0]["id"]
    (picked,) = views.redrive_scope(ledger, ids=[letter])
    assert (picked.stage, picked.ids) == ("extract", [letter])
    assert views.redrive_scope(ledger, stage="chunk") == []


def test_documents_by_prefix_returns_at_most_two(ledger):
    assert views.documents_by_prefix(ledger, "aaaaaa") == [A]
    assert views.documents_by_prefix(ledger, "dddddd") == []


def test_outbox_counts_and_events(conn):
    add_events(conn, 3)
    with conn.cursor() as cur:
        cur.execute(
            "UPDATE replayable.outbox SET status = 'dead', error_class = 'http_410'"
            " WHERE aggregate_id = 'doc2'"
        )
    conn.commit()
    counts = views.outbox_counts(conn)
    assert counts.by_status() == {"pending": 2, "published": 0, "dead": 1}
    assert counts.oldest_pending_age_s is not None and counts.oldest_pending_age_s >= 0
    dead = views.outbox_events(conn, "dead", 10)
    assert [(e["doc_id"], e["error_class"]) for e in dead] == [("doc2", "http_410")]
    assert [e["doc_id"] for e in views.outbox_events(conn, "pending", 1)] == ["doc1"]


def test_an_empty_outbox_has_no_backlog_age(conn):
    assert views.outbox_counts(conn) == views.OutboxCounts(0, 0, 0, None)


def test_matched_takes_the_count_off_every_row():
    rows = [{"id": 1, "matched": 7}, {"id": 2, "matched": 7}]
    assert views.matched(rows) == 7
    assert rows == [{"id": 1}, {"id": 2}]
    assert views.matched([]) == 0


def test_unique_keeps_the_first_order_and_makes_no_values_any():
    assert views.unique(["b", "a", "b"]) == ["b", "a"]
    assert views.unique([]) is None and views.unique(None) is None
