-- How many documents a rerun conf selects now (the same filters as select_rerun_docs).
SELECT count(*) AS matched
FROM replayable.stage_runs s
WHERE s.is_current AND s.stage = %(stage)s
  AND (%(statuses)s::text[] IS NULL OR s.status = ANY(%(statuses)s::text[]))
  AND (%(error_classes)s::text[] IS NULL OR s.error_class = ANY(%(error_classes)s::text[]))
  AND (%(code_version_lt)s::text IS NULL OR s.code_version = ANY(ARRAY(
        SELECT code_version FROM replayable.stage_counts
        WHERE stage = %(stage)s
          AND replayable.version_key(code_version)
              < replayable.version_key(%(code_version_lt)s::text)
        GROUP BY code_version HAVING sum(n) > 0)))
  AND (%(since)s::timestamptz IS NULL OR s.updated_at >= %(since)s::timestamptz)
  AND (%(doc_ids)s::text[] IS NULL OR s.doc_id = ANY(%(doc_ids)s::text[]))
