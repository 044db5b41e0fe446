-- A run's report counts and lists the dead letters the run opened (ADR 0116): through this
-- index, not by reading the whole queue.
CREATE INDEX IF NOT EXISTS dead_letters_run_idx ON replayable.dead_letters (run_id);
