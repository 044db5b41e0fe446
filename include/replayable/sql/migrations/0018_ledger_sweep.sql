-- What the sweep needs to finish every failed item, and not before its time (ADR 0135):
-- * stage_runs.retry_not_before: when an item failed with a Retry-After, the time before
--   which it is not to be tried again; the sweep leaves it alone until then;
-- * runs.settings: the params a run was planned with (less its selection), so that the sweep
--   re-runs an item failed under non-default settings with those settings.
-- Both nullable without a default: adding them rewrites no row. Idempotent.
ALTER TABLE replayable.stage_runs ADD COLUMN IF NOT EXISTS retry_not_before timestamptz;
ALTER TABLE replayable.runs ADD COLUMN IF NOT EXISTS settings jsonb;
