-- Current items with no outcome yet: in `statuses` (at quiescence pending, running and failed:
-- every item is then done or dead), and, when `stale_only`, only running items whose lease
-- has expired (a worker that is gone; in flight until a claim takes them over).
SELECT stage, doc_id, item_key,
       status || coalesce(' (' || error_class || ')', '') || ', ' || attempts::text
           || ' attempt(s)'
           || CASE WHEN status = 'running'
                   THEN ', lease ' || CASE WHEN lease_expires IS NULL OR lease_expires <= now()
                                           THEN 'expired' ELSE 'live' END
                        || coalesce(' (held by ' || lease_owner || ')', '')
                   ELSE '' END AS detail,
       count(*) OVER () AS total
FROM replayable.stage_runs
WHERE is_current AND status = ANY(%(statuses)s::text[])
  AND (NOT %(stale_only)s OR lease_expires IS NULL OR lease_expires <= now())
ORDER BY stage, doc_id
LIMIT %(limit)s
