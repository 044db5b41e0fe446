"""run_batch against a real Postgres and the real local model server."""

import multiprocessing
import threading
import time

import pytest

from checks import arrivals_ahead, seed_extraction
from devtools.model_server import LocalModelServer
from replayable import db
from replayable.budget import RequestBudget
from replayable.keys import sha256_bytes
from replayable.ledger import Ledger, RunContext
from replayable.models.embeddings import HttpEmbeddingClient
from replayable.retry import CallRetry
from replayable.runner import Limits, StageSpec, WorkItem, run_batch
from replayable.stages.chunk.chunker import ChunkConfig
from replayable.stages.chunk.spec import ChunkSpec
from replayable.stages.embed.spec import EmbedSpec

pytestmark = pytest.mark.db

CHUNKS = ChunkConfig(size=200, overlap=20)
FAST = CallRetry(max_attempts=8, base_s=0.01, cap_s=0.05, max_total_s=30)
BOILERPLATE = " ".join(f"Standard terms clause {j} applies to every shipment." for j in range(12))


def seed_documents(conn, n: int, *, shared: str = "", tag: str = "doc") -> list[str]:
    """Documents with extracted text, as the extract stage would leave them."""
    ids = []
    for i in range(n):
        body = " ".join(f"{tag}{i} sentence {j} about topic {j % 7}." for j in range(60))
        text = f"{body} {shared}".strip()
        doc_id = sha256_bytes(text.encode())
        seed_extraction(conn, doc_id, f"/docs/{tag}{i}.pdf", text)
        ids.append(doc_id)
    conn.commit()
    return sorted(ids)


def rows(conn, sql: str, *params) -> list[tuple]:
    with conn.cursor() as cur:
        cur.execute(sql, params)
        found = cur.fetchall()
    conn.commit()
    return list(found)


def count(conn, sql: str, *params) -> int:
    with conn.cursor() as cur:
        cur.execute(sql, params)
        value = cur.fetchone()[0]
    conn.commit()
    return int(value or 0)


def wait_for(condition, timeout_s: float = 20.0, every_s: float = 0.05):
    """Poll ``condition`` until it returns something true; return that, or fail at the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(every_s)
    pytest.fail(f"gave up waiting for {condition.__name__}")


def connect_to(dsn):
    return lambda: db.Database(dsn, outage_s=30)


def embed_spec(
    base_url: str, dsn: str, *, in_flight: int = 4, per_call: int = 8, rps: float | None = None
) -> EmbedSpec:
    client = HttpEmbeddingClient(base_url=base_url, model="m", retry=FAST, timeout_s=10)
    return EmbedSpec(
        provider=client,
        model="m",
        chunker_key=CHUNKS.key,
        connect=connect_to(dsn),
        budget=RequestBudget(base_url, in_flight, max_rps=rps, connect=connect_to(dsn)),
        inputs_per_call=per_call,
        max_in_flight=in_flight,
        peer_poll_s=0.05,
    )


def run(spec, dsn, doc_ids, owner="w1", **limits):
    return run_batch(
        spec,
        doc_ids,
        connect=connect_to(dsn),
        ctx=RunContext(owner=owner, run_id="run-1"),
        limits=Limits(**limits),
    )


@pytest.fixture
def chunked(conn, dsn):
    doc_ids = seed_documents(conn, 6)
    result = run(ChunkSpec(config=CHUNKS, connect=connect_to(dsn)), dsn, doc_ids)
    assert sorted(result.done) == doc_ids
    return doc_ids


def paid_once(model, conn) -> None:
    """At the provider, every distinct chunk text was charged exactly once."""
    stats = model.stats()
    assert set(stats["input_success_counts"].values()) == {1}
    assert stats["inputs_embedded"] == count(conn, "SELECT count(*) FROM replayable.chunks")


def test_a_second_run_makes_no_calls_and_writes_no_rows(conn, dsn, model, chunked):
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


def test_the_provider_never_sees_more_requests_in_flight_than_the_budget(conn, dsn, model):
    """Three workers with four threads each share one budget of two requests in flight."""
    doc_ids = seed_documents(conn, 12)
    run(ChunkSpec(config=CHUNKS, connect=connect_to(dsn)), dsn, doc_ids)
    model.set_faults(latency_ms=40, max_concurrency=2)
    results = []

    def worker(part, n):
        spec = embed_spec(model.base_url, dsn, in_flight=2, per_call=2)
        results.append(run(spec, dsn, part, owner=f"w{n}"))

    parts = [doc_ids[0::3], doc_ids[1::3], doc_ids[2::3]]
    threads = [threading.Thread(target=worker, args=(p, n)) for n, p in enumerate(parts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    stats = model.stats()
    assert stats["rejected_concurrency"] == 0
    assert stats["peak_in_flight"] == 2
    assert sum(len(r.done) for r in results) == len(doc_ids)
    paid_once(model, conn)


def test_a_task_keeps_to_its_own_max_in_flight_under_a_larger_shared_budget(conn, dsn, model):
    """A run that asked for fewer requests in flight than the connection's budget keeps to
    its own number (ADR 0086), whatever slots the shared budget has free."""
    doc_ids = seed_documents(conn, 8)
    run(ChunkSpec(config=CHUNKS, connect=connect_to(dsn)), dsn, doc_ids)
    model.set_faults(latency_ms=60)
    spec = embed_spec(model.base_url, dsn, in_flight=2, per_call=1)
    spec.budget = RequestBudget(model.base_url, 8, connect=connect_to(dsn))
    result = run(spec, dsn, doc_ids)
    assert sorted(result.done) == doc_ids
    stats = model.stats()
    assert stats["requests"] > 10
    assert stats["peak_in_flight"] == 2
    paid_once(model, conn)


def test_the_provider_never_sees_more_requests_a_second_than_max_rps(conn, dsn, model):
    """Three workers with four threads each share one budget of 20 requests a second: by any
    moment, the provider has received no more than 20 a second since the first was reserved."""
    doc_ids = seed_documents(conn, 12)
    run(ChunkSpec(config=CHUNKS, connect=connect_to(dsn)), dsn, doc_ids)
    model.set_faults(latency_ms=5)
    rate, results, asked = 20.0, [], []

    def worker(part, n):
        spec = embed_spec(model.base_url, dsn, in_flight=4, per_call=2, rps=rate)
        reserve = spec.budget.reserve

        def noted(tokens: int = 0) -> float:
            asked.append(time.monotonic())
            return reserve(tokens)

        spec.budget.reserve = noted
        try:
            results.append(run(spec, dsn, part, owner=f"w{n}"))
        finally:
            spec.budget.close()

    parts = [doc_ids[0::3], doc_ids[1::3], doc_ids[2::3]]
    threads = [threading.Thread(target=worker, args=(p, n)) for n, p in enumerate(parts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    # The provider's own clock says when each request arrived. Windows between two arrivals
    # would also count requests a loaded machine held back past their send times and then
    # let go together; counted from the first reservation, a late request is never a burst.
    arrivals = model.arrivals()
    ahead = arrivals_ahead(arrivals, rate, since=min(asked))
    span = max(arrivals) - min(asked)
    print(
        f"\n{len(arrivals)} requests in {span:.2f} s from the first reservation; {ahead:.2f} ahead"
    )
    assert len(arrivals) >= 40  # enough for the rate to bind
    # The first request may go at once; a twentieth of a request for the two clocks (Postgres
    # spaces the send times on its own, the provider stamps arrivals on the monotonic one).
    assert ahead <= 1.05
    assert sum(len(r.done) for r in results) == len(doc_ids)
    paid_once(model, conn)


def _embed_in_process(dsn, base_url, doc_ids, owner, queue):
    started = time.time()
    result = run(embed_spec(base_url, dsn, per_call=4), dsn, doc_ids, owner=owner, wait_poll_s=0.1)
    queue.put((owner, sorted(result.done), result.processed, started, time.time()))


def chunk_digests(conn, doc_ids) -> set[str]:
    """sha256 of the text of every chunk of ``doc_ids``: how the provider counts its inputs."""
    found = rows(
        conn,
        "SELECT DISTINCT c.text FROM replayable.doc_chunks d"
        " JOIN replayable.chunks c USING (chunk_id) WHERE d.doc_id = ANY(%s)",
        list(doc_ids),
    )
    return {sha256_bytes(text.encode()) for (text,) in found}


def sent_per_chunk(server) -> dict[str, int]:
    """Requests that carried each chunk, as the provider counted them.

    The provider counts inputs by text only when it charges them, so these are all the
    requests only when every request was charged: nothing failed, nothing was replayed.
    """
    stats = server.stats()
    assert stats["requests"] == stats["succeeded"] == stats["charged"], stats
    return dict(stats["input_success_counts"])


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


class _SlowSpec(StageSpec):
    """A stage whose items take longer than the lease."""

    name = "slow"
    code_version = "1"

    def __init__(self, seconds: float, on_start=None) -> None:
        self.seconds = seconds
        self.on_start = on_start
        self.finished: list[str] = []
        self.abandoned: list[str] = []
        self.release = threading.Event()  # set: end the item now, as if its work were done

    def key_config(self):
        return {}

    def lineage(self):
        return {}

    def plan(self, conn, doc_ids):
        return [WorkItem(doc_id, f"slow-{doc_id}") for doc_id in doc_ids]

    def process(self, items, io):
        if self.on_start:
            self.on_start()
        for item in items:
            deadline = time.monotonic() + self.seconds
            while time.monotonic() < deadline and not self.release.is_set():
                if not io.holds(item):
                    self.abandoned.append(item.doc_id)
                    break
                time.sleep(0.05)
            io.done(item)


def other_ledger(dsn):
    return Ledger(db.Database(dsn), "slow", "1", "x", "x", RunContext(owner="other"))


def test_a_long_item_keeps_its_lease_while_it_runs(conn, dsn):
    (doc_id,) = seed_documents(conn, 1)
    outcome: dict[str, object] = {}

    def worker():
        outcome["result"] = run(_SlowSpec(2.5), dsn, [doc_id], lease_s=0.9)

    thread = threading.Thread(target=worker)
    thread.start()
    time.sleep(1.8)  # two lease lengths: only a renewed lease is still live now
    assert not other_ledger(dsn).claim([(f"slow-{doc_id}", doc_id)])[f"slow-{doc_id}"].mine
    thread.join(timeout=30)
    assert outcome["result"].done == [doc_id]


class _HorizonSpec(_SlowSpec):
    """A slow stage that samples, while its item runs, until when its lease is known valid."""

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.samples: list[tuple[float, float]] = []  # (when, valid until), monotonic

    def process(self, items, io):
        for item in items:
            deadline = time.monotonic() + self.seconds
            while time.monotonic() < deadline:
                self.samples.append((time.monotonic(), io.lease_valid_until()))
                time.sleep(0.05)
            io.done(item)


def test_the_lease_horizon_stays_ahead_of_the_clock_as_renewals_answer(conn, dsn):
    """Work handed on ahead starts only before ``lease_valid_until`` (ADR 0126): with the
    keeper renewing, that stays in the future through an item three leases long."""
    (doc_id,) = seed_documents(conn, 1)
    spec = _HorizonSpec(2.7)
    assert run(spec, dsn, [doc_id], lease_s=0.9).done == [doc_id]
    assert all(valid_until > when for when, valid_until in spec.samples)
    # Renewals moved it: it ends later than a lease after the item began.
    assert spec.samples[-1][1] > spec.samples[0][0] + 0.9


RENEWAL = db.sql("ledger/renew_leases").splitlines()[0]  # how a renewal shows in pg_stat_activity


def keeper_sessions(conn) -> set[int]:
    """The backends whose last statement was a lease renewal: the lease keeper's sessions."""
    found = rows(
        conn,
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid() AND starts_with(query, %s)",
        RENEWAL,
    )
    return {pid for (pid,) in found}


def renewed_since(conn, item_key: str, since, lease_s: float) -> bool:
    """Whether the item's lease was last renewed (expiry = renewal + lease) after ``since``."""
    return rows(
        conn,
        "SELECT lease_expires - make_interval(secs => %s) > %s FROM replayable.stage_runs"
        " WHERE item_key = %s",
        lease_s,
        since,
        item_key,
    )[0][0]


def test_the_lease_keeper_survives_a_dropped_connection(conn, dsn):
    """The server ends the lease keeper's session mid-item: the keeper renews on a new session,
    and the lease is never lost."""
    (doc_id,) = seed_documents(conn, 1)
    key = f"slow-{doc_id}"
    spec = _SlowSpec(120.0)
    outcome: dict[str, object] = {}

    def worker():
        outcome["result"] = run(spec, dsn, [doc_id], lease_s=lease_s)

    lease_s = 1.2
    thread = threading.Thread(target=worker)
    thread.start()
    try:
        (old,) = wait_for(lambda: keeper_sessions(conn))
        assert rows(conn, "SELECT pg_terminate_backend(%s, 5000)", old) == [(True,)]
        assert old not in {pid for (pid,) in rows(conn, "SELECT pid FROM pg_stat_activity")}
        (dropped_at,) = rows(conn, "SELECT clock_timestamp()")[0]

        def renewed_on_a_new_session():
            sessions = keeper_sessions(conn)
            return (
                sessions and old not in sessions and renewed_since(conn, key, dropped_at, lease_s)
            )

        wait_for(renewed_on_a_new_session)
        # Renewed past the drop, the lease is still the keeper's: nobody else may claim it.
        assert not other_ledger(dsn).claim([(key, doc_id)])[key].mine
    finally:
        spec.release.set()
        thread.join(timeout=30)
    assert spec.abandoned == []
    assert outcome["result"].done == [doc_id]


def _stage(name: str, dsn: str, pool):
    """The real extract or chunk stage; chunk reads each document's text on its own."""
    from replayable.stages.extract.spec import ExtractSpec

    if name == "extract":
        return ExtractSpec(pool=pool, max_bytes=2**20)
    return ChunkSpec(config=CHUNKS, connect=connect_to(dsn), group_bytes=1)


def _stall_after_one_item(name: str, dsn: str, doc_ids, lease_s: float, folder: str) -> None:
    """Worker A, in its own process: run the real stage, stopping before its second item.

    Each time the stage calls its expensive step (a guarded extraction, or chunking) the
    document is appended to ``calls``; the first call for a second document waits until the
    file ``go`` exists. The lease keeper's warnings go to ``log``; the batch's result to
    ``result``.
    """
    import json
    import logging
    from pathlib import Path

    from replayable import guards
    from replayable.stages.chunk import chunker

    out = Path(folder)
    logging.basicConfig(filename=out / "log", level=logging.WARNING)

    # The spied step names its document by what it is given: the path of a call to extract
    # (four documents make calls of one, ADR 0126), a text to chunk. A call to extract can
    # come back unstarted and go again for the same document: when the pool's first worker
    # takes longer to start than the one-second lease is known valid, on a loaded machine.
    reader = db.connect(dsn)
    query = (
        "SELECT uri, doc_id FROM replayable.documents WHERE doc_id = ANY(%s)"
        if name == "extract"
        else "SELECT text, doc_id FROM replayable.extractions WHERE doc_id = ANY(%s)"
    )
    docs = dict(rows(reader, query, list(doc_ids)))
    reader.close()
    seen: list[str] = []

    def gated(step):
        def spy(*args, **kwargs):
            doc_id = docs[args[1][0][0] if name == "extract" else args[0]]
            seen.append(doc_id)
            with open(out / "calls", "a") as calls:
                print(doc_id, file=calls)
            if len(set(seen)) == 2:
                while not (out / "go").exists():
                    time.sleep(0.02)
            return step(*args, **kwargs)

        return spy

    with guards.GuardedPool(timeout_s=60, memory_mb=None, workers=1) as pool:
        spec = _stage(name, dsn, pool)
        if name == "extract":
            pool.run_each = gated(pool.run_each)
        else:
            chunker.chunk_text = gated(chunker.chunk_text)
        result = run_batch(
            spec,
            doc_ids,
            connect=connect_to(dsn),
            ctx=RunContext(owner="A", run_id="run-A"),
            limits=Limits(lease_s=lease_s, flush_items=1, wait_poll_s=0.1),
        )
    (out / "result").write_text(json.dumps(result.summary()))


def seed_pdfs(conn, folder, n: int) -> list[str]:
    """PDF files registered as documents, as discover leaves them."""
    import corpus

    ids = []
    for i in range(n):
        path = corpus.write_pdf(folder / f"doc{i}.pdf", [f"Document {i} says {i * 7} things."])
        doc_id = sha256_bytes(path.read_bytes())
        db.execute_values(conn, "plan/upsert_documents", [(doc_id, str(path), path.stat().st_size)])
        ids.append(doc_id)
    conn.commit()
    return sorted(ids)


@pytest.mark.parametrize("stage", ["extract", "chunk"])
def test_a_stage_stops_working_on_items_a_second_worker_took_over(conn, dsn, tmp_path, stage):
    """Worker A stalls (SIGSTOP) mid-batch past its lease; worker B takes the items over and
    finishes them. Resumed, A learns it lost them, finishes only the item it was already in,
    starts none of the others, and its outcomes change none of B's rows."""
    import os
    import signal

    from replayable import guards

    if stage == "extract":
        doc_ids = seed_pdfs(conn, tmp_path / "pdfs", 4)
    else:
        doc_ids = seed_documents(conn, 4)
    folder = tmp_path / "worker-a"
    folder.mkdir()
    ctx = multiprocessing.get_context("spawn")
    worker = ctx.Process(target=_stall_after_one_item, args=(stage, dsn, doc_ids, 1.0, str(folder)))
    worker.start()
    try:

        def calls() -> list[str]:
            path = folder / "calls"
            return path.read_text().split() if path.exists() else []

        def started() -> list[str]:
            """The documents A has handed its expensive step, in the order of their first call."""
            return list(dict.fromkeys(calls()))

        def done_by_a() -> list[str]:
            return [
                doc
                for (doc,) in rows(
                    conn,
                    "SELECT doc_id FROM replayable.stage_runs WHERE stage = %s AND status = 'done'",
                    stage,
                )
            ]

        wait_for(lambda: len(started()) == 2 and done_by_a() == started()[:1])
        first, current = started()
        before_stall = calls()  # A waits inside its call for ``current`` until ``go``
        os.kill(worker.pid, signal.SIGSTOP)  # a stall: the lease keeper stops too

        def leases_expired() -> bool:
            return not count(
                conn,
                "SELECT count(*) FROM replayable.stage_runs WHERE stage = %s"
                " AND status = 'running' AND lease_expires > now()",
                stage,
            )

        wait_for(leases_expired)
        with guards.GuardedPool(timeout_s=60, memory_mb=None, workers=1) as pool:
            taken = run_batch(
                _stage(stage, dsn, pool),
                doc_ids,
                connect=connect_to(dsn),
                ctx=RunContext(owner="B", run_id="run-B"),
            )
        assert sorted(taken.done) == doc_ids and taken.processed == 3
        b_rows = rows(
            conn,
            "SELECT doc_id, status, attempts, run_id, error_class, updated_at"
            " FROM replayable.stage_runs WHERE stage = %s ORDER BY doc_id",
            stage,
        )
        os.kill(worker.pid, signal.SIGCONT)

        lost = [
            key
            for (key,) in rows(
                conn,
                "SELECT item_key FROM replayable.stage_runs WHERE stage = %s AND doc_id <> %s",
                stage,
                first,
            )
        ]

        def a_knows_it_lost_them() -> bool:
            log = (folder / "log").read_text() if (folder / "log").exists() else ""
            return all(f"lost the lease on {key}" in log for key in lost)

        wait_for(a_knows_it_lost_them)
        (folder / "go").touch()
        worker.join(timeout=60)
        assert worker.exitcode == 0
    finally:
        if worker.is_alive():
            os.kill(worker.pid, signal.SIGCONT)
            worker.kill()
            worker.join(timeout=10)
    # A finished the item it was inside, and made no call after the stall: none for the items
    # it had lost, none again for the one it was inside.
    assert started() == [first, current]
    assert calls() == before_stall
    # Its outcomes changed nothing: every row is B's as B left it.
    assert (
        rows(
            conn,
            "SELECT doc_id, status, attempts, run_id, error_class, updated_at"
            " FROM replayable.stage_runs WHERE stage = %s ORDER BY doc_id",
            stage,
        )
        == b_rows
    )
    assert [(doc, run_id) for doc, _, _, run_id, _, _ in b_rows] == [
        (doc, "run-A" if doc == first else "run-B") for doc in doc_ids
    ]


def test_each_request_carries_a_key_naming_exactly_its_chunks(conn, dsn, model, chunked):
    """Two different requests never share a key; the same chunks always make the same key."""
    run(embed_spec(model.base_url, dsn, per_call=5), dsn, chunked)
    stats = model.stats()
    assert len(stats["idempotency_keys"]) == stats["requests"]
    assert set(stats["idempotency_keys"].values()) == {1}
    keys = [row[0] for row in _rows(conn, "SELECT idempotency_key FROM replayable.model_calls")]
    assert sorted(keys) == sorted(stats["idempotency_keys"])


def _rows(conn, sql):
    with conn.cursor() as cur:
        cur.execute(sql)
        found = cur.fetchall()
    conn.commit()
    return found


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
    time.sleep(0.6)
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


TPM = 240_000  # 4,000 tokens a second
TPM_WINDOW_S = 0.5  # the provider's bucket: 2,000 tokens, half a second of the limit


def _embed_under_tpm(model, dsn, parts, *, max_tpm):
    """Embed each part on its own worker (a thread with its own budget and sessions), all
    starting together."""
    results, spans = [], []
    together = threading.Barrier(len(parts), timeout=30)

    def worker(part, n):
        spec = embed_spec(model.base_url, dsn, in_flight=4, per_call=4)
        spec.budget = RequestBudget(
            model.base_url, 4, max_tpm=max_tpm, connect=connect_to(dsn), tokens_tolerance_s=0.2
        )
        together.wait()
        started = time.monotonic()
        try:
            results.append(run(spec, dsn, part, owner=f"w{n}"))
        finally:
            spans.append((started, time.monotonic()))
            spec.budget.close()

    threads = [threading.Thread(target=worker, args=(p, n)) for n, p in enumerate(parts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results, spans


def test_two_workers_share_the_tokens_per_minute_and_cause_no_429(conn, dsn, model):
    """Two workers spend one max_tpm against a provider that enforces it over half a second.

    With the budget, the provider refuses nothing and charges each chunk once; without it,
    the same work goes past the provider's limit (so the limit binds this workload).
    """
    doc_ids = seed_documents(conn, 12)
    unbudgeted = seed_documents(conn, 8, tag="control")
    run(ChunkSpec(config=CHUNKS, connect=connect_to(dsn)), dsn, doc_ids + unbudgeted)
    model.set_faults(max_tpm=TPM, tpm_window_s=TPM_WINDOW_S)
    results, spans = _embed_under_tpm(model, dsn, [doc_ids[0::2], doc_ids[1::2]], max_tpm=TPM)
    stats = model.stats()
    assert sorted(d for r in results for d in r.done) == doc_ids
    # They overlapped: started together, neither ended before the other began.
    assert max(start for start, _ in spans) < min(end for _, end in spans)
    assert stats["rejected_tpm"] == 0, stats
    # More than the provider's bucket was spent, so the rate, not the burst, carried it.
    assert stats["tokens_charged"] > 2 * TPM / 60 * TPM_WINDOW_S
    assert set(stats["input_success_counts"].values()) == {1}  # each chunk charged once
    assert set(stats["input_success_counts"]) == chunk_digests(conn, doc_ids)

    model.set_faults(max_tpm=TPM, tpm_window_s=TPM_WINDOW_S)
    model.reset_stats()
    _embed_under_tpm(model, dsn, [unbudgeted[0::2], unbudgeted[1::2]], max_tpm=None)
    assert model.stats()["rejected_tpm"] > 0


class _BudgetWhoseCorrectionFails(RequestBudget):
    def refund(self, reserved: int, used: int) -> None:
        raise RuntimeError("the budget's connection is gone")


def test_an_answer_paid_for_is_stored_when_the_token_correction_fails(conn, dsn, model):
    """Correcting the token budget comes after the answer is kept: a failure there costs
    the budget its correction, never a second charge or the document's outcome."""
    doc_ids = seed_documents(conn, 1)
    run(ChunkSpec(config=CHUNKS, connect=connect_to(dsn)), dsn, doc_ids)
    spec = embed_spec(model.base_url, dsn, per_call=100)
    spec.budget = _BudgetWhoseCorrectionFails(
        model.base_url, 4, max_tpm=6_000_000, connect=connect_to(dsn)
    )
    try:
        result = run(spec, dsn, doc_ids)
    finally:
        spec.budget.close()
    assert result.done == doc_ids
    assert model.stats()["requests"] == 1
    paid_once(model, conn)
