"""B17: a run over a whole source that lost and changed files, against an unchanged re-run.

A source of ``files`` files is discovered once and every document marked done; then each
repeat times ``plan`` (discover, with the listing's comparison, and the batches) of an
unchanged re-run, and of a run after ``changes`` files were deleted and ``changes`` others
rewritten with new bytes: that one also hashes the changed files, retracts the deleted and
superseded documents (their outbox events too) and plans the new ones. The files are small
(discover stats and hashes, it does not parse), each with bytes of its own.

The figure is the ratio of the two (target: at most 2). That the retraction's cost follows
the changes, not the index, is a count: the rows the run wrote to the source's listing, per
rewritten file (target: 1; a deleted path's row is removed), with the retracted, superseded
and planned documents checked.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import BenchError, Row, Samples, Target, services

from replayable import db, mirror, pipeline, sources
from replayable.settings import PipelineSettings
from replayable.stages.chunk.chunker import chunk_config_of
from replayable.stages.lineage import spec_hashes

FILES = 100_000
CHANGES = 1_000
REPEATS = 3
DAG_ID = "document_pipeline"
SETTINGS = PipelineSettings()
HASHES = spec_hashes(chunk_config_of(SETTINGS), "bench-model", None)
RATIO_TARGET = Target("≤ 2", at_most=2.0)
WRITES_TARGET = Target("= 1 row per rewritten file", equals=1.0)

_MARK_DONE = """
INSERT INTO replayable.stage_runs
    (stage, item_key, doc_id, status, attempts, code_version, config_hash, spec_hash,
     is_current, dag_id, run_id)
SELECT st.stage, st.stage || '-' || r.doc_id, r.doc_id, 'done', 1, '1.0', 'c', st.spec,
       true, r.dag_id, r.run_id
FROM replayable.run_docs r
CROSS JOIN unnest(%(stages)s::text[], %(specs)s::text[]) AS st (stage, spec)
WHERE r.dag_id = %(dag_id)s AND r.run_id = %(run_id)s AND r.batch IS NOT NULL
ON CONFLICT DO NOTHING
"""


def _content(i: int, version: int) -> bytes:
    return f"%PDF-1.4\n% bench document {i}, version {version}\n%%EOF\n".encode()


def _plan(conn: db.Connection, folder: Path, run_id: str) -> tuple[float, int]:
    """``plan``'s database work for a whole-source run: (seconds, documents with work)."""
    started = time.perf_counter()
    pipeline.discover(
        conn,
        str(folder),
        dag_id=DAG_ID,
        run_id=run_id,
        roots=sources.allowed_roots(),
        max_bytes=SETTINGS.max_bytes,
        policy=mirror.Policy(),
    )
    batches = pipeline.plan_batches(
        conn, SETTINGS, dag_id=DAG_ID, run_id=run_id, spec_hashes=HASHES
    )
    return time.perf_counter() - started, sum(batch["size"] for batch in batches)


def _mark_done(conn: db.Connection, run_id: str) -> None:
    """The run's documents with work, done in every default stage (the pipeline's effect)."""
    stages = ["extract", "chunk", "embed"]
    params = {
        "dag_id": DAG_ID,
        "run_id": run_id,
        "stages": stages,
        "specs": [HASHES[s] for s in stages],
    }
    with conn.cursor() as cur:
        cur.execute(_MARK_DONE, params)
        cur.execute("ANALYZE replayable.stage_runs")
    conn.commit()


def _one(conn: db.Connection, sql: str, *params: Any) -> Any:
    with conn.cursor() as cur:
        cur.execute(sql, params)
        (value,) = cur.fetchone()
    conn.commit()
    return value


def run(
    files: int = FILES, changes: int = CHANGES, repeats: int = REPEATS
) -> tuple[list[Row], dict[str, Any]]:
    """Time ``repeats`` unchanged re-runs and ``repeats`` runs after ``changes`` deletions and
    ``changes`` rewrites each, over a source of ``files`` files."""
    if 2 * changes * repeats > files:
        raise BenchError(f"{repeats} repeats of 2 x {changes} changes need more than {files}")
    previous_roots = os.environ.get(sources.ROOTS_ENV)
    with (
        tempfile.TemporaryDirectory(prefix="replayable-b17-") as tmp,
        services() as svc,
        contextlib.closing(db.connect(svc.dsn)) as conn,
    ):
        os.environ[sources.ROOTS_ENV] = tmp
        try:
            return _measure(conn, Path(tmp) / "source", files, changes, repeats)
        finally:
            if previous_roots is None:
                os.environ.pop(sources.ROOTS_ENV, None)
            else:
                os.environ[sources.ROOTS_ENV] = previous_roots


def _measure(
    conn: db.Connection, folder: Path, files: int, changes: int, repeats: int
) -> tuple[list[Row], dict[str, Any]]:
    folder.mkdir()
    started = time.perf_counter()
    for i in range(files):
        (folder / f"doc-{i:07d}.pdf").write_bytes(_content(i, 0))
    db.migrate(conn)
    first_s, to_do = _plan(conn, folder, "first")
    if to_do != files:
        raise BenchError(f"the first run planned {to_do} documents, not {files}")
    _mark_done(conn, "first")
    setup_s = time.perf_counter() - started
    unchanged: list[float] = []
    changed: list[float] = []
    writes: list[float] = []
    for repeat in range(repeats):
        seconds, to_do = _plan(conn, folder, f"same-{repeat}")
        if to_do:
            raise BenchError(f"an unchanged re-run planned {to_do} documents")
        unchanged.append(seconds)
        # Disjoint files each repeat: the first `changes` deleted, the next rewritten.
        base = 2 * changes * repeat
        for i in range(base, base + changes):
            (folder / f"doc-{i:07d}.pdf").unlink()
        for i in range(base + changes, base + 2 * changes):
            (folder / f"doc-{i:07d}.pdf").write_bytes(_content(i, repeat + 1))
        run_id = f"changed-{repeat}"
        since = _one(conn, "SELECT clock_timestamp()")
        seconds, to_do = _plan(conn, folder, run_id)
        counts = mirror.run_counts(conn, dag_id=DAG_ID, run_id=run_id)
        expected = {"retracted": changes, "superseded": changes, "restored": 0, "refused": None}
        if counts != expected or to_do != changes:
            raise BenchError(f"run {run_id}: {counts}, {to_do} planned; expected {expected}")
        written = _one(
            conn, "SELECT count(*) FROM replayable.source_files WHERE listed_at >= %s", since
        )
        writes.append(int(written) / changes)
        changed.append(seconds)
        _mark_done(conn, run_id)
    ratio = statistics.median(changed) / statistics.median(unchanged)
    extra_us = (statistics.median(changed) - statistics.median(unchanged)) / (2 * changes) * 1e6
    rows = [
        Row(
            "B17",
            f"plan + retraction, {files:,} files, {changes:,} deleted and {changes:,} changed",
            "plan of an unchanged re-run",
            Samples(tuple(unchanged)),
            "plan with the retraction",
            Samples(tuple(changed)),
            RATIO_TARGET,
            notes=[
                f"extra per changed file: {extra_us:.0f} µs",
                f"first discover of the source: {first_s:.1f} s",
            ],
        ),
        Row(
            "B17.writes",
            "rows a run with changes writes to the source's listing, per rewritten file",
            "rewritten files",
            Samples((1.0,), unit="rows"),
            "rows written",
            Samples(tuple(writes), unit="rows"),
            WRITES_TARGET,
            target_on="measured",
            notes=["the unchanged paths are compared, never rewritten"],
        ),
    ]
    details = {
        "files": files,
        "changes": changes,
        "repeats": repeats,
        "setup_s": round(setup_s, 1),
        "ratio": round(ratio, 3),
    }
    return rows, details
