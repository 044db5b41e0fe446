-- Which of these provider files are a submission's: recorded as its input, or named after a
-- submission still being sent (which finds and uses it). One statement for every candidate.
SELECT f.file_id
FROM unnest(%(file_ids)s::text[], %(submissions)s::text[]) AS f (file_id, submission)
WHERE EXISTS (
    SELECT 1 FROM replayable.provider_batches b
    WHERE b.input_file_id = f.file_id
       OR (b.submission = f.submission AND b.input_file_id IS NULL
           AND b.status = 'submitting')
)
