-- A consistent synthetic ledger of %(documents)s documents for the invariant check (B17): a
-- deployment's shape, in which every invariant holds. Each document falls in bucket
-- (i * 7919) %% 1000, which decides its state: 1 percent dead in chunk (empty text), 2 percent
-- dead in embed (a refused chunk), 1 percent failed in embed, 0.5 percent embedding in a
-- live batch, 0.2 percent running under an expired lease (in flight), the rest embedded; one
-- in ten summarized, one in five with an older embed row, one in fifty letters of an earlier
-- death already redriven. Each document has two chunks: its own, and one of 1,000 it shares
-- with others. Spec hashes are the stages' own (the caller computes them), so the check
-- reads each done row's outputs under its real lineage.
CREATE TEMP TABLE synthetic ON COMMIT DROP AS
SELECT i, encode(sha256(int8send(i)), 'hex') AS doc_id, (i * 7919) %% 1000 AS b,
       encode(sha256(convert_to('own-' || i, 'UTF8')), 'hex') AS own_chunk,
       encode(sha256(convert_to('shared-' || i %% 1000, 'UTF8')), 'hex') AS shared_chunk,
       now() - make_interval(mins => (i %% 43200)::int) AS at
FROM generate_series(1, %(documents)s::bigint) AS i;

INSERT INTO replayable.documents (doc_id, uri, size_bytes, first_seen)
SELECT doc_id, '/synthetic/' || i || '.pdf', 10000 + i %% 90000, at FROM synthetic;

INSERT INTO replayable.extractions
    (doc_id, extractor_version, page_count, text, text_sha256, engine, created_at)
SELECT doc_id, %(extractor)s, 1, 'Report ' || i, encode(sha256(convert_to('Report ' || i, 'UTF8')), 'hex'),
       'pdfium', at
FROM synthetic;

INSERT INTO replayable.stage_runs
    (stage, item_key, doc_id, status, attempts, code_version, config_hash, spec_hash,
     is_current, started_at, finished_at, updated_at, created_at, dag_id, run_id)
SELECT 'extract', 'x-' || doc_id, doc_id, 'done', 1, %(extract_version)s,
       %(extract_config)s, %(extract_spec)s, true, at, at, at, at, 'document_pipeline',
       'synthetic'
FROM synthetic;

INSERT INTO replayable.stage_runs
    (stage, item_key, doc_id, status, attempts, error_class, error_kind, last_error,
     code_version, config_hash, spec_hash, is_current, started_at, finished_at, updated_at,
     created_at, dag_id, run_id)
SELECT 'chunk', 'c-' || doc_id, doc_id, CASE WHEN b < 10 THEN 'dead' ELSE 'done' END, 1,
       CASE WHEN b < 10 THEN 'empty_text' END, CASE WHEN b < 10 THEN 'terminal' END,
       CASE WHEN b < 10 THEN 'the extracted text has no words' END,
       %(chunk_version)s, %(chunk_config)s, %(chunk_spec)s, true, at, at, at, at,
       'document_pipeline', 'synthetic'
FROM synthetic;

INSERT INTO replayable.chunks (chunk_id, text)
SELECT own_chunk, 'Report ' || i FROM synthetic WHERE b >= 10
UNION ALL
SELECT DISTINCT shared_chunk, 'Shared boilerplate ' || i %% 1000 FROM synthetic WHERE b >= 10;

INSERT INTO replayable.doc_chunks (doc_id, extractor_version, chunker_key, ordinal, chunk_id)
SELECT doc_id, %(extractor)s, %(chunker)s, 0, own_chunk FROM synthetic WHERE b >= 10
UNION ALL
SELECT doc_id, %(extractor)s, %(chunker)s, 1, shared_chunk FROM synthetic WHERE b >= 10;

INSERT INTO replayable.stage_runs
    (stage, item_key, doc_id, status, attempts, error_class, error_kind, last_error,
     code_version, config_hash, spec_hash, is_current, lease_owner, lease_expires,
     started_at, finished_at, updated_at, created_at, dag_id, run_id)
SELECT 'embed', 'e-' || doc_id, doc_id,
       CASE WHEN b < 30 THEN 'dead' WHEN b < 40 THEN 'failed' WHEN b < 47 THEN 'running'
            ELSE 'done' END,
       CASE WHEN b < 30 THEN 1 ELSE 2 END,
       CASE WHEN b < 30 THEN 'http_400' WHEN b < 40 THEN 'http_503' END,
       CASE WHEN b < 30 THEN 'terminal' WHEN b < 40 THEN 'retryable' END,
       CASE WHEN b < 40 THEN 'synthetic failure' END,
       %(embed_version)s, %(embed_config)s, %(embed_spec)s, true,
       CASE WHEN b >= 40 AND b < 47 THEN 'worker-' || i %% 7 END,
       CASE WHEN b >= 40 AND b < 45 THEN now() + interval '10 minutes'
            WHEN b >= 45 AND b < 47 THEN now() - interval '10 minutes' END,
       at, CASE WHEN b < 40 OR b >= 47 THEN at END, at, at, 'document_pipeline', 'synthetic'
FROM synthetic
WHERE b >= 10;

INSERT INTO replayable.stage_runs
    (stage, item_key, doc_id, status, attempts, code_version, config_hash, spec_hash,
     is_current, started_at, finished_at, updated_at, created_at, dag_id, run_id)
SELECT 'embed', 'e-old-' || doc_id, doc_id, 'done', 1, '0.9', 'old', %(old_embed_spec)s, false,
       at - interval '60 days', at - interval '60 days', at - interval '60 days',
       at - interval '60 days', 'document_pipeline', 'synthetic-old'
FROM synthetic
WHERE b >= 10 AND i %% 5 = 0;

INSERT INTO replayable.embeddings (chunk_id, model, dim, embedding)
SELECT own_chunk, %(model)s, 4, '[0.1, 0.2, 0.3, 0.4]'::vector FROM synthetic WHERE b >= 47
UNION ALL
SELECT DISTINCT shared_chunk, %(model)s, 4, '[0.4, 0.3, 0.2, 0.1]'::vector
FROM synthetic WHERE b >= 10;

INSERT INTO replayable.dead_letters
    (stage, item_key, doc_id, error_class, error_kind, error, attempts, code_version, dag_id,
     run_id, status, created_at, resolved_at, resolved_by)
SELECT stage, item_key, doc_id, error_class, error_kind, last_error, attempts, code_version,
       dag_id, run_id, 'open', updated_at, NULL, NULL
FROM replayable.stage_runs
WHERE is_current AND status = 'dead'
UNION ALL
SELECT 'embed', 'e-' || doc_id, doc_id, 'http_503', 'retryable', 'an earlier death', 3,
       %(embed_version)s, 'document_pipeline', 'synthetic-old', 'redriven', at - interval '1 day',
       at - interval '12 hours', 'redrive'
FROM synthetic
WHERE b >= 10 AND i %% 50 = 0;

INSERT INTO replayable.artifacts (stage, artifact_key, data)
SELECT 'summarize', 'sum-' || doc_id, jsonb_build_object('summary', 'Report ' || i)
FROM synthetic WHERE b >= 47 AND i %% 10 = 0;

INSERT INTO replayable.stage_runs
    (stage, item_key, doc_id, status, attempts, code_version, config_hash, spec_hash,
     is_current, started_at, finished_at, updated_at, created_at, dag_id, run_id)
SELECT 'summarize', 's-' || doc_id, doc_id, 'done', 1, '1.0', 'summary', 'spec-summary',
       true, at, at, at, at, 'document_pipeline', 'synthetic'
FROM synthetic WHERE b >= 47 AND i %% 10 = 0;

INSERT INTO replayable.item_artifacts (stage, item_key, doc_id, artifact_key)
SELECT 'summarize', 's-' || doc_id, doc_id, 'sum-' || doc_id
FROM synthetic WHERE b >= 47 AND i %% 10 = 0;

-- Batch mode: an older submission collected (its claims released), and one the provider
-- still has, claiming the own chunks of the documents embedding under a live lease.
INSERT INTO replayable.provider_batches (submission, provider, model, status, lines, inputs)
VALUES ('sub-collected', 'http://provider', %(model)s, 'collected', 1, 1),
       ('sub-waiting', 'http://provider', %(model)s, 'waiting', 1, 1);

INSERT INTO replayable.provider_batch_chunks (model, chunk_id, submission)
SELECT %(model)s, own_chunk, 'sub-waiting' FROM synthetic WHERE b >= 40 AND b < 45;

INSERT INTO replayable.runs (dag_id, run_id, documents, to_do, batches)
VALUES ('document_pipeline', 'synthetic', %(documents)s, %(documents)s, 1);

INSERT INTO replayable.run_reports (dag_id, run_id, report)
SELECT 'document_pipeline', 'synthetic',
       jsonb_build_object('documents', %(documents)s::bigint, 'stages', jsonb_build_object(
           'extract', jsonb_build_object('done', count(*), 'not_entered', 0),
           'chunk', jsonb_build_object('done', count(*) FILTER (WHERE b >= 10),
                                       'dead', count(*) FILTER (WHERE b < 10),
                                       'not_entered', 0)))
FROM synthetic
