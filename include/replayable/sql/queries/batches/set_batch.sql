UPDATE replayable.provider_batches
SET batch_id = %(batch_id)s, provider_status = %(provider_status)s, status = 'waiting',
    updated_at = now()
WHERE submission = %(submission)s
