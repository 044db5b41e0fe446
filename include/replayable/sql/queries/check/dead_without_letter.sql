-- Never neither: a current dead item has an open dead letter under its own key (the one
-- finish_items.sql or a killed claim opened). Dead items through
-- stage_runs_current_status_idx (per stage of `stages`), letters through
-- dead_letters_open_uq.
WITH found AS MATERIALIZED (
    SELECT s.stage, s.doc_id, s.item_key,
           'dead (' || coalesce(s.error_class, 'no class') || '), with no open dead letter'
               AS detail
    FROM replayable.stage_runs s
    WHERE s.is_current AND s.stage = ANY(%(stages)s::text[]) AND s.status = 'dead'
      AND NOT EXISTS (
          SELECT 1 FROM replayable.dead_letters d
          WHERE d.stage = s.stage AND d.item_key = s.item_key AND d.status = 'open')
)
SELECT *, count(*) OVER () AS total FROM found
ORDER BY stage, doc_id
LIMIT %(limit)s
