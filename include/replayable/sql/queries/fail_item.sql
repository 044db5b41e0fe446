-- Record a failure; at the attempt cap, or for a terminal error, the item is dead.
UPDATE replayable.stage_runs
SET status = CASE WHEN %(terminal)s OR attempts >= %(max_attempts)s THEN 'dead' ELSE 'failed' END,
    error_class = %(error_class)s, error_kind = %(error_kind)s, last_error = %(error)s,
    lease_owner = NULL, lease_expires = NULL, finished_at = now(), updated_at = now()
WHERE stage = %(stage)s AND item_key = %(item_key)s
  AND status = 'running' AND lease_owner = %(owner)s
RETURNING status, attempts, doc_id, code_version
