"""The outbox against a real Postgres and the local server's real webhook receiver."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from typing import Any

import pytest

from checks import rows, seed_extraction
from publishers import KILL_AFTER, add_events, kill_a_publisher_after_sending
from replayable import db, outbox
from replayable.airflow.sinks import WebhookSettings, WebhookSink
from replayable.keys import sha256_bytes
from replayable.ledger import Ledger, Outcome, Revival, RunContext
from replayable.models.embeddings import HttpEmbeddingClient
from replayable.outbox import Event, PublishLimits, publish
from replayable.retry import CallRetry, Classified, ErrorKind
from replayable.runner import Limits, run_batch
from replayable.stages.chunk.chunker import ChunkConfig
from replayable.stages.chunk.spec import ChunkSpec
from replayable.stages.embed.spec import EmbedSpec

pytestmark = pytest.mark.db

DOCS = [f"{i:x}" * 64 for i in range(1, 5)]
VERSIONS = {"stage": "embed", "code_version": "1.0", "model": "m"}
HOOK = "outbox-test"
FAST = CallRetry(max_attempts=3, max_total_s=5.0, base_s=0.01, cap_s=0.05)
LIMITS = PublishLimits(claim_size=5, lease_s=30.0, max_attempts=3, backoff_base_s=0.01)


@pytest.fixture
def sink(model):
    with WebhookSink(WebhookSettings(model.webhook_url(HOOK), timeout_s=5.0, retry=FAST)) as hook:
        yield hook


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
    assert payload["uri"] == f"/{payload['doc_id'][:4]}.pdf"
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
        seed_extraction(conn, doc_id, f"/docs/o{i}.pdf", text)
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


# --- publishing ------------------------------------------------------------------------


def test_published_only_after_the_receiver_acknowledged(conn, database, model, sink):
    ids = add_events(conn, 3)
    result = publish(database, sink, owner="p1", publication="pub-1", limits=LIMITS)
    assert (result.claimed, result.published, result.ready) == (3, 3, 3)
    stored = model.webhook_events(HOOK)
    assert [e["key"] for e in stored] == ids  # Idempotency-Key is the event id, in order
    assert stored[0]["body"]["id"] == ids[0]
    assert stored[0]["body"]["data"] == {"n": 1}
    assert rows(conn, "SELECT DISTINCT status, published_by FROM replayable.outbox") == [
        ("published", "pub-1")
    ]
    counts = database.transaction(lambda c: outbox.publication_counts(c, "pub-1"))
    assert counts == {"events": 3, "ready": 3, "retracted": 0}
    page = database.transaction(lambda c: outbox.published_in(c, "pub-1", limit=2))
    assert [r["event_id"] for r in page] == ids[:2]
    after = page[-1]["seq"]
    rest = database.transaction(lambda c: outbox.published_in(c, "pub-1", after_seq=after))
    assert [r["event_id"] for r in rest] == ids[2:]
    again = publish(database, sink, owner="p1", publication="pub-2", limits=LIMITS)
    assert again.claimed == 0


def test_a_503_then_200_ends_published_in_one_attempt(conn, database, model, sink):
    add_events(conn, 1)
    model.set_faults(webhook_statuses=[503, 200])
    result = publish(database, sink, owner="p1", publication="pub", limits=LIMITS)
    assert result.published == 1
    assert rows(conn, "SELECT status, attempts FROM replayable.outbox") == [("published", 1)]
    assert model.stats()["webhooks"] == {
        "received": 2,
        "stored": 1,
        "deduplicated": 0,
        "failed": 1,
    }


def test_a_400_dead_letters_the_event_with_its_error(conn, database, model, sink):
    add_events(conn, 2, "document.failed")
    model.set_faults(webhook_statuses=[400])
    result = publish(database, sink, owner="p1", publication="pub", limits=LIMITS)
    assert (result.dead, result.published) == (1, 1)
    dead = rows(
        conn,
        "SELECT attempts, error_class, last_error FROM replayable.outbox WHERE status = 'dead'",
    )
    assert len(dead) == 1
    attempts, error_class, last_error = dead[0]
    assert (attempts, error_class) == (1, "http_400")
    assert "400" in last_error
    assert len(model.webhook_events(HOOK)) == 1


def test_retryable_failures_end_dead_at_the_attempt_cap(conn, database, model, sink):
    add_events(conn, 1)
    model.set_faults(webhook_status_always=503)
    limits = PublishLimits(claim_size=5, lease_s=30.0, max_attempts=2, backoff_base_s=0.01)
    first = publish(database, sink, owner="p1", publication="pub", limits=limits)
    assert (first.retrying, first.errors) == (1, {"http_503": 1})
    assert rows(conn, "SELECT status, attempts FROM replayable.outbox") == [("pending", 1)]
    # Due again after its backoff (here at most 10 ms).
    time.sleep(0.05)
    second = publish(database, sink, owner="p1", publication="pub", limits=limits)
    assert second.dead == 1
    assert rows(conn, "SELECT status, attempts, error_class FROM replayable.outbox") == [
        ("dead", 2, "http_503")
    ]


def test_a_retry_after_longer_than_a_delivery_delays_the_event_by_it(conn, database, model, sink):
    add_events(conn, 1)
    model.set_faults(webhook_statuses=[429], retry_after=120)
    result = publish(database, sink, owner="p1", publication="pub", limits=LIMITS)
    assert result.retrying == 1
    wait = rows(conn, "SELECT extract(epoch FROM available_at - now()) FROM replayable.outbox")
    assert 100 < wait[0][0] <= 120


def test_a_refused_token_stops_publishing_without_spending_attempts(conn, database, model, sink):
    add_events(conn, 4)
    model.set_faults(webhook_status_always=401)
    result = publish(database, sink, owner="p1", publication="pub", limits=LIMITS)
    assert result.systemic is not None and result.systemic.error_class == "http_401"
    assert result.released == 4
    assert model.stats()["webhooks"]["received"] == 1  # stopped at the first refusal
    assert rows(conn, "SELECT DISTINCT status, attempts FROM replayable.outbox") == [("pending", 0)]


def test_without_a_sink_events_are_published_as_claimed(conn, database):
    add_events(conn, 2)
    result = publish(database, None, owner="p1", publication="assets-only", limits=LIMITS)
    assert (result.published, result.ready) == (2, 2)


def test_a_lease_longer_than_a_delivery_is_required(database, sink):
    with pytest.raises(ValueError, match="lease_s"):
        publish(database, sink, owner="p", publication="p", limits=PublishLimits(lease_s=1.0))


class SlowSink:
    """The real webhook sink, slowed down, recording when each delivery started and ended.

    Its first delivery waits at ``together`` until every publisher's sink is inside its own
    first delivery: the publishers are sending at once by construction, however a loaded
    machine schedules their threads.
    """

    def __init__(
        self,
        sink: WebhookSink,
        name: str,
        log: list[tuple[str, str, float, float]],
        together: threading.Barrier,
    ):
        self.sink, self.name, self.log, self.together = sink, name, log, together
        self.first = True

    @property
    def max_send_s(self) -> float:
        return self.sink.max_send_s

    def deliver(self, event: Event) -> None:
        started = time.monotonic()
        if self.first:
            self.first = False
            self.together.wait()
        time.sleep(0.02)
        self.sink.deliver(event)
        self.log.append((self.name, event.event_id, started, time.monotonic()))


def test_two_publishers_at_once_never_send_the_same_event(conn, dsn, model, sink):
    ids = add_events(conn, 40)
    log: list[tuple[str, str, float, float]] = []
    limits = PublishLimits(claim_size=3, lease_s=30.0)
    together = threading.Barrier(2, timeout=30)

    def publisher(name: str) -> None:
        database = db.Database(dsn)
        try:
            slow = SlowSink(sink, name, log, together)
            publish(database, slow, owner=name, publication=name, limits=limits)
        finally:
            database.close()

    threads = [threading.Thread(target=publisher, args=(n,)) for n in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    sent = [event_id for _, event_id, _, _ in log]
    assert sorted(sent) == sorted(ids)  # every event sent once, by one publisher
    by = {name: [(s, e) for n, _, s, e in log if n == name] for name in ("a", "b")}
    assert by["a"] and by["b"] and not together.broken
    # They overlapped: each was sending while the other was.
    assert min(s for s, _ in by["a"]) < max(e for _, e in by["b"])
    assert min(s for s, _ in by["b"]) < max(e for _, e in by["a"])
    assert model.stats()["webhooks"] == {
        "received": 40,
        "stored": 40,
        "deduplicated": 0,
        "failed": 0,
    }
    assert rows(conn, "SELECT count(*) FROM replayable.outbox WHERE status = 'published'") == [
        (40,)
    ]


def test_a_publisher_killed_between_send_and_mark_is_delivered_once_in_effect(
    conn, database, model, sink
):
    ids = add_events(conn, 8)
    kill_a_publisher_after_sending(database.dsn, model.webhook_url(HOOK), lease_s=2.0)
    assert len(model.webhook_events(HOOK)) == KILL_AFTER
    assert rows(conn, "SELECT count(*) FROM replayable.outbox WHERE status = 'pending'") == [(8,)]
    # Before the lease ends nobody may send them; after it, the next publisher does.
    early = publish(database, sink, owner="p2", publication="p2", limits=LIMITS)
    assert early.published == 8 - KILL_AFTER
    # Wait out the dead publisher's lease on what it left pending, by the database's clock.
    ((left,),) = rows(
        conn,
        "SELECT extract(epoch FROM max(lease_expires) - now()) FROM replayable.outbox"
        " WHERE status = 'pending'",
    )
    time.sleep(max(0.0, float(left)) + 0.05)
    late = publish(database, sink, owner="p2", publication="p2", limits=LIMITS)
    assert late.published == KILL_AFTER
    assert [e["key"] for e in model.webhook_events(HOOK)] == ids
    assert model.stats()["webhooks"] == {
        "received": 8 + KILL_AFTER,
        "stored": 8,
        "deduplicated": KILL_AFTER,
        "failed": 0,
    }


def test_the_envelope_is_the_same_on_every_delivery(conn, database):
    add_events(conn, 1)
    first = database.transaction(lambda c: outbox.claim(c, owner="a", limit=1, lease_s=0.01))
    time.sleep(0.05)
    second = database.transaction(lambda c: outbox.claim(c, owner="b", limit=1, lease_s=60))
    assert second.events[0].attempts == 2
    assert json.dumps(first.events[0].envelope()) == json.dumps(second.events[0].envelope())


def test_settling_after_a_takeover_changes_nothing(conn, database):
    add_events(conn, 1)
    database.transaction(lambda c: outbox.claim(c, owner="old", limit=1, lease_s=0.01))
    time.sleep(0.05)
    database.transaction(lambda c: outbox.claim(c, owner="new", limit=1, lease_s=60))
    event_id = rows(conn, "SELECT event_id FROM replayable.outbox")[0][0]
    late: Any = outbox._Settle(event_id, "published")
    settled = database.transaction(
        lambda c: outbox._settle(c, [late], owner="old", publication="old", max_attempts=3)
    )
    assert settled == {}
    assert rows(conn, "SELECT status, lease_owner FROM replayable.outbox") == [("pending", "new")]


# --- a receiver that is down or gone (ADR 0070) ------------------------------------------


def free_loopback_url(path: str) -> str:
    """A loopback URL where nothing listens: connecting to it is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/{path}"


def test_failures_in_a_row_stop_publishing_and_spend_no_attempt(conn, database, model, sink):
    add_events(conn, 12)
    model.set_faults(webhook_status_always=503)
    result = publish(database, sink, owner="p1", publication="pub", limits=LIMITS)
    assert rows(conn, "SELECT DISTINCT status, attempts FROM replayable.outbox") == [("pending", 0)]
    # systemic_after deliveries, each with its own tries, then nothing more was sent.
    assert model.stats()["webhooks"]["received"] == 5 * FAST.max_attempts
    assert result.systemic is not None and result.systemic.error_class == "receiver_unavailable"
    assert (result.released, result.retrying, result.dead) == (LIMITS.claim_size, 0, 0)
    assert rows(
        conn, "SELECT DISTINCT error_class FROM replayable.outbox WHERE error_class IS NOT NULL"
    ) == [("http_503",)]


def test_a_success_between_failures_starts_the_count_again(conn, database, model, sink):
    add_events(conn, 6)
    fail = [503] * FAST.max_attempts  # one delivery's tries
    # fail, fail, ok, fail, fail, ok: never systemic_after (3) in a row.
    model.set_faults(webhook_statuses=[*fail, *fail, 200, *fail, *fail, 200])
    limits = PublishLimits(claim_size=6, lease_s=30.0, max_attempts=3, systemic_after=3)
    result = publish(database, sink, owner="p1", publication="pub", limits=limits)
    assert result.systemic is None
    assert (result.published, result.retrying) == (2, 4)


def test_twenty_rounds_of_outage_dead_letter_no_event_and_the_backlog_drains_after(
    conn, database, model, sink
):
    add_events(conn, 12)
    # Backoff 0: every failed event is due again at the next round, as after a long outage.
    limits = PublishLimits(claim_size=5, lease_s=30.0, max_attempts=3, backoff_base_s=0.0)
    model.set_faults(webhook_status_always=503)
    for _ in range(20):
        publish(database, sink, owner="p1", publication="down", limits=limits)
    assert rows(conn, "SELECT status, count(*) FROM replayable.outbox GROUP BY 1") == [
        ("pending", 12)
    ]
    model.clear_faults()
    after = publish(database, sink, owner="p1", publication="up", limits=limits)
    assert (after.published, after.dead) == (12, 0)
    assert rows(conn, "SELECT status, count(*) FROM replayable.outbox GROUP BY 1") == [
        ("published", 12)
    ]


@pytest.mark.parametrize("status", [404, 410])
def test_a_missing_endpoint_stops_publishing_without_spending_attempts(
    conn, database, model, sink, status
):
    add_events(conn, 4)
    model.set_faults(webhook_status_always=status)
    result = publish(database, sink, owner="p1", publication="pub", limits=LIMITS)
    assert result.systemic is not None and result.systemic.error_class == f"http_{status}"
    assert (result.dead, result.released) == (0, 4)
    assert model.stats()["webhooks"]["received"] == 1
    assert rows(conn, "SELECT DISTINCT status, attempts FROM replayable.outbox") == [("pending", 0)]


def test_a_refused_connection_stops_publishing_without_spending_attempts(conn, database):
    add_events(conn, 3)
    once = CallRetry(max_attempts=1)
    url = free_loopback_url(SECRET_PATH)
    with WebhookSink(WebhookSettings(url, timeout_s=5.0, retry=once)) as down:
        result = publish(database, down, owner="p1", publication="pub", limits=LIMITS)
    assert result.systemic is not None and result.systemic.error_class == "connect_error"
    assert (result.dead, result.released) == (0, 3)
    assert rows(conn, "SELECT DISTINCT status, attempts FROM replayable.outbox") == [("pending", 0)]
    assert SECRET_PATH not in result.systemic.message


class ClockedSink:
    """The real webhook sink on a clock that each delivery moves on by ``step_s``."""

    def __init__(self, sink: WebhookSink, step_s: float) -> None:
        self.sink, self.step_s, self.now, self.sent = sink, step_s, 0.0, 0

    @property
    def max_send_s(self) -> float:
        return 5.0

    def clock(self) -> float:
        return self.now

    def deliver(self, event: Event) -> None:
        self.sink.deliver(event)
        self.sent += 1
        self.now += self.step_s


def test_publish_starts_no_delivery_that_could_end_past_its_time_budget(
    conn, database, model, sink
):
    add_events(conn, 10)
    clocked = ClockedSink(sink, step_s=10.0)
    limits = PublishLimits(claim_size=5, lease_s=300.0, max_s=35.0)
    result = publish(
        database, clocked, owner="p1", publication="pub", limits=limits, clock=clocked.clock
    )
    # Deliveries start at 0, 10 and 20 s; one at 30 s could end at 35 s, the budget's end:
    # the rest of the group is handed back, and no other group is claimed.
    assert clocked.sent == 3 == result.published
    assert result.out_of_time
    assert (result.claimed, result.released) == (5, 2)
    assert rows(
        conn, "SELECT status, attempts, count(*) FROM replayable.outbox GROUP BY 1, 2 ORDER BY 1"
    ) == [("pending", 0, 7), ("published", 1, 3)]


# --- the webhook's URL stays out of errors and logs (ADR 0070) -------------------------


SECRET_PATH = "hook-secret-7f3a9c"  # noqa: S105 - a stand-in path for the test


@pytest.mark.parametrize("status", [400, 503])
def test_a_failed_delivery_names_the_webhook_by_scheme_and_host_only(
    conn, database, model, caplog, status
):
    add_events(conn, 1)
    model.set_faults(webhook_status_always=status)
    url = model.webhook_url(SECRET_PATH)
    with WebhookSink(WebhookSettings(url, timeout_s=5.0, retry=FAST)) as hook:
        caplog.set_level(logging.DEBUG)
        publish(database, hook, owner="p1", publication="pub", limits=LIMITS)
    (last_error,) = rows(conn, "SELECT last_error FROM replayable.outbox")[0]
    assert str(status) in last_error
    assert "http://127.0.0.1:" in last_error
    assert SECRET_PATH not in last_error
    assert SECRET_PATH not in caplog.text
