-- The chunks nearest a query vector (cosine), among the embeddings of current documents
-- (not retracted, ADR 0138) under the settings the search names (ADR 0152): a document
-- with an embed item done for the model and dimensions (its config hash, whichever run or
-- chunker it was done under), through its chunks under the chunker and extractor named.
-- Exact search: it reads every vector of the model at the dimensions searched (0: its own
-- size, ADR 0151) that has the question's length (ADR 0118); a vector asked at other
-- dimensions, or of another length, is never compared with it.
SELECT dc.doc_id, d.uri, dc.ordinal, e.chunk_id,
       1 - (e.embedding <=> %(vector)s::vector) AS score,
       left(c.text, %(snippet)s) AS snippet
FROM replayable.doc_chunks dc
JOIN replayable.embeddings e
  ON e.chunk_id = dc.chunk_id AND e.model = %(model)s AND e.dimensions = %(dimensions)s
 AND e.dim = %(dim)s
JOIN replayable.documents d ON d.doc_id = dc.doc_id AND d.retracted_at IS NULL
JOIN replayable.chunks c ON c.chunk_id = dc.chunk_id
WHERE dc.extractor_version = %(extractor_version)s AND dc.chunker_key = %(chunker_key)s
  AND EXISTS (SELECT 1 FROM replayable.stage_runs s
              WHERE s.doc_id = dc.doc_id AND s.stage = 'embed' AND s.status = 'done'
                AND s.config_hash = %(config_hash)s)
  AND (%(source)s::text IS NULL OR starts_with(d.uri, %(source)s::text))
ORDER BY e.embedding <=> %(vector)s::vector, dc.doc_id, dc.ordinal
LIMIT %(k)s
