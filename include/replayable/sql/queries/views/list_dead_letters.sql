-- Dead letters for the UI and the CLI, newest first, with the full error, traceback and
-- resolution; a NULL filter means any. Keyset paging: pass the last row's (created_at, id)
-- as `after`. `matched` counts every match.
SELECT dl.id, dl.stage, dl.item_key, dl.doc_id, d.uri, dl.error_class, dl.error_kind,
       dl.error, dl.traceback, dl.attempts, dl.code_version, dl.dag_id, dl.run_id,
       dl.map_index, dl.try_number, dl.status, dl.owner, dl.note, dl.created_at, dl.resolved_at,
       dl.resolved_by, dl.resolution,
       (SELECT count(*) FROM replayable.dead_letters m
        WHERE (%(stage)s::text IS NULL OR m.stage = %(stage)s::text)
          AND (%(status)s::text IS NULL OR m.status = %(status)s::text)
          AND (%(error_classes)s::text[] IS NULL
               OR m.error_class = ANY(%(error_classes)s::text[]))
          AND (%(since)s::timestamptz IS NULL OR m.created_at >= %(since)s::timestamptz)
          AND (%(until)s::timestamptz IS NULL OR m.created_at < %(until)s::timestamptz))
       AS matched
FROM replayable.dead_letters dl
LEFT JOIN replayable.documents d ON d.doc_id = dl.doc_id
WHERE (%(stage)s::text IS NULL OR dl.stage = %(stage)s::text)
  AND (%(status)s::text IS NULL OR dl.status = %(status)s::text)
  AND (%(error_classes)s::text[] IS NULL OR dl.error_class = ANY(%(error_classes)s::text[]))
  AND (%(since)s::timestamptz IS NULL OR dl.created_at >= %(since)s::timestamptz)
  AND (%(until)s::timestamptz IS NULL OR dl.created_at < %(until)s::timestamptz)
  AND (%(after_created_at)s::timestamptz IS NULL
       OR (dl.created_at, dl.id) < (%(after_created_at)s::timestamptz, %(after_id)s::bigint))
ORDER BY dl.created_at DESC, dl.id DESC
LIMIT %(limit)s
