-- The counters the status pages and metrics read (stage_counts, kept by triggers) equal the
-- current rows they count: one pass over the current rows, grouped as the counters are.
WITH ledger AS (
    SELECT stage, status, coalesce(error_class, '') AS error_class, code_version, count(*) AS n
    FROM replayable.stage_runs
    WHERE is_current
    GROUP BY 1, 2, 3, 4
), counters AS (
    SELECT stage, status, error_class, code_version, sum(n) AS n
    FROM replayable.stage_counts
    GROUP BY 1, 2, 3, 4
    HAVING sum(n) <> 0
)
SELECT stage, NULL::text AS doc_id, NULL::text AS item_key,
       status || coalesce(nullif(' (' || error_class || ')', ' ()'), '') || ' at version '
           || code_version || ': ' || coalesce(l.n, 0)::text || ' current items, counters say '
           || coalesce(c.n, 0)::text AS detail,
       count(*) OVER () AS total
FROM ledger l
FULL JOIN counters c USING (stage, status, error_class, code_version)
WHERE coalesce(l.n, 0) <> coalesce(c.n, 0)
ORDER BY stage, status, error_class, code_version
LIMIT %(limit)s
