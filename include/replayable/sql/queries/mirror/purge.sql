-- Remove what retracted documents alone held, once they have been out of search for
-- retention_days (ADR 0138): their links to chunks, the chunks and vectors no other
-- document links (a chunk shared with a current or a younger retracted document stays),
-- their text and artifact links, and their stage rows (first made not current, which the
-- counters follow), so a document found again after this is done again like a new one. At most `limit` documents, oldest retraction first,
-- through the partial index. Returns how many were purged.
CREATE TEMP TABLE purge_docs ON COMMIT DROP AS
SELECT doc_id FROM replayable.documents
WHERE retracted_at IS NOT NULL AND purged_at IS NULL
  AND retracted_at < now() - make_interval(secs => %(retention_days)s * 86400)
ORDER BY retracted_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

CREATE TEMP TABLE purge_chunks ON COMMIT DROP AS
SELECT DISTINCT dc.chunk_id
FROM replayable.doc_chunks dc JOIN purge_docs p USING (doc_id);

DELETE FROM replayable.doc_chunks dc USING purge_docs p WHERE dc.doc_id = p.doc_id;

DELETE FROM purge_chunks p
WHERE EXISTS (SELECT 1 FROM replayable.doc_chunks dc WHERE dc.chunk_id = p.chunk_id)
   OR EXISTS (SELECT 1 FROM replayable.provider_batch_chunks b WHERE b.chunk_id = p.chunk_id);

DELETE FROM replayable.embeddings e USING purge_chunks p WHERE e.chunk_id = p.chunk_id;
DELETE FROM replayable.chunks c USING purge_chunks p WHERE c.chunk_id = p.chunk_id;
DELETE FROM replayable.extractions x USING purge_docs p WHERE x.doc_id = p.doc_id;
DELETE FROM replayable.item_artifacts a USING purge_docs p WHERE a.doc_id = p.doc_id;

UPDATE replayable.stage_runs s SET is_current = false
FROM purge_docs p
WHERE s.doc_id = p.doc_id AND s.is_current;
DELETE FROM replayable.stage_runs s USING purge_docs p WHERE s.doc_id = p.doc_id;

UPDATE replayable.documents d SET purged_at = now()
FROM purge_docs p
WHERE d.doc_id = p.doc_id
RETURNING d.doc_id
