-- A collected submission gives its chunks back: a missing line's are sent again.
WITH freed AS (
    DELETE FROM replayable.provider_batch_chunks WHERE submission = %(submission)s
)
UPDATE replayable.provider_batches
SET status = 'collected', provider_status = %(provider_status)s, collected_at = now(),
    updated_at = now()
WHERE submission = %(submission)s
