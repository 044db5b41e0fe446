"""B7, the ledger's read paths at a million documents: every page, command, sensor and scrape.

A synthetic ledger (``bench/sql/synthetic_ledger.sql``: 1,000,000 documents x 3 stages of
current rows, 200,000 superseded rows, 50,000 dead letters, a million model calls) is loaded
into a private Postgres; then each read that a person or a sensor makes runs five times warm
and its median is taken. The figure is the slowest read, against a target of 50 ms; for
scale, the same reads over a ledger a hundred times smaller.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from harness import Row, Samples, Target, ceiling_row, load_sql, services

from replayable import db, pipeline, read, views
from replayable.settings import STAGES, PipelineSettings
from replayable.stages.chunk.chunker import chunk_config_of
from replayable.stages.lineage import spec_hashes

DOCUMENTS = 1_000_000
LETTERS = 50_000
REPEATS = 5
TARGET = Target("< 50 ms", below=0.050)
SYNTHETIC = Path(__file__).with_name("sql") / "synthetic_ledger.sql"

Read = Callable[[db.Connection], Any]


def load(dsn: str, documents: int, letters: int) -> float:
    """Fill an empty ledger with the synthetic one; return the seconds it took."""
    params = {"documents": documents, "letters": letters, "calls": documents}
    return load_sql(dsn, SYNTHETIC, params)


def reads() -> dict[str, Read]:
    """Every read a person (UI, CLI) or a sensor makes, by name."""
    from replayable.web import metrics
    from replayable.web import reads as web

    def failed_page_two(conn: db.Connection) -> Any:
        first = web.failed_items(conn, None, None, 100)
        return web.failed_items(conn, None, None, 100, first.next_after)

    def letters_page_two(conn: db.Connection) -> Any:
        first = web.dead_letters(conn, None, "open", 100)
        return web.dead_letters(conn, None, "open", 100, first.next_after)

    def growth(stage: str | None) -> Read:
        params = {"window_minutes": 60, "stage": stage}
        return lambda conn: db.fetch_all(conn, "views/dead_letter_growth", params)

    def rerun(**selection: Any) -> Read:
        params = pipeline.rerun_params({"stage": "extract", **selection})
        return lambda conn: db.fetch_all(conn, "plan/count_rerun_docs", params)

    def redrive_scope(conn: db.Connection) -> Any:
        params = {
            "ids": None,
            "stage": "embed",
            "error_classes": ["http_400"],
            "since": datetime.now(UTC) - timedelta(days=7),
            "until": None,
        }
        return db.fetch_all(conn, "plan/redrive_scope", params)

    last_day = datetime.now(UTC) - timedelta(days=1)
    some_docs = [f"{i:064x}" for i in range(100)]
    return {
        "ui overview (summary)": web.summary,
        "ui failed items, page 1": lambda c: web.failed_items(c, None, None, 100),
        "ui failed items, page 2 (keyset)": failed_page_two,
        "ui failed items, stage + class": lambda c: web.failed_items(c, "embed", ["http_503"], 100),
        "ui dead letters, open": lambda c: web.dead_letters(c, None, "open", 100),
        "ui dead letters, all": lambda c: web.dead_letters(c, None, "all", 100),
        "ui dead letters, stage": lambda c: web.dead_letters(c, "chunk", "open", 100),
        "ui dead letters, page 2 (keyset)": letters_page_two,
        "ui dead letters, class + since": lambda c: web.dead_letters(
            c, None, "open", 100, error_classes=["http_400", "timeout"], since=last_day
        ),
        "ui dead-letter chart (48 hours)": web.letters_per_hour,
        "ui/cli redrive scope, stage + class + since": redrive_scope,
        "cli status --watch (the newest run)": lambda c: views.run_state(c, None),
        "cli status": lambda c: read.status_data(c, None),
        "cli status --run (1,000 docs)": lambda c: read.status_data(c, "run-small"),
        "cli failed": lambda c: read.failed_data(c, None, None, 50),
        "cli dead-letters": lambda c: read.dead_letters_data(c, None, "open", 50),
        "sensor: dead-letter growth": growth(None),
        "sensor: dead-letter growth, one stage": growth("embed"),
        "rerun: failed, by class": rerun(status=["failed"], error_class=["http_503"]),
        "rerun: dead": rerun(status=["dead"]),
        "rerun: code_version_lt": rerun(code_version_lt="1.1"),
        "rerun: doc ids": rerun(doc_ids=some_docs),
        "metrics scrape": lambda c: metrics.render(c),
        "ui/cli model cost, last 30 days": lambda c: views.model_costs(c),
        "ui newest runs with their cost (10 running)": lambda c: views.recent_runs(c),
        "report: a run's cost (1,000 calls)": lambda c: views.model_costs(c, "run-7"),
        "ui filter's stages (the shipped and your own)": views.known_stages,
        "a model stage's letters of one item (its revival key)": lambda c: db.fetch_all(
            c, "stages/item_letters", {"stage": "embed", "item_key": some_docs[0]}
        ),
        "an artifact stage's inputs, 100 docs": lambda c: db.fetch_all(
            c,
            "stages/artifact_inputs",
            {"stage": "chunk", "doc_ids": some_docs, "spec_hash": "s"},
        ),
        "report of a 1,000-doc run": lambda c: db.fetch_all(
            c,
            "report/stage_status",
            {"dag_id": "document_pipeline", "run_id": "run-small", "stages": list(STAGES)},
        ),
    }


def selections() -> dict[str, Read]:
    """Selections a run's ``plan`` makes over the ledger: they write the run's documents,
    so each is timed inside a transaction that is rolled back."""
    redrive = PipelineSettings(
        redrive={"stage": "embed", "error_class": ["http_400"], "reason": "bench"}
    )
    hashes = spec_hashes(chunk_config_of(redrive), "m", None)

    def redrive_select(conn: db.Connection) -> Any:
        return pipeline.select_documents(conn, redrive, dag_id="bench", run_id="redrive")

    def redrive_plan(conn: db.Connection) -> Any:
        pipeline.select_documents(conn, redrive, dag_id="bench", run_id="redrive")
        return pipeline.plan_batches(
            conn, redrive, dag_id="bench", run_id="redrive", spec_hashes=hashes, revived_by="b"
        )

    return {
        "redrive selection (open letters of a class)": redrive_select,
        "redrive plan (selection + batches)": redrive_plan,
    }


def _no_commit(conn: db.Connection) -> Any:
    """``conn`` with commit made a no-op, so a selection's writes stay in one transaction."""
    return type(
        "NoCommit",
        (),
        {"__getattr__": lambda _, name: getattr(conn, name), "commit": lambda _: None},
    )()


def time_reads(dsn: str, repeats: int) -> dict[str, float]:
    """Median seconds of each read, warm (one untimed call first)."""
    return _time_reads(dsn, repeats)


def time_selections(dsn: str, repeats: int) -> dict[str, float]:
    """Median seconds of each of plan's selections, each in a transaction rolled back."""
    medians: dict[str, float] = {}
    conn = db.connect(dsn)
    try:
        for name, select in selections().items():
            samples = []
            for _ in range(repeats + 1):  # the first is the warm-up
                started = time.perf_counter()
                select(_no_commit(conn))
                samples.append(time.perf_counter() - started)
                conn.rollback()
            medians[name] = statistics.median(samples[1:])
    finally:
        conn.close()
    return medians


def _time_reads(dsn: str, repeats: int) -> dict[str, float]:
    conn = db.connect(dsn)
    conn.set_session(readonly=True, autocommit=True)
    medians: dict[str, float] = {}
    try:
        for name, read in reads().items():
            read(conn)
            samples = []
            for _ in range(repeats):
                started = time.perf_counter()
                read(conn)
                samples.append(time.perf_counter() - started)
            medians[name] = statistics.median(samples)
    finally:
        conn.close()
    return medians


def run(
    repeats: int = REPEATS, documents: int = DOCUMENTS, letters: int = LETTERS
) -> tuple[list[Row], dict[str, Any]]:
    small_docs = max(documents // 100, 1000)
    with services() as svc:
        small_load = load(svc.dsn, small_docs, max(letters // 100, 50))
        small = time_reads(svc.dsn, repeats)
    with services() as svc:
        big_load = load(svc.dsn, documents, letters)
        big = time_reads(svc.dsn, repeats)
        plans = time_selections(svc.dsn, repeats)
        with contextlib.closing(db.connect(svc.dsn)) as conn, conn.cursor() as cur:
            cur.execute(
                "SELECT count(DISTINCT doc_id) FROM replayable.dead_letters"
                " WHERE status = 'open' AND stage = 'embed' AND error_class = 'http_400'"
            )
            redriven_docs = int(cur.fetchone()[0])
    slowest = max(big, key=lambda name: big[name])
    rows = [
        ceiling_row(
            "B7",
            f"slowest ledger read at {documents:,} documents ({slowest})",
            "median of 5, warm",
            big[slowest],
            TARGET,
        ),
        Row(
            "B7.scale",
            f"slowest read: {documents:,} vs {small_docs:,} documents",
            f"{small_docs:,} documents",
            Samples((max(small.values()),)),
            f"{documents:,} documents",
            Samples((big[slowest],)),
            notes=["close to 1: the reads' cost does not grow with the ledger"],
        ),
        Row(
            "B7.plan",
            f"a redrive's plan over {redriven_docs:,} letters' documents, at {documents:,}",
            "redrive selection alone",
            Samples((plans["redrive selection (open letters of a class)"],)),
            "selection + batches",
            Samples((plans["redrive plan (selection + batches)"],)),
            notes=["a run's own planning: its cost follows the documents it selects"],
        ),
    ]
    details = {
        "documents": documents,
        "dead_letters": letters,
        "load_seconds": {"small": round(small_load, 1), "large": round(big_load, 1)},
        "reads_ms": {name: round(1000 * s, 2) for name, s in big.items()},
        "reads_ms_small": {name: round(1000 * s, 2) for name, s in small.items()},
        "plan_ms": {name: round(1000 * s, 2) for name, s in plans.items()},
        "redriven_documents": redriven_docs,
        "notes": [
            f"{name}: {1000 * s:.1f} ms" for name, s in sorted(big.items(), key=lambda kv: -kv[1])
        ],
    }
    return rows, details
