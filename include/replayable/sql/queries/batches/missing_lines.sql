-- Lines an expired or cancelled batch never ran, holding any of these chunks: sent again
-- as they were, under the same custom_id.
SELECT submission, custom_id, chunk_ids FROM replayable.provider_batch_lines
WHERE status = 'missing' AND chunk_ids && %(chunk_ids)s::text[]
