"""Documents that share their text: the work is paid once, every document gets its outcome.

Two different files can extract to the same text (a re-saved copy, a scan with new metadata).
Their chunks are one set of content addresses, embedded once; but each document is its own
item in every stage, ends done there, and announces its own ``document.ready`` (ADR 0085).
"""

import pytest

from checks import rows, seed_extraction
from helpers.runner import CHUNKS, connect_to, embed_spec, run
from replayable.keys import sha256_bytes
from replayable.stages.chunk.spec import ChunkSpec

pytestmark = pytest.mark.db

TEXT = " ".join(f"Shared sentence {j} about the annual report, topic {j % 5}." for j in range(40))


def seed_twins(conn, copies: int) -> list[str]:
    """``copies`` documents of different bytes whose extracted text is the same."""
    ids = []
    for i in range(copies):
        doc_id = sha256_bytes(f"file {i} with its own metadata".encode())
        seed_extraction(conn, doc_id, f"/docs/twin{i}.pdf", TEXT, size=100 + i)
        ids.append(doc_id)
    conn.commit()
    return sorted(ids)


def embed(model, dsn, doc_ids, owner):
    return run(embed_spec(model.base_url, dsn, per_call=4), dsn, doc_ids, owner=owner)


def chunk(dsn, doc_ids):
    return run(ChunkSpec(config=CHUNKS, connect=connect_to(dsn)), dsn, doc_ids, owner="c")


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


def test_a_twin_in_a_later_batch_is_done_by_its_claim_without_a_call_and_announced(
    conn, dsn, model
):
    """Its embed plan finds every chunk's vector stored, so the claim records it done, with
    no lease, no attempt and no finish, and writes its ``document.ready`` in the shape a
    finish writes (ADR 0125): identical text is announced on this path too."""
    twins = seed_twins(conn, 3)
    chunk(dsn, twins)
    embed(model, dsn, twins[:1], owner="w1")
    paid = model.stats()["inputs_embedded"]
    requests = model.stats()["requests"]
    later = embed(model, dsn, twins[1:], owner="w2")
    assert sorted(later.done) == twins[1:] and later.processed == 0
    assert model.stats()["inputs_embedded"] == paid
    assert model.stats()["requests"] == requests
    report = rows(
        conn,
        "SELECT count(*) FROM replayable.stage_runs"
        " WHERE stage = 'embed' AND is_current AND status = 'done'",
    )
    assert report == [(3,)]
    assert rows(
        conn,
        "SELECT doc_id, status, attempts, lease_owner, started_at FROM replayable.stage_runs"
        " WHERE stage = 'embed' AND doc_id = ANY(%s) ORDER BY doc_id",
        twins[1:],
    ) == [(doc_id, "done", 0, None, None) for doc_id in twins[1:]]
    events = dict(
        rows(
            conn,
            "SELECT aggregate_id, payload FROM replayable.outbox"
            " WHERE event_type = 'document.ready'",
        )
    )
    assert sorted(events) == twins
    finished, *claimed = (events[doc_id] for doc_id in twins)
    for payload in claimed:
        assert set(payload) == set(finished)
        assert payload["versions"] == finished["versions"]
        assert payload["spec_hash"] == finished["spec_hash"]
