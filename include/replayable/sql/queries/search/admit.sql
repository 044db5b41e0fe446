-- Admit one search of a user (ADR 0153): count it in the user's current minute unless the
-- minute holds `limit` of them already (no limit: always), and count an admitted one in the
-- user's day. One statement: concurrent searches of one user queue on the user's row, so the
-- count is exact across API server processes. `searches` is NULL when refused;
-- `retry_after_s` is the seconds to the next minute (at least 1).
WITH clock AS (
    SELECT date_trunc('minute', now()) AS minute
),
admitted AS (
    INSERT INTO replayable.search_rates AS r (username, minute, searches)
    SELECT %(username)s, minute, 1 FROM clock
    ON CONFLICT (username) DO UPDATE
    SET minute = EXCLUDED.minute,
        searches = CASE WHEN r.minute = EXCLUDED.minute THEN r.searches + 1 ELSE 1 END
    WHERE r.minute <> EXCLUDED.minute
       OR %(limit)s::int IS NULL
       OR r.searches < %(limit)s::int
    RETURNING searches
),
counted AS (
    INSERT INTO replayable.search_counts AS c (day, username, searches)
    SELECT (now() AT TIME ZONE 'UTC')::date, %(username)s, 1 FROM admitted
    ON CONFLICT (day, username) DO UPDATE SET searches = c.searches + 1
)
SELECT (SELECT searches FROM admitted) AS searches,
       greatest(1, ceil(extract(epoch FROM minute + interval '1 minute' - now())))::int
           AS retry_after_s
FROM clock
