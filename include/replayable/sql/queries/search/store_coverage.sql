-- A count of what a search of these settings covers (ADR 0152), as of its transaction.
INSERT INTO replayable.search_coverage AS c
    (config_hash, extractor_version, chunker_key, documents, left_out, counted_at)
VALUES (%(config_hash)s, %(extractor_version)s, %(chunker_key)s, %(documents)s,
        %(left_out)s::jsonb, now())
ON CONFLICT (config_hash, extractor_version, chunker_key) DO UPDATE
SET documents = EXCLUDED.documents, left_out = EXCLUDED.left_out,
    counted_at = EXCLUDED.counted_at
RETURNING counted_at
