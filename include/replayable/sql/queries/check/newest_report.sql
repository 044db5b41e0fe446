-- The newest saved report: at quiescence it still describes its run's documents.
SELECT dag_id, run_id, report FROM replayable.run_reports
ORDER BY created_at DESC, run_id DESC
LIMIT 1
