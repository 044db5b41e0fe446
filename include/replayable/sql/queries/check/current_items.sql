-- A document has at most one current item per stage (invariant 13). The partial unique index
-- stage_runs_current_uq holds it today; this reads that index alone (an index-only scan in
-- (stage, doc_id) order), so a change that drops or widens the index is caught on the ledger.
SELECT stage, doc_id, min(item_key) AS item_key,
       count(*)::text || ' current items' AS detail, count(*) OVER () AS total
FROM replayable.stage_runs
WHERE is_current
GROUP BY stage, doc_id
HAVING count(*) > 1
ORDER BY stage, doc_id
LIMIT %(limit)s
