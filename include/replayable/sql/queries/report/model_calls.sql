SELECT count(*) AS calls,
       count(*) FILTER (WHERE status = 'ok') AS ok,
       coalesce(sum(n_inputs) FILTER (WHERE status = 'ok'), 0) AS inputs,
       coalesce(sum(tokens), 0) AS tokens
FROM replayable.model_calls
WHERE run_id = %(run_id)s
