"""A synthetic ledger of any size, generated inside Postgres: documents, stage rows, outbox.

``generate(conn, documents)`` fills the replayable schema the way a long-lived deployment
would look: every document extracted and chunked, most embedded, a few of them failed,
dead or in flight, some with history rows under an older spec, and an outbox that holds a
``document.ready`` event per embedded document (most published long ago, some pending or
dead). The shares are fixed fractions (see ``SHARES``) of a deterministic per-document
bucket, so a size always gives the same counts, which ``expected`` returns. Rows are
written with ``INSERT … SELECT generate_series`` in the server, through the real triggers
(the counters stay right), then vacuumed and analysed.

Used by ``outbox_queries.py`` (the sweep's selection and the publisher's claim at a million
documents) and by its reduced-size test; other read paths can time themselves on it too.
"""

from __future__ import annotations

from typing import Any

from replayable.db import Connection

# Each document falls in bucket (i * 7919) % 1000; these bucket ranges decide its state.
SHARES: dict[str, tuple[int, int]] = {
    "chunk_failed": (0, 5),  # failed in chunk (current spec), never embedded
    "embed_failed": (5, 15),  # failed in embed under the current spec: what a sweep takes
    "embed_failed_old_spec": (15, 25),  # failed under a spec no run uses any more
    "embed_dead": (25, 30),
    "embed_running": (30, 35),  # leased by a live worker
    "ready_pending_due": (35, 45),  # embedded; its ready event waits for a publisher
    "ready_pending_later": (45, 50),  # embedded; its event waits for its backoff
    "ready_dead": (50, 55),  # embedded; its event was refused for good
}
HISTORY_EVERY = 5  # one document in five also has an older, non-current embed row
# Pipelines share the ledger: one document in four was run by another pipeline's DAG, whose
# own sweeper takes its failed items (ADR 0109); the rest by document_pipeline.
PIPELINE = "document_pipeline"
OTHER_PIPELINE = "other_pipeline"
OTHER_PIPELINE_EVERY = 4
SPEC = {"extract": "spec-extract", "chunk": "spec-chunk", "embed": "spec-embed"}
OLD_EMBED_SPEC = "spec-embed-old"
MAX_ATTEMPTS = 3

_SQL = """
CREATE TEMP TABLE synthetic ON COMMIT DROP AS
SELECT i, encode(sha256(int8send(i)), 'hex') AS doc_id, (i * 7919) %% 1000 AS bucket,
       now() - make_interval(mins => (i %% 43200)::int) AS changed,
       CASE WHEN i %% %(other_every)s = 0 THEN %(other_pipeline)s ELSE %(pipeline)s END
           AS dag_id
FROM generate_series(1, %(documents)s::bigint) AS i;

INSERT INTO replayable.documents (doc_id, uri, size_bytes, first_seen)
SELECT doc_id, '/synthetic/' || i || '.pdf', 10000 + i %% 90000, changed FROM synthetic;

INSERT INTO replayable.stage_runs
    (stage, item_key, doc_id, status, attempts, code_version, config_hash, spec_hash,
     is_current, started_at, finished_at, updated_at, created_at, dag_id)
SELECT 'extract', 'x-' || doc_id, doc_id, 'done', 1, '1.0', 'c', %(extract)s, true,
       changed, changed, changed, changed, dag_id
FROM synthetic;

INSERT INTO replayable.stage_runs
    (stage, item_key, doc_id, status, attempts, error_class, error_kind, last_error,
     code_version, config_hash, spec_hash, is_current, started_at, finished_at, updated_at,
     created_at, dag_id)
SELECT 'chunk', 'c-' || doc_id, doc_id,
       CASE WHEN bucket < %(chunk_failed_hi)s THEN 'failed' ELSE 'done' END,
       1, CASE WHEN bucket < %(chunk_failed_hi)s THEN 'timeout' END,
       CASE WHEN bucket < %(chunk_failed_hi)s THEN 'retryable' END,
       CASE WHEN bucket < %(chunk_failed_hi)s THEN 'synthetic failure' END,
       '1.0', 'c', %(chunk)s, true, changed, changed, changed, changed, dag_id
FROM synthetic;

INSERT INTO replayable.stage_runs
    (stage, item_key, doc_id, status, attempts, error_class, error_kind, last_error,
     code_version, config_hash, spec_hash, is_current, lease_owner, lease_expires,
     started_at, finished_at, updated_at, created_at, dag_id)
SELECT 'embed', 'e-' || doc_id, doc_id,
       CASE WHEN bucket < %(embed_dead_lo)s THEN 'failed'
            WHEN bucket < %(embed_running_lo)s THEN 'dead'
            WHEN bucket < %(embed_running_hi)s THEN 'running'
            ELSE 'done' END,
       1 + i %% 2,
       CASE WHEN bucket < %(embed_running_lo)s THEN 'http_503' END,
       CASE WHEN bucket < %(embed_running_lo)s THEN 'retryable' END,
       CASE WHEN bucket < %(embed_running_lo)s THEN 'synthetic failure' END,
       '1.0', 'c',
       CASE WHEN bucket >= %(old_spec_lo)s AND bucket < %(old_spec_hi)s THEN %(old_embed)s
            ELSE %(embed)s END,
       true,
       CASE WHEN bucket >= %(embed_running_lo)s AND bucket < %(embed_running_hi)s
            THEN 'worker-' || i %% 7 END,
       CASE WHEN bucket >= %(embed_running_lo)s AND bucket < %(embed_running_hi)s
            THEN now() + interval '10 minutes' END,
       changed, changed, changed, changed, dag_id
FROM synthetic
WHERE bucket >= %(embed_failed_lo)s;

INSERT INTO replayable.stage_runs
    (stage, item_key, doc_id, status, attempts, code_version, config_hash, spec_hash,
     is_current, started_at, finished_at, updated_at, created_at, dag_id)
SELECT 'embed', 'e-old-' || doc_id, doc_id, 'done', 1, '0.9', 'c', %(old_embed)s, false,
       changed - interval '60 days', changed - interval '60 days',
       changed - interval '60 days', changed - interval '60 days', dag_id
FROM synthetic
WHERE i %% %(history_every)s = 0;

INSERT INTO replayable.outbox
    (event_id, event_key, event_type, aggregate_id, payload, status, attempts, error_class,
     last_error, available_at, published_by, created_at, published_at, updated_at)
SELECT replayable.outbox_event_id(k.key), k.key, k.type, s.doc_id,
       jsonb_build_object('doc_id', s.doc_id, 'stage', 'embed'),
       k.status,
       CASE WHEN k.state = 'due' THEN 0 ELSE 1 END,
       CASE WHEN k.status = 'dead' THEN 'http_400' END,
       CASE WHEN k.status = 'dead' THEN 'synthetic refusal' END,
       CASE WHEN k.state = 'later' THEN now() + interval '30 minutes' ELSE s.changed END,
       CASE WHEN k.status = 'published' THEN 'synthetic/' || s.i / 1000 END,
       s.changed,
       CASE WHEN k.status = 'published' THEN s.changed END,
       s.changed
FROM synthetic s
CROSS JOIN LATERAL (
    SELECT t.*, CASE WHEN t.state IN ('due', 'later') THEN 'pending'
                     WHEN t.state = 'dead' THEN 'dead' ELSE 'published' END AS status
    FROM (
        SELECT CASE WHEN s.bucket < %(embed_running_lo)s THEN 'document.failed'
                    ELSE 'document.ready' END AS type,
               CASE WHEN s.bucket < %(embed_running_lo)s
                    THEN 'document.failed:synthetic-' || s.i
                    ELSE 'document.ready:' || s.doc_id || ':' || %(embed)s END AS key,
               CASE WHEN s.bucket >= %(due_lo)s AND s.bucket < %(due_hi)s THEN 'due'
                    WHEN s.bucket >= %(due_hi)s AND s.bucket < %(later_hi)s THEN 'later'
                    WHEN s.bucket >= %(ready_dead_lo)s AND s.bucket < %(ready_dead_hi)s
                    THEN 'dead'
                    ELSE 'published' END AS state
    ) t
) k
WHERE s.bucket >= %(embed_running_hi)s
   OR (s.bucket >= %(embed_dead_lo)s AND s.bucket < %(embed_running_lo)s);
"""


def _params(documents: int) -> dict[str, Any]:
    return {
        "documents": documents,
        "extract": SPEC["extract"],
        "chunk": SPEC["chunk"],
        "embed": SPEC["embed"],
        "old_embed": OLD_EMBED_SPEC,
        "history_every": HISTORY_EVERY,
        "pipeline": PIPELINE,
        "other_pipeline": OTHER_PIPELINE,
        "other_every": OTHER_PIPELINE_EVERY,
        "chunk_failed_hi": SHARES["chunk_failed"][1],
        "embed_failed_lo": SHARES["embed_failed"][0],
        "old_spec_lo": SHARES["embed_failed_old_spec"][0],
        "old_spec_hi": SHARES["embed_failed_old_spec"][1],
        "embed_dead_lo": SHARES["embed_dead"][0],
        "embed_running_lo": SHARES["embed_running"][0],
        "embed_running_hi": SHARES["embed_running"][1],
        "due_lo": SHARES["ready_pending_due"][0],
        "due_hi": SHARES["ready_pending_due"][1],
        "later_hi": SHARES["ready_pending_later"][1],
        "ready_dead_lo": SHARES["ready_dead"][0],
        "ready_dead_hi": SHARES["ready_dead"][1],
    }


def _in_bucket(documents: int, low: int, high: int) -> int:
    return sum(1 for i in range(1, documents + 1) if low <= (i * 7919) % 1000 < high)


def expected(documents: int) -> dict[str, int]:
    """How many documents of a generated ledger fall in each share (computed, not queried)."""
    counts = {name: _in_bucket(documents, low, high) for name, (low, high) in SHARES.items()}
    counts["documents"] = documents
    counts["history"] = documents // HISTORY_EVERY
    return counts


def sweepable(documents: int, min_age_minutes: int) -> dict[str, int]:
    """Documents per stage that document_pipeline's sweep with ``min_age_minutes`` may take
    (no item cap)."""
    ages = {i: i % 43200 for i in range(1, documents + 1)}  # minutes, as generated
    counts = {}
    for stage, share in (("chunk", "chunk_failed"), ("embed", "embed_failed")):
        low, high = SHARES[share]
        counts[stage] = sum(
            1
            for i, age in ages.items()
            if low <= (i * 7919) % 1000 < high
            and age >= min_age_minutes
            and i % OTHER_PIPELINE_EVERY
        )
    return counts


def generate(conn: Connection, documents: int) -> None:
    """Fill an empty replayable schema with a ledger of ``documents`` documents.

    The caller migrates and empties the schema first; this commits, then vacuums and
    analyses the tables it wrote (so plans and index-only scans are those of a settled
    deployment).
    """
    with conn.cursor() as cur:
        cur.execute(_SQL, _params(documents))
    conn.commit()
    autocommit = conn.autocommit
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for table in ("documents", "stage_runs", "stage_counts", "outbox"):
                # Fixed table names from this module, never input.
                cur.execute(f"VACUUM (ANALYZE) replayable.{table}")
    finally:
        conn.autocommit = autocommit
