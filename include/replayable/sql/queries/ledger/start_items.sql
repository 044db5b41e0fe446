-- Start items this worker took over unstarted (claim_items.sql): spend their attempt now,
-- just before the work, in a statement of its own that commits first (ADR 0084). Only the
-- lease holder starts an item, and only once. Returns each started key's attempt number.
UPDATE replayable.stage_runs
SET attempts = attempts + 1, started_at = now(), updated_at = now()
WHERE stage = %(stage)s AND item_key = ANY(%(keys)s::text[])
  AND status = 'running' AND lease_owner = %(owner)s AND started_at IS NULL
RETURNING item_key, attempts
