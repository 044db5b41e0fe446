-- The run `status --watch` follows: the one named (its newest record, if a run id was
-- reused across DAGs), else the newest run the ledger knows. `reported` says the run's
-- report task has written its report since the run was recorded: the report task runs
-- however the run went (trigger rule all_done), so it marks the run's end in the ledger.
SELECT ru.dag_id, ru.run_id, ru.created_at, ru.documents, ru.to_do,
       coalesce(rr.created_at >= ru.created_at, false) AS reported
FROM replayable.runs ru
LEFT JOIN replayable.run_reports rr ON rr.dag_id = ru.dag_id AND rr.run_id = ru.run_id
WHERE %(run_id)s::text IS NULL OR ru.run_id = %(run_id)s::text
ORDER BY ru.created_at DESC
LIMIT 1
