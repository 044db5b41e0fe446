-- The newest runs and what their model calls cost (ADR 0110): from the run's report once it
-- is written, else summed from the run's calls so far (through model_calls' run index; the
-- sum is skipped for a reported run).
SELECT ru.dag_id, ru.run_id, ru.created_at, ru.documents, ru.to_do,
       coalesce(rr.created_at >= ru.created_at, false) AS reported,
       coalesce((rr.report -> 'cost' ->> 'usd')::float8, live.usd, 0) AS usd,
       coalesce((rr.report -> 'cost' ->> 'unpriced_calls')::bigint, live.unpriced, 0)
           AS unpriced_calls
FROM replayable.runs ru
LEFT JOIN replayable.run_reports rr ON rr.dag_id = ru.dag_id AND rr.run_id = ru.run_id
LEFT JOIN LATERAL (
    SELECT coalesce(sum(c.cost_usd), 0)::float8 AS usd,
           count(*) FILTER (WHERE c.cost_usd IS NULL) AS unpriced
    FROM replayable.model_calls c
    WHERE (rr.report -> 'cost') IS NULL AND c.run_id = ru.run_id
      AND (c.status = 'ok' OR (c.http_status BETWEEN 200 AND 299 AND c.tokens > 0))
) live ON true
ORDER BY ru.created_at DESC
LIMIT %(limit)s
