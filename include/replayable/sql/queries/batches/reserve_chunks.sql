-- Claim chunks for a submission: a chunk another submission holds under the model and
-- dimensions is not taken, nor one that has its vector under them. The claim is taken under
-- each chunk's lock, the one a sync request holds while it buys the chunk
-- (stages/lock_free_chunks, ADR 0130): it waits for such a request (in chunk order, so
-- claims never wait on each other in a cycle), then, in a statement of its own that sees
-- what that request stored, leaves its chunks out.
SELECT count(pg_advisory_xact_lock(
    hashtextextended(c || '/' || %(model)s || '/' || %(dimensions)s::int, 0)))
FROM (SELECT DISTINCT c FROM unnest(%(chunk_ids)s::text[]) AS c ORDER BY c) AS chunks;

INSERT INTO replayable.provider_batch_chunks (model, dimensions, chunk_id, submission)
SELECT %(model)s, %(dimensions)s, c, %(submission)s FROM unnest(%(chunk_ids)s::text[]) AS c
WHERE NOT EXISTS (SELECT 1 FROM replayable.embeddings e
                  WHERE e.chunk_id = c AND e.model = %(model)s
                    AND e.dimensions = %(dimensions)s)
ON CONFLICT (model, dimensions, chunk_id) DO NOTHING
RETURNING chunk_id
