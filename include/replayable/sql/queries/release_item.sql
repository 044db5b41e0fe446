-- A systemic failure is not the item's fault: give back the attempt it took. The item
-- stays to do (failed, under the cap), so the invariant items in = done + failed + dead holds.
UPDATE replayable.stage_runs
SET status = 'failed', attempts = greatest(attempts - 1, 0),
    error_class = %(error_class)s, error_kind = 'systemic', last_error = %(error)s,
    lease_owner = NULL, lease_expires = NULL, finished_at = now(), updated_at = now()
WHERE stage = %(stage)s AND item_key = %(item_key)s
  AND status = 'running' AND lease_owner = %(owner)s
