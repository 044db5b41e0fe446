-- One dead letter with its document's URI, as list_dead_letters shows it.
SELECT dl.id, dl.stage, dl.item_key, dl.doc_id, d.uri, dl.error_class, dl.error_kind,
       dl.error, dl.traceback, dl.attempts, dl.code_version, dl.dag_id, dl.run_id,
       dl.map_index, dl.try_number, dl.status, dl.owner, dl.note, dl.created_at, dl.resolved_at,
       dl.resolved_by, dl.resolution
FROM replayable.dead_letters dl
LEFT JOIN replayable.documents d ON d.doc_id = dl.doc_id
WHERE dl.id = %(id)s
