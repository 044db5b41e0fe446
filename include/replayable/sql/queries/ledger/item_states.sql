-- The state of a batch's items, in one query.
SELECT item_key, doc_id, status, attempts,
       (status = 'running' AND lease_owner IS NOT DISTINCT FROM %(owner)s) AS mine,
       (lease_expires IS NOT NULL AND lease_expires > now()) AS lease_live,
       (status = 'running' AND lease_owner IS NOT DISTINCT FROM %(owner)s
        AND started_at IS NULL) AS unstarted
FROM replayable.stage_runs
WHERE stage = %(stage)s AND item_key = ANY(%(keys)s::text[])
