SELECT doc_id FROM replayable.run_docs
WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s AND batch = %(batch)s
ORDER BY doc_id
