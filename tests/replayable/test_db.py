import pytest

from replayable import db


def test_migrating_again_applies_nothing(conn):
    assert db.migrate(conn) == []


def test_every_migration_is_idempotent_on_its_own(conn):
    """Re-running a migration's SQL over an up-to-date schema is a no-op, not an error."""
    for _, text in db._migrations():
        with conn.cursor() as cur:
            cur.execute(text)
        conn.commit()


@pytest.mark.parametrize(
    ("older", "newer"),
    [("1.9", "1.10"), ("1.0", "1.0.1"), ("2", "10"), ("0.9.9", "1.0")],
)
def test_code_versions_compare_semantically_in_sql(conn, older, newer):
    with conn.cursor() as cur:
        cur.execute(
            "SELECT replayable.version_key(%s) < replayable.version_key(%s)", (older, newer)
        )
        assert cur.fetchone()[0] is True
    conn.commit()


def test_named_queries_bind_values_instead_of_formatting_them(conn):
    hostile = "x'); DROP TABLE replayable.documents; --"
    db.execute_values(conn, "upsert_documents", [(hostile, hostile, 1)])
    conn.commit()
    rows = db.fetch_all(conn, "documents_by_id", {"doc_ids": [hostile]})
    assert rows == [{"doc_id": hostile, "uri": hostile, "size_bytes": 1}]


def test_the_metrics_migration_counts_what_was_there_before_it(conn):
    """0005 rebuilds its counters from the tables, so calls and letters from before count."""
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO replayable.model_calls (stage, attempt, call_try, status, latency_ms,"
            " n_inputs, tokens, idempotency_key) VALUES ('embed', 1, %s, %s, 20, 1, 5, 'k')",
            [(1, "ok"), (2, "ok"), (3, "http_503")],
        )
        cur.executemany(
            "INSERT INTO replayable.dead_letters (stage, item_key, doc_id, error_class,"
            " error_kind, error, attempts, code_version, status)"
            " VALUES ('embed', %s, 'd', 'http_400', 'terminal', 'e', 1, '1', %s)",
            [("i1", "open"), ("i2", "open"), ("i3", "redriven")],
        )
        # As if the rows were written before the migration: no counter knows them.
        cur.execute("TRUNCATE replayable.model_call_counts, replayable.dead_letter_counts")
    conn.commit()
    (text,) = [text for name, text in db._migrations() if name == "0005_metrics"]
    for _ in range(2):  # and applying it twice changes nothing
        with conn.cursor() as cur:
            cur.execute(text)
            cur.execute("SELECT sum(calls), sum(retries) FROM replayable.model_call_counts")
            assert cur.fetchone() == (3, 2)
            cur.execute(
                "SELECT sum(n) FILTER (WHERE status = 'open'), sum(created)"
                " FROM replayable.dead_letter_counts"
            )
            assert cur.fetchone() == (2, 3)
        conn.commit()
