"""The sweep's selection and the publisher's claim on a synthetic ledger of a million documents.

Invariant 10 says reads that pick work go through indexes on current state and stay under
50 ms at a million documents; the two queries of the outbox and the sweeper (ADR 0041,
0042) are such reads. ``synthetic_ledger.generate`` builds the ledger in the server; each
query is then run once to warm up and ``repeats`` times timed (from the client, on one
connection over the local socket), and the median is the figure. The claim runs in a
transaction that is rolled back, so every repeat claims the same rows. A small ledger
(a hundredth of the size) is measured first as the baseline: a ratio near 1 means the
query's cost does not grow with the corpus.

    PYTHONPATH=include:. .venv/bin/python bench/outbox_queries.py                  # 1,000,000
    PYTHONPATH=include:. .venv/bin/python bench/outbox_queries.py --documents 100000
    PYTHONPATH=include:. .venv/bin/python bench/outbox_queries.py --dsn postgresql://…/bench

Without ``--dsn`` it starts a private Postgres (pgserver) under a temporary folder and
stops it at the end. With ``--dsn`` it migrates that database and EMPTIES its replayable
tables: never point it at data you keep. Exit status 1 when a query misses 50 ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import synthetic_ledger  # the folder is put on the path just above

from devtools import devenv
from replayable import db

TARGET_S = 0.050
SWEEP = {
    "dag_id": synthetic_ledger.PIPELINE,
    "stages": list(synthetic_ledger.SPEC),
    "spec_hashes": list(synthetic_ledger.SPEC.values()),
    "min_age_s": 1800.0,
    "max_attempts": synthetic_ledger.MAX_ATTEMPTS,
    "limit": 500,
}
CLAIM = {"owner": "bench", "limit": 50, "lease_s": 300.0, "due_by": None}


@dataclass(frozen=True)
class Timing:
    """One query's timed repeats, the rows it returned and the plan it ran with."""

    query: str
    seconds: tuple[float, ...]
    rows: int
    plan: str

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def _timed(conn: Any, query: str, params: dict[str, Any], *, rollback: bool) -> tuple[float, int]:
    with conn.cursor() as cur:
        started = time.perf_counter()
        cur.execute(db.sql(query), params)
        found = cur.fetchall()
        elapsed = time.perf_counter() - started
    if rollback:
        conn.rollback()
    else:
        conn.commit()
    return elapsed, len(found)


def _plan(conn: Any, query: str, params: dict[str, Any]) -> str:
    with conn.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + db.sql(query), params)
        text = "\n".join(row[0] for row in cur.fetchall())
    conn.rollback()
    return text


def measure(conn: Any, repeats: int = 5) -> list[Timing]:
    """Time the sweep's selection and the publisher's claim: 1 warm-up, then ``repeats``."""
    timings = []
    for query, params, rollback in (
        ("plan/sweep_failed_items", SWEEP, False),
        ("outbox/claim", CLAIM, True),
    ):
        _timed(conn, query, params, rollback=rollback)
        samples = [_timed(conn, query, params, rollback=rollback) for _ in range(repeats)]
        timings.append(
            Timing(
                query,
                tuple(seconds for seconds, _ in samples),
                samples[-1][1],
                _plan(conn, query, params),
            )
        )
    return timings


def prepare(conn: Any, documents: int) -> float:
    """Migrate, empty and fill the schema with ``documents`` documents; return seconds taken."""
    started = time.perf_counter()
    db.migrate(conn)
    devenv.empty_ledger(conn)
    synthetic_ledger.generate(conn, documents)
    return time.perf_counter() - started


@contextmanager
def _database(dsn: str | None) -> Iterator[str]:
    if dsn:
        yield dsn
        return
    import harness

    with harness.services() as services:
        yield services.dsn


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dsn", help="an existing database to EMPTY and fill (default: private)")
    args = parser.parse_args(argv)
    sizes = [max(args.documents // 100, 1000), args.documents]
    results: dict[int, list[Timing]] = {}
    with _database(args.dsn) as dsn:
        conn = db.connect(dsn)
        try:
            for size in sizes:
                took = prepare(conn, size)
                print(f"generated {size:,} documents in {took:.0f} s", flush=True)
                results[size] = measure(conn, args.repeats)
        finally:
            conn.close()
    small, large = (results[size] for size in sizes)
    missed = []
    print(
        f"\n{'query':<20} {'at ' + format(sizes[0], ','):>14} {'at ' + format(sizes[1], ','):>14}"
        f" {'ratio':>6}  {'min-max at full size':>22}  target < 50 ms"
    )
    for base, full in zip(small, large, strict=True):
        ok = full.median < TARGET_S
        missed += [] if ok else [full.query]
        print(
            f"{full.query:<20} {_ms(base.median):>14} {_ms(full.median):>14}"
            f" {full.median / base.median:>6.2f}"
            f"  {_ms(min(full.seconds)) + ' - ' + _ms(max(full.seconds)):>22}"
            f"  {'pass' if ok else 'FAIL'} ({full.rows} rows)"
        )
    for timing in large:
        print(f"\n-- plan of {timing.query} at {sizes[1]:,} documents\n{timing.plan}")
    if missed:
        print(f"bench: target missed: {', '.join(missed)} at {sizes[1]:,}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
