-- Request-rate budgets shared by every worker (replayable.budget, ADR 0022): one row per
-- budget, the time at which its next request is due (GCRA, the virtual-scheduling form of a
-- token bucket). A worker reserves a send time with one statement and waits until then.
CREATE TABLE IF NOT EXISTS replayable.request_rates (
    name    text PRIMARY KEY,
    next_at timestamptz NOT NULL
);

-- Numbered 0003 until ADR 0158: a database that recorded 0003_request_rates has applied this
-- file (db.RENAMED_MIGRATIONS), so it is not run there again.
