"""B22, ``replayable check`` at a million documents: every invariant, on a consistent ledger.

A consistent synthetic ledger (``bench/sql/consistent_ledger.sql``: 1,000,000 documents with
their extractions, two chunks each (one shared), vectors, dead letters, summaries, batch
claims and superseded rows, under the stages' real spec hashes) is loaded into a private
Postgres; then :func:`replayable.invariants.run_check` runs three times warm and its median
is the figure, against the issue's budget of 30 s. It must find no violation (a count, so a
smoke run checks it too), and the items running under an expired lease as in flight. For
scale, the same check over a ledger a hundred times smaller.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from harness import BenchError, Row, Samples, Target, ceiling_row, load_sql, services

from replayable import db, invariants
from replayable.keys import config_hash
from replayable.stages import chunk, embed, extract
from replayable.stages.chunk.chunker import ChunkConfig
from replayable.stages.lineage import chunk_hash, embed_hash, extract_hash

DOCUMENTS = 1_000_000
REPEATS = 3
MODEL = "text-embedding-3-small"
BUDGET = Target("< 30 s", below=30.0)
CLEAN = Target("= 0 violations", equals=0)
CONSISTENT = Path(__file__).with_name("sql") / "consistent_ledger.sql"


def params(documents: int) -> dict[str, Any]:
    """The generator's parameters: the shipped stages' versions and spec hashes."""
    config = ChunkConfig()
    return {
        "documents": documents,
        "extractor": extract.extractor_id(),
        "extract_version": extract.VERSION,
        "extract_config": config_hash({"engine": extract.DEFAULT_ENGINE}),
        "extract_spec": extract_hash(),
        "chunker": config.key,
        "chunk_version": chunk.VERSION,
        "chunk_config": config_hash({"size": config.size, "overlap": config.overlap}),
        "chunk_spec": chunk_hash(config),
        "embed_version": embed.VERSION,
        "embed_config": config_hash({"model": MODEL, "dimensions": None}),
        "embed_spec": embed_hash(MODEL, None, config),
        "old_embed_spec": "spec-embed-old",
        "model": MODEL,
    }


def in_flight(documents: int) -> int:
    """Documents the generator leaves running under an expired lease (buckets 45 and 46)."""
    return sum(1 for i in range(1, documents + 1) if 45 <= (i * 7919) % 1000 < 47)


def load(dsn: str, documents: int) -> float:
    """Fill an empty ledger with the consistent one; return the seconds it took."""
    return load_sql(dsn, CONSISTENT, params(documents))


def time_check(dsn: str, documents: int, repeats: int) -> tuple[float, invariants.CheckResult]:
    """Median seconds of ``run_check`` (after one untimed run), and what it found."""
    conn = db.connect(dsn)
    try:
        result = invariants.run_check(conn, limit=20)
        if not result.clean:
            raise BenchError(f"the consistent ledger breaks invariants: {result.totals}")
        if result.in_flight_total != in_flight(documents):
            raise BenchError(
                f"{result.in_flight_total} items in flight, expected {in_flight(documents)}"
            )
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            result = invariants.run_check(conn, limit=20)
            samples.append(time.perf_counter() - started)
    finally:
        conn.close()
    return statistics.median(samples), result


def run(repeats: int = REPEATS, documents: int = DOCUMENTS) -> tuple[list[Row], dict[str, Any]]:
    small_docs = max(documents // 100, 1000)
    with services() as svc:
        small_load = load(svc.dsn, small_docs)
        small, _ = time_check(svc.dsn, small_docs, repeats)
    with services() as svc:
        big_load = load(svc.dsn, documents)
        big, found = time_check(svc.dsn, documents, repeats)
    violations = sum(found.totals.values())
    rows = [
        ceiling_row(
            "B22",
            f"replayable check at {documents:,} documents",
            f"median of {repeats}, warm",
            big,
            BUDGET,
            baseline_label="budget",
        ),
        Row(
            "B22.clean",
            f"violations found on the consistent {documents:,}-document ledger",
            "none",
            Samples((0.0,), unit="violations"),
            "found",
            Samples((float(violations),), unit="violations"),
            CLEAN,
            target_on="measured",
        ),
        Row(
            "B22.scale",
            f"replayable check: {documents:,} vs {small_docs:,} documents",
            f"{small_docs:,} documents",
            Samples((small,)),
            f"{documents:,} documents",
            Samples((big,)),
            notes=["about the ratio of the sizes: the check reads the whole ledger, once"],
        ),
    ]
    details = {
        "documents": documents,
        "load_seconds": {"small": round(small_load, 1), "large": round(big_load, 1)},
        "check_seconds": {"small": round(small, 2), "large": round(big, 2)},
        "in_flight": found.in_flight_total,
        "totals": found.totals,
    }
    return rows, details
