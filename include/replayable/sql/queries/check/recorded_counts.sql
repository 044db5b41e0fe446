-- The last recorded check's counts per invariant (the metrics endpoint's read: a few rows).
SELECT invariant, violations, quiescent, extract(epoch FROM checked_at)::float8 AS checked_at
FROM replayable.invariant_checks
ORDER BY invariant
