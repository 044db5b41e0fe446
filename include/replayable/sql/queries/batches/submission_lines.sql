SELECT custom_id, chunk_ids, status FROM replayable.provider_batch_lines
WHERE submission = %(submission)s
ORDER BY custom_id
