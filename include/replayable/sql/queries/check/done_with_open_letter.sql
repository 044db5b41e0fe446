-- Never both outcomes: an open dead letter of a (stage, document) whose current item is done
-- (a letter of an older key of the document counts: its document is done and still listed as
-- dead). Open letters are few; each finds its document's current row through
-- stage_runs_current_uq.
WITH found AS MATERIALIZED (
    SELECT d.stage, d.doc_id, s.item_key, d.id,
           'done, with open dead letter ' || d.id::text || ' (' || d.error_class
               || CASE WHEN d.item_key = s.item_key THEN ', this item'
                       ELSE ', item ' || left(d.item_key, 16) END || ')' AS detail
    FROM replayable.dead_letters d
    JOIN replayable.stage_runs s
        ON s.stage = d.stage AND s.doc_id = d.doc_id AND s.is_current
    WHERE d.status = 'open' AND s.status = 'done'
)
SELECT stage, doc_id, item_key, detail, count(*) OVER () AS total FROM found
ORDER BY stage, doc_id, id
LIMIT %(limit)s
