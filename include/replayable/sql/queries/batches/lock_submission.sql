-- One worker at a time sends or collects a submission; another one skips it and waits.
SELECT submission, provider, model, dimensions, input_file_id, batch_id, status, run_id,
       extract(epoch FROM created_at)::float8 AS created_at
FROM replayable.provider_batches
WHERE submission = %(submission)s
FOR UPDATE SKIP LOCKED
