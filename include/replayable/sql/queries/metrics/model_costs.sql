-- What answered model calls cost, per model and mode, for the metrics endpoint: from the
-- counters only (ADR 0110), summed over their days and slots.
SELECT model, mode,
       sum(cost_usd)::float8 AS cost_usd,
       sum(unpriced_calls)::bigint AS unpriced_calls
FROM replayable.model_cost_counts
GROUP BY model, mode
ORDER BY model, mode
