-- A done extract item has its extraction, under the extractor its row names: its code
-- version and the engine policy its config hash gives (`config_hashes` → `engines`, hashed
-- by the invariants module as the stage hashes its config). A row whose config hash names
-- no engine (an older release's) needs some extraction under its code version.
WITH engines AS (
    SELECT * FROM unnest(%(config_hashes)s::text[], %(engines)s::text[])
        AS t (config_hash, engine)
)
SELECT s.stage, s.doc_id, s.item_key,
       'done, with no extraction under ' || s.code_version || '+' || coalesce(g.engine, '*')
           AS detail,
       count(*) OVER () AS total
FROM replayable.stage_runs s
LEFT JOIN engines g ON g.config_hash = s.config_hash
WHERE s.stage = 'extract' AND s.is_current AND s.status = 'done'
  AND NOT EXISTS (
      SELECT 1 FROM replayable.extractions e
      WHERE e.doc_id = s.doc_id
        AND (e.extractor_version = s.code_version || '+' || g.engine
             OR (g.engine IS NULL
                 AND left(e.extractor_version, length(s.code_version) + 1)
                     = s.code_version || '+')))
ORDER BY s.doc_id
LIMIT %(limit)s
