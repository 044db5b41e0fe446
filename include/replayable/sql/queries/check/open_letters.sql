-- At most one open dead letter per (stage, document): one outcome, one line of the work list.
WITH found AS MATERIALIZED (
    SELECT stage, doc_id, min(item_key) AS item_key,
           count(*)::text || ' open dead letters (ids '
               || string_agg(id::text, ', ' ORDER BY id) || ')' AS detail
    FROM replayable.dead_letters
    WHERE status = 'open'
    GROUP BY stage, doc_id
    HAVING count(*) > 1
)
SELECT *, count(*) OVER () AS total FROM found
ORDER BY stage, doc_id
LIMIT %(limit)s
