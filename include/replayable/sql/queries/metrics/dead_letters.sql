-- Open dead letters and letters ever created, per stage, for the metrics endpoint: from the
-- counters only (migration 0005).
SELECT stage,
       coalesce(sum(n) FILTER (WHERE status = 'open'), 0)::bigint AS open,
       sum(created)::bigint AS created
FROM replayable.dead_letter_counts
GROUP BY stage
