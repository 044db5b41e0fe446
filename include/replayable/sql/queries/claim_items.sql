-- Claim a batch's items in one round trip (ADR 0002, 0009). Statements run in order in one
-- implicit transaction, each seeing the ones before:
-- 1. the keys given become each document's current row in this stage;
-- 2. new items enter already claimed by this worker (one write per new item);
-- 3. existing items are taken when nobody holds a live lease on them, or when the holder is
--    an earlier try of this same task instance (Airflow only starts a new try once it has
--    given up on the old one), or, in a revive, when they are dead (fresh attempt budget);
--    an item's row takes the current spec_hash: the same key under a new lineage (say, a new
--    extractor that gave the same text) is the same output, so done stays done;
-- 4. a revive closes the revived items' open dead letters as redriven;
-- 5. the state of every key is returned; `mine` marks the ones this worker now holds.
WITH input AS (
    SELECT * FROM unnest(%(keys)s::text[], %(doc_ids)s::text[]) AS t (item_key, doc_id)
)
UPDATE replayable.stage_runs s SET is_current = false
FROM input
WHERE s.stage = %(stage)s AND s.doc_id = input.doc_id AND s.is_current
  AND s.item_key <> input.item_key;

INSERT INTO replayable.stage_runs
    (stage, item_key, doc_id, status, attempts, code_version, config_hash, spec_hash,
     is_current, lease_owner, lease_expires, dag_id, run_id, map_index, try_number, started_at)
SELECT %(stage)s, item_key, doc_id, 'running', 1, %(code_version)s, %(config_hash)s,
       %(spec_hash)s, true, %(owner)s, now() + make_interval(secs => %(lease_s)s),
       %(dag_id)s, %(run_id)s, %(map_index)s, %(try_number)s, now()
FROM unnest(%(keys)s::text[], %(doc_ids)s::text[]) AS t (item_key, doc_id)
ON CONFLICT DO NOTHING;

WITH takeable AS (
    SELECT s.item_key,
           (s.status IN ('pending', 'failed')
            OR (s.status = 'running'
                AND (s.lease_expires IS NULL OR s.lease_expires <= now()
                     OR (s.dag_id = %(dag_id)s AND s.run_id = %(run_id)s
                         AND s.map_index IS NOT DISTINCT FROM %(map_index)s
                         AND s.try_number < %(try_number)s)))
            OR (%(revive)s AND s.status = 'dead')) AS claim
    FROM replayable.stage_runs s
    WHERE s.stage = %(stage)s AND s.item_key = ANY(%(keys)s::text[])
      AND NOT (s.status = 'running' AND s.lease_owner = %(owner)s)
    FOR UPDATE
)
UPDATE replayable.stage_runs s
SET is_current = true,
    status = CASE WHEN t.claim THEN 'running' ELSE s.status END,
    attempts = CASE WHEN NOT t.claim THEN s.attempts
                    WHEN s.status = 'dead' THEN 1
                    ELSE s.attempts + 1 END,
    error_class = CASE WHEN t.claim AND s.status = 'dead' THEN NULL ELSE s.error_class END,
    lease_owner = CASE WHEN t.claim THEN %(owner)s ELSE s.lease_owner END,
    lease_expires = CASE WHEN t.claim THEN now() + make_interval(secs => %(lease_s)s)
                         ELSE s.lease_expires END,
    spec_hash = %(spec_hash)s,
    dag_id = CASE WHEN t.claim THEN %(dag_id)s ELSE s.dag_id END,
    run_id = CASE WHEN t.claim THEN %(run_id)s ELSE s.run_id END,
    map_index = CASE WHEN t.claim THEN %(map_index)s ELSE s.map_index END,
    try_number = CASE WHEN t.claim THEN %(try_number)s ELSE s.try_number END,
    started_at = CASE WHEN t.claim THEN now() ELSE s.started_at END,
    finished_at = CASE WHEN t.claim THEN NULL ELSE s.finished_at END,
    updated_at = CASE WHEN t.claim THEN now() ELSE s.updated_at END
FROM takeable t
WHERE s.stage = %(stage)s AND s.item_key = t.item_key
  AND (t.claim OR NOT s.is_current OR s.spec_hash IS DISTINCT FROM %(spec_hash)s);

UPDATE replayable.dead_letters d
SET status = 'redriven', resolved_at = now(), resolved_by = %(revive_by)s,
    resolution = %(revive_reason)s
FROM replayable.stage_runs s
WHERE %(revive)s AND d.stage = %(stage)s AND d.status = 'open'
  AND d.item_key = ANY(%(keys)s::text[])
  AND s.stage = d.stage AND s.item_key = d.item_key
  AND s.status = 'running' AND s.lease_owner = %(owner)s;

SELECT item_key, doc_id, status, attempts,
       (status = 'running' AND lease_owner IS NOT DISTINCT FROM %(owner)s) AS mine,
       (lease_expires IS NOT NULL AND lease_expires > now()) AS lease_live
FROM replayable.stage_runs
WHERE stage = %(stage)s AND item_key = ANY(%(keys)s::text[])
