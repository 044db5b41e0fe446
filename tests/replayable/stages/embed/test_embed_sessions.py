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
from replayable.retry import CallRetry
from replayable.runner import Limits, run_batch
from replayable.stages.chunk.chunker import ChunkConfig
from replayable.stages.chunk.spec import ChunkSpec
from replayable.stages.embed.client import HttpEmbeddingClient
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
