INSERT INTO replayable.provider_batch_lines (submission, custom_id, chunk_ids) VALUES %s
ON CONFLICT DO NOTHING
