-- A done embed item has a vector for every chunk of its document under the item's model and
-- dimensions: vectors equal chunks. Its config hash names the model and dimensions
-- (`config_hashes` → `models`, `dimensions`: every model and size that has vectors, hashed
-- by the invariants module as the stage hashes its config; a hash that names none is an item
-- done under a model and size that no vector has). Its spec hash names the chunker and
-- extractor whose chunks it embedded (`spec_hashes` → `extractors`, `chunkers`); where it
-- names none known (an older release's rows), one chunk with a vector will do.
-- Set-based: the chunks without a vector under each model and size needed (an anti-join),
-- joined to the done items that need them; done items without chunks (another anti-join);
-- only the few that break it are counted in detail.
WITH sizes AS (
    SELECT * FROM unnest(%(config_hashes)s::text[], %(models)s::text[], %(dimensions)s::int[])
        AS t (config_hash, model, dimensions)
), lineage AS (
    SELECT * FROM unnest(%(spec_hashes)s::text[], %(extractors)s::text[], %(chunkers)s::text[])
        AS t (spec_hash, extractor_version, chunker_key)
), done AS MATERIALIZED (
    SELECT s.doc_id, s.item_key, s.config_hash, z.model, z.dimensions, l.extractor_version,
           l.chunker_key
    FROM replayable.stage_runs s
    LEFT JOIN sizes z ON z.config_hash = s.config_hash
    LEFT JOIN lineage l ON l.spec_hash = s.spec_hash
    WHERE s.stage = 'embed' AND s.is_current AND s.status = 'done'
), missing AS MATERIALIZED (
    -- Chunks without a vector under a model of `needed_models` (few: those of documents not
    -- embedded yet), by one hash anti-join of the chunks with the vectors; for a model
    -- stored at several sizes (`several_sizes`), every chunk with the size of its vector.
    SELECT dc.doc_id, dc.extractor_version, dc.chunker_key, m.model, e.dim
    FROM replayable.doc_chunks dc
    CROSS JOIN unnest(%(needed_models)s::text[]) AS m (model)
    LEFT JOIN replayable.embeddings e ON e.chunk_id = dc.chunk_id AND e.model = m.model
    WHERE e.chunk_id IS NULL OR m.model = ANY(%(several_sizes)s::text[])
), unembedded AS MATERIALIZED (
    -- The done items those chunks belong to, through stage_runs_current_uq.
    SELECT DISTINCT s.doc_id, s.item_key, z.model, z.dimensions, l.extractor_version,
           l.chunker_key
    FROM missing m
    JOIN replayable.stage_runs s
        ON s.stage = 'embed' AND s.doc_id = m.doc_id AND s.is_current AND s.status = 'done'
    JOIN sizes z ON z.config_hash = s.config_hash AND z.model = m.model
    JOIN lineage l
        ON l.spec_hash = s.spec_hash AND l.extractor_version = m.extractor_version
       AND l.chunker_key = m.chunker_key
    WHERE m.dim IS NULL OR (z.dimensions IS NOT NULL AND m.dim <> z.dimensions)
), found AS MATERIALIZED (
    SELECT d.doc_id, d.item_key,
           'done, with ' || (
               SELECT count(*) FROM replayable.doc_chunks dc
               JOIN replayable.embeddings e ON e.chunk_id = dc.chunk_id AND e.model = d.model
               WHERE dc.doc_id = d.doc_id AND dc.extractor_version = d.extractor_version
                 AND dc.chunker_key = d.chunker_key
                 AND (d.dimensions IS NULL OR e.dim = d.dimensions))::text
               || ' vectors for ' || (
               SELECT count(*) FROM replayable.doc_chunks dc
               WHERE dc.doc_id = d.doc_id AND dc.extractor_version = d.extractor_version
                 AND dc.chunker_key = d.chunker_key)::text
               || ' chunks under ' || d.model
               || coalesce(' at ' || d.dimensions::text || ' dimensions', '') AS detail
    FROM unembedded d
    UNION ALL
    -- A chunk set starts at ordinal 0 (the chunker numbers from it, in one transaction).
    SELECT d.doc_id, d.item_key, 'done, with no chunks under ' || d.chunker_key
    FROM done d
    WHERE d.model IS NOT NULL AND d.chunker_key IS NOT NULL
      AND NOT EXISTS (
          SELECT 1 FROM replayable.doc_chunks dc
          WHERE dc.doc_id = d.doc_id AND dc.extractor_version = d.extractor_version
            AND dc.chunker_key = d.chunker_key AND dc.ordinal = 0)
    UNION ALL
    SELECT d.doc_id, d.item_key,
           'done under a model and size that no stored vector has (config hash '
               || d.config_hash || ')'
    FROM done d
    WHERE d.model IS NULL
    UNION ALL
    SELECT d.doc_id, d.item_key,
           'done, with no chunk that has a vector under ' || d.model
               || coalesce(' at ' || d.dimensions::text || ' dimensions', '')
    FROM done d
    WHERE d.model IS NOT NULL AND d.chunker_key IS NULL
      AND NOT EXISTS (
          SELECT 1 FROM replayable.doc_chunks dc
          JOIN replayable.embeddings e ON e.chunk_id = dc.chunk_id
          WHERE dc.doc_id = d.doc_id AND e.model = d.model
            AND (d.dimensions IS NULL OR e.dim = d.dimensions))
)
SELECT 'embed' AS stage, doc_id, item_key, detail, count(*) OVER () AS total
FROM found
ORDER BY doc_id
LIMIT %(limit)s
