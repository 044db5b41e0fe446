-- The dead letters a run opened, and the documents they belong to (ADR 0116), through the
-- run index: the cost follows the run, not the dead-letter queue.
SELECT count(*) AS opened, count(DISTINCT doc_id) AS documents
FROM replayable.dead_letters
WHERE run_id = %(run_id)s AND coalesce(dag_id, %(dag_id)s) = %(dag_id)s
