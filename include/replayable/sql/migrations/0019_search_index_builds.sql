-- Search index builds that failed (ADR 0137): a concurrent HNSW build that fails leaves an
-- invalid index behind. The failure is recorded here, so that the searches after it read
-- every vector instead of each dropping the index and building it again; one retries once
-- the pause has passed. A successful build deletes its row.
CREATE TABLE IF NOT EXISTS replayable.search_index_builds (
    name        text PRIMARY KEY,
    failed_at   timestamptz NOT NULL DEFAULT now(),
    failures    int NOT NULL DEFAULT 1,
    error       text NOT NULL
);
