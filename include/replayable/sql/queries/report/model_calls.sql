-- A run's billable requests: in all, and by stage. Inputs are the chunks the embed stage
-- sent (a chat request carries one document, and is counted in its stage's calls).
WITH calls AS (
    SELECT stage, status, n_inputs, tokens FROM replayable.model_calls WHERE run_id = %(run_id)s
)
SELECT count(*) AS calls,
       count(*) FILTER (WHERE status = 'ok') AS ok,
       count(*) FILTER (WHERE status = 'truncated') AS truncated,
       coalesce(sum(n_inputs) FILTER (WHERE status = 'ok' AND stage = 'embed'), 0) AS inputs,
       coalesce(sum(tokens), 0) AS tokens,
       (SELECT coalesce(jsonb_object_agg(stage, n), '{}')
        FROM (SELECT stage, count(*) AS n FROM calls GROUP BY stage) AS per_stage) AS by_stage
FROM calls
