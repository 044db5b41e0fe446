-- Billable calls per stage: from the counters, or, for one run, from its own calls.
SELECT stage, sum(calls) AS calls, sum(ok) AS ok, sum(tokens) AS tokens
FROM (
    SELECT stage, calls, CASE WHEN status = 'ok' THEN calls ELSE 0 END AS ok, tokens
    FROM replayable.model_call_counts
    WHERE %(run_id)s::text IS NULL
    UNION ALL
    SELECT stage, 1, (status = 'ok')::int, tokens
    FROM replayable.model_calls
    WHERE run_id = %(run_id)s::text
) counted
GROUP BY stage
