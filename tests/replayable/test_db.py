import threading
from concurrent.futures import ThreadPoolExecutor
from importlib import resources

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
    db.execute_values(conn, "plan/upsert_documents", [(hostile, hostile, 1)])
    conn.commit()
    rows = db.fetch_all(conn, "stages/documents_by_id", {"doc_ids": [hostile]})
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


def _before_dimensions(cur) -> None:
    """The embeddings and batch claims as they were before 0026: keyed without dimensions."""
    cur.execute(
        "ALTER TABLE replayable.embeddings DROP CONSTRAINT embeddings_pkey;"
        "ALTER TABLE replayable.embeddings DROP COLUMN dimensions;"
        "ALTER TABLE replayable.embeddings ADD PRIMARY KEY (chunk_id, model);"
        "CREATE INDEX embeddings_model_idx ON replayable.embeddings (model, dim);"
        "ALTER TABLE replayable.provider_batches DROP COLUMN dimensions;"
        "ALTER TABLE replayable.provider_batch_chunks DROP CONSTRAINT provider_batch_chunks_pkey;"
        "ALTER TABLE replayable.provider_batch_chunks DROP COLUMN dimensions;"
        "ALTER TABLE replayable.provider_batch_chunks ADD PRIMARY KEY (model, chunk_id);"
    )


def test_the_dimensions_migration_labels_each_vector_by_what_its_items_asked(conn):
    """0026 labels the vectors stored before it (ADR 0151): a length items asked for
    explicitly is theirs, the model's own size is 0, and the own size that items also asked
    for by number is kept under both; a live submission takes the dimensions its lines'
    custom_id was made with, and its claims with it. Applied twice, it changes nothing."""
    from replayable.keys import config_hash
    from replayable.stages.embed import key_config
    from replayable.stages.embed.store import request_key

    sized = {  # model: (lengths stored, dimensions its embed items were keyed by)
        "own-only": ((4,), (None,)),
        "asked": ((2,), (2,)),
        "both": ((8, 2), (None, 2, 8)),
    }
    with conn.cursor() as cur:
        _before_dimensions(cur)
        cur.execute(
            "INSERT INTO replayable.documents (doc_id, uri, size_bytes) VALUES ('d', '/d', 1)"
        )
        for model, (lengths, asked) in sized.items():
            for dim in lengths:
                chunk = f"{model}-{dim}"
                cur.execute(
                    "INSERT INTO replayable.chunks (chunk_id, text) VALUES (%s, 'x')", (chunk,)
                )
                cur.execute(
                    "INSERT INTO replayable.embeddings (chunk_id, model, dim, embedding)"
                    " VALUES (%s, %s, %s, %s::vector)",
                    (chunk, model, dim, "[" + ",".join(["1"] * dim) + "]"),
                )
            for n, dims in enumerate(asked):
                cur.execute(
                    "INSERT INTO replayable.stage_runs (stage, item_key, doc_id, status,"
                    " attempts, code_version, config_hash, spec_hash)"
                    " VALUES ('embed', %s, 'd', 'done', 1, '1.0', %s, 's')",
                    (f"{model}-{n}", config_hash(key_config(model, dims))),
                )
        for submission, dims in (("at-2", 2), ("at-own", None)):
            chunks = [f"{submission}-b", f"{submission}-a"]
            cur.execute(
                "INSERT INTO replayable.provider_batches (submission, provider, model, status,"
                " lines, inputs) VALUES (%s, 'p', 'asked', 'waiting', 1, 2)",
                (submission,),
            )
            cur.execute(
                "INSERT INTO replayable.provider_batch_lines (submission, custom_id, chunk_ids)"
                " VALUES (%s, %s, %s)",
                (submission, request_key("asked", dims, chunks), chunks),
            )
            cur.executemany(
                "INSERT INTO replayable.provider_batch_chunks (model, chunk_id, submission)"
                " VALUES ('asked', %s, %s)",
                [(chunk, submission) for chunk in chunks],
            )
    conn.commit()
    (text,) = [text for name, text in db._migrations() if name == "0026_embedding_dimensions"]
    for _ in range(2):
        with conn.cursor() as cur:
            cur.execute(text)
            cur.execute("SELECT model, dim, dimensions FROM replayable.embeddings ORDER BY 1, 2, 3")
            assert cur.fetchall() == [
                ("asked", 2, 2),
                ("both", 2, 2),
                ("both", 8, 0),
                ("both", 8, 8),
                ("own-only", 4, 0),
            ]
            cur.execute(
                "SELECT b.submission, b.dimensions, array_agg(DISTINCT c.dimensions)"
                " FROM replayable.provider_batches b JOIN replayable.provider_batch_chunks c"
                " USING (submission) GROUP BY 1, 2 ORDER BY 1"
            )
            assert cur.fetchall() == [("at-2", 2, [2]), ("at-own", 0, [0])]
        conn.commit()


def in_threads(n, fn):
    """Run ``fn(i)`` in ``n`` threads started together; return results or raised errors."""
    barrier = threading.Barrier(n)

    def call(i):
        barrier.wait()
        try:
            return fn(i)
        except Exception as error:
            return error

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(call, range(n)))


def migrate_once(dsn, **options):
    conn = db.connect(dsn)
    try:
        return db.migrate(conn, **options)
    finally:
        conn.close()


def bounded(fn, bound_s=30):
    """``fn()`` in a daemon thread; the test fails, not hangs, if it still waits after ``bound_s``.

    The caller releases what ``fn`` waits for afterwards, so the thread ends with the test.
    """
    outcome = {}

    def target():
        try:
            outcome["value"] = fn()
        except Exception as error:
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(bound_s)
    if thread.is_alive():
        pytest.fail(f"still waiting after {bound_s} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def test_plans_migrating_a_fresh_database_at_once_all_succeed_and_apply_each_once(fresh_dsn):
    results = in_threads(6, lambda _: migrate_once(fresh_dsn))
    assert not [r for r in results if isinstance(r, Exception)], results
    applied = [version for result in results for version in result]
    assert sorted(applied) == [version for version, _ in db._migrations()]
    conn = db.connect(fresh_dsn)
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM replayable.schema_migrations")
        assert cur.fetchone()[0] == len(db._migrations())
    conn.close()


def test_an_up_to_date_schema_is_not_migrated_behind_a_stuck_migrator(fresh_dsn):
    """Every plan migrates: with nothing to apply it must not queue for the migration lock."""
    migrate_once(fresh_dsn)
    stuck = db.connect(fresh_dsn)
    with stuck.cursor() as cur:
        cur.execute("SELECT pg_advisory_lock(%s)", (db._MIGRATION_LOCK,))
    try:
        assert bounded(lambda: migrate_once(fresh_dsn)) == []
    finally:
        stuck.close()


def test_a_migration_behind_a_long_transaction_gives_up_and_applies_once_it_ends(fresh_dsn):
    """DDL waiting on a busy table would queue every reader behind it: it waits lock_timeout."""
    migrate_once(fresh_dsn)
    version = "0007_redrive_run"  # alters dead_letters
    setup = db.connect(fresh_dsn)
    with setup.cursor() as cur:
        cur.execute("DELETE FROM replayable.schema_migrations WHERE version = %s", (version,))
    setup.commit()
    reader = db.connect(fresh_dsn)
    with reader.cursor() as cur:
        cur.execute("SELECT count(*) FROM replayable.dead_letters")  # holds ACCESS SHARE
    try:
        with pytest.raises(db.MigrationLockTimeout, match=version):
            bounded(lambda: migrate_once(fresh_dsn, lock_timeout_s=0.2, attempts=2))
        with setup.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM replayable.schema_migrations WHERE version = %s", (version,)
            )
            assert cur.fetchone()[0] == 0
        setup.commit()
    finally:
        reader.close()
    assert migrate_once(fresh_dsn, lock_timeout_s=0.2) == [version]
    setup.close()


def test_every_query_lives_in_a_topic_folder_and_loads_by_its_topic_name():
    queries = resources.files("replayable").joinpath("sql", "queries")
    assert not [f.name for f in queries.iterdir() if f.name.endswith(".sql")], "put it in a topic"
    for topic in (t for t in queries.iterdir() if t.is_dir() and not t.name.startswith("_")):
        for query in (f for f in topic.iterdir() if f.name.endswith(".sql")):
            assert db.sql(f"{topic.name}/{query.name.removesuffix('.sql')}") == query.read_text()


def test_a_query_name_without_its_topic_is_refused():
    with pytest.raises(ValueError, match="topic/name"):
        db.sql("claim_items")
