-- A call is billed when the provider answered it 2xx with its usage, whether or not the
-- answer was usable (ADR 0114): a refusal or an empty chat answer is charged like any other.
-- Before this, only calls with status 'ok' were counted, so a refused answer cost nothing
-- in the ledger. A billed call is status 'ok', or a 2xx whose tokens the client read.
CREATE OR REPLACE FUNCTION replayable.count_model_costs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO replayable.model_cost_counts AS c
        (day, model, mode, slot, calls, input_tokens, output_tokens, cost_usd, unpriced_calls)
    SELECT (created_at AT TIME ZONE 'UTC')::date, coalesce(model, 'unknown'), mode,
           pg_backend_pid() % 16, count(*), sum(tokens - output_tokens), sum(output_tokens),
           coalesce(sum(cost_usd), 0), count(*) FILTER (WHERE cost_usd IS NULL)
    FROM new_rows
    WHERE status = 'ok' OR (http_status BETWEEN 200 AND 299 AND tokens > 0)
    GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT (day, model, mode, slot) DO UPDATE
    SET calls = c.calls + EXCLUDED.calls,
        input_tokens = c.input_tokens + EXCLUDED.input_tokens,
        output_tokens = c.output_tokens + EXCLUDED.output_tokens,
        cost_usd = c.cost_usd + EXCLUDED.cost_usd,
        unpriced_calls = c.unpriced_calls + EXCLUDED.unpriced_calls;
    RETURN NULL;
END
$$;
-- Rows recorded before this migration carry no tokens unless they were 'ok', so the
-- counters need no rebuild.
