-- The index mirrors the sources (ADR 0138). A run over a whole source compares its listing
-- with the last complete listing of that source, kept here; a document that no listing
-- holds any more is retracted: it leaves search at once, and the sweep removes what only it
-- held after a retention. Every statement is idempotent.

-- The last complete listing of each source (the folder or file a run named, resolved):
-- which document each of its paths held. A document is held while any row names it, in
-- this source or another (two paths, two sources: ADR 0138).
CREATE TABLE IF NOT EXISTS replayable.source_files (
    source      text NOT NULL,
    path        text NOT NULL,
    doc_id      text NOT NULL,
    listed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source, path)
);
CREATE INDEX IF NOT EXISTS source_files_doc_idx ON replayable.source_files (doc_id);

-- A retracted document is out of search (and out of what the UI calls current) from
-- retracted_at; purged_at is when the sweep removed its text, chunks and vectors that no
-- other document holds. A document found again is restored: both are cleared.
ALTER TABLE replayable.documents ADD COLUMN IF NOT EXISTS retracted_at timestamptz;
ALTER TABLE replayable.documents ADD COLUMN IF NOT EXISTS purged_at timestamptz;
-- Restoring and purging read the retracted documents only: a small partial index.
CREATE INDEX IF NOT EXISTS documents_retracted_idx
    ON replayable.documents (retracted_at, doc_id) WHERE retracted_at IS NOT NULL;

-- What each run did to the index: a document retracted because its paths are gone
-- (deleted), or because a path of it holds other bytes now (updated, successor names
-- them), or found again (restored). The report counts them by run, so a plan that runs
-- twice still reports what its first try did; the outbox event of each is keyed by its id.
CREATE TABLE IF NOT EXISTS replayable.retractions (
    id          bigserial PRIMARY KEY,
    doc_id      text NOT NULL REFERENCES replayable.documents (doc_id),
    kind        text NOT NULL CHECK (kind IN ('deleted', 'updated', 'restored')),
    source      text,
    path        text,
    successor   text,
    dag_id      text NOT NULL,
    run_id      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS retractions_run_idx ON replayable.retractions (dag_id, run_id);
CREATE INDEX IF NOT EXISTS retractions_doc_idx ON replayable.retractions (doc_id, id);

-- Why a run over a whole source retracted nothing (the guard, ADR 0138); NULL when it
-- did, or had nothing to retract. The report shows it and fails the run with it.
ALTER TABLE replayable.runs ADD COLUMN IF NOT EXISTS retract_refused text;
