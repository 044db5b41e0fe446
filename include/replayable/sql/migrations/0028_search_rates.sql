-- Searches are rated and costed per user (ADR 0153).
--
-- search_rates: each user's searches in the current minute, one row per user, overwritten
-- when a new minute begins: the limit's count is shared by every API server process, and
-- the table holds one row per user who ever searched, never one per user-minute, so no
-- sweep purges it.
CREATE TABLE IF NOT EXISTS replayable.search_rates (
    username  text PRIMARY KEY,
    minute    timestamptz NOT NULL,
    searches  int NOT NULL
);

-- search_counts: per day (UTC) and user, the searches admitted and the paid calls that
-- embedded their questions (billed as ADR 0114 bills: 'ok', or a 2xx with its tokens), their
-- tokens and cost; a question answered from query_vectors is a search and no call. The
-- overview reads its last 30 days here, never model_calls. A row per user and day, as
-- model_cost_counts keeps a row per model and day.
CREATE TABLE IF NOT EXISTS replayable.search_counts (
    day             date NOT NULL,
    username        text NOT NULL,
    searches        bigint NOT NULL DEFAULT 0,
    paid_calls      bigint NOT NULL DEFAULT 0,
    input_tokens    bigint NOT NULL DEFAULT 0,
    output_tokens   bigint NOT NULL DEFAULT 0,
    cost_usd        numeric NOT NULL DEFAULT 0,
    unpriced_calls  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (day, username)
);

-- Who asked the question a search call embedded (NULL for every other call). Nullable with
-- no default: adding it rewrites no row.
ALTER TABLE replayable.model_calls ADD COLUMN IF NOT EXISTS searched_by text;

-- A row trigger whose WHEN is checked without calling the function: the pipeline's calls
-- (searched_by NULL) pay nothing for it.
CREATE OR REPLACE FUNCTION replayable.count_search_cost() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO replayable.search_counts AS c
        (day, username, paid_calls, input_tokens, output_tokens, cost_usd, unpriced_calls)
    VALUES ((NEW.created_at AT TIME ZONE 'UTC')::date, NEW.searched_by, 1,
            NEW.tokens - NEW.output_tokens, NEW.output_tokens, coalesce(NEW.cost_usd, 0),
            (NEW.cost_usd IS NULL)::int)
    ON CONFLICT (day, username) DO UPDATE
    SET paid_calls = c.paid_calls + 1,
        input_tokens = c.input_tokens + EXCLUDED.input_tokens,
        output_tokens = c.output_tokens + EXCLUDED.output_tokens,
        cost_usd = c.cost_usd + EXCLUDED.cost_usd,
        unpriced_calls = c.unpriced_calls + EXCLUDED.unpriced_calls;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS model_calls_search_cost ON replayable.model_calls;
CREATE TRIGGER model_calls_search_cost AFTER INSERT ON replayable.model_calls
    FOR EACH ROW
    WHEN (NEW.searched_by IS NOT NULL
          AND (NEW.status = 'ok' OR (NEW.http_status BETWEEN 200 AND 299 AND NEW.tokens > 0)))
    EXECUTE FUNCTION replayable.count_search_cost();
