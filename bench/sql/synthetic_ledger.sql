-- A synthetic ledger of %(documents)s documents for the read-path benchmark (B7): every
-- document has a current row in each of the three stages (2 percent dead, 1.5 percent
-- failed, 0.1 percent running, the rest done; 1 percent of extract rows on an older code
-- version), a fifth of them has an older, superseded extract row, %(letters)s dead letters
-- (60 percent open, 30 percent redriven, 10 percent ignored) spread over 30 days with a
-- burst in the last hour, %(calls)s model calls over 1,000 runs (5 percent failed, 5 percent
-- retries), and two runs of 1,000 and 10,000 documents in run_docs.
INSERT INTO replayable.documents (doc_id, uri, size_bytes, first_seen)
SELECT encode(sha256(('doc-' || i)::bytea), 'hex'),
       '/corpus/' || (i %% 1000) || '/report-' || i || '.pdf',
       10000 + (i::bigint * 7919) %% 500000,
       now() - (i %% 43200) * interval '1 minute'
FROM generate_series(1, %(documents)s) AS i;

INSERT INTO replayable.stage_runs
    (stage, item_key, doc_id, status, attempts, error_class, error_kind, last_error,
     code_version, config_hash, spec_hash, is_current, dag_id, run_id, map_index, try_number,
     created_at, started_at, finished_at, updated_at)
SELECT s.stage,
       encode(sha256((s.stage || '-' || i)::bytea), 'hex'),
       encode(sha256(('doc-' || i)::bytea), 'hex'),
       st.status,
       CASE st.status WHEN 'dead' THEN 3 WHEN 'failed' THEN 1 ELSE 1 END,
       st.error_class,
       CASE WHEN st.error_class IS NULL THEN NULL
            WHEN st.status = 'dead' THEN 'terminal' ELSE 'retryable' END,
       CASE WHEN st.error_class IS NULL THEN NULL ELSE st.error_class || ': synthetic' END,
       CASE WHEN s.stage = 'extract' AND i %% 100 = 7 THEN '1.0' ELSE s.version END,
       'cfg', 'spec-' || s.stage, true,
       'document_pipeline', 'run-' || (i %% 1000), (i / 50) %% 1024, 1,
       now() - (i %% 43200) * interval '1 minute',
       now() - (i %% 43200) * interval '1 minute',
       now() - (i %% 43200) * interval '1 minute',
       now() - (i %% 43200) * interval '1 minute'
FROM generate_series(1, %(documents)s) AS i
CROSS JOIN (VALUES ('extract', 0, '1.1'), ('chunk', 17, '1.0'), ('embed', 31, '1.0'))
    AS s (stage, shift, version)
CROSS JOIN LATERAL (
    SELECT CASE WHEN (i + s.shift) %% 50 = 0 THEN 'dead'
                WHEN (i + s.shift) %% 200 IN (1, 2, 3) THEN 'failed'
                WHEN (i + s.shift) %% 1000 = 999 THEN 'running'
                ELSE 'done' END AS status,
           CASE WHEN (i + s.shift) %% 50 = 0
                     THEN (ARRAY['http_400', 'malformed', 'encrypted', 'timeout', 'memory',
                                 'oversize'])[1 + (i / 50) %% 6]
                WHEN (i + s.shift) %% 200 IN (1, 2, 3)
                     THEN (ARRAY['http_503', 'http_429', 'read_timeout', 'timeout'])[1 + i %% 4]
           END AS error_class
) AS st;

INSERT INTO replayable.stage_runs
    (stage, item_key, doc_id, status, attempts, code_version, config_hash, spec_hash,
     is_current, run_id, created_at, updated_at)
SELECT 'extract', encode(sha256(('extract-old-' || i)::bytea), 'hex'),
       encode(sha256(('doc-' || i)::bytea), 'hex'), 'done', 1, '0.9', 'cfg', 'spec-old',
       false, 'run-old', now() - interval '40 days', now() - interval '40 days'
FROM generate_series(1, %(documents)s / 5) AS i;

INSERT INTO replayable.dead_letters
    (stage, item_key, doc_id, error_class, error_kind, error, traceback, attempts,
     code_version, dag_id, run_id, map_index, status, owner, note, created_at)
SELECT s.stage, s.item_key, s.doc_id, s.error_class, 'terminal',
       s.error_class || ': synthetic failure', 'Traceback (most recent call last): ...', 3,
       s.code_version, s.dag_id, s.run_id, s.map_index,
       CASE WHEN n %% 10 < 6 THEN 'open' WHEN n %% 10 < 9 THEN 'redriven' ELSE 'ignored' END,
       CASE WHEN n %% 7 = 0 THEN 'oncall' END, NULL,
       CASE WHEN n <= 300 THEN now() - (n %% 60) * interval '1 minute'
            ELSE now() - (n %% 43200) * interval '1 minute' END
FROM (
    SELECT *, row_number() OVER (ORDER BY item_key) AS n
    FROM replayable.stage_runs
    WHERE status = 'dead' AND is_current
) s
WHERE n <= %(letters)s;

INSERT INTO replayable.model_calls
    (stage, item_key, attempt, call_try, status, http_status, latency_ms, n_inputs, tokens,
     idempotency_key, run_id, created_at, model, cost_usd)
SELECT 'embed', NULL, 1, CASE WHEN i %% 20 = 1 THEN 2 ELSE 1 END,
       CASE WHEN i %% 20 = 0 THEN 'http_503' ELSE 'ok' END,
       CASE WHEN i %% 20 = 0 THEN 503 ELSE 200 END,
       20 + (i * 37) %% 400, 32, CASE WHEN i %% 20 = 0 THEN 0 ELSE 6400 END,
       'bench-' || i, 'run-' || (i %% 1000), now() - (i %% 43200) * interval '1 minute',
       'text-embedding-3-small',
       CASE WHEN i %% 20 = 0 THEN NULL ELSE 6400 * 0.02 / 1000000 END
FROM generate_series(1, %(calls)s) AS i;

INSERT INTO replayable.runs (dag_id, run_id, documents, to_do, batches)
VALUES ('document_pipeline', 'run-small', 1000, 0, 0),
       ('document_pipeline', 'run-large', 10000, 0, 0);
-- The overview's newest runs, unreported, each with its share of the calls above (a
-- thousandth of them): their cost is summed from their calls.
INSERT INTO replayable.runs (dag_id, run_id, documents, to_do, batches, created_at)
SELECT 'document_pipeline', 'run-' || i, 1000, 1000, 4, now() + i * interval '1 second'
FROM generate_series(1, 10) AS i;

INSERT INTO replayable.run_docs (dag_id, run_id, doc_id)
SELECT 'document_pipeline', 'run-small', encode(sha256(('doc-' || i)::bytea), 'hex')
FROM generate_series(1, %(documents)s, greatest(%(documents)s / 1000, 1)) AS i
LIMIT 1000;

INSERT INTO replayable.run_docs (dag_id, run_id, doc_id)
SELECT 'document_pipeline', 'run-large', encode(sha256(('doc-' || i)::bytea), 'hex')
FROM generate_series(2, %(documents)s, greatest(%(documents)s / 10000, 1)) AS i
LIMIT 10000
