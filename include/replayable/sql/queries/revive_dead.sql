-- A re-run that asks for dead items: reopen them with a fresh attempt budget and close
-- their open dead letters as redriven, noting the re-run.
WITH revived AS (
    UPDATE replayable.stage_runs
    SET status = 'pending', attempts = 0, error_class = NULL, error_kind = NULL,
        last_error = NULL, updated_at = now()
    WHERE stage = %(stage)s AND item_key = ANY(%(keys)s) AND status = 'dead'
    RETURNING item_key
)
UPDATE replayable.dead_letters d
SET status = 'redriven', resolved_at = now(), resolved_by = %(by)s, note = %(reason)s
FROM revived r
WHERE d.stage = %(stage)s AND d.item_key = r.item_key AND d.status = 'open'
