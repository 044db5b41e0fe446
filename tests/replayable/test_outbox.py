"""The outbox against a real Postgres: events written with the state they announce."""

from __future__ import annotations

import pytest

from replayable import db
from replayable.keys import sha256_bytes
from replayable.ledger import Ledger, Outcome, Revival, RunContext
from replayable.retry import CallRetry, Classified, ErrorKind
from replayable.runner import Limits, run_batch
from replayable.specs import ChunkSpec, EmbedSpec
from replayable.stages.chunk import ChunkConfig
from replayable.stages.embed import HttpEmbeddingClient

pytestmark = pytest.mark.db

DOCS = [f"{i:x}" * 64 for i in range(1, 5)]
VERSIONS = {"stage": "embed", "code_version": "1.0", "model": "m"}
FAST = CallRetry(max_attempts=3, max_total_s=5.0, base_s=0.01, cap_s=0.05)


@pytest.fixture
def docs(conn):
    db.execute_values(conn, "upsert_documents", [(d, f"/docs/{d[:4]}.pdf", 10) for d in DOCS])
    conn.commit()
    return DOCS


@pytest.fixture
def database(dsn):
    handle = db.Database(dsn)
    yield handle
    handle.close()


def rows(conn, sql, *params):
    with conn.cursor() as cur:
        cur.execute(sql, params)
        found = cur.fetchall()
    conn.commit()
    return found


def execute(conn, sql, *params):
    with conn.cursor() as cur:
        cur.execute(sql, params)
    conn.commit()


def events(conn, event_type=None):
    return rows(
        conn,
        "SELECT event_type, aggregate_id, payload, status, attempts, error_class, last_error"
        " FROM replayable.outbox WHERE %s::text IS NULL OR event_type = %s ORDER BY seq",
        event_type,
        event_type,
    )


def ledger(database, stage="embed", *, announce=True, owner="w1", max_attempts=3):
    return Ledger(
        database,
        stage,
        "1.0",
        "cfg",
        "spec-1",
        RunContext(owner=owner, dag_id="d", run_id="r1"),
        lease_s=60.0,
        max_attempts=max_attempts,
        announce_ready=VERSIONS if announce else None,
    )


def done(doc):
    return Outcome.done(f"k{doc[:4]}")


# --- events written with the state they announce ---------------------------------------


def test_an_item_of_the_last_stage_ending_done_writes_one_ready_event(conn, docs, database):
    book = ledger(database)
    book.claim((f"k{d[:4]}", d) for d in docs[:2])
    database.transaction(lambda c: book.finish(c, [done(d) for d in docs[:2]]))
    found = events(conn)
    assert [(e[0], e[1], e[3]) for e in found] == [
        ("document.ready", d, "pending") for d in sorted(docs[:2])
    ]
    payload = found[0][2]
    assert payload["versions"] == VERSIONS
    assert payload["spec_hash"] == "spec-1"
    assert payload["uri"] == f"/docs/{payload['doc_id'][:4]}.pdf"
    assert (payload["dag_id"], payload["run_id"]) == ("d", "r1")


def test_a_stage_that_is_not_a_documents_last_announces_nothing(conn, docs, database):
    book = ledger(database, "chunk", announce=False)
    book.claim([(f"k{docs[0][:4]}", docs[0])])
    database.transaction(lambda c: book.finish(c, [done(docs[0])]))
    assert events(conn) == []


def test_no_event_is_left_when_the_finish_transaction_rolls_back(conn, docs, database):
    book = ledger(database)
    book.claim([(f"k{docs[0][:4]}", docs[0])])
    work = db.connect(database.dsn)
    try:
        book.finish(work, [done(docs[0])])
        work.rollback()  # e.g. the outputs written with it failed
    finally:
        work.close()
    assert events(conn) == []
    assert rows(conn, "SELECT status FROM replayable.stage_runs") == [("running",)]


def test_finishing_a_document_again_under_the_same_versions_adds_no_event(conn, docs, database):
    book = ledger(database)
    key = f"k{docs[0][:4]}"
    book.claim([(key, docs[0])])
    database.transaction(lambda c: book.finish(c, [done(docs[0])]))
    # As if a forced re-run processed the item again: back to pending, claimed, done.
    execute(conn, "UPDATE replayable.stage_runs SET status = 'pending' WHERE item_key = %s", key)
    assert book.claim([(key, docs[0])])[key].mine
    database.transaction(lambda c: book.finish(c, [done(docs[0])]))
    assert len(events(conn, "document.ready")) == 1


def test_a_dead_letter_writes_one_failed_event_with_its_error(conn, docs, database):
    book = ledger(database, "extract", announce=False)
    key = f"k{docs[1][:4]}"
    book.claim([(key, docs[1])])
    error = Classified("encrypted", ErrorKind.TERMINAL, "PdfReadError: file is encrypted")
    database.transaction(lambda c: book.finish(c, [Outcome(key, "failed", error, "tb")]))
    found = events(conn)
    assert [(e[0], e[1]) for e in found] == [("document.failed", docs[1])]
    payload = found[0][2]
    assert payload["stage"] == "extract"
    assert payload["error_class"] == "encrypted"
    assert payload["error"] == "PdfReadError: file is encrypted"
    letter = rows(conn, "SELECT id FROM replayable.dead_letters")[0][0]
    assert payload["dead_letter_id"] == letter
    # A revival that dies again opens a new letter: a new failure, a new event.
    book.claim([(key, docs[1])], revive=Revival(by="t", reason="retry"))
    database.transaction(lambda c: book.finish(c, [Outcome(key, "failed", error, "tb")]))
    assert len(events(conn, "document.failed")) == 2


def test_a_retryable_failure_under_the_cap_announces_nothing(conn, docs, database):
    book = ledger(database)
    key = f"k{docs[0][:4]}"
    book.claim([(key, docs[0])])
    error = Classified("http_503", ErrorKind.RETRYABLE, "503")
    database.transaction(lambda c: book.finish(c, [Outcome(key, "failed", error, None)]))
    assert events(conn) == []


def seed_texts(conn, n):
    ids = []
    for i in range(n):
        text = " ".join(f"outbox doc {i} sentence {j} on topic {j % 5}." for j in range(40))
        doc_id = sha256_bytes(text.encode())
        db.execute_values(conn, "upsert_documents", [(doc_id, f"/docs/o{i}.pdf", len(text))])
        db.execute_values(
            conn,
            "insert_extraction",
            [(doc_id, "1.0", 1, text, sha256_bytes(text.encode()), 0)],
        )
        ids.append(doc_id)
    conn.commit()
    return sorted(ids)


def test_the_embed_stage_announces_each_document_once_across_runs(conn, dsn, model):
    doc_ids = seed_texts(conn, 4)
    chunks = ChunkConfig(size=200, overlap=20)

    def connect():
        return db.Database(dsn, outage_s=30)

    def run(spec):
        return run_batch(
            spec, doc_ids, connect=connect, ctx=RunContext(owner="w1", run_id="r"), limits=Limits()
        )

    chunked = run(ChunkSpec(config=chunks, connect=connect))
    assert sorted(chunked.done) == doc_ids
    assert events(conn) == []  # chunk is not a document's last stage
    for _ in range(2):
        client = HttpEmbeddingClient(base_url=model.base_url, model="m", retry=FAST)
        spec = EmbedSpec(
            provider=client,
            model="m",
            chunker_key=chunks.key,
            connect=connect,
            budget=outbox_budget(model.base_url),
        )
        try:
            assert sorted(run(spec).done) == doc_ids
        finally:
            client.close()
    ready = events(conn, "document.ready")
    assert sorted(e[1] for e in ready) == doc_ids
    assert {e[2]["versions"]["model"] for e in ready} == {"m"}


def outbox_budget(base_url):
    from replayable.budget import RequestBudget

    return RequestBudget(base_url, 4)
