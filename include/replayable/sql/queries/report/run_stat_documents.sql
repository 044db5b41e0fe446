-- A run's documents that were named after their stat because they were too large to read.
SELECT d.doc_id, d.uri
FROM replayable.run_docs r
JOIN replayable.documents d ON d.doc_id = r.doc_id
WHERE r.dag_id = %(dag_id)s AND r.run_id = %(run_id)s AND d.stat_id
