-- A stage that could not be built for a run (its `build` raised) says so in the run's row,
-- by stage name, so that the run's report names why its documents never entered that stage
-- instead of counting them as "other" (ADR 0133). Idempotent: the column is added once.
ALTER TABLE replayable.runs ADD COLUMN IF NOT EXISTS stage_errors jsonb;
