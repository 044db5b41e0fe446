-- Never neither: a current dead item has its letter under its own key (the one
-- finish_items.sql or a killed claim opened), open, or ignored on purpose (an ignored letter
-- is how a dead item stays accounted for: dead_letters/ignore.sql). Dead items through
-- stage_runs_current_status_idx (per stage of `stages`), letters through
-- dead_letters_item_idx.
WITH found AS MATERIALIZED (
    SELECT s.stage, s.doc_id, s.item_key,
           'dead (' || coalesce(s.error_class, 'no class')
               || '), with no open or ignored dead letter' AS detail
    FROM replayable.stage_runs s
    WHERE s.is_current AND s.stage = ANY(%(stages)s::text[]) AND s.status = 'dead'
      AND NOT EXISTS (
          SELECT 1 FROM replayable.dead_letters d
          WHERE d.stage = s.stage AND d.item_key = s.item_key
            AND d.status IN ('open', 'ignored'))
)
SELECT *, count(*) OVER () AS total FROM found
ORDER BY stage, doc_id
LIMIT %(limit)s
