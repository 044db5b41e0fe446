-- Outbox events per status now, and events that ever entered it, for the metrics endpoint,
-- the CLI and the UI: from the counters only (migration 0008).
SELECT status, sum(n)::bigint AS n, sum(entered)::bigint AS entered
FROM replayable.outbox_counts
GROUP BY status
