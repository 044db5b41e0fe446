INSERT INTO replayable.embeddings (chunk_id, model, dimensions, dim, embedding) VALUES %s
ON CONFLICT (chunk_id, model, dimensions) DO NOTHING
