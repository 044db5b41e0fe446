-- Embeddings through the provider's Batch API (ADR 0117).
--
-- A submission is one batch job as the ledger knows it, named by an id of ours before
-- anything is sent: the id is the uploaded file's name and the batch's metadata, so that a
-- worker killed between the upload, the batch's creation and this row's update finds them
-- again instead of paying for a second batch. Its lines are the requests it carries, each
-- named (custom_id) by the same Idempotency-Key a synchronous request for exactly those
-- chunks would carry.
CREATE TABLE IF NOT EXISTS replayable.provider_batches (
    submission      text PRIMARY KEY,
    provider        text NOT NULL,            -- the API root it was sent to
    model           text NOT NULL,
    input_file_id   text,
    batch_id        text UNIQUE,
    -- submitting: its lines are recorded, its batch not yet created (or not yet recorded);
    -- waiting: the provider has it; collected: its results are stored, its chunks free.
    status          text NOT NULL DEFAULT 'submitting'
                    CHECK (status IN ('submitting', 'waiting', 'collected')),
    provider_status text,                     -- the provider's status when last read
    lines           int NOT NULL,
    inputs          int NOT NULL,
    dag_id          text,
    run_id          text,
    map_index       int,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    collected_at    timestamptz
);
CREATE INDEX IF NOT EXISTS provider_batches_open_idx
    ON replayable.provider_batches (created_at) WHERE status <> 'collected';

CREATE TABLE IF NOT EXISTS replayable.provider_batch_lines (
    submission      text NOT NULL REFERENCES replayable.provider_batches ON DELETE CASCADE,
    custom_id       text NOT NULL,
    chunk_ids       text[] NOT NULL,
    -- submitted; done (vectors stored); failed (in the error file: error_* say why);
    -- missing (the batch expired or was cancelled before it ran); resent (a missing line
    -- sent again, under the same custom_id, in a new submission).
    status          text NOT NULL DEFAULT 'submitted'
                    CHECK (status IN ('submitted', 'done', 'failed', 'missing', 'resent')),
    error_class     text,
    error_kind      text,
    error           text,
    PRIMARY KEY (submission, custom_id)
);
CREATE INDEX IF NOT EXISTS provider_batch_lines_missing_idx
    ON replayable.provider_batch_lines USING gin (chunk_ids) WHERE status = 'missing';

-- A chunk is in at most one submission that is not collected yet, per model: the row is
-- the claim that keeps a second worker from sending it again while a batch has it, and is
-- deleted when the batch is collected.
CREATE TABLE IF NOT EXISTS replayable.provider_batch_chunks (
    model           text NOT NULL,
    chunk_id        text NOT NULL,
    submission      text NOT NULL REFERENCES replayable.provider_batches ON DELETE CASCADE,
    PRIMARY KEY (model, chunk_id)
);
CREATE INDEX IF NOT EXISTS provider_batch_chunks_submission_idx
    ON replayable.provider_batch_chunks (submission);
