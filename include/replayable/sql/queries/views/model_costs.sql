-- What billed model calls cost (a 2xx with its usage, refusals too: ADR 0114), by model and mode (ADR 0110): for one run, its own calls;
-- otherwise the counters of the last `days` days (UTC), today included. usd leaves out the
-- calls whose model had no price; they are counted in unpriced.
SELECT model, mode, sum(calls)::bigint AS calls,
       sum(input_tokens)::bigint AS input_tokens, sum(output_tokens)::bigint AS output_tokens,
       coalesce(sum(usd), 0)::float8 AS usd, sum(unpriced)::bigint AS unpriced
FROM (
    SELECT model, mode, calls, input_tokens, output_tokens, cost_usd AS usd,
           unpriced_calls AS unpriced
    FROM replayable.model_cost_counts
    WHERE %(run_id)s::text IS NULL
      AND day > (now() AT TIME ZONE 'UTC')::date - %(days)s::int
    UNION ALL
    SELECT coalesce(model, 'unknown'), mode, 1, tokens - output_tokens, output_tokens,
           cost_usd, (cost_usd IS NULL)::int
    FROM replayable.model_calls
    WHERE run_id = %(run_id)s::text
      AND (status = 'ok' OR (http_status BETWEEN 200 AND 299 AND tokens > 0))
) counted
GROUP BY model, mode
ORDER BY model, mode
