"""The embed stage's database sessions are bounded apart from what a run asks of the provider.

Each in-flight request holds its chunk locks in a transaction of its own session (ADR 0031),
so a task's sender threads and its sessions come together; their number is capped by
``max_sessions``, never by the ``max_in_flight`` a run asked for (ADR 0086).
"""

import threading

import psycopg2
import pytest

from checks import seed_extraction
from replayable import db
from replayable.budget import RequestBudget
from replayable.keys import sha256_bytes
from replayable.ledger import RunContext
from replayable.models.embeddings import HttpEmbeddingClient
from replayable.retry import CallRetry
from replayable.runner import Limits, run_batch
from replayable.stages.chunk.chunker import ChunkConfig
from replayable.stages.chunk.spec import ChunkSpec
from replayable.stages.embed.spec import EmbedSpec

pytestmark = pytest.mark.db

CHUNKS = ChunkConfig(size=100, overlap=10)
FAST = CallRetry(max_attempts=8, base_s=0.01, cap_s=0.05, max_total_s=30)


def seed(conn, n):
    ids = []
    for i in range(n):
        text = " ".join(f"document {i} line {j} of the session test." for j in range(30))
        doc_id = sha256_bytes(text.encode())
        seed_extraction(conn, doc_id, f"/docs/s{i}.pdf", text)
        ids.append(doc_id)
    conn.commit()
    return sorted(ids)


class SessionSampler:
    """Counts the sessions opened on the database since it started, until stopped.

    Sessions that were open before (the test's own, ones an earlier test on this worker left
    to close) are not counted, so nothing has to be waited for first.
    """

    def __init__(self, dsn):
        self.conn = psycopg2.connect(dsn)
        self.conn.autocommit = True
        with self.conn.cursor() as cur:
            cur.execute("SELECT now()")
            self.since = cur.fetchone()[0]
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        with self.conn.cursor() as cur:
            while not self._stop.wait(0.02):
                cur.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid() AND backend_start >= %s",
                    (self.since,),
                )
                self.peak = max(self.peak, cur.fetchone()[0])

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.conn.close()


def test_a_task_asking_for_many_requests_in_flight_opens_few_database_sessions(conn, dsn, model):
    doc_ids = seed(conn, 4)

    def connect():
        return db.Database(dsn, outage_s=30)

    ctx = RunContext(owner="w1", run_id="r")
    run_batch(ChunkSpec(config=CHUNKS, connect=connect), doc_ids, connect=connect, ctx=ctx)
    model.set_faults(latency_ms=150)
    client = HttpEmbeddingClient(base_url=model.base_url, model="m", retry=FAST, timeout_s=10)
    spec = EmbedSpec(
        provider=client,
        model="m",
        chunker_key=CHUNKS.key,
        connect=connect,
        budget=RequestBudget(model.base_url, 64),
        inputs_per_call=1,
        max_in_flight=64,
        max_sessions=4,
    )
    try:
        with SessionSampler(dsn) as sampler:
            result = run_batch(spec, doc_ids, connect=connect, ctx=ctx, limits=Limits())
    finally:
        client.close()
    assert sorted(result.done) == doc_ids
    stats = model.stats()
    assert stats["requests"] > 20  # far more requests than the cap allows sessions
    assert stats["peak_in_flight"] == 4  # the senders were busy, four at a time
    # Four senders, the batch's own check of missing vectors and the runner's three (work,
    # control, lease keeper); without the cap, one per request.
    assert sampler.peak <= 4 + 1 + 3


class LockProbe:
    """An embedding provider that, once each answer is back, checks from a session of its
    own whether the request's chunks are still locked (ADR 0031): they must be, until the
    transaction that stores their vectors commits."""

    def __init__(self, client, dsn, model):
        self.client = client
        self.model = model
        self.conn = psycopg2.connect(dsn)
        self.conn.autocommit = True
        self.unlocked: list[str] = []
        self._lock = threading.Lock()

    def embed(self, texts, **kwargs):
        result = self.client.embed(texts, **kwargs)
        with self._lock, self.conn.cursor() as cur:
            cur.execute(
                "SELECT c.chunk_id FROM replayable.chunks c WHERE c.text = ANY(%s)"
                " AND pg_try_advisory_lock(hashtextextended(c.chunk_id || '/' || %s || '/0', 0))",
                (list(texts), self.model),
            )
            free = [row[0] for row in cur.fetchall()]
            cur.execute("SELECT pg_advisory_unlock_all()")
        self.unlocked += free
        return result


def sessions_ended(conn) -> int:
    """Sessions of this database that Postgres ended with a fatal error (an idle limit)."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT sessions_fatal FROM pg_stat_database WHERE datname = current_database()"
        )
        (ended,) = cur.fetchone()
    conn.commit()
    return int(ended)


def test_a_request_whose_session_ends_while_it_waits_for_its_turn_is_sent_holding_its_chunks(
    conn, dsn, model
):
    """More senders than slots (ADR 0112): a request waits for its turn with its chunks
    locked, in a transaction whose idle limit (max_call_s) is set for one call and its
    retries, not for the wait as well. When Postgres ends that session, its locks go; the
    request must find out before it is sent, or a peer could take its chunks and pay for
    them again (ADR 0115)."""
    doc_ids = seed(conn, 1)
    ended = sessions_ended(conn)

    def connect():
        return db.Database(dsn, outage_s=30)

    ctx = RunContext(owner="w1", run_id="r")
    run_batch(ChunkSpec(config=CHUNKS, connect=connect), doc_ids, connect=connect, ctx=ctx)
    # Half the tries are refused with Retry-After 0.3 s: a request and its retries take 0.2 s,
    # 0.7 s, 1.2 s..., and its transaction is idle at most 0.5 s at a time (each try's budget
    # slot is a statement), under the 0.6 s limit; a request waiting for the slot is idle for
    # as long as the one ahead of it takes.
    model.set_faults(latency_ms=200, status_rates={"429": 0.5}, retry_after=0.3, seed=3)
    client = HttpEmbeddingClient(base_url=model.base_url, model="m", retry=FAST, timeout_s=10)
    probe = LockProbe(client, dsn, "m")
    spec = EmbedSpec(
        provider=probe,
        model="m",
        chunker_key=CHUNKS.key,
        connect=connect,
        budget=RequestBudget(model.base_url, 64),
        inputs_per_call=4,
        max_in_flight=1,
        max_call_s=0.6,
    )
    try:
        result = run_batch(spec, doc_ids, connect=connect, ctx=ctx, limits=Limits())
    finally:
        client.close()
        probe.conn.close()
    assert sorted(result.done) == doc_ids
    stats = model.stats()
    assert stats["charged"] >= 4 and stats["by_status"].get("429", 0) >= 2
    # The session of a request that waited was ended by its idle limit; the budget's slot,
    # taken on that session before the send, failed, and the request began again.
    assert sessions_ended(conn) > ended
    assert probe.unlocked == []
