-- The model the newest paid embedding call used: what the pipeline last asked for, when a
-- search names no model. A backward scan of the calls' primary key, stopping at the first.
SELECT model FROM replayable.model_calls
WHERE stage = %(stage)s AND status = 'ok' AND model IS NOT NULL
ORDER BY id DESC
LIMIT 1
