-- A done chunk item has its doc_chunks rows, under the chunker its row names (its code
-- version, and the size and overlap its config hash gives: `config_hashes` → `shapes`) and
-- the extractor its spec hash names (`spec_hashes` → `extractors`). Where a hash names
-- nothing known (an older release's rows), any extractor, or any chunker of its version,
-- will do: those few rows are looked up one by one through doc_chunks' primary key. A
-- chunk set starts at ordinal 0 (the chunker numbers from it, in one transaction).
WITH shapes AS (
    SELECT * FROM unnest(%(config_hashes)s::text[], %(shapes)s::text[])
        AS t (config_hash, shape)
), lineage AS (
    SELECT * FROM unnest(%(spec_hashes)s::text[], %(extractors)s::text[])
        AS t (spec_hash, extractor_version)
), done AS MATERIALIZED (
    SELECT s.doc_id, s.item_key, l.extractor_version,
           'v' || s.code_version || '-' || coalesce(g.shape, '') AS chunker,
           g.shape IS NULL AS any_shape
    FROM replayable.stage_runs s
    LEFT JOIN shapes g ON g.config_hash = s.config_hash
    LEFT JOIN lineage l ON l.spec_hash = s.spec_hash
    WHERE s.stage = 'chunk' AND s.is_current AND s.status = 'done'
), found AS MATERIALIZED (
    SELECT d.* FROM done d
    WHERE d.extractor_version IS NOT NULL AND NOT d.any_shape
      AND NOT EXISTS (
          SELECT 1 FROM replayable.doc_chunks dc
          WHERE dc.doc_id = d.doc_id AND dc.extractor_version = d.extractor_version
            AND dc.chunker_key = d.chunker AND dc.ordinal = 0)
    UNION ALL
    SELECT d.* FROM done d
    WHERE (d.extractor_version IS NULL OR d.any_shape)
      AND NOT EXISTS (
          SELECT 1 FROM replayable.doc_chunks dc
          WHERE dc.doc_id = d.doc_id
            AND (dc.extractor_version = d.extractor_version OR d.extractor_version IS NULL)
            AND (dc.chunker_key = d.chunker
                 OR (d.any_shape AND left(dc.chunker_key, length(d.chunker)) = d.chunker)))
)
SELECT 'chunk' AS stage, doc_id, item_key,
       'done, with no chunks under ' || chunker || CASE WHEN any_shape THEN '*' ELSE '' END
           || ' of ' || coalesce(extractor_version, 'any extractor') AS detail,
       count(*) OVER () AS total
FROM found
ORDER BY doc_id
LIMIT %(limit)s
