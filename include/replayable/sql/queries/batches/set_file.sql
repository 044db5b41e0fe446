UPDATE replayable.provider_batches SET input_file_id = %(file_id)s, updated_at = now()
WHERE submission = %(submission)s
