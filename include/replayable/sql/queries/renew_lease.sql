UPDATE replayable.stage_runs
SET lease_expires = now() + make_interval(secs => %(lease_s)s), updated_at = now()
WHERE stage = %(stage)s AND item_key = %(item_key)s
  AND status = 'running' AND lease_owner = %(owner)s
