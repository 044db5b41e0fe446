INSERT INTO replayable.documents (doc_id, uri, size_bytes)
VALUES %s
ON CONFLICT (doc_id) DO NOTHING
