-- The chunks nearest a query vector (cosine), among the current embeddings of current
-- documents (not retracted, ADR 0138): a document whose embed item is done under the spec
-- the search names (model, dimensions, chunker, extractor), through its chunks under that
-- chunker and extractor.
-- Exact search: it reads every such vector of the question's dimension (ADR 0118); a vector
-- of another dimension is never compared with it.
SELECT dc.doc_id, d.uri, dc.ordinal, e.chunk_id,
       1 - (e.embedding <=> %(vector)s::vector) AS score,
       left(c.text, %(snippet)s) AS snippet
FROM replayable.stage_runs s
JOIN replayable.doc_chunks dc
  ON dc.doc_id = s.doc_id AND dc.extractor_version = %(extractor_version)s
 AND dc.chunker_key = %(chunker_key)s
JOIN replayable.embeddings e
  ON e.chunk_id = dc.chunk_id AND e.model = %(model)s AND e.dim = %(dim)s
JOIN replayable.documents d ON d.doc_id = s.doc_id AND d.retracted_at IS NULL
JOIN replayable.chunks c ON c.chunk_id = dc.chunk_id
WHERE s.stage = 'embed' AND s.is_current AND s.status = 'done'
  AND s.spec_hash = %(spec_hash)s
  AND (%(source)s::text IS NULL OR starts_with(d.uri, %(source)s::text))
ORDER BY e.embedding <=> %(vector)s::vector, dc.doc_id, dc.ordinal
LIMIT %(k)s
