-- Lock every chunk that no other worker holds under the model and dimensions, in one round
-- trip. The locks last until the transaction that stores the embeddings commits, so two
-- workers never pay for one chunk; batches/reserve_chunks.sql takes the same locks.
SELECT chunk_id
FROM unnest(%(chunk_ids)s::text[]) AS c (chunk_id)
WHERE pg_try_advisory_xact_lock(
    hashtextextended(chunk_id || '/' || %(model)s || '/' || %(dimensions)s::int, 0))
