-- Current state you can read without scanning history (ADR 0009).
--
-- stage_runs keeps one row per item key: every code version and config a document went
-- through. The row of the keys a run last planned is the document's *current* row in that
-- stage (is_current); pages, the CLI, the report, sensors and re-run selection read only
-- current rows, through partial indexes, and counts come from stage_counts, which triggers
-- keep in the same transaction as every transition. Runs keep their documents and batches
-- in run_docs, so XComs carry (run, batch number) instead of id lists.

ALTER TABLE replayable.stage_runs ADD COLUMN IF NOT EXISTS is_current boolean NOT NULL DEFAULT false;
-- Hash of the stage's code version and output-shaping config and those of the stages it
-- reads (its lineage): done under the current spec_hash means done under the current key.
ALTER TABLE replayable.stage_runs ADD COLUMN IF NOT EXISTS spec_hash text;

-- Move existing data forward: the newest row of each (stage, document) is current.
UPDATE replayable.stage_runs s SET is_current = true
FROM (
    SELECT DISTINCT ON (stage, doc_id) stage, item_key
    FROM replayable.stage_runs
    ORDER BY stage, doc_id, updated_at DESC, item_key
) newest
WHERE s.stage = newest.stage AND s.item_key = newest.item_key AND NOT s.is_current;

-- History-wide indexes are replaced by partial ones on current rows: every transition
-- writes each index, so only what the read paths use is kept.
DROP INDEX IF EXISTS replayable.stage_runs_status_idx;
DROP INDEX IF EXISTS replayable.stage_runs_version_idx;
DROP INDEX IF EXISTS replayable.stage_runs_run_idx;
CREATE UNIQUE INDEX IF NOT EXISTS stage_runs_current_uq
    ON replayable.stage_runs (stage, doc_id) WHERE is_current;
CREATE INDEX IF NOT EXISTS stage_runs_current_status_idx
    ON replayable.stage_runs (stage, status, error_class) WHERE is_current;
CREATE INDEX IF NOT EXISTS stage_runs_current_version_idx
    ON replayable.stage_runs (stage, code_version) WHERE is_current;
CREATE INDEX IF NOT EXISTS stage_runs_current_failed_idx
    ON replayable.stage_runs (updated_at, stage, doc_id) WHERE is_current AND status = 'failed';

-- Items per stage, status, error class and code version among current rows. Each backend
-- adds to its own slot, so concurrent workers rarely wait on one counter row.
CREATE TABLE IF NOT EXISTS replayable.stage_counts (
    stage           text NOT NULL,
    status          text NOT NULL,
    error_class     text NOT NULL,          -- '' for none
    code_version    text NOT NULL,
    slot            int NOT NULL,
    n               bigint NOT NULL,
    PRIMARY KEY (stage, status, error_class, code_version, slot)
);

CREATE OR REPLACE FUNCTION replayable.count_inserted_runs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO replayable.stage_counts AS c (stage, status, error_class, code_version, slot, n)
    SELECT stage, status, coalesce(error_class, ''), code_version, pg_backend_pid() % 16, count(*)
    FROM new_rows WHERE is_current
    GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
    ON CONFLICT (stage, status, error_class, code_version, slot) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION replayable.count_updated_runs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO replayable.stage_counts AS c (stage, status, error_class, code_version, slot, n)
    SELECT stage, status, error_class, code_version, pg_backend_pid() % 16, sum(d)
    FROM (
        SELECT stage, status, coalesce(error_class, '') AS error_class, code_version, 1 AS d
        FROM new_rows WHERE is_current
        UNION ALL
        SELECT stage, status, coalesce(error_class, ''), code_version, -1
        FROM old_rows WHERE is_current
    ) delta
    GROUP BY 1, 2, 3, 4 HAVING sum(d) <> 0 ORDER BY 1, 2, 3, 4
    ON CONFLICT (stage, status, error_class, code_version, slot) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END
$$;

-- Rebuild the counters from the current rows (the migration uses it; so can a repair).
CREATE OR REPLACE FUNCTION replayable.recount_stages() RETURNS void
LANGUAGE sql AS $$
    DELETE FROM replayable.stage_counts;
    INSERT INTO replayable.stage_counts (stage, status, error_class, code_version, slot, n)
    SELECT stage, status, coalesce(error_class, ''), code_version, 0, count(*)
    FROM replayable.stage_runs WHERE is_current
    GROUP BY 1, 2, 3, 4;
$$;

-- The transition tables let one statement-level trigger count a whole batch at once.
DROP TRIGGER IF EXISTS stage_runs_count_insert ON replayable.stage_runs;
CREATE TRIGGER stage_runs_count_insert AFTER INSERT ON replayable.stage_runs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION replayable.count_inserted_runs();
DROP TRIGGER IF EXISTS stage_runs_count_update ON replayable.stage_runs;
CREATE TRIGGER stage_runs_count_update AFTER UPDATE ON replayable.stage_runs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION replayable.count_updated_runs();
SELECT replayable.recount_stages();

-- Model calls: one row per HTTP request; a request packed with chunks of several documents
-- names each in model_call_items with its share of inputs and tokens.
ALTER TABLE replayable.model_calls ALTER COLUMN item_key DROP NOT NULL;
CREATE TABLE IF NOT EXISTS replayable.model_call_items (
    call_id     bigint NOT NULL REFERENCES replayable.model_calls (id) ON DELETE CASCADE,
    item_key    text NOT NULL,
    n_inputs    int NOT NULL,
    tokens      int NOT NULL DEFAULT 0,
    PRIMARY KEY (call_id, item_key)
);
CREATE INDEX IF NOT EXISTS model_call_items_item_idx ON replayable.model_call_items (item_key);

-- Calls, inputs, tokens and latency per stage, outcome and latency bucket, kept by a trigger
-- so that status pages and metrics never count model_calls.
CREATE TABLE IF NOT EXISTS replayable.model_call_counts (
    stage           text NOT NULL,
    status          text NOT NULL,
    le_ms           int NOT NULL,           -- latency bucket's upper bound; -1 is +Inf
    slot            int NOT NULL,
    calls           bigint NOT NULL,
    inputs          bigint NOT NULL,
    tokens          bigint NOT NULL,
    latency_ms      bigint NOT NULL,
    PRIMARY KEY (stage, status, le_ms, slot)
);

CREATE OR REPLACE FUNCTION replayable.latency_bucket(ms int) RETURNS int
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT coalesce(
        (SELECT b FROM unnest('{5,10,25,50,100,250,500,1000,2500,5000,10000,30000}'::int[]) b
         WHERE ms <= b ORDER BY b LIMIT 1),
        -1)
$$;

CREATE OR REPLACE FUNCTION replayable.count_model_calls() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO replayable.model_call_counts AS c
        (stage, status, le_ms, slot, calls, inputs, tokens, latency_ms)
    SELECT stage, status, replayable.latency_bucket(latency_ms), pg_backend_pid() % 16,
           count(*), sum(n_inputs), sum(tokens), sum(latency_ms)
    FROM new_rows GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT (stage, status, le_ms, slot) DO UPDATE
    SET calls = c.calls + EXCLUDED.calls, inputs = c.inputs + EXCLUDED.inputs,
        tokens = c.tokens + EXCLUDED.tokens, latency_ms = c.latency_ms + EXCLUDED.latency_ms;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS model_calls_count ON replayable.model_calls;
CREATE TRIGGER model_calls_count AFTER INSERT ON replayable.model_calls
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION replayable.count_model_calls();
DELETE FROM replayable.model_call_counts;
INSERT INTO replayable.model_call_counts (stage, status, le_ms, slot, calls, inputs, tokens, latency_ms)
SELECT stage, status, replayable.latency_bucket(latency_ms), 0,
       count(*), sum(n_inputs), sum(tokens), sum(latency_ms)
FROM replayable.model_calls GROUP BY 1, 2, 3;

-- Dead letters: keyset paging newest first, by status and optionally stage; lookups by
-- document for the current work list.
DROP INDEX IF EXISTS replayable.dead_letters_created_idx;
CREATE INDEX IF NOT EXISTS dead_letters_created_idx
    ON replayable.dead_letters (created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS dead_letters_status_idx
    ON replayable.dead_letters (status, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS dead_letters_open_stage_idx
    ON replayable.dead_letters (stage, error_class) WHERE status = 'open';
CREATE INDEX IF NOT EXISTS dead_letters_doc_idx ON replayable.dead_letters (doc_id, stage);
CREATE INDEX IF NOT EXISTS dead_letters_run_idx ON replayable.dead_letters (run_id);

-- Runs and their documents: discover fills run_docs, plan numbers the batches of the
-- documents with work left (batch NULL: nothing to do in this run).
CREATE TABLE IF NOT EXISTS replayable.runs (
    dag_id      text NOT NULL,
    run_id      text NOT NULL,
    source      text,
    selection   jsonb,
    documents   int NOT NULL DEFAULT 0,
    to_do       int,                    -- documents with work left when the run was planned
    batches     int,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (dag_id, run_id)
);
CREATE INDEX IF NOT EXISTS runs_created_idx ON replayable.runs (created_at);
CREATE TABLE IF NOT EXISTS replayable.run_docs (
    dag_id      text NOT NULL,
    run_id      text NOT NULL,
    doc_id      text NOT NULL REFERENCES replayable.documents (doc_id),
    batch       int,
    PRIMARY KEY (dag_id, run_id, doc_id),
    FOREIGN KEY (dag_id, run_id) REFERENCES replayable.runs (dag_id, run_id) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS run_docs_batch_idx
    ON replayable.run_docs (dag_id, run_id, batch, doc_id) WHERE batch IS NOT NULL;

-- Discover's stat cache: a file whose (size, mtime, inode, device) is unchanged is not read.
CREATE TABLE IF NOT EXISTS replayable.file_cache (
    path        text PRIMARY KEY,
    size_bytes  bigint NOT NULL,
    mtime_ns    bigint NOT NULL,
    inode       bigint NOT NULL,
    device      bigint NOT NULL,
    doc_id      text NOT NULL,
    hashed_at   timestamptz NOT NULL DEFAULT now()
);

-- A document too large to read when discovered is named after its path and stat, not its
-- bytes (stat_id); once it fits max_bytes it is hashed and re-identified (see discover).
ALTER TABLE replayable.documents ADD COLUMN IF NOT EXISTS stat_id boolean NOT NULL DEFAULT false;

-- What extraction had to change so that Postgres accepts the text (NUL characters).
ALTER TABLE replayable.extractions ADD COLUMN IF NOT EXISTS removed_chars int NOT NULL DEFAULT 0;
