-- Lines an expired or cancelled batch of the model and dimensions never ran, holding any of
-- these chunks: sent again as they were, under the same custom_id (which names the model
-- and dimensions, so a line of another size is never sent as this one's).
SELECT l.submission, l.custom_id, l.chunk_ids FROM replayable.provider_batch_lines l
JOIN replayable.provider_batches b ON b.submission = l.submission
WHERE l.status = 'missing' AND l.chunk_ids && %(chunk_ids)s::text[]
  AND b.model = %(model)s AND b.dimensions = %(dimensions)s
