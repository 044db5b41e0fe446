-- Whether the ledger holds a vector of the model (at the dimensions, when given: 0 is the
-- model's own size), through embeddings_size_idx.
SELECT EXISTS (SELECT 1 FROM replayable.embeddings
               WHERE model = %(model)s
                 AND (%(dimensions)s::int IS NULL OR dimensions = %(dimensions)s::int)) AS found
