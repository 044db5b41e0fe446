-- The chunks nearest a query vector (cosine) among the embeddings of current documents
-- (not retracted, ADR 0138) under the settings searched, as best_chunks.sql scopes them
-- (ADR 0152), through the HNSW index of the model, dimensions and length (ADR 0119, 0151):
-- the index gives the %(pool)s nearest vectors of the model at those dimensions, and of
-- those the current ones are kept. The caller searches exactly when fewer than it asked
-- for are left. {dim} is the vectors' length, an integer the caller formats in: pgvector
-- indexes a typed dimension only.
WITH nearest AS MATERIALIZED (
    SELECT e.chunk_id,
           e.embedding::vector({dim}) <=> %(vector)s::vector({dim}) AS distance
    FROM replayable.embeddings e
    WHERE e.model = %(model)s AND e.dimensions = %(dimensions)s AND e.dim = {dim}
    ORDER BY e.embedding::vector({dim}) <=> %(vector)s::vector({dim})
    LIMIT %(pool)s
)
SELECT dc.doc_id, d.uri, dc.ordinal, n.chunk_id, 1 - n.distance AS score,
       left(c.text, %(snippet)s) AS snippet, (SELECT count(*) FROM nearest) AS pooled
FROM nearest n
JOIN replayable.doc_chunks dc
  ON dc.chunk_id = n.chunk_id AND dc.extractor_version = %(extractor_version)s
 AND dc.chunker_key = %(chunker_key)s
JOIN replayable.documents d ON d.doc_id = dc.doc_id AND d.retracted_at IS NULL
JOIN replayable.chunks c ON c.chunk_id = n.chunk_id
WHERE (%(source)s::text IS NULL OR starts_with(d.uri, %(source)s::text))
  AND EXISTS (SELECT 1 FROM replayable.stage_runs s
              WHERE s.doc_id = dc.doc_id AND s.stage = 'embed' AND s.status = 'done'
                AND s.config_hash = %(config_hash)s)
ORDER BY n.distance, dc.doc_id, dc.ordinal
LIMIT %(k)s
