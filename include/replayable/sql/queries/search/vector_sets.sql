-- The models, dimensions (0: the model's own size, ADR 0151) and vector lengths the ledger
-- holds vectors of, in order: a skip scan of embeddings_size_idx, one probe per set, so it
-- reads a handful of index pages whatever the number of vectors. A search names them when
-- the one asked for has none.
WITH RECURSIVE sets AS (
    (SELECT model, dimensions, dim FROM replayable.embeddings
     ORDER BY model, dimensions, dim LIMIT 1)
    UNION ALL
    SELECT n.model, n.dimensions, n.dim
    FROM sets p,
         LATERAL (SELECT e.model, e.dimensions, e.dim FROM replayable.embeddings e
                  WHERE (e.model, e.dimensions, e.dim) > (p.model, p.dimensions, p.dim)
                  ORDER BY e.model, e.dimensions, e.dim LIMIT 1) n
)
SELECT model, dimensions, dim FROM sets
