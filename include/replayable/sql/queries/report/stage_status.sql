-- A run's documents by their current state in each stage, counted by status and class.
-- Looked up document by document through (stage, doc_id): the cost follows the run, never
-- the ledger (OFFSET 0 keeps the planner from turning it into a scan of every current row).
SELECT c.stage, c.status, coalesce(c.error_class, '') AS error_class, count(*) AS n
FROM replayable.run_docs r
CROSS JOIN LATERAL (
    SELECT s.stage, s.status, s.error_class
    FROM replayable.stage_runs s
    WHERE s.stage = ANY(%(stages)s::text[]) AND s.doc_id = r.doc_id AND s.is_current
    OFFSET 0
) c
WHERE r.dag_id = %(dag_id)s AND r.run_id = %(run_id)s
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3
