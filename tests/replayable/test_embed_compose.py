"""The sync embed stage where features meet: shared chunks, refused inputs, provider batches.

Run against a real Postgres and the real local model server; what the provider answered and
charged is read from its own counters.
"""

import pytest
from test_runner import (
    BOILERPLATE,
    CHUNKS,
    connect_to,
    count,
    embed_spec,
    rows,
    run,
    seed_documents,
)

from replayable.stages.chunk.spec import ChunkSpec

pytestmark = pytest.mark.db


def shared_chunks(conn, doc_ids) -> set[str]:
    """The chunks that more than one of ``doc_ids`` holds."""
    return {
        chunk_id
        for (chunk_id,) in rows(
            conn,
            "SELECT chunk_id FROM replayable.doc_chunks WHERE doc_id = ANY(%s)"
            " GROUP BY chunk_id HAVING count(DISTINCT doc_id) > 1",
            list(doc_ids),
        )
    }


def test_a_refused_chunk_two_documents_share_dead_letters_both_naming_it_in_few_requests(
    conn, dsn, model
):
    """A chunk the provider refuses as bad is bad for every document that holds it: each ends
    dead at its first attempt, its letter naming the chunk under the provider's error class,
    and the requests stay within the attempt cap times the batch's chunks (they used to
    double every round, a part per document still carrying the shared chunk)."""
    poisoned = seed_documents(conn, 2, shared=f"{BOILERPLATE} Closing note: POISON-400.", tag="p")
    clean = seed_documents(conn, 1, tag="c")
    docs = sorted(poisoned + clean)
    run(ChunkSpec(config=CHUNKS, connect=connect_to(dsn)), dsn, docs)
    (bad,) = [
        chunk_id
        for (chunk_id,) in rows(
            conn,
            "SELECT chunk_id FROM replayable.chunks WHERE text LIKE '%%POISON-400%%'",
        )
    ]
    assert bad in shared_chunks(conn, poisoned)
    chunks = count(conn, "SELECT count(DISTINCT chunk_id) FROM replayable.doc_chunks")
    model.set_faults(fail_inputs_containing={"POISON-400": 400})

    result = run(embed_spec(model.base_url, dsn, per_call=64), dsn, docs, deadline_s=10)

    assert result.systemic is None  # not stopped at the deadline
    assert sorted(result.dead) == poisoned
    assert result.done == clean
    letters = rows(
        conn,
        "SELECT doc_id, error_class, attempts, error FROM replayable.dead_letters"
        " WHERE status = 'open' ORDER BY doc_id",
    )
    assert [(d, c, a) for d, c, a, _ in letters] == [(d, "http_400", 1) for d in poisoned]
    assert all(bad in error for *_, error in letters)
    stats = model.stats()
    assert stats["requests"] <= 3 * chunks, stats["requests"]  # the default cap: 3 attempts
    # Every other chunk was bought, once.
    assert stats["inputs_embedded"] == chunks - 1
    assert set(stats["input_success_counts"].values()) == {1}
