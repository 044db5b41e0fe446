-- The vector stored for a question (ADR 0142), as text.
SELECT embedding::text AS embedding FROM replayable.query_vectors
WHERE model = %(model)s AND dimensions = %(dimensions)s AND query_hash = %(query_hash)s
