"""B3, ledger bookkeeping: what claiming and finishing a batch costs on top of the work.

A stage that does no work of its own runs over batches of new items, so that all that is
timed is the ledger. The baseline is the cheapest way to write the same rows at all, a bare
``INSERT … ON CONFLICT DO NOTHING`` of them into ``stage_runs`` (with its indexes and
counters, in one transaction).

- **B3**, a no-work batch: the stage's plan finds every item's outputs stored already (a
  document whose chunks all have vectors, say), so the claim registers them done in its one
  round trip and no finish follows (ADR 0125). Items per second of the bookkeeping against
  the bare insert: target ≥ 0.5; round trips per batch (B3.trips): target ≤ 3.
- **B3.work**, for context: the same items when the stage has to process them: the claim
  registers them leased, the stage marks them done, the finish records it; two writes of
  each row. No target.
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
    """A stage that does no work: only the ledger's own cost is left. With ``ready`` its plan
    says so (the items' outputs are stored already); without, each item goes through
    ``process``, which marks it done."""

    name = "bench"

    def __init__(self, version: str, *, ready: bool) -> None:
        self.code_version = version
        self.ready = ready

    def key_config(self) -> dict[str, Any]:
        return {}

    def lineage(self) -> dict[str, Any]:
        return {}

    def plan(self, conn: db.Connection, doc_ids: Sequence[str]) -> list[WorkItem]:
        return [
            WorkItem(d, sha256_bytes(f"{self.code_version}/{d}".encode()), ready=self.ready)
            for d in doc_ids
        ]

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


def _against_bare(
    fig: str,
    what: str,
    label: str,
    seconds: list[float],
    bare: list[float],
    target: Target | None,
    note: str,
) -> Row:
    """Throughput against the bare insert: (items / ledger time) / (items / bare time)."""
    return Row(
        fig,
        f"ledger bookkeeping {what}",
        label,
        Samples(tuple(seconds)),
        "bare INSERT … ON CONFLICT",
        Samples(tuple(bare)),
        target,
        notes=[note],
    )


def run(repeats: int = REPEATS, batch: int = BATCH) -> tuple[list[Row], dict[str, Any]]:
    """Time batch claims and finishes against a bare insert of the same rows."""
    bare: list[float] = []
    timings: dict[bool, list[float]] = {True: [], False: []}  # by ready
    trips: dict[bool, list[float]] = {True: [], False: []}
    with services() as svc:
        doc_ids = _documents(svc.dsn, batch)
        counter = StatementCounter(svc.dsn)
        for r in range(repeats + 1):  # the first repeat warms caches and is dropped
            _clear(svc.dsn)
            seconds_bare, _ = timed(lambda r=r: _bare_insert(svc.dsn, doc_ids, f"bare-{r}"))
            if r:
                bare.append(seconds_bare)
            for ready in (True, False):
                _clear(svc.dsn)
                counter.reset()
                stage = _NoWork(f"ledger-{r}-{ready}", ready=ready)
                seconds, result = timed(
                    lambda stage=stage, r=r: run_batch(
                        stage,
                        doc_ids,
                        connect=counter.database,
                        ctx=RunContext(owner="bench", run_id=f"bench-{r}"),
                        limits=Limits(lease_s=600),
                    )
                )
                if len(result.done) != batch:
                    raise RuntimeError(f"expected {batch} done, got {len(result.done)}")
                if r:
                    timings[ready].append(seconds)
                    trips[ready].append(counter.statements)
    rows = [
        _against_bare(
            "B3",
            f"of a no-work batch: items/s against a bare insert (batch {batch})",
            "bookkeeping (the claim records them done)",
            timings[True],
            bare,
            THROUGHPUT,
            "ratio = bookkeeping throughput / bare-insert throughput (higher is better)",
        ),
        Row(
            "B3.trips",
            f"ledger bookkeeping of a no-work batch: round trips per batch of {batch}",
            "per batch",
            Samples((1.0,), unit="batch"),
            "statements sent",
            Samples(tuple(trips[True]), unit="round trips"),
            ROUND_TRIPS,
            target_on="measured",
        ),
        _against_bare(
            "B3.work",
            f"of items processed: items/s against a bare insert (batch {batch}, for context)",
            "bookkeeping (claim + finish)",
            timings[False],
            bare,
            None,
            "two writes of each row: the claim leases it, the finish records it done",
        ),
    ]
    details = {
        "batch": batch,
        "round_trips": trips[True],
        "round_trips_work": trips[False],
        "notes": [
            f"a batch of {batch} new items the stage's plan found ready: one claim statement "
            "registers them done (ADR 0125)",
            "the same items processed: claim (register + lease) and finish, each one "
            "statement; lease renewals never ran (the batch is quicker than a lease)",
        ],
    }
    return rows, details
