-- Billable calls per stage; with a run id, only the calls that run made.
SELECT stage,
       count(*) AS calls,
       count(*) FILTER (WHERE status = 'ok') AS ok,
       coalesce(sum(tokens), 0) AS tokens
FROM replayable.model_calls
WHERE %(run_id)s::text IS NULL OR run_id = %(run_id)s::text
GROUP BY stage
