-- What each model call cost (ADR 0110). A call is priced when it is recorded, from the
-- model connection's extra `prices` (USD per million input and output tokens) as they were
-- then; a model with no price leaves cost_usd NULL, counted as unpriced, never as free.
-- Only answered calls (status 'ok') carry tokens, and a call is recorded in the transaction
-- that stores its answer, so a replayed answer (the provider's, under the same
-- Idempotency-Key, after the first was lost) is counted once, as the provider bills it.
ALTER TABLE replayable.model_calls ADD COLUMN IF NOT EXISTS model text;
ALTER TABLE replayable.model_calls ADD COLUMN IF NOT EXISTS mode text NOT NULL DEFAULT 'sync';
ALTER TABLE replayable.model_calls ADD COLUMN IF NOT EXISTS output_tokens int NOT NULL DEFAULT 0;
ALTER TABLE replayable.model_calls ADD COLUMN IF NOT EXISTS cost_usd numeric;

-- Answered calls, tokens and cost per day, model and mode (a call recorded before this
-- migration, with no model, is the model 'unknown'), kept by a trigger (as
-- model_call_counts is) so that the overview's 30 days and the metric never read
-- model_calls. Writers spread over slots, so that parallel senders never queue on one row.
CREATE TABLE IF NOT EXISTS replayable.model_cost_counts (
    day             date NOT NULL,
    model           text NOT NULL,
    mode            text NOT NULL,
    slot            int NOT NULL,
    calls           bigint NOT NULL,
    input_tokens    bigint NOT NULL,
    output_tokens   bigint NOT NULL,
    cost_usd        numeric NOT NULL,
    unpriced_calls  bigint NOT NULL,
    PRIMARY KEY (day, model, mode, slot)
);

CREATE OR REPLACE FUNCTION replayable.count_model_costs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO replayable.model_cost_counts AS c
        (day, model, mode, slot, calls, input_tokens, output_tokens, cost_usd, unpriced_calls)
    SELECT (created_at AT TIME ZONE 'UTC')::date, coalesce(model, 'unknown'), mode,
           pg_backend_pid() % 16, count(*), sum(tokens - output_tokens), sum(output_tokens),
           coalesce(sum(cost_usd), 0), count(*) FILTER (WHERE cost_usd IS NULL)
    FROM new_rows WHERE status = 'ok' GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT (day, model, mode, slot) DO UPDATE
    SET calls = c.calls + EXCLUDED.calls,
        input_tokens = c.input_tokens + EXCLUDED.input_tokens,
        output_tokens = c.output_tokens + EXCLUDED.output_tokens,
        cost_usd = c.cost_usd + EXCLUDED.cost_usd,
        unpriced_calls = c.unpriced_calls + EXCLUDED.unpriced_calls;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS model_calls_cost ON replayable.model_calls;
CREATE TRIGGER model_calls_cost AFTER INSERT ON replayable.model_calls
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION replayable.count_model_costs();
DELETE FROM replayable.model_cost_counts;
INSERT INTO replayable.model_cost_counts
    (day, model, mode, slot, calls, input_tokens, output_tokens, cost_usd, unpriced_calls)
SELECT (created_at AT TIME ZONE 'UTC')::date, coalesce(model, 'unknown'), mode, 0, count(*),
       sum(tokens - output_tokens), sum(output_tokens), coalesce(sum(cost_usd), 0),
       count(*) FILTER (WHERE cost_usd IS NULL)
FROM replayable.model_calls WHERE status = 'ok' GROUP BY 1, 2, 3;
