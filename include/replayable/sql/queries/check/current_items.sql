-- A document has at most one current item per stage (invariant 13). The partial unique index
-- stage_runs_current_uq holds it by construction: while it exists, is valid and is the one
-- migration 0002 made, nothing is read (the scan's one-time filter is false). Without it
-- (dropped, rebuilding, or widened), every current row is grouped by (stage, document). Each
-- check gathers every violation first (MATERIALIZED: planned for a whole pass, never for the
-- first few rows of LIMIT, which on a clean ledger never come), then counts and lists them.
WITH held AS MATERIALIZED (
    SELECT EXISTS (
        SELECT 1 FROM pg_index i
        WHERE i.indexrelid = to_regclass('replayable.stage_runs_current_uq')
          AND i.indisunique AND i.indisvalid
          AND pg_get_indexdef(i.indexrelid) LIKE '%%USING btree (stage, doc_id) WHERE is_current'
    ) AS unique_index
), found AS MATERIALIZED (
    SELECT stage, doc_id, count(*) AS n
    FROM replayable.stage_runs
    WHERE is_current AND NOT (SELECT unique_index FROM held)
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
