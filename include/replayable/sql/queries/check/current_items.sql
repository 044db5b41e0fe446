-- A document has at most one current item per stage (invariant 13). The partial unique index
-- stage_runs_current_uq holds it today; this reads that index alone (an index-only scan), so
-- a change that drops or widens the index is caught on the ledger it left. Each check
-- gathers every violation first (MATERIALIZED: planned for a whole pass, never for the
-- first few rows of LIMIT, which on a clean ledger never come), then counts and lists them.
WITH found AS MATERIALIZED (
    SELECT stage, doc_id, count(*) AS n
    FROM replayable.stage_runs
    WHERE is_current
    GROUP BY stage, doc_id
    HAVING count(*) > 1
)
SELECT f.stage, f.doc_id,
       (SELECT min(s.item_key) FROM replayable.stage_runs s
        WHERE s.stage = f.stage AND s.doc_id = f.doc_id AND s.is_current) AS item_key,
       f.n::text || ' current items' AS detail, count(*) OVER () AS total
FROM found f
ORDER BY f.stage, f.doc_id
LIMIT %(limit)s
