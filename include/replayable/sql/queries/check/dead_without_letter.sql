-- Never neither: a current dead item has an open dead letter under its own key (the one
-- finish_items.sql or a killed claim opened), found through dead_letters_open_uq.
SELECT s.stage, s.doc_id, s.item_key,
       'dead (' || coalesce(s.error_class, 'no class') || '), with no open dead letter' AS detail,
       count(*) OVER () AS total
FROM replayable.stage_runs s
WHERE s.is_current AND s.status = 'dead'
  AND NOT EXISTS (
      SELECT 1 FROM replayable.dead_letters d
      WHERE d.stage = s.stage AND d.item_key = s.item_key AND d.status = 'open')
ORDER BY s.stage, s.doc_id
LIMIT %(limit)s
