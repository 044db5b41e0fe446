-- Items per stage by current status, for the metrics endpoint: from the counters only.
SELECT stage, status, sum(n)::bigint AS n
FROM replayable.stage_counts
GROUP BY stage, status
HAVING sum(n) <> 0
