-- The newest state of each document in each stage, counted by status and error class.
SELECT stage, status, coalesce(error_class, '') AS error_class, count(*) AS n
FROM (
    SELECT DISTINCT ON (stage, doc_id) stage, doc_id, status, error_class
    FROM replayable.stage_runs
    WHERE doc_id = ANY(%(doc_ids)s)
    ORDER BY stage, doc_id, updated_at DESC
) latest
GROUP BY stage, status, error_class
ORDER BY stage, status, error_class
