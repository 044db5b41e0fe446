-- Whether a provider file is a submission's: recorded as its input, or named after a
-- submission still being sent (which finds and uses it).
SELECT 1 FROM replayable.provider_batches
WHERE input_file_id = %(file_id)s
   OR (submission = %(submission)s AND input_file_id IS NULL AND status = 'submitting')
