"""B3, ledger bookkeeping: what claiming and finishing a batch costs on top of the work.

A stage that does no work of its own runs over batches of new items, so that all that is
timed is the ledger: one round trip to register and claim the batch, one to finish it. The
baseline is the cheapest way to write the same rows at all, a bare
``INSERT … ON CONFLICT DO NOTHING`` of them into ``stage_runs`` (with its indexes and
counters, in one transaction). Figures: round trips per batch (target ≤ 3), and items per
second of the bookkeeping against the bare insert (target ≥ 0.5 of it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness import Row, Samples, StatementCounter, Target, services, timed

from replayable import db
from replayable.keys import sha256_bytes
from replayable.ledger import RunContext
from replayable.runner import BatchIO, Limits, StageSpec, WorkItem, run_batch

BATCH = 500
REPEATS = 5
ROUND_TRIPS = Target("≤ 3", at_most=3)
THROUGHPUT = Target("≥ 0.5", at_least=0.5)


class _NoWork(StageSpec):
    """A stage whose items need no work: only the ledger's own cost is left."""

    name = "bench"

    def __init__(self, version: str) -> None:
        self.code_version = version

    def key_config(self) -> dict[str, Any]:
        return {}

    def lineage(self) -> dict[str, Any]:
        return {}

    def plan(self, conn: db.Connection, doc_ids: Sequence[str]) -> list[WorkItem]:
        return [WorkItem(d, sha256_bytes(f"{self.code_version}/{d}".encode())) for d in doc_ids]

    def process(self, items: Sequence[WorkItem], io: BatchIO) -> None:
        for item in items:
            io.done(item)


def _documents(dsn: str, n: int) -> list[str]:
    ids = [sha256_bytes(f"bench-doc-{i}".encode()) for i in range(n)]
    conn = db.connect(dsn)
    try:
        db.execute_values(
            conn, "plan/upsert_documents", [(d, f"/bench/{d[:8]}.pdf", 1) for d in ids]
        )
        conn.commit()
    finally:
        conn.close()
    return ids


def _bare_insert(dsn: str, doc_ids: Sequence[str], version: str) -> None:
    conn = db.connect(dsn)
    try:
        rows = [
            ("bench", sha256_bytes(f"{version}/{d}".encode()), d, version, "x", "x", True)
            for d in doc_ids
        ]
        with conn.cursor() as cur:
            import psycopg2.extras

            psycopg2.extras.execute_values(
                cur,
                "INSERT INTO replayable.stage_runs (stage, item_key, doc_id, code_version,"
                " config_hash, spec_hash, is_current) VALUES %s ON CONFLICT DO NOTHING",
                rows,
                page_size=len(rows),
            )
        conn.commit()
    finally:
        conn.close()


def _clear(dsn: str) -> None:
    conn = db.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("DELETE FROM replayable.stage_runs WHERE stage = 'bench'")
            cur.execute("DELETE FROM replayable.stage_counts WHERE stage = 'bench'")
        conn.commit()
    finally:
        conn.close()


def run(repeats: int = REPEATS, batch: int = BATCH) -> tuple[list[Row], dict[str, Any]]:
    """Time batch claims and finishes against a bare insert of the same rows."""
    bare: list[float] = []
    ledger: list[float] = []
    trips: list[float] = []
    with services() as svc:
        doc_ids = _documents(svc.dsn, batch)
        counter = StatementCounter(svc.dsn)
        for r in range(repeats + 1):  # the first repeat warms caches and is dropped
            _clear(svc.dsn)
            seconds_bare, _ = timed(lambda r=r: _bare_insert(svc.dsn, doc_ids, f"bare-{r}"))
            _clear(svc.dsn)
            counter.reset()
            seconds, result = timed(
                lambda r=r: run_batch(
                    _NoWork(f"ledger-{r}"),
                    doc_ids,
                    connect=counter.database,
                    ctx=RunContext(owner="bench", run_id=f"bench-{r}"),
                    limits=Limits(lease_s=600),
                )
            )
            if len(result.done) != batch:
                raise RuntimeError(f"expected {batch} done, got {len(result.done)}")
            if r:
                bare.append(seconds_bare)
                ledger.append(seconds)
                trips.append(counter.statements)
    # Throughput ratio: (items / ledger time) / (items / bare time) = bare / ledger.
    rows = [
        Row(
            "B3",
            f"ledger bookkeeping: items/s against a bare insert (batch {batch})",
            "bookkeeping (claim + finish)",
            Samples(tuple(ledger)),
            "bare INSERT … ON CONFLICT",
            Samples(tuple(bare)),
            THROUGHPUT,
            notes=["ratio = bookkeeping throughput / bare-insert throughput (higher is better)"],
        ),
        Row(
            "B3.trips",
            f"ledger bookkeeping: round trips per batch of {batch}",
            "per batch",
            Samples((1.0,), unit="batch"),
            "statements sent",
            Samples(tuple(trips), unit="round trips"),
            ROUND_TRIPS,
            target_on="measured",
        ),
    ]
    details = {
        "batch": batch,
        "round_trips": trips,
        "notes": [
            f"a batch of {batch} new items: claim (register + lease) and finish, "
            "each one statement; lease renewals never ran (the batch is quicker than a lease)"
        ],
    }
    return rows, details
