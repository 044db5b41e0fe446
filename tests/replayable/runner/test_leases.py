"""Leases while items run: kept by the lease keeper, known valid ahead of the clock, and
lost to a second worker that took the items over."""

import multiprocessing
import threading
import time

import pytest

from checks import rows, scalar
from helpers.runner import CHUNKS, ItemPerDocument, connect_to, count, run, seed_documents, wait_for
from replayable import db
from replayable.keys import sha256_bytes
from replayable.ledger import Ledger, RunContext
from replayable.runner import Limits, run_batch
from replayable.stages.chunk.spec import ChunkSpec

pytestmark = pytest.mark.db


class _SlowSpec(ItemPerDocument):
    """A stage whose items take longer than the lease."""

    def __init__(self, seconds: float, on_start=None) -> None:
        self.seconds = seconds
        self.on_start = on_start
        self.finished: list[str] = []
        self.abandoned: list[str] = []
        self.release = threading.Event()  # set: end the item now, as if its work were done

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
    """Past the expiry of the lease its item was claimed with, on Postgres's own clock, the
    item is still its worker's: the lease was renewed while it ran."""
    (doc_id,) = seed_documents(conn, 1)
    key = f"slow-{doc_id}"
    started = threading.Event()
    spec = _SlowSpec(120.0, on_start=started.set)
    outcome: dict[str, object] = {}

    def worker():
        outcome["result"] = run(spec, dsn, [doc_id], lease_s=1.5)

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert started.wait(timeout=30)
        # No earlier than the claim's expiry: a renewal since then only moves it later.
        claimed_until = scalar(
            conn, "SELECT lease_expires FROM replayable.stage_runs WHERE item_key = %s", key
        )
        wait_for(lambda: scalar(conn, "SELECT clock_timestamp() > %s", claimed_until))
        assert not other_ledger(dsn).claim([(key, doc_id)])[key].mine
    finally:
        spec.release.set()
        thread.join(timeout=30)
    assert spec.abandoned == []
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
    keeper renewing, that stays in the future through an item two leases long. The horizon
    runs a third of a lease (0.6 s) ahead of the last renewal that answered: a renewal that
    takes the loaded machine a few hundred milliseconds to answer does not reach it."""
    (doc_id,) = seed_documents(conn, 1)
    lease_s = 1.8
    spec = _HorizonSpec(2 * lease_s)
    assert run(spec, dsn, [doc_id], lease_s=lease_s).done == [doc_id]
    assert all(valid_until > when for when, valid_until in spec.samples)
    # Renewals moved it: it ends later than a lease after the item began.
    assert spec.samples[-1][1] > spec.samples[0][0] + lease_s


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

        # A spawned worker starts its own extraction pool: slow on a loaded machine.
        wait_for(lambda: len(started()) == 2 and done_by_a() == started()[:1], timeout_s=180)
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
