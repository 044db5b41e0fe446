-- Current items with no outcome yet: in `statuses` (at quiescence pending, running and failed:
-- every item is then done or dead), and, when `stale_only`, only those whose lease has
-- expired (a worker that is gone; in flight until a claim takes them over). Through
-- stage_runs_current_status_idx, one range per stage of `stages` and status.
WITH found AS MATERIALIZED (
    SELECT stage, doc_id, item_key,
           status || coalesce(' (' || error_class || ')', '') || ', ' || attempts::text
               || ' attempt(s)'
               || CASE WHEN status = 'running'
                       THEN ', lease '
                            || CASE WHEN lease_expires IS NULL OR lease_expires <= now()
                                    THEN 'expired' ELSE 'live' END
                            || coalesce(' (held by ' || lease_owner || ')', '')
                       ELSE '' END AS detail
    FROM replayable.stage_runs
    WHERE is_current AND stage = ANY(%(stages)s::text[]) AND status = ANY(%(statuses)s::text[])
      AND (NOT %(stale_only)s OR lease_expires IS NULL OR lease_expires <= now())
)
SELECT *, count(*) OVER () AS total FROM found
ORDER BY stage, doc_id
LIMIT %(limit)s
