"""run_batch's outcomes against a real Postgres and the real local model server: what is
paid, what is replayed, what dead-letters, what stops a batch."""

import threading

import pytest

from checks import rows, seed_extraction
from helpers.runner import (
    CHUNKS,
    chunk_digests,
    connect_to,
    count,
    embed_spec,
    paid_once,
    run,
    seed_documents,
    wait_for,
)
from replayable import db
from replayable.keys import sha256_bytes
from replayable.retry import CallRetry
from replayable.stages.chunk.spec import ChunkSpec

pytestmark = pytest.mark.db


def test_a_second_run_makes_no_calls_and_writes_norows(conn, dsn, model, chunked):
    first = run(embed_spec(model.base_url, dsn), dsn, chunked)
    assert sorted(first.done) == chunked
    calls, rows = (
        model.stats()["requests"],
        count(conn, "SELECT count(*) FROM replayable.embeddings"),
    )
    second = run(embed_spec(model.base_url, dsn), dsn, chunked)
    assert (second.processed, second.skipped_done) == (0, len(chunked))
    assert model.stats()["requests"] == calls
    assert count(conn, "SELECT count(*) FROM replayable.embeddings") == rows


def test_documents_without_input_do_not_enter_the_stage(conn, dsn, model, chunked):
    result = run(embed_spec(model.base_url, dsn), dsn, [*chunked, "f" * 64])
    assert result.not_entered == ["f" * 64]
    assert result.entered == len(chunked)


def test_requests_pack_chunks_of_several_documents_and_pay_each_chunk_once(
    conn, dsn, model, chunked
):
    """Full requests span documents; every call and its share per item is recorded."""
    chunks = count(conn, "SELECT count(*) FROM replayable.chunks")
    result = run(embed_spec(model.base_url, dsn, per_call=8), dsn, chunked)
    assert sorted(result.done) == chunked
    stats = model.stats()
    assert stats["requests"] == -(-chunks // 8)  # ceil: only the last request is short
    paid_once(model, conn)
    spanning = count(
        conn,
        "SELECT count(*) FROM (SELECT call_id FROM replayable.model_call_items"
        " GROUP BY call_id HAVING count(*) > 1) multi",
    )
    assert spanning > 0
    assert count(conn, "SELECT sum(n_inputs) FROM replayable.model_call_items") == chunks


def test_transient_faults_end_done_with_one_paid_call_per_chunk(conn, dsn, model, chunked):
    model.set_faults(status_rates={"503": 0.3, "429": 0.1}, retry_after="0", seed=11)
    result = run(embed_spec(model.base_url, dsn), dsn, chunked)
    assert sorted(result.done) == chunked
    assert model.stats()["failed"] > 0
    paid_once(model, conn)
    assert count(conn, "SELECT sum(n_inputs) FROM replayable.model_calls WHERE status = 'ok'") == (
        count(conn, "SELECT count(*) FROM replayable.chunks")
    )


def test_a_lost_response_is_replayed_not_charged_again(conn, dsn, model, chunked):
    """The provider charges, the answer never arrives; the retry's same key is not charged."""
    model.set_faults(lose_response_rate=0.4, seed=3)
    result = run(embed_spec(model.base_url, dsn), dsn, chunked)
    assert sorted(result.done) == chunked
    stats = model.stats()
    assert stats["lost_responses"] > 0 and stats["deduplicated"] > 0
    paid_once(model, conn)


def test_a_bad_request_dead_letters_only_that_item_after_one_attempt(conn, dsn, model):
    doc_ids = seed_documents(conn, 3)
    poisoned = doc_ids[1]
    with conn.cursor() as cur:
        cur.execute(
            "UPDATE replayable.extractions SET text = text || ' POISON-400' WHERE doc_id = %s",
            (poisoned,),
        )
    conn.commit()
    run(ChunkSpec(config=CHUNKS, connect=connect_to(dsn)), dsn, doc_ids)
    model.set_faults(fail_inputs_containing={"POISON-400": 400})
    result = run(embed_spec(model.base_url, dsn, per_call=64), dsn, doc_ids)
    assert result.dead == [poisoned]
    assert sorted(result.done) == sorted(set(doc_ids) - {poisoned})
    assert (
        count(
            conn,
            "SELECT attempts FROM replayable.stage_runs WHERE stage = 'embed' AND doc_id = %s",
            poisoned,
        )
        == 1
    )
    assert (
        count(conn, "SELECT count(*) FROM replayable.dead_letters WHERE error_class = 'http_400'")
        == 1
    )


def test_an_auth_error_stops_the_batch_without_spending_attempts(conn, dsn, model, chunked):
    model.set_faults(status_always=401)
    result = run(embed_spec(model.base_url, dsn, in_flight=2), dsn, chunked)
    assert result.systemic is not None and result.systemic.error_class == "http_401"
    assert model.stats()["requests"] <= 2  # only what was already in flight
    assert count(conn, "SELECT count(*) FROM replayable.dead_letters") == 0
    assert count(conn, "SELECT max(attempts) FROM replayable.stage_runs WHERE stage = 'embed'") == 0
    assert count(
        conn,
        "SELECT count(*) FROM replayable.stage_runs WHERE stage = 'embed' AND status = 'failed'",
    ) == len(chunked)


def test_a_provider_down_for_the_whole_batch_stops_it_early(conn, dsn, model, chunked):
    model.set_faults(status_always=503)
    spec = embed_spec(model.base_url, dsn, in_flight=1, per_call=2)
    spec.provider.retry = CallRetry(max_attempts=2, base_s=0.01, cap_s=0.01)
    spec.systemic_after = 2
    result = run(spec, dsn, chunked)
    assert result.systemic is not None and result.systemic.error_class == "provider_unavailable"
    assert model.stats()["requests"] == 4  # two requests, two tries each
    assert len(result.failed) == len(chunked)
    assert count(conn, "SELECT count(*) FROM replayable.dead_letters") == 0


def test_each_request_carries_a_key_naming_exactly_its_chunks(conn, dsn, model, chunked):
    """Two different requests never share a key; the same chunks always make the same key."""
    run(embed_spec(model.base_url, dsn, per_call=5), dsn, chunked)
    stats = model.stats()
    assert len(stats["idempotency_keys"]) == stats["requests"]
    assert set(stats["idempotency_keys"].values()) == {1}
    keys = [row[0] for row in rows(conn, "SELECT idempotency_key FROM replayable.model_calls")]
    assert sorted(keys) == sorted(stats["idempotency_keys"])


def test_a_later_failure_keeps_the_vectors_already_paid_for(conn, dsn, model, chunked):
    """Request 1 succeeds, request 2 fails for good: request 1's vectors stay, never re-paid."""
    spec = embed_spec(model.base_url, dsn, in_flight=1, per_call=4)
    spec.provider.retry = CallRetry(max_attempts=1)
    spec.systemic_after = 100
    # The first request goes through, then the provider fails every request.
    calls = {"n": 0}
    real_embed = spec.provider.embed

    def first_then_down(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            model.set_faults(status_always=503)
        return real_embed(*args, **kwargs)

    spec.provider.embed = first_then_down
    result = run(spec, dsn, chunked)
    assert result.failed  # the batch did not finish
    kept = count(conn, "SELECT count(*) FROM replayable.embeddings")
    assert kept == 4  # the first request's four vectors were committed
    model.clear_faults()
    model.reset_stats()
    again = run(embed_spec(model.base_url, dsn), dsn, chunked)
    assert sorted(again.done) == chunked
    charged = model.stats()["inputs_embedded"]
    assert charged == count(conn, "SELECT count(*) FROM replayable.chunks") - kept


def test_a_database_outage_mid_batch_costs_no_attempt(conn, dsn, model, chunked):
    """Every session is dropped while requests are in flight: the batch reconnects and ends."""
    model.set_faults(latency_ms=150)
    outcome: dict[str, object] = {}

    def worker():
        outcome["result"] = run(embed_spec(model.base_url, dsn, per_call=2), dsn, chunked)

    thread = threading.Thread(target=worker)
    thread.start()
    # Mid-batch by the provider's own count: its first requests have come in.
    wait_for(lambda: model.stats()["requests"] >= 2)
    with conn.cursor() as cur:
        cur.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'replayable' AND pid <> pg_backend_pid()"
        )
        assert cur.fetchall()  # there were live sessions to drop
    conn.commit()
    thread.join(timeout=60)
    assert sorted(outcome["result"].done) == chunked
    assert count(conn, "SELECT max(attempts) FROM replayable.stage_runs WHERE stage = 'embed'") == 1
    assert count(conn, "SELECT count(*) FROM replayable.dead_letters") == 0
    paid_once(model, conn)


def test_extract_refuses_a_file_swapped_for_a_link_out_of_the_roots(conn, dsn, tmp_path):
    """The roots are checked again when the file is read: a document registered inside them
    and then replaced by a symlink to a file outside ends dead as outside_roots, unread."""
    import corpus
    from replayable import guards
    from replayable.stages.extract.spec import ExtractSpec

    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    inside = root / "report.pdf"
    corpus.write_pdf(inside, ["A report that was inside the roots when it was found."])
    corpus.write_pdf(outside / "secret.pdf", ["Text that must never reach the provider."])
    doc_id = sha256_bytes(inside.read_bytes())
    db.execute_values(conn, "plan/upsert_documents", [(doc_id, str(inside), inside.stat().st_size)])
    conn.commit()
    inside.unlink()
    inside.symlink_to(outside / "secret.pdf")

    with guards.GuardedPool(timeout_s=30, memory_mb=512, workers=1) as pool:
        spec = ExtractSpec(pool=pool, max_bytes=2**20, roots=[str(root)])
        result = run(spec, dsn, [doc_id])
    assert result.dead == [doc_id]
    assert rows(conn, "SELECT error_class FROM replayable.dead_letters") == [("outside_roots",)]
    assert count(conn, "SELECT count(*) FROM replayable.extractions") == 0


def test_a_chunk_past_the_per_input_limit_is_dead_before_anything_is_sent(conn, dsn, model):
    """A document whose chunk is estimated past max_input_tokens is dead as input_too_long;
    the provider never sees its chunks, and the other documents are embedded."""
    plain = seed_documents(conn, 3)
    # 200 characters of three UTF-8 bytes each: about 200 tokens a chunk, against about 67.
    wide = sha256_bytes(b"wide")
    seed_extraction(conn, wide, "/docs/wide.pdf", "語" * 600)
    conn.commit()
    doc_ids = sorted([*plain, wide])
    run(ChunkSpec(config=CHUNKS, connect=connect_to(dsn)), dsn, doc_ids)
    spec = embed_spec(model.base_url, dsn)
    spec.max_input_tokens = 100
    result = run(spec, dsn, doc_ids)
    assert result.dead == [wide] and sorted(result.done) == plain
    assert rows(
        conn,
        "SELECT error_class FROM replayable.stage_runs WHERE stage = 'embed' AND doc_id = %s",
        wide,
    ) == [("input_too_long",)]
    charged = set(model.stats()["input_success_counts"])
    assert charged == chunk_digests(conn, plain)
    assert not charged & chunk_digests(conn, [wide])
