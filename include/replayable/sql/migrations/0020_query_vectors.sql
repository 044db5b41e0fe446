-- The vectors of the questions searched (ADR 0142), by model, the dimensions asked for (0:
-- the model's own) and the question's digest: the same question of the same model costs no
-- second call, whatever the provider de-duplicates.
CREATE TABLE IF NOT EXISTS replayable.query_vectors (
    model       text NOT NULL,
    dimensions  int NOT NULL,
    query_hash  text NOT NULL,
    embedding   vector NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (model, dimensions, query_hash)
);
