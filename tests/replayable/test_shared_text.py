"""Documents that share their text: the work is paid once, every document gets its outcome.

Two different files can extract to the same text (a re-saved copy, a scan with new metadata).
Their chunks are one set of content addresses, embedded once; but each document is its own
item in every stage, ends done there, and announces its own ``document.ready`` (ADR 0085).
"""

import pytest

from replayable import db
from replayable.budget import RequestBudget
from replayable.keys import sha256_bytes
from replayable.ledger import RunContext
from replayable.retry import CallRetry
from replayable.runner import Limits, run_batch
from replayable.specs import ChunkSpec, EmbedSpec
from replayable.stages.chunk import ChunkConfig
from replayable.stages.embed import HttpEmbeddingClient

pytestmark = pytest.mark.db

CHUNKS = ChunkConfig(size=200, overlap=20)
FAST = CallRetry(max_attempts=8, base_s=0.01, cap_s=0.05, max_total_s=30)
TEXT = " ".join(f"Shared sentence {j} about the annual report, topic {j % 5}." for j in range(40))


def seed_twins(conn, copies: int) -> list[str]:
    """``copies`` documents of different bytes whose extracted text is the same."""
    ids = []
    for i in range(copies):
        doc_id = sha256_bytes(f"file {i} with its own metadata".encode())
        db.execute_values(conn, "upsert_documents", [(doc_id, f"/docs/twin{i}.pdf", 100 + i)])
        db.execute_values(
            conn,
            "insert_extraction",
            [(doc_id, "1.0", 1, TEXT, sha256_bytes(TEXT.encode()), 0)],
        )
        ids.append(doc_id)
    conn.commit()
    return sorted(ids)


def rows(conn, sql, *params):
    with conn.cursor() as cur:
        cur.execute(sql, params)
        found = cur.fetchall()
    conn.commit()
    return found


def connect_to(dsn):
    return lambda: db.Database(dsn, outage_s=30)


def embed(model, dsn, doc_ids, owner):
    client = HttpEmbeddingClient(base_url=model.base_url, model="m", retry=FAST, timeout_s=10)
    spec = EmbedSpec(
        provider=client,
        model="m",
        chunker_key=CHUNKS.key,
        connect=connect_to(dsn),
        budget=RequestBudget(model.base_url, 4, connect=connect_to(dsn)),
        inputs_per_call=4,
        max_in_flight=4,
        peer_poll_s=0.05,
    )
    try:
        return run_batch(
            spec,
            doc_ids,
            connect=connect_to(dsn),
            ctx=RunContext(owner=owner, run_id="r"),
            limits=Limits(),
        )
    finally:
        client.close()


def chunk(dsn, doc_ids):
    return run_batch(
        ChunkSpec(config=CHUNKS, connect=connect_to(dsn)),
        doc_ids,
        connect=connect_to(dsn),
        ctx=RunContext(owner="c", run_id="r"),
        limits=Limits(),
    )


def test_two_files_with_identical_text_both_end_done_and_announce_ready_paid_once(conn, dsn, model):
    twins = seed_twins(conn, 2)
    assert sorted(chunk(dsn, twins).done) == twins
    chunk_ids = {r[0] for r in rows(conn, "SELECT chunk_id FROM replayable.doc_chunks")}
    result = embed(model, dsn, twins, owner="w1")
    assert sorted(result.done) == twins
    assert rows(
        conn,
        "SELECT doc_id, status FROM replayable.stage_runs"
        " WHERE stage = 'embed' AND is_current ORDER BY doc_id",
    ) == [(d, "done") for d in twins]
    ready = rows(
        conn,
        "SELECT aggregate_id FROM replayable.outbox WHERE event_type = 'document.ready' ORDER BY 1",
    )
    assert ready == [(d,) for d in twins]
    stats = model.stats()
    # Paid once: every distinct chunk charged exactly once at the provider.
    assert stats["inputs_embedded"] == len(chunk_ids)
    assert set(stats["input_success_counts"].values()) == {1}


def test_a_twin_in_a_later_batch_is_done_without_a_call(conn, dsn, model):
    twins = seed_twins(conn, 3)
    chunk(dsn, twins)
    embed(model, dsn, twins[:1], owner="w1")
    paid = model.stats()["inputs_embedded"]
    later = embed(model, dsn, twins[1:], owner="w2")
    assert sorted(later.done) == twins[1:]
    assert model.stats()["inputs_embedded"] == paid
    report = rows(
        conn,
        "SELECT count(*) FROM replayable.stage_runs"
        " WHERE stage = 'embed' AND is_current AND status = 'done'",
    )
    assert report == [(3,)]
