-- Items per stage by current status. Without a run id the counters answer (no scan of the
-- ledger); with one, the run's documents are looked up one by one (cost follows the run).
SELECT stage,
       coalesce(sum(n) FILTER (WHERE status = 'pending'), 0) AS pending,
       coalesce(sum(n) FILTER (WHERE status = 'running'), 0) AS running,
       coalesce(sum(n) FILTER (WHERE status = 'done'), 0) AS done,
       coalesce(sum(n) FILTER (WHERE status = 'failed'), 0) AS failed,
       coalesce(sum(n) FILTER (WHERE status = 'dead'), 0) AS dead,
       coalesce(sum(n), 0) AS total
FROM (
    SELECT stage, status, n
    FROM replayable.stage_counts
    WHERE %(run_id)s::text IS NULL
    UNION ALL
    SELECT c.stage, c.status, 1
    FROM replayable.runs ru
    JOIN replayable.run_docs r ON r.dag_id = ru.dag_id AND r.run_id = ru.run_id
    CROSS JOIN LATERAL (
        SELECT s.stage, s.status
        FROM replayable.stage_runs s
        WHERE s.stage = ANY(%(stages)s::text[]) AND s.doc_id = r.doc_id AND s.is_current
        OFFSET 0  -- per document through (stage, doc_id), never a scan of every current row
    ) c
    WHERE ru.run_id = %(run_id)s::text
) counted
GROUP BY stage
HAVING sum(n) <> 0
