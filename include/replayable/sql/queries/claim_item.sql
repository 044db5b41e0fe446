-- Take the item if nobody holds a live lease on it and it is still to do.
UPDATE replayable.stage_runs
SET status = 'running',
    attempts = attempts + 1,
    lease_owner = %(owner)s,
    lease_expires = now() + make_interval(secs => %(lease_s)s),
    dag_id = %(dag_id)s, run_id = %(run_id)s, map_index = %(map_index)s,
    try_number = %(try_number)s,
    started_at = now(), finished_at = NULL, updated_at = now()
WHERE stage = %(stage)s AND item_key = %(item_key)s
  AND (status IN ('pending', 'failed')
       OR (status = 'running' AND (lease_expires IS NULL OR lease_expires <= now())))
RETURNING attempts
