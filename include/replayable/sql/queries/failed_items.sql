-- Failed items, for the UI and the CLI: items whose newest row in a stage is failed
-- (retryable, under the attempt cap), with the run and map index that last touched them.
-- `matched` counts every match, so a page cut by the limit can say how much it left out.
SELECT s.stage, s.item_key, s.doc_id, d.uri, s.attempts, s.error_class, s.last_error,
       s.code_version, s.dag_id, s.run_id, s.map_index, s.updated_at,
       count(*) OVER () AS matched
FROM (
    SELECT DISTINCT ON (stage, doc_id)
           stage, item_key, doc_id, status, attempts, error_class, last_error, code_version,
           dag_id, run_id, map_index, updated_at
    FROM replayable.stage_runs
    WHERE %(stage)s::text IS NULL OR stage = %(stage)s::text
    ORDER BY stage, doc_id, updated_at DESC
) s
LEFT JOIN replayable.documents d ON d.doc_id = s.doc_id
WHERE s.status = 'failed'
  AND (%(error_classes)s::text[] IS NULL OR s.error_class = ANY(%(error_classes)s::text[]))
ORDER BY s.updated_at DESC, s.stage, s.doc_id
LIMIT %(limit)s
