-- The models and dimensions the ledger holds vectors of, in order: a skip scan of the
-- (model, dim) index, one probe per pair, so it reads a handful of index pages whatever the
-- number of vectors. A search names them when the one asked for has none.
WITH RECURSIVE pairs AS (
    (SELECT model, dim FROM replayable.embeddings ORDER BY model, dim LIMIT 1)
    UNION ALL
    SELECT n.model, n.dim
    FROM pairs p,
         LATERAL (SELECT e.model, e.dim FROM replayable.embeddings e
                  WHERE (e.model, e.dim) > (p.model, p.dim)
                  ORDER BY e.model, e.dim LIMIT 1) n
)
SELECT model, dim FROM pairs
