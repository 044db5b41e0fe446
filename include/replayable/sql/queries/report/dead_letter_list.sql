-- The first dead letters a run opened, with their documents' URIs, for its report.
SELECT dl.id, dl.stage, dl.error_class, dl.doc_id, d.uri
FROM replayable.dead_letters dl
LEFT JOIN replayable.documents d ON d.doc_id = dl.doc_id
WHERE dl.run_id = %(run_id)s AND coalesce(dl.dag_id, %(dag_id)s) = %(dag_id)s
ORDER BY dl.id
LIMIT %(limit)s
