-- What the ledger's lineages can be made of, read by skipping through indexes (each a few
-- probes per distinct value): the code versions of current rows per stage
-- (stage_runs_current_version_idx) and the models at each dimensions they are stored at
-- (embeddings_size_idx; 0: the model's own size, ADR 0151). The invariants module hashes
-- every combination as the stages do, so that a done row's spec_hash names the outputs it
-- must have.
WITH RECURSIVE versions AS (
    (SELECT stage, code_version FROM replayable.stage_runs
     WHERE is_current ORDER BY stage, code_version LIMIT 1)
    UNION ALL
    SELECT n.stage, n.code_version
    FROM versions v
    CROSS JOIN LATERAL (
        SELECT s.stage, s.code_version FROM replayable.stage_runs s
        WHERE s.is_current AND (s.stage, s.code_version) > (v.stage, v.code_version)
        ORDER BY s.stage, s.code_version LIMIT 1
    ) n
), models AS (
    (SELECT model, dimensions FROM replayable.embeddings ORDER BY model, dimensions LIMIT 1)
    UNION ALL
    SELECT n.model, n.dimensions
    FROM models m
    CROSS JOIN LATERAL (
        SELECT e.model, e.dimensions FROM replayable.embeddings e
        WHERE (e.model, e.dimensions) > (m.model, m.dimensions)
        ORDER BY e.model, e.dimensions LIMIT 1
    ) n
)
SELECT 'version' AS kind, stage AS a, code_version AS b, NULL::int AS dimensions FROM versions
UNION ALL
SELECT 'model', model, NULL, dimensions FROM models
