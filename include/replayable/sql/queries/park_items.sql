-- Items a stopped batch never reached: failed for a systemic reason, no attempt spent.
UPDATE replayable.stage_runs
SET status = 'failed', error_class = %(error_class)s, error_kind = 'systemic',
    last_error = %(error)s, updated_at = now()
WHERE stage = %(stage)s AND item_key = ANY(%(keys)s) AND status = 'pending'
