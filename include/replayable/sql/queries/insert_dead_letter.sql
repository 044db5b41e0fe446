INSERT INTO replayable.dead_letters
    (stage, item_key, doc_id, error_class, error_kind, error, traceback, attempts,
     code_version, dag_id, run_id, map_index)
VALUES (%(stage)s, %(item_key)s, %(doc_id)s, %(error_class)s, %(error_kind)s, %(error)s,
        %(traceback)s, %(attempts)s, %(code_version)s, %(dag_id)s, %(run_id)s, %(map_index)s)
ON CONFLICT (stage, item_key) WHERE status = 'open' DO NOTHING
