-- A done item of an artifact stage (summarize, your own ArtifactStage) is linked to its
-- output in item_artifacts, under its own key (the primary key).
WITH found AS MATERIALIZED (
    SELECT s.stage, s.doc_id, s.item_key, 'done, with no item_artifacts link' AS detail
    FROM replayable.stage_runs s
    WHERE s.stage = ANY(%(stages)s::text[]) AND s.is_current AND s.status = 'done'
      AND NOT EXISTS (
          SELECT 1 FROM replayable.item_artifacts a
          WHERE a.stage = s.stage AND a.item_key = s.item_key)
)
SELECT *, count(*) OVER () AS total FROM found
ORDER BY stage, doc_id
LIMIT %(limit)s
