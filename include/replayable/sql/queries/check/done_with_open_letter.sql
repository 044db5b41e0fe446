-- Never both outcomes: an open dead letter of a (stage, document) whose current item is done
-- (a letter of an older key of the document counts: its document is done and still listed as
-- dead). Open letters are few; each finds its document's current row through
-- stage_runs_current_uq.
SELECT d.stage, d.doc_id, s.item_key,
       'done, with open dead letter ' || d.id::text || ' (' || d.error_class
           || CASE WHEN d.item_key = s.item_key THEN ', this item'
                   ELSE ', item ' || left(d.item_key, 16) END || ')' AS detail,
       count(*) OVER () AS total
FROM replayable.dead_letters d
JOIN replayable.stage_runs s
    ON s.stage = d.stage AND s.doc_id = d.doc_id AND s.is_current
WHERE d.status = 'open' AND s.status = 'done'
ORDER BY d.stage, d.doc_id, d.id
LIMIT %(limit)s
