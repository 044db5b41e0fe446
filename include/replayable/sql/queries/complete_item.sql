-- Only the lease holder may complete; a worker whose lease was taken over writes nothing.
UPDATE replayable.stage_runs
SET status = 'done', error_class = NULL, error_kind = NULL, last_error = NULL,
    lease_owner = NULL, lease_expires = NULL, finished_at = now(), updated_at = now()
WHERE stage = %(stage)s AND item_key = %(item_key)s
  AND status = 'running' AND lease_owner = %(owner)s
