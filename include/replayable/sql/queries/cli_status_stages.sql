-- Items per stage by their newest status (a document has one row per code version and
-- config, so only its newest counts). With a run id: the documents that run touched.
SELECT stage,
       count(*) FILTER (WHERE status = 'pending') AS pending,
       count(*) FILTER (WHERE status = 'running') AS running,
       count(*) FILTER (WHERE status = 'done') AS done,
       count(*) FILTER (WHERE status = 'failed') AS failed,
       count(*) FILTER (WHERE status = 'dead') AS dead,
       count(*) AS total
FROM (
    SELECT DISTINCT ON (stage, doc_id) stage, doc_id, status
    FROM replayable.stage_runs
    WHERE %(run_id)s::text IS NULL
       OR doc_id IN (SELECT doc_id FROM replayable.stage_runs WHERE run_id = %(run_id)s::text)
    ORDER BY stage, doc_id, updated_at DESC
) latest
GROUP BY stage
