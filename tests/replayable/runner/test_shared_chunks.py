"""Chunks shared by documents and workers: each paid once, a peer's held chunk waited for
without new connections, a frozen holder's locks given up."""

import multiprocessing
import threading
import time

import pytest

from checks import rows
from devtools.model_server import LocalModelServer
from helpers.runner import (
    BOILERPLATE,
    CHUNKS,
    chunk_digests,
    connect_to,
    count,
    embed_spec,
    paid_once,
    run,
    seed_documents,
    sent_per_chunk,
    wait_for,
)
from replayable import db
from replayable.stages.chunk.spec import ChunkSpec

pytestmark = pytest.mark.db


def _embed_in_process(dsn, base_url, doc_ids, owner, queue):
    started = time.time()
    result = run(embed_spec(base_url, dsn, per_call=4), dsn, doc_ids, owner=owner, wait_poll_s=0.1)
    queue.put((owner, sorted(result.done), result.processed, started, time.time()))


def chunk_locks(conn) -> dict[int, int]:
    """Chunk locks granted now, by backend (a chunk's lock has one bigint key: objsubid 1;
    a budget slot's has two int keys)."""
    found = rows(
        conn,
        "SELECT pid, count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1"
        " AND granted GROUP BY pid",
    )
    return {pid: int(n) for pid, n in found}


def test_a_worker_waits_for_the_shared_chunks_a_peer_holds_and_never_sends_them(conn, dsn, model):
    """Documents with common boilerplate, embedded by two workers, each with its own provider.
    While the first holds the shared chunks' locks in a request, the second sends only the
    chunks no one else holds and waits; once the first has stored the shared ones, the second
    finishes without ever sending them."""
    ours = seed_documents(conn, 3, shared=BOILERPLATE, tag="a")
    theirs = seed_documents(conn, 3, shared=BOILERPLATE, tag="b")
    run(ChunkSpec(config=CHUNKS, connect=connect_to(dsn)), dsn, ours + theirs)
    holders, wanted = chunk_digests(conn, ours), chunk_digests(conn, theirs)
    shared = holders & wanted
    assert shared and wanted - shared
    # The holder sends all its chunks in one request and stops inside it, locks held.
    holder = embed_spec(model.base_url, dsn, per_call=100)
    holder.provider = _FrozenProvider(holder.provider)
    outcome: dict[str, object] = {}
    holding = threading.Thread(
        target=lambda: outcome.update(holder=run(holder, dsn, ours, owner="holder"))
    )
    holding.start()
    with LocalModelServer(dim=32) as own:
        waiter = embed_spec(own.base_url, dsn, per_call=4)
        waiter.wait_for_peer_s = 120
        waiter.peer_poll_s = 0.05
        waiting = threading.Thread(
            target=lambda: outcome.update(waiter=run(waiter, dsn, theirs, owner="waiter"))
        )
        try:
            assert holder.provider.entered.wait(timeout=30)
            ((locker, locked),) = chunk_locks(conn).items()
            assert locked == len(holders)
            waiting.start()

            def sent_its_own_and_holds_nothing() -> bool:
                charged = set(own.stats()["input_success_counts"])
                return charged == wanted - shared and chunk_locks(conn) == {locker: locked}

            wait_for(sent_its_own_and_holds_nothing)
            # Everything else is stored; the waiter cannot end before the shared chunks are.
            assert waiting.is_alive()
            assert count(conn, "SELECT count(*) FROM replayable.embeddings") == len(wanted - shared)
        finally:
            holder.provider.release.set()
            holding.join(timeout=60)
            if waiting.ident is not None:
                waiting.join(timeout=60)
        assert sorted(outcome["waiter"].done) == theirs
        waiters_requests = sent_per_chunk(own)
    assert sorted(outcome["holder"].done) == ours
    assert waiters_requests == dict.fromkeys(wanted - shared, 1)  # none for a shared chunk
    assert sent_per_chunk(model) == dict.fromkeys(holders, 1)
    assert count(conn, "SELECT count(*) FROM replayable.embeddings") == len(holders | wanted)


def test_two_workers_on_one_batch_pay_for_each_chunk_once(conn, dsn, model, chunked):
    model.set_faults(latency_ms=100)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    workers = [
        ctx.Process(target=_embed_in_process, args=(dsn, model.base_url, chunked, f"w{i}", queue))
        for i in range(2)
    ]
    for w in workers:
        w.start()
    results = [queue.get(timeout=120) for _ in workers]
    for w in workers:
        w.join(timeout=30)
    assert all(done == chunked for _, done, _, _, _ in results)
    assert sum(processed for _, _, processed, _, _ in results) == len(chunked)
    paid_once(model, conn)
    assert all(n == 1 for n in model.stats()["idempotency_keys"].values())


def _backends(dsn) -> int:
    with db.connect(dsn, autocommit=True) as probe, probe.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'replayable'"
            " AND datname = current_database() AND pid <> pg_backend_pid()"
        )
        n = int(cur.fetchone()[0])
    probe.close()
    return n


def test_waiting_round_after_round_for_a_peers_chunk_opens_no_new_connections(conn, dsn, model):
    """A batch that waits for a chunk a peer holds keeps one connection per request thread,
    however many rounds it waits (it used to open new ones every round, until Postgres ran
    out of connections for everyone)."""
    docs = seed_documents(conn, 2, shared=BOILERPLATE, tag="w")
    run(ChunkSpec(config=CHUNKS, connect=connect_to(dsn)), dsn, docs)
    (shared, *_) = [
        chunk_id
        for (chunk_id,) in rows(
            conn,
            "SELECT chunk_id FROM replayable.doc_chunks GROUP BY chunk_id"
            " HAVING count(DISTINCT doc_id) > 1",
        )
    ]
    peer = db.connect(dsn)  # a peer in the middle of a request that holds the shared chunk
    with peer.cursor() as cur:
        cur.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s || '/' || %s || '/0', 0))",
            (shared, "m"),
        )
    before = _backends(dsn)
    peak = [before]
    waiting = threading.Event()

    def watch():
        while not waiting.wait(0.05):
            peak[0] = max(peak[0], _backends(dsn))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        spec = embed_spec(model.base_url, dsn, in_flight=4)
        spec.wait_for_peer_s = 2
        spec.peer_poll_s = 0.02
        result = run(spec, dsn, docs)
    finally:
        waiting.set()
        watcher.join(timeout=10)
        peer.rollback()
        peer.close()
    assert result.errors == {"chunk_busy": 2}
    # The runner's three (work, control, lease keeper), the batch's own, one per thread.
    assert peak[0] - before <= 3 + 1 + spec.max_in_flight


class _FrozenProvider:
    """Forwards to a real client, but the first call stops until released: a frozen worker."""

    def __init__(self, client) -> None:
        self.client = client
        self.entered = threading.Event()
        self.release = threading.Event()

    def embed(self, texts, **kwargs):
        if not self.entered.is_set():
            self.entered.set()
            self.release.wait(timeout=120)
        return self.client.embed(texts, **kwargs)


def test_a_frozen_worker_holds_shared_chunks_no_longer_than_its_longest_call(conn, dsn, model):
    """A worker frozen mid-request (SIGSTOP, a host gone without closing its socket) loses
    its chunk locks once its transaction has sat idle past ``max_call_s``: a peer that needs
    the same chunks embeds them instead of waiting for it, then failing ``chunk_busy``."""
    frozen_docs = seed_documents(conn, 2, shared=BOILERPLATE, tag="f")
    peer_docs = seed_documents(conn, 2, shared=BOILERPLATE, tag="p")
    run(ChunkSpec(config=CHUNKS, connect=connect_to(dsn)), dsn, frozen_docs + peer_docs)
    frozen = embed_spec(model.base_url, dsn, per_call=100)
    frozen.provider = _FrozenProvider(frozen.provider)
    frozen.max_call_s = 1.0
    outcome = {}
    worker = threading.Thread(
        target=lambda: outcome.update(result=run(frozen, dsn, frozen_docs, owner="frozen"))
    )
    worker.start()
    try:
        assert frozen.provider.entered.wait(timeout=30)
        peer = embed_spec(model.base_url, dsn)
        # Generous for a loaded machine: a peer that gave up waiting would end chunk_busy.
        peer.wait_for_peer_s = 30
        result = run(peer, dsn, peer_docs, owner="peer")
        assert sorted(result.done) == peer_docs, result.errors
        assert not frozen.provider.release.is_set()  # the peer did not wait for the thaw
    finally:
        frozen.provider.release.set()
        worker.join(timeout=60)
    # Thawed, the frozen worker stores what it was paid for on a new connection.
    assert sorted(outcome["result"].done) == frozen_docs
    missing = count(
        conn,
        "SELECT count(*) FROM replayable.chunks c WHERE NOT EXISTS"
        " (SELECT 1 FROM replayable.embeddings e WHERE e.chunk_id = c.chunk_id)",
    )
    assert missing == 0
