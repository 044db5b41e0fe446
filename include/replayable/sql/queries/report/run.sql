SELECT documents, to_do, batches, stage_errors FROM replayable.runs
WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s
