-- Counters for the Prometheus endpoint (ADR 0050): a scrape reads only counter tables, so
-- its cost does not grow with the ledger.
--
-- * model_call_counts gains `retries`: calls that were a retry inside an item's attempt
--   (call_try > 1). The trigger function is replaced to keep it, and the counters are
--   rebuilt from model_calls once so that calls made before this migration count too.
-- * dead_letter_counts: letters per stage and status now (`n`) and letters ever created
--   (`created`, which only grows: it is a Prometheus counter), kept by statement-level
--   triggers in the transaction of every insert, update and delete of dead_letters.
--
-- Both rebuilds lock their source table against writers for the moment they take, so that
-- no call or letter is counted twice or missed while the migration runs.

ALTER TABLE replayable.model_call_counts ADD COLUMN IF NOT EXISTS retries bigint NOT NULL DEFAULT 0;

CREATE OR REPLACE FUNCTION replayable.count_model_calls() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO replayable.model_call_counts AS c
        (stage, status, le_ms, slot, calls, inputs, tokens, latency_ms, retries)
    SELECT stage, status, replayable.latency_bucket(latency_ms), pg_backend_pid() % 16,
           count(*), sum(n_inputs), sum(tokens), sum(latency_ms),
           count(*) FILTER (WHERE call_try > 1)
    FROM new_rows GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT (stage, status, le_ms, slot) DO UPDATE
    SET calls = c.calls + EXCLUDED.calls, inputs = c.inputs + EXCLUDED.inputs,
        tokens = c.tokens + EXCLUDED.tokens, latency_ms = c.latency_ms + EXCLUDED.latency_ms,
        retries = c.retries + EXCLUDED.retries;
    RETURN NULL;
END
$$;

LOCK TABLE replayable.model_calls IN SHARE ROW EXCLUSIVE MODE;
DELETE FROM replayable.model_call_counts;
INSERT INTO replayable.model_call_counts
    (stage, status, le_ms, slot, calls, inputs, tokens, latency_ms, retries)
SELECT stage, status, replayable.latency_bucket(latency_ms), 0,
       count(*), sum(n_inputs), sum(tokens), sum(latency_ms),
       count(*) FILTER (WHERE call_try > 1)
FROM replayable.model_calls GROUP BY 1, 2, 3;

CREATE TABLE IF NOT EXISTS replayable.dead_letter_counts (
    stage           text NOT NULL,
    status          text NOT NULL,
    slot            int NOT NULL,
    n               bigint NOT NULL,        -- letters in this status now
    created         bigint NOT NULL,        -- letters created in this status; never decreases
    PRIMARY KEY (stage, status, slot)
);

-- Postgres allows transition tables on single-event triggers only: one function each.
-- SECURITY DEFINER, as for the letters' history (0003): a role that may change letters
-- (the UI's) needs no right on the counters.
CREATE OR REPLACE FUNCTION replayable.count_inserted_letters() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO replayable.dead_letter_counts AS c (stage, status, slot, n, created)
    SELECT stage, status, pg_backend_pid() % 16, count(*), count(*)
    FROM new_rows GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (stage, status, slot) DO UPDATE
    SET n = c.n + EXCLUDED.n, created = c.created + EXCLUDED.created;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION replayable.count_updated_letters() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- Owner and note changes move nothing: HAVING drops every zero delta, so they write
    -- no counter row.
    INSERT INTO replayable.dead_letter_counts AS c (stage, status, slot, n, created)
    SELECT stage, status, pg_backend_pid() % 16, sum(d), 0
    FROM (
        SELECT stage, status, 1 AS d FROM new_rows
        UNION ALL
        SELECT stage, status, -1 FROM old_rows
    ) delta
    GROUP BY 1, 2 HAVING sum(d) <> 0 ORDER BY 1, 2
    ON CONFLICT (stage, status, slot) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION replayable.count_deleted_letters() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO replayable.dead_letter_counts AS c (stage, status, slot, n, created)
    SELECT stage, status, pg_backend_pid() % 16, -count(*), 0
    FROM old_rows GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (stage, status, slot) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS dead_letters_count_insert ON replayable.dead_letters;
CREATE TRIGGER dead_letters_count_insert AFTER INSERT ON replayable.dead_letters
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION replayable.count_inserted_letters();
DROP TRIGGER IF EXISTS dead_letters_count_update ON replayable.dead_letters;
CREATE TRIGGER dead_letters_count_update AFTER UPDATE ON replayable.dead_letters
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION replayable.count_updated_letters();
DROP TRIGGER IF EXISTS dead_letters_count_delete ON replayable.dead_letters;
CREATE TRIGGER dead_letters_count_delete AFTER DELETE ON replayable.dead_letters
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION replayable.count_deleted_letters();

LOCK TABLE replayable.dead_letters IN SHARE ROW EXCLUSIVE MODE;
DELETE FROM replayable.dead_letter_counts;
INSERT INTO replayable.dead_letter_counts (stage, status, slot, n, created)
SELECT stage, status, 0, count(*), count(*)
FROM replayable.dead_letters GROUP BY 1, 2;
