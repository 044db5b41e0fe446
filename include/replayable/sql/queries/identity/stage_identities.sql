-- The class each of the stages stands for in the ledger, locked until the plan's
-- transaction ends, so that the versions recorded next are compared by one plan at a time.
SELECT stage, class_path, dag_id
FROM replayable.stage_identities
WHERE stage = ANY(%(stages)s)
ORDER BY stage
FOR UPDATE
