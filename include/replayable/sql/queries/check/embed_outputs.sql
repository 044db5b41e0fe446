-- A done embed item has a vector for every chunk of its document under the item's model and
-- dimensions: vectors equal chunks. Its config hash names the model and dimensions
-- (`config_hashes` → `models`, `dimensions`: every model and size that has vectors, hashed
-- by the invariants module as the stage hashes its config; a hash that names none is an item
-- done under a model and size that has no vector at all). Its spec hash names the chunker
-- and extractor whose chunks it embedded (`spec_hashes` → `extractors`, `chunkers`); where
-- it names none known (an older release's rows), one chunk with a vector will do. One pass:
-- done items, their chunks, each chunk's vector under the item's model.
WITH sizes AS (
    SELECT * FROM unnest(%(config_hashes)s::text[], %(models)s::text[], %(dimensions)s::int[])
        AS t (config_hash, model, dimensions)
), lineage AS (
    SELECT * FROM unnest(%(spec_hashes)s::text[], %(extractors)s::text[], %(chunkers)s::text[])
        AS t (spec_hash, extractor_version, chunker_key)
), done AS (
    SELECT s.doc_id, s.item_key, s.config_hash, z.model, z.dimensions, l.extractor_version,
           l.chunker_key
    FROM replayable.stage_runs s
    LEFT JOIN sizes z ON z.config_hash = s.config_hash
    LEFT JOIN lineage l ON l.spec_hash = s.spec_hash
    WHERE s.stage = 'embed' AND s.is_current AND s.status = 'done'
), known AS (
    SELECT d.doc_id, d.item_key, d.model, d.dimensions, d.chunker_key,
           count(dc.chunk_id) AS chunks, count(e.chunk_id) AS vectors
    FROM done d
    LEFT JOIN replayable.doc_chunks dc
        ON dc.doc_id = d.doc_id AND dc.extractor_version = d.extractor_version
       AND dc.chunker_key = d.chunker_key
    LEFT JOIN replayable.embeddings e
        ON e.chunk_id = dc.chunk_id AND e.model = d.model
       AND (d.dimensions IS NULL OR e.dim = d.dimensions)
    WHERE d.model IS NOT NULL AND d.chunker_key IS NOT NULL
    GROUP BY d.doc_id, d.item_key, d.model, d.dimensions, d.chunker_key
), missing AS (
    SELECT doc_id, item_key,
           CASE WHEN chunks = 0 THEN 'done, with no chunks under ' || chunker_key
                ELSE 'done, with ' || vectors::text || ' vectors for ' || chunks::text
                     || ' chunks under ' || model
                     || coalesce(' at ' || dimensions::text || ' dimensions', '') END AS detail
    FROM known
    WHERE chunks = 0 OR vectors < chunks
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
FROM missing
ORDER BY doc_id
LIMIT %(limit)s
