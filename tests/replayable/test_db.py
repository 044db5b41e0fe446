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
