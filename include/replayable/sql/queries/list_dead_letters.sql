-- Dead letters for the UI and the CLI, newest first, with the full error, traceback and
-- resolution; a NULL status means every status.
SELECT dl.id, dl.stage, dl.item_key, dl.doc_id, d.uri, dl.error_class, dl.error_kind,
       dl.error, dl.traceback, dl.attempts, dl.code_version, dl.dag_id, dl.run_id,
       dl.map_index, dl.status, dl.owner, dl.note, dl.created_at, dl.resolved_at,
       dl.resolved_by,
       count(*) OVER () AS matched
FROM replayable.dead_letters dl
LEFT JOIN replayable.documents d ON d.doc_id = dl.doc_id
WHERE (%(stage)s::text IS NULL OR dl.stage = %(stage)s::text)
  AND (%(status)s::text IS NULL OR dl.status = %(status)s::text)
ORDER BY dl.created_at DESC, dl.id DESC
LIMIT %(limit)s
