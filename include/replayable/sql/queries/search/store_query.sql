-- Keep a question's vector (ADR 0142); a question stored already keeps its own.
INSERT INTO replayable.query_vectors (model, dimensions, query_hash, embedding)
VALUES (%(model)s, %(dimensions)s, %(query_hash)s, %(embedding)s::vector)
ON CONFLICT DO NOTHING
