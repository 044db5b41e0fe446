-- The pipelines whose runs left a shared stage's item unfinished before a run of another
-- pipeline took it over (ADR 0135, finding 13 of issue 36). Items are keyed by stage and
-- spec, so two pipelines that share a stage share its rows, and the taking run's dag_id
-- replaces the leaving one's: without this, the leaving pipeline's later stages never ran
-- for the document and its sweep, which looks for failed rows, had nothing to find.
-- Idempotent.
ALTER TABLE replayable.stage_runs ADD COLUMN IF NOT EXISTS left_by text[];
CREATE INDEX IF NOT EXISTS stage_runs_handed_over_idx
    ON replayable.stage_runs (stage, updated_at) WHERE is_current AND left_by IS NOT NULL;
