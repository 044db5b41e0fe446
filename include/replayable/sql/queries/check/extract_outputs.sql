-- A done extract item has its extraction, under the extractor its row names: its code
-- version and the engine policy its config hash gives (`config_hashes` → `engines`, hashed
-- by the invariants module as the stage hashes its config). A row whose config hash names
-- no engine (an older release's) needs some extraction under its code version.
WITH engines AS (
    SELECT * FROM unnest(%(config_hashes)s::text[], %(engines)s::text[])
        AS t (config_hash, engine)
), done AS MATERIALIZED (
    SELECT s.doc_id, s.item_key, s.code_version, g.engine,
           s.code_version || '+' || g.engine AS extractor_version
    FROM replayable.stage_runs s
    LEFT JOIN engines g ON g.config_hash = s.config_hash
    WHERE s.stage = 'extract' AND s.is_current AND s.status = 'done'
), found AS MATERIALIZED (
    SELECT d.* FROM done d
    WHERE d.engine IS NOT NULL
      AND NOT EXISTS (
          SELECT 1 FROM replayable.extractions e
          WHERE e.doc_id = d.doc_id AND e.extractor_version = d.extractor_version)
    UNION ALL
    SELECT d.* FROM done d
    WHERE d.engine IS NULL
      AND NOT EXISTS (
          SELECT 1 FROM replayable.extractions e
          WHERE e.doc_id = d.doc_id
            AND left(e.extractor_version, length(d.code_version) + 1) = d.code_version || '+')
)
SELECT 'extract' AS stage, doc_id, item_key,
       'done, with no extraction under ' || coalesce(extractor_version, code_version || '+*')
           AS detail,
       count(*) OVER () AS total
FROM found
ORDER BY doc_id
LIMIT %(limit)s
