"""run_batch against a real Postgres and the real local model server."""

import multiprocessing
import threading
import time

import pytest

from replayable import db
from replayable.keys import sha256_bytes
from replayable.ledger import Ledger, RunContext
from replayable.retry import CallRetry
from replayable.runner import Limits, WorkItem, run_batch
from replayable.specs import ChunkSpec, EmbedSpec
from replayable.stages.chunk import ChunkConfig
from replayable.stages.embed import HttpEmbeddingClient

CHUNKS = ChunkConfig(size=200, overlap=20)
FAST = CallRetry(max_attempts=8, base_s=0.01, cap_s=0.05, max_total_s=30)


def seed_documents(conn, n: int) -> list[str]:
    """Documents with extracted text, as the extract stage would leave them."""
    ids = []
    for i in range(n):
        text = " ".join(f"doc{i} sentence {j} about topic {j % 7}." for j in range(60))
        doc_id = sha256_bytes(text.encode())
        db.execute_values(conn, "upsert_documents", [(doc_id, f"/docs/{i}.pdf", len(text))])
        db.execute(
            conn,
            "insert_extraction",
            {
                "doc_id": doc_id,
                "extractor_version": "1.0",
                "page_count": 1,
                "text": text,
                "text_sha256": sha256_bytes(text.encode()),
            },
        )
        ids.append(doc_id)
    conn.commit()
    return sorted(ids)


def count(conn, sql: str, *params) -> int:
    with conn.cursor() as cur:
        cur.execute(sql, params)
        value = cur.fetchone()[0]
    conn.commit()
    return int(value)


def embed_spec(base_url: str) -> EmbedSpec:
    client = HttpEmbeddingClient(base_url=base_url, model="m", retry=FAST, timeout_s=10)
    return EmbedSpec(provider=client, model="m", chunker_key=CHUNKS.key, inputs_per_call=8)


def run(spec, dsn, doc_ids, owner="w1", **limits):
    return run_batch(
        spec,
        doc_ids,
        connect=lambda: db.connect(dsn),
        ctx=RunContext(owner=owner, run_id="run-1"),
        limits=Limits(**limits),
    )


@pytest.fixture
def chunked(conn, dsn):
    doc_ids = seed_documents(conn, 6)
    result = run(ChunkSpec(config=CHUNKS), dsn, doc_ids)
    assert sorted(result.done) == doc_ids
    return doc_ids


def test_a_second_run_makes_no_calls_and_writes_no_rows(conn, dsn, model, chunked):
    first = run(embed_spec(model.base_url), dsn, chunked)
    assert sorted(first.done) == chunked
    calls, rows = (
        model.stats()["requests"],
        count(conn, "SELECT count(*) FROM replayable.embeddings"),
    )
    second = run(embed_spec(model.base_url), dsn, chunked)
    assert (second.processed, second.skipped_done) == (0, len(chunked))
    assert model.stats()["requests"] == calls
    assert count(conn, "SELECT count(*) FROM replayable.embeddings") == rows


def test_documents_without_input_do_not_enter_the_stage(conn, dsn, model, chunked):
    result = run(embed_spec(model.base_url), dsn, [*chunked, "f" * 64])
    assert result.not_entered == ["f" * 64]
    assert result.entered == len(chunked)


def test_transient_faults_end_done_with_one_paid_call_per_chunk(conn, dsn, model, chunked):
    model.set_faults(status_rates={"503": 0.3, "429": 0.1}, retry_after="0", seed=11)
    result = run(embed_spec(model.base_url), dsn, chunked)
    assert sorted(result.done) == chunked
    chunk_count = count(conn, "SELECT count(*) FROM replayable.chunks")
    stats = model.stats()
    assert stats["failed"] > 0
    assert sorted(set(stats["input_success_counts"].values())) == [1]
    assert stats["inputs_embedded"] == chunk_count
    assert count(conn, "SELECT sum(n_inputs) FROM replayable.model_calls WHERE status = 'ok'") == (
        chunk_count
    )


def test_a_bad_request_dead_letters_only_that_item_after_one_attempt(conn, dsn, model):
    doc_ids = seed_documents(conn, 3)
    poisoned = doc_ids[1]
    db.execute(
        conn,
        "insert_extraction",
        {  # unused; keeps the fixture shape obvious
            "doc_id": poisoned,
            "extractor_version": "0.9",
            "page_count": 1,
            "text": "x",
            "text_sha256": "x",
        },
    )
    with conn.cursor() as cur:
        cur.execute(
            "UPDATE replayable.extractions SET text = text || ' POISON-400'"
            " WHERE doc_id = %s AND extractor_version = '1.0'",
            (poisoned,),
        )
    conn.commit()
    run(ChunkSpec(config=CHUNKS), dsn, doc_ids)
    model.set_faults(fail_inputs_containing={"POISON-400": 400})
    result = run(embed_spec(model.base_url), dsn, doc_ids)
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
    result = run(embed_spec(model.base_url), dsn, chunked)
    assert result.systemic is not None and result.systemic.error_class == "http_401"
    assert model.stats()["requests"] == 1
    assert count(conn, "SELECT count(*) FROM replayable.dead_letters") == 0
    assert count(conn, "SELECT max(attempts) FROM replayable.stage_runs WHERE stage = 'embed'") == 0
    assert count(
        conn,
        "SELECT count(*) FROM replayable.stage_runs WHERE stage = 'embed' AND status = 'failed'",
    ) == len(chunked)


def test_a_provider_down_for_the_whole_batch_stops_it_early(conn, dsn, model, chunked):
    model.set_faults(status_always=503)
    spec = embed_spec(model.base_url)
    spec.provider.retry = CallRetry(max_attempts=2, base_s=0.01, cap_s=0.01)
    result = run(spec, dsn, chunked, systemic_after=2)
    assert result.systemic is not None and result.systemic.error_class == "provider_unavailable"
    assert (
        count(
            conn,
            "SELECT count(*) FROM replayable.stage_runs WHERE stage = 'embed' AND attempts > 0",
        )
        == 2
    )
    assert len(result.failed) == len(chunked)


def _run_in_process(dsn, base_url, doc_ids, owner, queue):
    result = run(embed_spec(base_url), dsn, doc_ids, owner=owner, wait_poll_s=0.2)
    queue.put((sorted(result.done), result.processed))


def test_two_workers_on_one_batch_pay_for_each_chunk_once(conn, dsn, model, chunked):
    model.set_faults(latency_ms=150)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    workers = [
        ctx.Process(target=_run_in_process, args=(dsn, model.base_url, chunked, f"w{i}", queue))
        for i in range(2)
    ]
    for w in workers:
        w.start()
    results = [queue.get(timeout=120) for _ in workers]
    for w in workers:
        w.join(timeout=30)
    assert all(done == chunked for done, _ in results)
    assert sum(processed for _, processed in results) == len(chunked)
    stats = model.stats()
    assert sorted(set(stats["input_success_counts"].values())) == [1]
    assert all(n == 1 for n in stats["idempotency_keys"].values())
    assert count(conn, "SELECT count(*) FROM replayable.embeddings") == count(
        conn, "SELECT count(*) FROM replayable.chunks"
    )


class _SlowSpec:
    """A stage whose single item takes longer than its lease."""

    name = "slow"
    code_version = "1"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def key_config(self):
        return {}

    def plan(self, conn, doc_ids):
        return [WorkItem(doc_id, f"slow-{doc_id}") for doc_id in doc_ids]

    def process(self, conn, item, calls):
        time.sleep(self.seconds)


def test_a_long_item_keeps_its_lease_while_it_runs(conn, dsn):
    (doc_id,) = seed_documents(conn, 1)
    other = Ledger(conn, "slow", "1", "x", RunContext(owner="other"))
    outcome: dict[str, object] = {}

    def worker():
        outcome["result"] = run(_SlowSpec(2.5), dsn, [doc_id], lease_s=0.9)

    thread = threading.Thread(target=worker)
    thread.start()
    time.sleep(1.8)  # two lease lengths: only a renewed lease is still live now
    assert other.claim(f"slow-{doc_id}") is None
    thread.join(timeout=30)
    assert outcome["result"].done == [doc_id]


def test_each_request_carries_its_own_idempotency_key(conn, dsn, model, chunked):
    """One request for a whole item uses the item key; parts of an item get keys of their own."""
    spec = embed_spec(model.base_url)
    spec.inputs_per_call = 1000
    whole = run(spec, dsn, chunked[:1])
    assert whole.done == chunked[:1]
    (key,) = model.stats()["idempotency_keys"]
    item_keys = {
        k
        for (k,) in _rows(conn, "SELECT item_key FROM replayable.stage_runs WHERE stage = 'embed'")
    }
    assert key in item_keys

    run(embed_spec(model.base_url), dsn, chunked[1:])  # 8 inputs per request: several per item
    stats = model.stats()
    assert len(stats["idempotency_keys"]) == stats["requests"]
    assert set(stats["idempotency_keys"].values()) == {1}


def _rows(conn, sql):
    with conn.cursor() as cur:
        cur.execute(sql)
        found = cur.fetchall()
    conn.commit()
    return found
