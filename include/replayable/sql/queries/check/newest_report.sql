-- The newest saved report, and whether any current item of its run's documents changed
-- after it was saved (then the report describes an earlier ledger, and is not compared).
SELECT r.dag_id, r.run_id, r.report,
       EXISTS (
           SELECT 1 FROM replayable.run_docs d
           JOIN replayable.stage_runs s ON s.doc_id = d.doc_id AND s.is_current
           WHERE d.dag_id = r.dag_id AND d.run_id = r.run_id AND s.updated_at > r.created_at
       ) AS changed_since
FROM replayable.run_reports r
ORDER BY r.created_at DESC, r.run_id DESC
LIMIT 1
