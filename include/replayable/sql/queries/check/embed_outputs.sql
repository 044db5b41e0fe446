-- A done embed item has a vector for every chunk of its document under the item's model and
-- dimensions (ADR 0151): vectors equal chunks. Its config hash names the model and
-- dimensions (`config_hashes` → `models`, `dimensions`: every model and dimensions that has
-- vectors, 0 for the model's own size, hashed by the invariants module as the stage hashes
-- its config; a hash that names none is an item done under a model and dimensions that no
-- vector has). Its spec hash names the chunker and extractor whose chunks it embedded
-- (`spec_hashes` → `extractors`, `chunkers`); where it names none known (an older
-- release's rows), one chunk with a vector will do.
-- Set-based: the chunks without a vector under each model and dimensions stored (an
-- anti-join each), joined to the done items that need them; done items without chunks
-- (another anti-join); only the few that break it are counted in detail.
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
    -- Chunks without a vector under a model and dimensions stored (few: those of documents
    -- not embedded yet under them), by one hash anti-join of the chunks with the vectors.
    -- The sets are unnested here, not read from the `sizes` CTE: a CTE scan would keep
    -- this join, the query's largest, from running in parallel.
    SELECT dc.doc_id, dc.extractor_version, dc.chunker_key, z.config_hash
    FROM replayable.doc_chunks dc
    CROSS JOIN unnest(%(config_hashes)s::text[], %(models)s::text[], %(dimensions)s::int[])
        AS z (config_hash, model, dimensions)
    LEFT JOIN replayable.embeddings e
        ON e.chunk_id = dc.chunk_id AND e.model = z.model AND e.dimensions = z.dimensions
    WHERE e.chunk_id IS NULL
), unembedded AS MATERIALIZED (
    -- The done items those chunks belong to, through stage_runs_current_uq.
    SELECT DISTINCT s.doc_id, s.item_key, z.model, z.dimensions, l.extractor_version,
           l.chunker_key
    FROM missing m
    JOIN replayable.stage_runs s
        ON s.stage = 'embed' AND s.doc_id = m.doc_id AND s.is_current AND s.status = 'done'
       AND s.config_hash = m.config_hash
    JOIN sizes z ON z.config_hash = m.config_hash
    JOIN lineage l
        ON l.spec_hash = s.spec_hash AND l.extractor_version = m.extractor_version
       AND l.chunker_key = m.chunker_key
), found AS MATERIALIZED (
    SELECT d.doc_id, d.item_key,
           'done, with ' || (
               SELECT count(*) FROM replayable.doc_chunks dc
               JOIN replayable.embeddings e
                 ON e.chunk_id = dc.chunk_id AND e.model = d.model
                AND e.dimensions = d.dimensions
               WHERE dc.doc_id = d.doc_id AND dc.extractor_version = d.extractor_version
                 AND dc.chunker_key = d.chunker_key)::text
               || ' vectors for ' || (
               SELECT count(*) FROM replayable.doc_chunks dc
               WHERE dc.doc_id = d.doc_id AND dc.extractor_version = d.extractor_version
                 AND dc.chunker_key = d.chunker_key)::text
               || ' chunks under ' || d.model
               || coalesce(' at ' || nullif(d.dimensions, 0)::text || ' dimensions', '')
               AS detail
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
           'done under a model and dimensions that no stored vector has (config hash '
               || d.config_hash || ')'
    FROM done d
    WHERE d.model IS NULL
    UNION ALL
    SELECT d.doc_id, d.item_key,
           'done, with no chunk that has a vector under ' || d.model
               || coalesce(' at ' || nullif(d.dimensions, 0)::text || ' dimensions', '')
    FROM done d
    WHERE d.model IS NOT NULL AND d.chunker_key IS NULL
      AND NOT EXISTS (
          SELECT 1 FROM replayable.doc_chunks dc
          JOIN replayable.embeddings e ON e.chunk_id = dc.chunk_id
          WHERE dc.doc_id = d.doc_id AND e.model = d.model AND e.dimensions = d.dimensions)
)
SELECT 'embed' AS stage, doc_id, item_key, detail, count(*) OVER () AS total
FROM found
ORDER BY doc_id
LIMIT %(limit)s
