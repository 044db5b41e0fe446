-- Claim chunks for a submission: a chunk another submission holds is not taken.
INSERT INTO replayable.provider_batch_chunks (model, chunk_id, submission)
SELECT %(model)s, c, %(submission)s FROM unnest(%(chunk_ids)s::text[]) AS c
ON CONFLICT (model, chunk_id) DO NOTHING
RETURNING chunk_id
