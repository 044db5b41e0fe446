-- Extend this worker's leases; the keys not returned are no longer this worker's to finish.
-- updated_at is left alone, so the renewal changes no indexed column (a HOT update).
UPDATE replayable.stage_runs
SET lease_expires = now() + make_interval(secs => %(lease_s)s)
WHERE stage = %(stage)s AND item_key = ANY(%(keys)s::text[])
  AND status = 'running' AND lease_owner = %(owner)s
RETURNING item_key
