-- A batch's documents' chunks, each with whether it has a vector under the model and
-- dimensions already (content-addressed, as chunks_missing_embedding.sql checks): a document
-- whose chunks all have one is ready, with nothing to send (ADR 0125).
SELECT dc.doc_id, dc.ordinal, dc.chunk_id,
       EXISTS (SELECT 1 FROM replayable.embeddings e
               WHERE e.chunk_id = dc.chunk_id AND e.model = %(model)s
                 AND e.dimensions = %(dimensions)s) AS embedded
FROM replayable.doc_chunks dc
WHERE dc.doc_id = ANY(%(doc_ids)s)
  AND dc.extractor_version = %(extractor_version)s AND dc.chunker_key = %(chunker_key)s
ORDER BY dc.doc_id, dc.ordinal
