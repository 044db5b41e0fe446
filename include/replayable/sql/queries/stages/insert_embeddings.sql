INSERT INTO replayable.embeddings (chunk_id, model, dim, embedding) VALUES %s
ON CONFLICT (chunk_id, model) DO NOTHING
