-- One snapshot, read-only, for every check of a run (replayable.invariants.run_check).
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY
