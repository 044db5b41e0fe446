INSERT INTO replayable.chunks (chunk_id, text) VALUES %s
ON CONFLICT (chunk_id) DO NOTHING
