-- Documents for a partial re-run: every filter is optional (NULL means "any").
SELECT DISTINCT doc_id
FROM replayable.stage_runs
WHERE stage = %(stage)s
  AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
  AND (%(error_classes)s::text[] IS NULL OR error_class = ANY(%(error_classes)s::text[]))
  AND (%(code_version_lt)s::text IS NULL
       OR replayable.version_key(code_version) < replayable.version_key(%(code_version_lt)s::text))
  AND (%(since)s::timestamptz IS NULL OR updated_at >= %(since)s::timestamptz)
  AND (%(doc_ids)s::text[] IS NULL OR doc_id = ANY(%(doc_ids)s::text[]))
ORDER BY doc_id
