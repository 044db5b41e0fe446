-- A redriven letter names the run that took its item back to work (ADR 0083), so that a
-- redrive run's selection is the same however often its `plan` runs: the letters still open
-- plus the ones this run has already closed. A redrive selects without closing; the claim
-- that actually takes the item closes its letters (or plan, for an item already done under
-- the current spec). Idempotent: the columns and the index are added once.

ALTER TABLE replayable.dead_letters ADD COLUMN IF NOT EXISTS resolved_dag_id text;
ALTER TABLE replayable.dead_letters ADD COLUMN IF NOT EXISTS resolved_run_id text;

CREATE INDEX IF NOT EXISTS dead_letters_resolved_run_idx
    ON replayable.dead_letters (resolved_run_id, resolved_dag_id)
    WHERE resolved_run_id IS NOT NULL;
