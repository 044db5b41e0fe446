-- How many vectors the index of a model and dimension will hold: its build's memory is
-- sized from it (ADR 0120). An index-only scan of embeddings (model, dim).
SELECT count(*) AS vectors
FROM replayable.embeddings
WHERE model = %(model)s AND dim = %(dim)s
