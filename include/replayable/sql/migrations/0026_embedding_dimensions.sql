-- The dimensions a vector was asked at are part of its identity (ADR 0151): a chunk's vector
-- of a model is keyed (chunk_id, model, dimensions), where dimensions is the number the
-- request asked for, or 0 when it asked for none (the model's own size); dim stays the
-- vector's length, which the search casts to. A submission and its chunk claims carry the
-- dimensions too: a batch at one size never holds a chunk for a run at another.
--
-- Rows stored before are labelled once, in the guarded block below, from what the ledger
-- says was asked: a model's vectors of length L are L's when an embed item was ever keyed
-- by that model at dimensions L, unless items were keyed by its own size as well and L is
-- its longest length (the own size, which dimensions only shorten): then they serve both,
-- and are kept under each. Otherwise 0, the reading of the default (no dimensions). A
-- submission not finished is labelled by its lines' custom_id, which hashes the dimensions.
-- The search indexes, partial on (model, dim), are dropped: the next search of each model
-- and dimensions builds its own. Idempotent: the block runs while the column is missing.

DO $migration$
BEGIN
    IF EXISTS (SELECT 1 FROM information_schema.columns
               WHERE table_schema = 'replayable' AND table_name = 'embeddings'
                 AND column_name = 'dimensions') THEN
        RETURN;
    END IF;

    ALTER TABLE replayable.embeddings ADD COLUMN dimensions int NOT NULL DEFAULT 0;

    -- Every (model, length) stored, by a skip scan of embeddings_model_idx, with the config
    -- hashes an embed item of it at that length, or at the model's own size, is keyed by
    -- (replayable.keys.config_hash of replayable.stages.embed.key_config: sha256 of the
    -- canonical JSON, 16 hex digits).
    CREATE TEMP TABLE embedding_sizes ON COMMIT DROP AS
    WITH RECURSIVE pairs AS (
        (SELECT model, dim FROM replayable.embeddings ORDER BY model, dim LIMIT 1)
        UNION ALL
        SELECT n.model, n.dim
        FROM pairs p,
             LATERAL (SELECT e.model, e.dim FROM replayable.embeddings e
                      WHERE (e.model, e.dim) > (p.model, p.dim)
                      ORDER BY e.model, e.dim LIMIT 1) n
    ), keyed AS (
        SELECT DISTINCT config_hash FROM replayable.stage_runs WHERE stage = 'embed'
    )
    SELECT p.model, p.dim,
           EXISTS (SELECT 1 FROM keyed k WHERE k.config_hash = left(encode(sha256(convert_to(
               '{"dimensions":' || p.dim || ',"model":' || to_json(p.model)::text || '}',
               'UTF8')), 'hex'), 16)) AS asked,
           EXISTS (SELECT 1 FROM keyed k WHERE k.config_hash = left(encode(sha256(convert_to(
               '{"dimensions":null,"model":' || to_json(p.model)::text || '}',
               'UTF8')), 'hex'), 16)) AS own_asked,
           p.dim = max(p.dim) OVER (PARTITION BY p.model) AS longest
    FROM pairs p;

    UPDATE replayable.embeddings e SET dimensions = e.dim
    FROM embedding_sizes s
    WHERE s.model = e.model AND s.dim = e.dim AND s.asked AND NOT (s.own_asked AND s.longest);

    ALTER TABLE replayable.embeddings DROP CONSTRAINT IF EXISTS embeddings_pkey;
    ALTER TABLE replayable.embeddings ADD PRIMARY KEY (chunk_id, model, dimensions);

    INSERT INTO replayable.embeddings (chunk_id, model, dimensions, dim, embedding, created_at)
    SELECT e.chunk_id, e.model, e.dim, e.dim, e.embedding, e.created_at
    FROM replayable.embeddings e
    JOIN embedding_sizes s ON s.model = e.model AND s.dim = e.dim
    WHERE e.dimensions = 0 AND s.asked AND s.own_asked AND s.longest;

    -- Submissions and their claims. A submission's dimensions are those its first line's
    -- custom_id was hashed with (replayable.stages.embed.store.request_key): the model's own
    -- size ('None') first, then each size a request may ask for.
    ALTER TABLE replayable.provider_batches ADD COLUMN dimensions int NOT NULL DEFAULT 0;
    UPDATE replayable.provider_batches b SET dimensions = found.dimensions
    FROM (
        SELECT DISTINCT ON (l.submission) l.submission, l.custom_id, l.chunk_ids, s.model
        FROM replayable.provider_batches s
        JOIN replayable.provider_batch_lines l ON l.submission = s.submission
        WHERE s.status IN ('submitting', 'waiting')
        ORDER BY l.submission, l.custom_id
    ) line
    CROSS JOIN LATERAL (
        SELECT string_agg(convert_to(c, 'UTF8'), '\x00'::bytea ORDER BY c COLLATE "C") AS ids
        FROM unnest(line.chunk_ids) AS c
    ) chunks
    CROSS JOIN LATERAL (
        SELECT d.dimensions
        FROM (SELECT 'None' AS asked, 0 AS dimensions
              UNION ALL
              SELECT n::text, n FROM generate_series(1, 8192) AS n) d
        WHERE line.custom_id = 'replayable-embed-' || left(encode(sha256(
            convert_to(line.model, 'UTF8') || '\x00'::bytea || convert_to(d.asked, 'UTF8')
            || '\x00'::bytea || chunks.ids), 'hex'), 40)
        LIMIT 1
    ) found
    WHERE b.submission = line.submission;

    ALTER TABLE replayable.provider_batch_chunks ADD COLUMN dimensions int NOT NULL DEFAULT 0;
    UPDATE replayable.provider_batch_chunks c SET dimensions = b.dimensions
    FROM replayable.provider_batches b
    WHERE b.submission = c.submission AND b.dimensions <> 0;
    ALTER TABLE replayable.provider_batch_chunks DROP CONSTRAINT IF EXISTS provider_batch_chunks_pkey;
    ALTER TABLE replayable.provider_batch_chunks ADD PRIMARY KEY (model, dimensions, chunk_id);

    -- Partial on (model, dim), they would mix two sizes of one length: dropped, and built
    -- again per (model, dimensions, dim) by the next search of each (search/index.py).
    DECLARE
        index_row record;
    BEGIN
        FOR index_row IN
            SELECT indexname FROM pg_indexes
            WHERE schemaname = 'replayable' AND indexname LIKE 'embeddings\_hnsw\_%'
        LOOP
            EXECUTE format('DROP INDEX replayable.%I', index_row.indexname);
        END LOOP;
    END;
END
$migration$;

-- What a search and the check skip-scan for: the sizes each model is stored at.
CREATE INDEX IF NOT EXISTS embeddings_size_idx ON replayable.embeddings (model, dimensions, dim);
DROP INDEX IF EXISTS replayable.embeddings_model_idx;
