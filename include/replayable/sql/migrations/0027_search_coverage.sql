-- What a search covered (ADR 0152), counted at most every few minutes per settings: the
-- count reads every current embed item (about 5 s at a million documents), too much for
-- each search. A row is counted again when it is older than the search's freshness bound
-- or than the newest run report. One row per settings searched. Idempotent.
CREATE TABLE IF NOT EXISTS replayable.search_coverage (
    config_hash         text NOT NULL,      -- the embed stage's key config (model, dimensions)
    extractor_version   text NOT NULL,
    chunker_key         text NOT NULL,
    documents           bigint NOT NULL,
    left_out            jsonb NOT NULL,     -- {"other_settings": n, "failed": n, ...}
    counted_at          timestamptz NOT NULL,
    PRIMARY KEY (config_hash, extractor_version, chunker_key)
);
