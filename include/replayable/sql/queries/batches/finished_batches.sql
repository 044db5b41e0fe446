-- Which of these provider batches are ours and finished (collected or abandoned): their
-- output and error files are no longer needed.
SELECT batch_id FROM replayable.provider_batches
WHERE batch_id = ANY(%(batch_ids)s::text[]) AND status IN ('collected', 'abandoned')
