-- Dead letters created per hour (UTC) over the last `hours` hours, the current hour last,
-- whatever their status now: the overview's chart. Hours without letters are zeros. One
-- range scan of dead_letters_created_idx over the window: the cost follows the letters of
-- the window, not the queue's size.
WITH bounds AS (
    SELECT date_trunc('hour', now(), 'UTC') - make_interval(hours => %(hours)s - 1) AS first_hour
), counted AS (
    SELECT date_trunc('hour', dl.created_at, 'UTC') AS hour, count(*) AS created
    FROM replayable.dead_letters dl, bounds b
    WHERE dl.created_at >= b.first_hour
    GROUP BY 1
)
SELECT h.hour, coalesce(c.created, 0) AS created
FROM bounds b
CROSS JOIN LATERAL generate_series(b.first_hour, b.first_hour
                                   + make_interval(hours => %(hours)s - 1), interval '1 hour') AS h (hour)
LEFT JOIN counted c ON c.hour = h.hour
ORDER BY h.hour
