-- How many vectors the index of a model, dimensions and length will hold: its build's
-- memory is sized from it (ADR 0120). An index-only scan of embeddings_size_idx.
SELECT count(*) AS vectors
FROM replayable.embeddings
WHERE model = %(model)s AND dimensions = %(dimensions)s AND dim = %(dim)s
