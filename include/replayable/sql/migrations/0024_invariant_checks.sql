-- The last counts of `replayable check --record` (ADR 0150), one row per invariant, so that
-- the metrics endpoint reports them without running the check: a check reads the whole
-- ledger (seconds at a million documents), a scrape must not.
CREATE TABLE IF NOT EXISTS replayable.invariant_checks (
    invariant       text PRIMARY KEY,
    violations      bigint NOT NULL,
    quiescent       boolean NOT NULL,
    checked_at      timestamptz NOT NULL DEFAULT now()
);
