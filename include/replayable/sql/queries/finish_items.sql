-- Record how each claimed item ended, in the caller's transaction (with the item's outputs).
-- Only the lease holder can finish an item: a worker whose lease was taken over changes
-- nothing. Outcomes: 'done'; 'failed' (dead if terminal or at the attempt cap, with an open
-- dead letter carrying the full error); 'release' (a systemic stop: failed, and the attempt
-- it took is given back). Returns every key's state afterwards.
WITH input AS (
    SELECT * FROM unnest(%(keys)s::text[], %(outcomes)s::text[], %(error_classes)s::text[],
                         %(error_kinds)s::text[], %(errors)s::text[], %(tracebacks)s::text[])
        AS t (item_key, outcome, error_class, error_kind, error, traceback)
), finished AS (
    UPDATE replayable.stage_runs s
    SET status = CASE WHEN i.outcome = 'done' THEN 'done'
                      WHEN i.outcome = 'release' THEN 'failed'
                      WHEN i.error_kind = 'terminal' OR s.attempts >= %(max_attempts)s THEN 'dead'
                      ELSE 'failed' END,
        attempts = CASE WHEN i.outcome = 'release' THEN greatest(s.attempts - 1, 0)
                        ELSE s.attempts END,
        error_class = i.error_class, error_kind = i.error_kind, last_error = i.error,
        lease_owner = NULL, lease_expires = NULL, finished_at = now(), updated_at = now()
    FROM input i
    WHERE s.stage = %(stage)s AND s.item_key = i.item_key
      AND s.status = 'running' AND s.lease_owner = %(owner)s
    RETURNING s.item_key, s.doc_id, s.status, s.attempts, s.code_version
)
INSERT INTO replayable.dead_letters
    (stage, item_key, doc_id, error_class, error_kind, error, traceback, attempts,
     code_version, dag_id, run_id, map_index)
SELECT %(stage)s, f.item_key, f.doc_id, i.error_class, i.error_kind, i.error, i.traceback,
       f.attempts, f.code_version, %(dag_id)s, %(run_id)s, %(map_index)s
FROM finished f JOIN input i USING (item_key)
WHERE f.status = 'dead'
ON CONFLICT (stage, item_key) WHERE status = 'open' DO NOTHING;

SELECT item_key, doc_id, status, attempts,
       (status = 'running' AND lease_owner IS NOT DISTINCT FROM %(owner)s) AS mine,
       (lease_expires IS NOT NULL AND lease_expires > now()) AS lease_live
FROM replayable.stage_runs
WHERE stage = %(stage)s AND item_key = ANY(%(keys)s::text[])
