-- Dead-letter growth for DeadLetterGrowthSensor, as one row (no placeholders in comments:
-- the driver would substitute them there too).
--   new_letters        letters created in the last window_minutes minutes, whatever their
--                      status now: a letter redriven since still arrived in the window
--   open_letters       the open depth, for the alert message only (alerts follow the rate)
--   top_error_classes  [[error_class, count], ...] of the window's letters, commonest first
-- A NULL stage means every stage. The window ends at the database's now(), the clock
-- that stamped created_at.
WITH scoped AS (
    SELECT error_class, status, created_at
    FROM replayable.dead_letters
    WHERE %(stage)s::text IS NULL OR stage = %(stage)s::text
),
recent AS (
    SELECT error_class
    FROM scoped
    WHERE created_at > now() - make_interval(mins => %(window_minutes)s::int)
),
top_classes AS (
    SELECT error_class, count(*) AS n
    FROM recent
    GROUP BY error_class
    ORDER BY n DESC, error_class
    LIMIT 3
)
SELECT
    (SELECT count(*) FROM recent) AS new_letters,
    (SELECT count(*) FROM scoped WHERE status = 'open') AS open_letters,
    (SELECT coalesce(jsonb_agg(jsonb_build_array(error_class, n) ORDER BY n DESC, error_class),
                     '[]'::jsonb)
     FROM top_classes) AS top_error_classes
