-- Failed items (current rows: retryable, under the attempt cap), newest first, for the UI
-- and the CLI. Keyset paging: pass the last row's (updated_at, stage, doc_id) as `after` to
-- get the next page. `matched` counts every match, from the counters (kept per error
-- class), so it costs no scan.
SELECT s.stage, s.item_key, s.doc_id, d.uri, s.attempts, s.error_class, s.last_error,
       s.code_version, s.dag_id, s.run_id, s.map_index, s.try_number, s.updated_at,
       (SELECT coalesce(sum(n), 0) FROM replayable.stage_counts k
        WHERE k.status = 'failed'
          AND (%(stage)s::text IS NULL OR k.stage = %(stage)s::text)
          AND (%(error_classes)s::text[] IS NULL
               OR k.error_class = ANY(%(error_classes)s::text[]))) AS matched
FROM replayable.stage_runs s
LEFT JOIN replayable.documents d ON d.doc_id = s.doc_id
WHERE s.is_current AND s.status = 'failed'
  AND (%(stage)s::text IS NULL OR s.stage = %(stage)s::text)
  AND (%(error_classes)s::text[] IS NULL OR s.error_class = ANY(%(error_classes)s::text[]))
  AND (%(after_updated_at)s::timestamptz IS NULL
       OR (s.updated_at, s.stage, s.doc_id)
          < (%(after_updated_at)s::timestamptz, %(after_stage)s::text, %(after_doc_id)s::text))
ORDER BY s.updated_at DESC, s.stage DESC, s.doc_id DESC
LIMIT %(limit)s
