"""The tests' own ledger emptying (helpers.ledger.empty_ledger) leaves what devenv's leaves."""

from __future__ import annotations

from typing import Any

from checks import scalar
from helpers.ledger import empty_ledger


def _table_rows(conn: Any) -> dict[str, int]:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'replayable'"
            " AND tablename <> 'schema_migrations'"
        )
        names = [row[0] for row in cur.fetchall()]
    return {n: scalar(conn, f"SELECT count(*) FROM replayable.{n}") for n in names}  # noqa: S608


def test_every_table_ends_empty_and_no_trigger_writes_while_it_empties(conn):
    with conn.cursor() as cur:
        # Enough documents for TRUNCATE, and a dead letter whose triggers keep counters and
        # a history: both paths at once.
        cur.execute(
            "INSERT INTO replayable.documents (doc_id, uri, size_bytes)"
            " SELECT lpad(n::text, 64, '0'), '/data/' || n || '.pdf', 1"
            " FROM generate_series(1, 1500) AS n"
        )
        cur.execute(
            "INSERT INTO replayable.dead_letters (stage, item_key, doc_id, error_class,"
            " error_kind, error, attempts, code_version)"
            " VALUES ('extract', 'k', lpad('1', 64, '0'), 'encrypted', 'terminal', 'x', 1, '1')"
        )
        cur.execute(
            "INSERT INTO replayable.model_calls (stage, item_key, attempt, status, latency_ms,"
            " n_inputs, idempotency_key) VALUES ('embed', 'k', 1, 'ok', 5, 1, 'i')"
        )
    conn.commit()
    assert sum(_table_rows(conn).values()) > 1502
    empty_ledger(conn)
    assert {n: c for n, c in _table_rows(conn).items() if c} == {}
