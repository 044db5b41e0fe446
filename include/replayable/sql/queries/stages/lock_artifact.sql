-- Hold an artifact's key until the transaction that stores it commits: a peer that wants
-- the same answer waits here, then finds it stored (ADR 0107).
SELECT pg_advisory_xact_lock(hashtextextended('replayable.artifact:' || %(stage)s || ':' || %(key)s, 0))
