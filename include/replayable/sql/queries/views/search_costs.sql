-- Each user's searches and the paid calls that embedded their questions over the last `days`
-- days (UTC), today included (ADR 0153), from the per-day counters: the costliest users
-- first, at most `limit` of them.
SELECT username, sum(searches)::bigint AS searches, sum(paid_calls)::bigint AS paid_calls,
       sum(input_tokens)::bigint AS input_tokens, sum(output_tokens)::bigint AS output_tokens,
       sum(cost_usd)::float8 AS usd, sum(unpriced_calls)::bigint AS unpriced
FROM replayable.search_counts
WHERE day > (now() AT TIME ZONE 'UTC')::date - %(days)s::int
GROUP BY username
ORDER BY usd DESC, searches DESC, username
LIMIT %(limit)s
