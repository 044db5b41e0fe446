"""The sync embed stage where features meet: shared chunks, refused inputs, provider batches.

Run against a real Postgres and the real local model server; what the provider answered and
charged is read from its own counters.
"""

import hashlib
import threading

import pytest

from checks import assert_nothing_lost, rows, subset
from helpers.runner import (
    BOILERPLATE,
    CHUNKS,
    FAST,
    connect_to,
    count,
    embed_spec,
    run,
    seed_documents,
    wait_for,
)
from replayable import db
from replayable.models.batch_api import BatchApi
from replayable.stages import extract
from replayable.stages.chunk.chunker import chunk_config_of
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
        "SELECT doc_id, error_class, attempts, error || traceback FROM replayable.dead_letters"
        " WHERE status = 'open' ORDER BY doc_id",
    )
    assert [(d, c, a) for d, c, a, _ in letters] == [(d, "http_400", 1) for d in poisoned]
    assert all(bad in error for *_, error in letters)
    # The full error, as every letter carries it: the provider's refusal where it was raised.
    assert all("Traceback (most recent call last)" in error for *_, error in letters)
    stats = model.stats()
    assert stats["requests"] <= 3 * chunks, stats["requests"]  # the default cap: 3 attempts
    # Every other chunk was bought, once.
    assert stats["inputs_embedded"] == chunks - 1
    assert set(stats["input_success_counts"].values()) == {1}


def batch_api(model) -> BatchApi:
    return BatchApi(base_url=model.base_url, model="m", retry=FAST)


def texts_by_digest(conn) -> dict[str, str]:
    """Chunk ids by the sha256 of their text, as the provider counts the inputs it charged."""
    return {
        hashlib.sha256(text.encode()).hexdigest(): chunk_id
        for chunk_id, text in rows(conn, "SELECT chunk_id, text FROM replayable.chunks")
    }


def bought(conn, model) -> tuple[dict[str, int], dict[str, int]]:
    """Per chunk, the times the provider charged it: synchronously, and in batch lines."""
    by_digest = texts_by_digest(conn)
    stats = model.stats()
    sync = {by_digest[d]: n for d, n in stats["input_success_counts"].items()}
    lines = dict(
        rows(conn, "SELECT DISTINCT custom_id, chunk_ids FROM replayable.provider_batch_lines")
    )
    batch: dict[str, int] = {}
    for custom_id, times in stats["batch_line_charges"].items():
        for chunk_id in lines[custom_id]:
            batch[chunk_id] = batch.get(chunk_id, 0) + times
    return sync, batch


def test_a_sync_run_never_buys_chunks_a_live_batch_holds_and_collects_them_when_it_ends(
    conn, dsn, model
):
    """Sync and batch mode over the same chunks: a sync run over documents whose chunks a
    provider batch is embedding buys only the chunks no submission holds; the documents that
    need the held ones are released without spending an attempt, and a later sync run takes
    their vectors from the batch once it has ended. Each chunk is charged once, in one mode,
    and the ledger records both."""
    batched = seed_documents(conn, 2, shared=BOILERPLATE, tag="b")
    later = seed_documents(conn, 1, shared=BOILERPLATE, tag="s")
    docs = sorted(batched + later)
    run(ChunkSpec(config=CHUNKS, connect=connect_to(dsn)), dsn, docs)
    chunks = count(conn, "SELECT count(DISTINCT chunk_id) FROM replayable.doc_chunks")
    model.set_faults(batch_delay_s=4)
    submitter = embed_spec(model.base_url, dsn, per_call=8)
    submitter.mode, submitter.batches = "batch", batch_api(model)
    first = run(submitter, dsn, batched, owner="batch")
    assert first.systemic is not None and first.systemic.error_class == "batch_waiting"
    held = {c for (c,) in rows(conn, "SELECT chunk_id FROM replayable.provider_batch_chunks")}
    assert held & shared_chunks(conn, docs)

    # Without the Batch API at hand, the sync pass leaves them to wait for the batch.
    sync = embed_spec(model.base_url, dsn, per_call=8)
    second = run(sync, dsn, docs, owner="sync")

    assert second.systemic is not None and second.systemic.error_class == "batch_waiting"
    assert rows(
        conn,
        "SELECT DISTINCT status, attempts, error_class FROM replayable.stage_runs"
        " WHERE stage = 'embed'",
    ) == [("failed", 0, "batch_waiting")]
    paid_sync, _ = bought(conn, model)
    assert not held & set(paid_sync)  # none of the held chunks bought again
    assert (
        set(paid_sync)
        == {  # the later document's own chunks were
            c
            for (c,) in rows(
                conn, "SELECT chunk_id FROM replayable.doc_chunks WHERE doc_id = %s", later[0]
            )
        }
        - held
    )

    (batch_id,) = sync.waiting_on
    api = batch_api(model)
    wait_for(lambda: api.get(batch_id).finished, timeout_s=30)
    # With it, the sync pass collects the batch that has ended, as a batch-mode pass would.
    sync.batches = api
    third = run(sync, dsn, docs, owner="sync-again")

    assert sorted(third.done) == docs
    paid_sync, paid_batch = bought(conn, model)
    assert set(paid_sync.values()) == set(paid_batch.values()) == {1}
    assert not set(paid_sync) & set(paid_batch)
    assert len(paid_sync) + len(paid_batch) == chunks
    assert rows(
        conn,
        "SELECT mode, sum(n_inputs) FROM replayable.model_calls WHERE status = 'ok'"
        " GROUP BY mode ORDER BY mode",
    ) == [("batch", len(paid_batch)), ("sync", len(paid_sync))]
    assert count(conn, "SELECT count(*) FROM replayable.provider_batch_chunks") == 0


def at_dimensions(spec, dimensions):
    """``spec`` asking its model for ``dimensions`` (None: the model's own size)."""
    spec.dimensions = spec.provider.dimensions = dimensions
    return spec


def test_a_live_batch_holds_its_chunks_at_its_own_dimensions_only(conn, dsn, model):
    """A model at two sizes is two purchases (ADR 0151): a batch embedding the chunks at 16
    dimensions keeps a sync run at 16 waiting for it, and no sync run at the model's own
    size, which buys every chunk itself, once, while the batch still runs."""
    docs = seed_documents(conn, 2, shared=BOILERPLATE, tag="d")
    run(ChunkSpec(config=CHUNKS, connect=connect_to(dsn)), dsn, docs)
    chunks = count(conn, "SELECT count(DISTINCT chunk_id) FROM replayable.doc_chunks")
    model.set_faults(batch_delay_s=30)
    submitter = at_dimensions(embed_spec(model.base_url, dsn, per_call=8), 16)
    submitter.mode, submitter.batches = "batch", batch_api(model)
    first = run(submitter, dsn, docs, owner="batch")
    assert first.systemic is not None and first.systemic.error_class == "batch_waiting"
    assert count(conn, "SELECT count(*) FROM replayable.provider_batch_chunks") == chunks

    same = run(at_dimensions(embed_spec(model.base_url, dsn, per_call=8), 16), dsn, docs)
    assert same.systemic is not None and same.systemic.error_class == "batch_waiting"
    assert model.stats()["charged"] == 0

    own = run(embed_spec(model.base_url, dsn, per_call=8), dsn, docs, owner="own")
    assert own.systemic is None and sorted(own.done) == docs
    stats = model.stats()
    assert stats["inputs_embedded"] == chunks
    assert set(stats["input_success_counts"].values()) == {1}
    assert rows(
        conn, "SELECT dimensions, count(*) FROM replayable.embeddings GROUP BY dimensions"
    ) == [(0, chunks)]
    assert count(conn, "SELECT count(*) FROM replayable.provider_batch_chunks") == chunks


def test_a_batch_never_claims_a_chunk_a_sync_request_is_buying(conn, dsn, model):
    """A submission claims its chunks under the locks a sync request holds while it buys
    them: it waits for the request, and leaves out the chunks that request stored."""
    docs = seed_documents(conn, 2, tag="r")
    run(ChunkSpec(config=CHUNKS, connect=connect_to(dsn)), dsn, docs)
    ((bought_by_sync,),) = rows(
        conn, "SELECT min(chunk_id) FROM replayable.doc_chunks WHERE doc_id = %s", docs[0]
    )
    peer = db.connect(dsn)  # a sync request in flight: it holds the chunk's lock
    with peer.cursor() as cur:
        cur.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s || '/' || %s || '/0', 0))",
            (bought_by_sync, "m"),
        )
    model.set_faults(batch_delay_s=1)
    submitter = embed_spec(model.base_url, dsn, per_call=8)
    submitter.mode, submitter.batches = "batch", batch_api(model)
    outcome = {}
    passing = threading.Thread(target=lambda: outcome.update(result=run(submitter, dsn, docs)))
    passing.start()
    try:

        def claiming_or_claimed() -> bool:
            """The pass has checked what is missing, and waits to claim it (or has)."""
            return bool(
                count(
                    conn,
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
                )
                or count(conn, "SELECT count(*) FROM replayable.provider_batches")
            )

        wait_for(claiming_or_claimed)
        with peer.cursor() as cur:
            cur.execute(
                "INSERT INTO replayable.embeddings (chunk_id, model, dim, embedding)"
                " VALUES (%s, 'm', 3, '[1, 0, 0]')",
                (bought_by_sync,),
            )
        peer.commit()  # the request stored its answer
    finally:
        passing.join(timeout=60)
        peer.close()
    assert "result" in outcome
    claimed = rows(
        conn,
        "SELECT submission FROM replayable.provider_batch_lines WHERE %s = ANY(chunk_ids)",
        bought_by_sync,
    )
    assert claimed == []


def test_a_run_records_the_embed_mode_its_sweep_reruns_in(run_in_process, conn, model, tmp_path):
    """The plan records each run's embed mode with the run, which the sweep reads back for
    the items the run left (tests/replayable/test_sweeper.py)."""
    model.set_faults(batch_delay_s=0.1)
    batched = run_in_process(
        {"source": str(subset(tmp_path, 1)), "embed_mode": "batch", "batch_poll_s": 0.1}
    )
    plain = run_in_process({"source": str(subset(tmp_path, 2))})
    assert not batched["_failed"] and not plain["_failed"]
    assert rows(conn, "SELECT run_id, embed_mode FROM replayable.runs ORDER BY created_at") == [
        (batched["run_id"], "batch"),
        (plain["run_id"], "sync"),
    ]


def test_a_sync_run_over_documents_a_batch_embeds_waits_for_it_and_buys_nothing(
    run_in_process, conn, dsn, model, tmp_path
):
    """A plain run (sync mode) over documents whose chunks a batch-mode submission holds: its
    embed task buys none of them, waits for the batch (on the triggerer, while it runs) and
    takes the vectors from it; the ledger records the batch's lines, each charged once."""
    from replayable.settings import PipelineSettings

    folder = subset(tmp_path, 3)
    first = run_in_process({"source": str(folder), "stages": ["extract", "chunk"]})
    assert not first["_failed"], first["_tasks"]
    defaults = PipelineSettings()
    submitter = embed_spec(model.base_url, dsn, per_call=8)
    submitter.model = submitter.provider.model = "text-embedding-3-small"
    submitter.chunker_key = chunk_config_of(defaults).key
    submitter.extractor_version = extract.extractor_id(defaults.extractor)
    submitter.mode, submitter.batches = "batch", batch_api(model)
    submitter.batches.model = submitter.model
    model.set_faults(batch_delay_s=10)
    docs = [d for (d,) in rows(conn, "SELECT doc_id FROM replayable.documents ORDER BY 1")]
    submitted = run(submitter, dsn, docs, owner="batch")
    assert submitted.systemic is not None and submitted.systemic.error_class == "batch_waiting"

    second = run_in_process({"source": str(folder), "batch_poll_s": 0.1})

    assert not second["_failed"], second["_tasks"]
    assert second["stages"]["embed"]["done"] == 3
    stats = model.stats()
    assert stats["charged"] == 0  # no chunk bought synchronously
    assert set(stats["batch_line_charges"].values()) == {1}
    assert rows(conn, "SELECT DISTINCT mode FROM replayable.model_calls WHERE status = 'ok'") == [
        ("batch",)
    ]
    assert count(conn, "SELECT count(*) FROM replayable.provider_batch_chunks") == 0
    assert_nothing_lost(conn)
