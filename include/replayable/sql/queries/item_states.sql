-- The one check per batch: the state of every item of the batch.
SELECT item_key, status, attempts, lease_owner,
       (lease_expires IS NOT NULL AND lease_expires > now()) AS lease_live
FROM replayable.stage_runs
WHERE stage = %(stage)s AND item_key = ANY(%(keys)s)
