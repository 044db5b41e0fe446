-- Which of these provider input files a submission still needs: recorded as the input of a
-- submission not finished, or named after a submission still being sent (which finds and
-- uses it). A finished (collected or abandoned) submission's input is not needed: the
-- collect deletes it, and this sweep deletes it when that failed. One statement.
SELECT f.file_id
FROM unnest(%(file_ids)s::text[], %(submissions)s::text[]) AS f (file_id, submission)
WHERE EXISTS (
    SELECT 1 FROM replayable.provider_batches b
    WHERE (b.input_file_id = f.file_id AND b.status IN ('submitting', 'waiting'))
       OR (b.submission = f.submission AND b.input_file_id IS NULL
           AND b.status = 'submitting')
)
