"""SummarizeSpec through run_batch, against a real Postgres and the local model server."""

from __future__ import annotations

import threading
import time

import pytest

from checks import rows, seed_extraction
from replayable import db
from replayable.budget import RequestBudget
from replayable.ledger import RunContext
from replayable.models.chat import HttpChatClient
from replayable.retry import CallRetry
from replayable.runner import Limits, run_batch
from replayable.stages.summarize.config import SummaryConfig
from replayable.stages.summarize.spec import SummarizeSpec

pytestmark = pytest.mark.db

FAST = CallRetry(max_attempts=6, base_s=0.01, cap_s=0.05, max_total_s=30)
TEXT = "The lease runs ten years. Rent rises with inflation. Either side may end it early."


def summarize_spec(model, dsn: str) -> SummarizeSpec:
    def connect() -> db.Database:
        return db.Database(dsn, outage_s=30)

    client = HttpChatClient(base_url=model.base_url, model="chat", max_tokens=20, retry=FAST)
    return SummarizeSpec(
        provider=client,
        config=SummaryConfig(model="chat", prompt="Summarise.", max_tokens=20),
        connect=connect,
        budget=RequestBudget(model.base_url, 4, connect=connect),
    )


class _OnceAPeerWaits:
    """The chat client, each of whose calls first waits (30 s at most) until Postgres shows
    another session waiting for an advisory lock; ``calls`` records, per call, whether one did."""

    def __init__(self, client, dsn: str, calls: list[bool]) -> None:
        self.client, self.dsn, self.calls = client, dsn, calls

    def complete(self, messages, **kwargs):
        probe = db.connect(self.dsn, autocommit=True)
        try:
            give_up = time.monotonic() + 30
            while not (waits := _lock_waiters(probe)) and time.monotonic() < give_up:
                time.sleep(0.02)
        finally:
            probe.close()
        self.calls.append(waits > 0)
        return self.client.complete(messages, **kwargs)


def _lock_waiters(conn) -> int:
    found = rows(
        conn,
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    return int(found[0][0])


def test_two_workers_wanting_the_same_answer_overlap_and_pay_for_it_once(conn, dsn, model):
    """Two documents with one text, each in its own worker at the same time: the second
    waits on the first's artifact lock, then finds the answer stored."""
    docs = ["a" * 64, "b" * 64]
    for doc_id in docs:
        seed_extraction(conn, doc_id, f"/docs/{doc_id[0]}.pdf", TEXT)
    conn.commit()
    start = threading.Barrier(2)
    results = {}
    calls: list[bool] = []

    def work(doc_id: str) -> None:
        spec = summarize_spec(model, dsn)
        spec.provider = _OnceAPeerWaits(spec.provider, dsn, calls)
        start.wait()
        results[doc_id] = run_batch(
            spec,
            [doc_id],
            connect=lambda: db.Database(dsn, outage_s=30),
            ctx=RunContext(owner=f"worker-{doc_id[0]}", run_id="run-1"),
            limits=Limits(),
        )

    threads = [threading.Thread(target=work, args=(doc_id,)) for doc_id in docs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert all(results[d].done == [d] for d in docs), results
    # One call, made while Postgres had the other worker waiting on its lock.
    assert calls == [True]
    assert model.stats()["chat_charged"] == 1
    assert rows(conn, "SELECT count(*) FROM replayable.artifacts") == [(1,)]
    assert rows(
        conn, "SELECT count(DISTINCT artifact_key), count(*) FROM replayable.item_artifacts"
    ) == [(1, 2)]
    # One billable call, recorded against the item that paid for it.
    assert rows(conn, "SELECT stage, status, n_inputs FROM replayable.model_calls") == [
        ("summarize", "ok", 1)
    ]


def test_a_refusal_is_a_dead_letter_not_a_summary(conn, dsn, model):
    seed_extraction(conn, "c" * 64, "/docs/c.pdf", TEXT)
    conn.commit()
    model.set_faults(chat_refusal_containing="lease")
    result = run_batch(
        summarize_spec(model, dsn),
        ["c" * 64],
        connect=lambda: db.Database(dsn, outage_s=30),
        ctx=RunContext(owner="w", run_id="run-2"),
        limits=Limits(),
    )
    assert result.dead == ["c" * 64]
    assert result.errors == {"refused": 1}
    assert rows(conn, "SELECT count(*) FROM replayable.artifacts") == [(0,)]
