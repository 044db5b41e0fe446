-- Model calls per stage, outcome and latency bucket (le_ms -1 is +Inf), for the metrics
-- endpoint: from the counters only, summed over their slots.
SELECT stage, status, le_ms,
       sum(calls)::bigint AS calls,
       sum(tokens)::bigint AS tokens,
       sum(latency_ms)::bigint AS latency_ms,
       sum(retries)::bigint AS retries
FROM replayable.model_call_counts
GROUP BY stage, status, le_ms
