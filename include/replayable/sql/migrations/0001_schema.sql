-- Replayable's schema. Every statement is idempotent so that applying it twice is a no-op.
CREATE EXTENSION IF NOT EXISTS vector;
CREATE SCHEMA IF NOT EXISTS replayable;

-- Semantic version key: '1.10' sorts after '1.9'. Non-numeric parts count as 0.
CREATE OR REPLACE FUNCTION replayable.version_key(v text) RETURNS int[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(CASE WHEN p ~ '^[0-9]+$' THEN p::int ELSE 0 END ORDER BY n), '{}')
    FROM unnest(string_to_array(v, '.')) WITH ORDINALITY AS t(p, n)
$$;

CREATE TABLE IF NOT EXISTS replayable.documents (
    doc_id      text PRIMARY KEY,          -- sha256 of the bytes
    uri         text NOT NULL,
    size_bytes  bigint NOT NULL,
    first_seen  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS replayable.stage_runs (
    stage           text NOT NULL,
    item_key        text NOT NULL,
    doc_id          text NOT NULL REFERENCES replayable.documents (doc_id),
    status          text NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'running', 'done', 'failed', 'dead')),
    attempts        int NOT NULL DEFAULT 0,
    error_class     text,
    error_kind      text,
    last_error      text,
    code_version    text NOT NULL,
    config_hash     text NOT NULL,
    lease_owner     text,
    lease_expires   timestamptz,
    dag_id          text,
    run_id          text,
    map_index       int,
    try_number      int,
    created_at      timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    finished_at     timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stage, item_key)
);
CREATE INDEX IF NOT EXISTS stage_runs_status_idx
    ON replayable.stage_runs (stage, status, error_class);
CREATE INDEX IF NOT EXISTS stage_runs_doc_idx ON replayable.stage_runs (doc_id, stage);
CREATE INDEX IF NOT EXISTS stage_runs_version_idx
    ON replayable.stage_runs (stage, (replayable.version_key(code_version)));
CREATE INDEX IF NOT EXISTS stage_runs_run_idx ON replayable.stage_runs (run_id);

CREATE TABLE IF NOT EXISTS replayable.dead_letters (
    id              bigserial PRIMARY KEY,
    stage           text NOT NULL,
    item_key        text NOT NULL,
    doc_id          text NOT NULL,
    error_class     text NOT NULL,
    error_kind      text NOT NULL,
    error           text NOT NULL,
    traceback       text,
    attempts        int NOT NULL,
    code_version    text NOT NULL,
    dag_id          text,
    run_id          text,
    map_index       int,
    status          text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'redriven', 'ignored')),
    owner           text,
    note            text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    resolved_at     timestamptz,
    resolved_by     text
);
CREATE UNIQUE INDEX IF NOT EXISTS dead_letters_open_uq
    ON replayable.dead_letters (stage, item_key) WHERE status = 'open';
CREATE INDEX IF NOT EXISTS dead_letters_created_idx ON replayable.dead_letters (created_at);

CREATE TABLE IF NOT EXISTS replayable.extractions (
    doc_id              text NOT NULL REFERENCES replayable.documents (doc_id),
    extractor_version   text NOT NULL,
    page_count          int NOT NULL,
    text                text NOT NULL,
    text_sha256         text NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (doc_id, extractor_version)
);

CREATE TABLE IF NOT EXISTS replayable.chunks (
    chunk_id        text PRIMARY KEY,       -- sha256(chunker version, text)
    text            text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS replayable.doc_chunks (
    doc_id              text NOT NULL REFERENCES replayable.documents (doc_id),
    extractor_version   text NOT NULL,
    chunker_key         text NOT NULL,      -- chunker version + size + overlap
    ordinal             int NOT NULL,
    chunk_id            text NOT NULL REFERENCES replayable.chunks (chunk_id),
    PRIMARY KEY (doc_id, extractor_version, chunker_key, ordinal)
);

CREATE TABLE IF NOT EXISTS replayable.embeddings (
    chunk_id        text NOT NULL REFERENCES replayable.chunks (chunk_id),
    model           text NOT NULL,
    dim             int NOT NULL,
    embedding       vector NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (chunk_id, model)
);

CREATE TABLE IF NOT EXISTS replayable.model_calls (
    id              bigserial PRIMARY KEY,
    stage           text NOT NULL,
    item_key        text NOT NULL,
    attempt         int NOT NULL,           -- the item's attempt (stage_runs.attempts)
    call_try        int NOT NULL DEFAULT 1, -- retry number inside that attempt
    status          text NOT NULL,          -- 'ok' or the error class
    http_status     int,
    latency_ms      int NOT NULL,
    n_inputs        int NOT NULL,
    tokens          int NOT NULL DEFAULT 0,
    idempotency_key text NOT NULL,
    run_id          text,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS model_calls_item_idx ON replayable.model_calls (stage, item_key);
CREATE INDEX IF NOT EXISTS model_calls_run_idx ON replayable.model_calls (run_id);

-- The report task's summary of each run, so that `make run` and people can read it back.
CREATE TABLE IF NOT EXISTS replayable.run_reports (
    dag_id      text NOT NULL,
    run_id      text NOT NULL,
    report      jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (dag_id, run_id)
);
