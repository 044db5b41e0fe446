INSERT INTO replayable.doc_chunks (doc_id, extractor_version, chunker_key, ordinal, chunk_id)
VALUES %s
ON CONFLICT (doc_id, extractor_version, chunker_key, ordinal) DO NOTHING
