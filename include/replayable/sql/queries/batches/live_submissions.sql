-- The submissions not collected yet that hold any of these chunks under the model and
-- dimensions (ADR 0117, 0151).
SELECT DISTINCT b.submission, b.provider, b.batch_id, b.status, b.run_id,
       extract(epoch FROM b.created_at)::float8 AS created_at
FROM replayable.provider_batch_chunks c
JOIN replayable.provider_batches b ON b.submission = c.submission
WHERE c.model = %(model)s AND c.dimensions = %(dimensions)s
  AND c.chunk_id = ANY(%(chunk_ids)s::text[])
ORDER BY b.submission
