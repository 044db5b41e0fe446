-- The outbox in numbers, for the metrics endpoint, the CLI and the UI (ADR 0072), kept as
-- dead_letter_counts is (0005): statement-level triggers count rows per status in the
-- transaction of every change, so a read costs the same however large the outbox grows.
--
-- * n: events in the status now (pending is the backlog; dead is the work list);
-- * entered: events that ever entered the status; it never decreases (Prometheus counters:
--   published_total, dead_lettered_total), also when a dead event is requeued.
--
-- Two partial indexes serve the reads of one status in order: the oldest pending event (the
-- backlog's age) and the CLI's lists of pending and dead events.

CREATE TABLE IF NOT EXISTS replayable.outbox_counts (
    status          text NOT NULL,
    slot            int NOT NULL,
    n               bigint NOT NULL,
    entered         bigint NOT NULL,
    PRIMARY KEY (status, slot)
);

CREATE OR REPLACE FUNCTION replayable.count_inserted_events() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO replayable.outbox_counts AS c (status, slot, n, entered)
    SELECT status, pg_backend_pid() % 16, count(*), count(*)
    FROM new_rows GROUP BY 1 ORDER BY 1
    ON CONFLICT (status, slot) DO UPDATE
    SET n = c.n + EXCLUDED.n, entered = c.entered + EXCLUDED.entered;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION replayable.count_updated_events() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- A claim or a retry keeps the status: its deltas sum to zero and write no counter row.
    -- Rows are matched by event_id, so that a row entering a status counts once in entered.
    INSERT INTO replayable.outbox_counts AS c (status, slot, n, entered)
    SELECT status, pg_backend_pid() % 16, sum(d), sum(e)
    FROM (
        SELECT n.status, 1 AS d, CASE WHEN n.status <> o.status THEN 1 ELSE 0 END AS e
        FROM new_rows n JOIN old_rows o USING (event_id)
        UNION ALL
        SELECT status, -1, 0 FROM old_rows
    ) delta
    GROUP BY 1 HAVING sum(d) <> 0 OR sum(e) <> 0 ORDER BY 1
    ON CONFLICT (status, slot) DO UPDATE
    SET n = c.n + EXCLUDED.n, entered = c.entered + EXCLUDED.entered;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION replayable.count_deleted_events() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO replayable.outbox_counts AS c (status, slot, n, entered)
    SELECT status, pg_backend_pid() % 16, -count(*), 0
    FROM old_rows GROUP BY 1 ORDER BY 1
    ON CONFLICT (status, slot) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS outbox_count_insert ON replayable.outbox;
CREATE TRIGGER outbox_count_insert AFTER INSERT ON replayable.outbox
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION replayable.count_inserted_events();
DROP TRIGGER IF EXISTS outbox_count_update ON replayable.outbox;
CREATE TRIGGER outbox_count_update AFTER UPDATE ON replayable.outbox
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION replayable.count_updated_events();
DROP TRIGGER IF EXISTS outbox_count_delete ON replayable.outbox;
CREATE TRIGGER outbox_count_delete AFTER DELETE ON replayable.outbox
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION replayable.count_deleted_events();

CREATE INDEX IF NOT EXISTS outbox_pending_seq_idx
    ON replayable.outbox (seq) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS outbox_dead_seq_idx
    ON replayable.outbox (seq) WHERE status = 'dead';

-- Rebuilt from the table once, with writers held off for the moment it takes, so that no
-- event is counted twice or missed while the migration runs.
LOCK TABLE replayable.outbox IN SHARE ROW EXCLUSIVE MODE;
DELETE FROM replayable.outbox_counts;
INSERT INTO replayable.outbox_counts (status, slot, n, entered)
SELECT status, 0, count(*), count(*)
FROM replayable.outbox GROUP BY 1;
